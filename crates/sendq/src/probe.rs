//! Health probes over HTTP: a GET whose 2xx answer means the host is up
//! ([`HttpProbe::new`], for a health URL), or whose answer of any status
//! below 500 does ([`HttpProbe::reachability`], for a host that has no
//! health URL, such as a webhook's origin, which often answers 404).
//!
//! Used with a probe type ([`crate::TypeConfig::probe`]): the queue counts
//! failures and marks the host down past the threshold, and up again on the
//! first success.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError, TransportError};
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
    /// Any answer below 500 means up, not only a 2xx.
    reachability: bool,
}

impl HttpProbe {
    /// A probe of a health URL: up when it answers 2xx. `timeout` bounds
    /// each probe from connect to answer.
    pub fn new(timeout: Duration) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::client(timeout, None)?,
            timeout,
            reachability: false,
        })
    }

    /// A probe of whether a host's HTTP server is there: up when it
    /// answers with any status below 500; no answer, a timeout or a 5xx is
    /// a failure.
    pub fn reachability(timeout: Duration) -> Result<Self, ConfigError> {
        Ok(Self {
            reachability: true,
            ..Self::new(timeout)?
        })
    }

    /// [`HttpProbe::reachability`] through a client that resolves host
    /// names through `resolver` (which may refuse a name by the addresses
    /// it has), as the transport that sends to the host does.
    pub fn reachability_with_resolver(
        timeout: Duration,
        resolver: std::sync::Arc<dyn reqwest::dns::Resolve>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::client(timeout, Some(resolver))?,
            timeout,
            reachability: true,
        })
    }
}

impl<H: Send + Sync + 'static> Transport<H, ProbeRequest> for HttpProbe {
    type Answer = HttpAnswer;

    async fn send(
        &self,
        request: Request<'_, H, ProbeRequest>,
        reply: Reply<HttpAnswer>,
    ) -> Result<(), SendError> {
        let url = http::parse_url(&request.payload.url)?;
        let get = self.client.get(url).timeout(self.timeout);
        if !self.reachability {
            return http::send_without_body(get, reply).await;
        }
        let answer = match get.send().await {
            Ok(response) if response.status().as_u16() < 500 => Ok(HttpAnswer {
                status: response.status().as_u16(),
                body: String::new(),
            }),
            Ok(response) => Err(TransportError::Status(response.status().as_u16()).into()),
            Err(e) => Err(TransportError::Http(e).into()),
        };
        reply.answer(answer);
        Ok(())
    }
}
