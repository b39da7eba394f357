//! SMS through an HTTP gateway: the gateway's URL, method and body template
//! come from the configuration, with the recipient and the text filled in.
//!
//! Placeholders are `{recipient}` and `{text}`. In the URL they are
//! percent-encoded; in the body they are escaped for the configured content
//! type (JSON string escaping for JSON, percent-encoding for forms, as is
//! otherwise), so a text can never break the request's syntax.

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError};
use crate::http::{self, HttpAnswer};
use crate::transport::{Reply, Request, Transport};

/// How to reach the SMS gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsConfig {
    /// URL template, e.g. `https://gw.example/send?to={recipient}&msg={text}`.
    pub url: String,
    /// HTTP method, e.g. `POST` or `GET`.
    pub method: String,
    /// Body template; `None` sends no body.
    pub body: Option<String>,
    /// Content type of the body; decides how placeholders are escaped in it.
    pub content_type: String,
    /// Limit on establishing the connection.
    pub connect_timeout: Duration,
    /// Limit on the whole call, answer included.
    pub timeout: Duration,
}

impl Default for SmsConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            method: "POST".into(),
            body: Some(r#"{"to":"{recipient}","text":"{text}"}"#.into()),
            content_type: "application/json".into(),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// One SMS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsMessage {
    /// The recipient's phone number.
    pub recipient: String,
    /// The text.
    pub text: String,
}

/// How placeholders in the body are escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    Json,
    Form,
    Raw,
}

/// Sends [`SmsMessage`]s through the configured gateway; a 2xx status is the answer.
#[derive(Debug, Clone)]
pub struct SmsTransport {
    client: reqwest::Client,
    config: SmsConfig,
    method: Method,
    escape: Escape,
}

impl SmsTransport {
    /// Builds the transport, checking the method and that the URL template
    /// makes a valid URL.
    pub fn new(config: SmsConfig) -> Result<Self, ConfigError> {
        let method =
            Method::from_bytes(config.method.as_bytes()).map_err(|e| ConfigError::Invalid {
                what: "SMS gateway method",
                reason: e.to_string(),
            })?;
        http::parse_url(&fill(&config.url, "0", "x", percent_encode))?;
        let escape = if config.content_type.contains("json") {
            Escape::Json
        } else if config.content_type.contains("x-www-form-urlencoded") {
            Escape::Form
        } else {
            Escape::Raw
        };
        Ok(Self {
            client: http::client(config.connect_timeout, None)?,
            config,
            method,
            escape,
        })
    }

    /// The URL and body for one message.
    fn render(&self, sms: &SmsMessage) -> (String, Option<Vec<u8>>) {
        let url = fill(&self.config.url, &sms.recipient, &sms.text, percent_encode);
        let body = self.config.body.as_ref().map(|template| {
            let escape: fn(&str) -> String = match self.escape {
                Escape::Json => json_escape,
                Escape::Form => percent_encode,
                Escape::Raw => str::to_owned,
            };
            fill(template, &sms.recipient, &sms.text, escape).into_bytes()
        });
        (url, body)
    }
}

impl<H: Send + Sync + 'static> Transport<H, SmsMessage> for SmsTransport {
    type Answer = HttpAnswer;

    async fn send(
        &self,
        request: Request<'_, H, SmsMessage>,
        reply: Reply<HttpAnswer>,
    ) -> Result<(), SendError> {
        let (url, body) = self.render(request.payload);
        let url = http::parse_url(&url)?;
        let call = self
            .client
            .request(self.method.clone(), url)
            .timeout(self.config.timeout);
        match body {
            Some(body) => {
                let call = call.header(CONTENT_TYPE, self.config.content_type.as_str());
                http::send_with_body(call, body, reply).await
            }
            None => http::send_without_body(call, reply).await,
        }
    }
}

/// Replaces the placeholders in one pass, so a recipient or text that itself
/// contains `{text}` is not expanded again.
fn fill(template: &str, recipient: &str, text: &str, escape: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(template.len() + text.len());
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("{recipient}") {
            out.push_str(&escape(recipient));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{text}") {
            out.push_str(&escape(text));
            rest = after;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

/// Escapes a string for use inside a JSON string literal.
fn json_escape(s: &str) -> String {
    let quoted = serde_json::Value::String(s.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_once_and_escaped() {
        let out = fill(
            "a={recipient}&b={text}&c={other}",
            "+1 2",
            "{text} & é",
            percent_encode,
        );
        assert_eq!(out, "a=%2B1%202&b=%7Btext%7D%20%26%20%C3%A9&c={other}");
    }

    #[test]
    fn json_escaping_keeps_the_body_valid() {
        let body = fill(
            r#"{"to":"{recipient}","text":"{text}"}"#,
            "1",
            "say \"hi\"\n",
            json_escape,
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["text"], "say \"hi\"\n");
    }

    #[test]
    fn a_bad_method_or_url_is_a_config_error() {
        let bad_method = SmsConfig {
            url: "http://127.0.0.1/".into(),
            method: "NOT A METHOD".into(),
            ..SmsConfig::default()
        };
        assert!(matches!(
            SmsTransport::new(bad_method),
            Err(ConfigError::Invalid { .. })
        ));
        let bad_url = SmsConfig {
            url: "not a url {text}".into(),
            ..SmsConfig::default()
        };
        assert!(matches!(
            SmsTransport::new(bad_url),
            Err(ConfigError::InvalidUrl { .. })
        ));
    }
}
