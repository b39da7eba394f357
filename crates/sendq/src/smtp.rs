//! E-mail over SMTP (lettre, async), with optional STARTTLS and authentication.
//!
//! SMTP is a dialogue: the server's reply to the end of DATA both confirms
//! that the message was written and answers it, so for this transport the
//! sent event and the answer coincide. Raise
//! [`crate::QueueConfig::per_host_sends`] to run several SMTP sessions to
//! one relay at once.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, CertificateStore, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, SendError, TransportError};
use crate::transport::{Reply, Request, Transport};

/// How the SMTP connection is secured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SmtpSecurity {
    /// Plain text (only for a relay on a trusted network or loopback).
    None,
    /// STARTTLS is required; the server's certificate must verify against the
    /// system's roots or, if given, only against this PEM root certificate.
    StartTls {
        /// A PEM root certificate to trust instead of the system's.
        root_certificate_pem: Option<String>,
    },
}

/// A user name and password for SMTP AUTH (PLAIN or LOGIN).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmtpCredentials {
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for SmtpCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpCredentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// How to reach the SMTP relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmtpConfig {
    /// The relay's host name (also the name its TLS certificate must carry).
    pub host: String,
    /// The relay's port.
    pub port: u16,
    /// Plain or STARTTLS.
    pub security: SmtpSecurity,
    /// Log in with these, if given.
    pub credentials: Option<SmtpCredentials>,
    /// The sender address, e.g. `Estafeta <alerts@example.org>`.
    pub from: String,
    /// Limit on each step of the SMTP dialogue.
    pub timeout: Duration,
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

impl SmtpTransport {
    /// Builds the transport; checks the sender address and the TLS settings.
    pub fn new(config: &SmtpConfig) -> Result<Self, ConfigError> {
        let from = mailbox(&config.from)?;
        let tls = match &config.security {
            SmtpSecurity::None => Tls::None,
            SmtpSecurity::StartTls {
                root_certificate_pem,
            } => {
                let mut params = TlsParameters::builder(config.host.clone());
                if let Some(pem) = root_certificate_pem {
                    let root = Certificate::from_pem(pem.as_bytes()).map_err(tls_error)?;
                    params = params
                        .certificate_store(CertificateStore::None)
                        .add_root_certificate(root);
                }
                Tls::Required(params.build_rustls().map_err(tls_error)?)
            }
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&config.host)
            .port(config.port)
            .timeout(Some(config.timeout))
            .tls(tls);
        if let Some(c) = &config.credentials {
            builder = builder.credentials(Credentials::new(c.username.clone(), c.password.clone()));
        }
        Ok(Self {
            mailer: builder.build(),
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
