//! E-mail over SMTP (lettre, async): the relay given as an SMTP URL (plain,
//! STARTTLS required or opportunistic, or TLS from the start; a login).
//!
//! SMTP is a dialogue: the server's reply to the end of DATA both confirms
//! that the message was written and answers it, so for this transport the
//! sent event and the answer coincide. Raise
//! [`crate::QueueConfig::per_host_sends`] to run several SMTP sessions to
//! one relay at once.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::client::{Certificate, CertificateStore, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError, TransportError};
use crate::transport::{Reply, Request, Transport};

/// How to reach the SMTP relay.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmtpConfig {
    /// The relay as an SMTP URL, read by lettre:
    /// `smtp://[user[:password]@]host[:port]` is plain text (port 25),
    /// `?tls=required` adds STARTTLS, required, and `?tls=opportunistic`
    /// STARTTLS when the relay offers it (both port 587), `smtps://…` is TLS
    /// from the first byte (port 465). User and password are
    /// percent-encoded; a path names the host given in EHLO.
    pub url: String,
    /// A PEM root certificate that TLS trusts instead of the system's.
    pub root_certificate_pem: Option<String>,
    /// The sender address, e.g. `Estafeta <alerts@example.org>`.
    pub from: String,
    /// Limit on each step of the SMTP dialogue.
    pub timeout: Duration,
}

impl std::fmt::Debug for SmtpConfig {
    /// The URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match reqwest::Url::parse(&self.url) {
            Ok(mut url) if url.password().is_some() => {
                let _ = url.set_password(Some("***"));
                url.to_string()
            }
            Ok(url) => url.to_string(),
            Err(_) => "(not a URL)".to_owned(),
        };
        f.debug_struct("SmtpConfig")
            .field("url", &url)
            .field("root_certificate_pem", &self.root_certificate_pem.is_some())
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// One e-mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailMessage {
    /// Recipient addresses.
    pub to: Vec<String>,
    /// The subject line.
    pub subject: String,
    /// The plain-text body.
    pub body: String,
}

/// The relay's positive answer to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpAnswer {
    /// The reply code, e.g. `250`.
    pub code: String,
    /// The reply text.
    pub message: String,
}

/// Sends [`EmailMessage`]s through one SMTP relay.
#[derive(Clone)]
pub struct SmtpTransport {
    mailer: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl std::fmt::Debug for SmtpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpTransport")
            .field("from", &self.from.to_string())
            .finish_non_exhaustive()
    }
}

fn tls_error(e: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        what: "SMTP TLS settings",
        reason: e.to_string(),
    }
}

fn mailbox(address: &str) -> Result<Mailbox, ConfigError> {
    address.parse().map_err(
        |e: lettre::address::AddressError| ConfigError::InvalidAddress {
            address: address.to_owned(),
            reason: e.to_string(),
        },
    )
}

fn url_error(reason: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        what: "SMTP URL",
        reason: reason.to_string(),
    }
}

impl SmtpTransport {
    /// Builds the transport; checks the URL (as lettre reads it), the sender
    /// address and the TLS settings. Errors never repeat the URL, which may
    /// hold a password.
    pub fn new(config: &SmtpConfig) -> Result<Self, ConfigError> {
        let from = mailbox(&config.from)?;
        let url = reqwest::Url::parse(&config.url).map_err(url_error)?;
        // lettre reads `tls` and passes over any other option: a misspelt
        // one would quietly mean plain text.
        let mut tls = None;
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "tls" => tls = Some(value.into_owned()),
                _ => {
                    return Err(url_error(format!(
                        "unknown option {key}={value}; the one option is tls=required or \
                         tls=opportunistic (STARTTLS), or smtps:// for TLS from the start"
                    )));
                }
            }
        }
        let mut builder =
            AsyncSmtpTransport::<Tokio1Executor>::from_url(&config.url).map_err(url_error)?;
        if let Some(pem) = &config.root_certificate_pem {
            let host = url.host_str().unwrap_or_default().to_owned();
            let root = Certificate::from_pem(pem.as_bytes()).map_err(tls_error)?;
            let params = TlsParameters::builder(host)
                .certificate_store(CertificateStore::None)
                .add_root_certificate(root)
                .build_rustls()
                .map_err(tls_error)?;
            // The mode lettre chose from the URL, with this root.
            builder = builder.tls(match (url.scheme(), tls.as_deref()) {
                ("smtps", _) => Tls::Wrapper(params),
                (_, Some("required")) => Tls::Required(params),
                (_, Some("opportunistic")) => Tls::Opportunistic(params),
                _ => Tls::None,
            });
        }
        Ok(Self {
            mailer: builder.timeout(Some(config.timeout)).build(),
            from,
        })
    }

    fn message(&self, email: &EmailMessage) -> Result<Message, ConfigError> {
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(email.subject.clone())
            .header(ContentType::TEXT_PLAIN);
        for to in &email.to {
            builder = builder.to(mailbox(to)?);
        }
        builder
            .body(email.body.clone())
            .map_err(|e| ConfigError::Invalid {
                what: "e-mail message",
                reason: e.to_string(),
            })
    }
}

impl<H: Send + Sync + 'static> Transport<H, EmailMessage> for SmtpTransport {
    type Answer = SmtpAnswer;

    async fn send(
        &self,
        request: Request<'_, H, EmailMessage>,
        reply: Reply<SmtpAnswer>,
    ) -> Result<(), SendError> {
        let message = self.message(request.payload)?;
        let result = match self.mailer.send(message).await {
            Ok(response) => Ok(SmtpAnswer {
                code: response.code().to_string(),
                message: response.message().collect::<Vec<_>>().join("\n"),
            }),
            Err(e) => Err(TransportError::Smtp(e).into()),
        };
        reply.answer(result);
        Ok(())
    }
}
