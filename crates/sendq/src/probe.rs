//! Health probes over HTTP: a GET whose 2xx answer means the host is up.
//!
//! Used with a probe type ([`crate::TypeConfig::probe`]): the queue counts
//! failures and marks the host down past the threshold, and up again on the
//! first success.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError};
use crate::http::{self, HttpAnswer};
use crate::transport::{Reply, Request, Transport};

/// Where to probe a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRequest {
    /// The health URL to GET.
    pub url: String,
}

/// Sends [`ProbeRequest`]s as GETs with a timeout.
#[derive(Debug, Clone)]
pub struct HttpProbe {
    client: reqwest::Client,
    timeout: Duration,
}

impl HttpProbe {
    /// Builds the probe; `timeout` bounds each probe from connect to answer.
    pub fn new(timeout: Duration) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::client(timeout)?,
            timeout,
        })
    }
}

impl<H: Send + Sync + 'static> Transport<H, ProbeRequest> for HttpProbe {
    type Answer = HttpAnswer;

    async fn send(
        &self,
        request: Request<H, ProbeRequest>,
        reply: Reply<HttpAnswer>,
    ) -> Result<(), SendError> {
        let url = http::parse_url(&request.payload.url)?;
        http::send_without_body(self.client.get(url).timeout(self.timeout), reply).await
    }
}
