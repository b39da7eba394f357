//! HTTP webhooks: a JSON POST per entry; a 2xx status is the answer,
//! anything else an error.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError};
use crate::http::{self, HttpAnswer};
use crate::transport::{Reply, Request, Transport};

/// Timeouts for webhook calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookConfig {
    /// Limit on establishing the connection.
    pub connect_timeout: Duration,
    /// Limit on the whole call, answer included.
    pub timeout: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// One webhook call: where to POST and the JSON to send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookRequest {
    /// The webhook's URL.
    pub url: String,
    /// The JSON body.
    pub body: serde_json::Value,
}

/// The answer to a webhook call.
pub type WebhookAnswer = HttpAnswer;

/// Sends [`WebhookRequest`]s as JSON POSTs. The sent event is the body
/// written out; the answer is the response.
#[derive(Debug, Clone)]
pub struct WebhookTransport {
    client: reqwest::Client,
    timeout: Duration,
}

impl WebhookTransport {
    /// Builds the transport with its own HTTP client.
    pub fn new(config: &WebhookConfig) -> Result<Self, ConfigError> {
        Self::build(config, None)
    }

    /// Builds the transport with a client that resolves host names through
    /// `resolver` (which may refuse a name, e.g. by the addresses it has).
    pub fn with_resolver(
        config: &WebhookConfig,
        resolver: std::sync::Arc<dyn reqwest::dns::Resolve>,
    ) -> Result<Self, ConfigError> {
        Self::build(config, Some(resolver))
    }

    fn build(
        config: &WebhookConfig,
        resolver: Option<std::sync::Arc<dyn reqwest::dns::Resolve>>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            client: http::client(config.connect_timeout, resolver)?,
            timeout: config.timeout,
        })
    }
}

impl<H: Send + Sync + 'static> Transport<H, WebhookRequest> for WebhookTransport {
    type Answer = WebhookAnswer;

    async fn send(
        &self,
        request: Request<'_, H, WebhookRequest>,
        reply: Reply<WebhookAnswer>,
    ) -> Result<(), SendError> {
        let url = http::parse_url(&request.payload.url)?;
        let body = serde_json::to_vec(&request.payload.body).map_err(|e| ConfigError::Invalid {
            what: "webhook body",
            reason: e.to_string(),
        })?;
        let call = self
            .client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .timeout(self.timeout);
        http::send_with_body(call, body, reply).await
    }
}
