//! [`Outbound`]: the send queues alerts go out through. E-mail has a queue
//! of its own (its transport answers with SMTP replies); the HTTP channels
//! (the SMS gateway and webhooks) share one queue whose transport forwards
//! each payload to the matching `estafeta_sendq` transport, with a health
//! probe type so a host that fails its probes is marked down and its
//! alerts wait for it.

use std::sync::Arc;
use std::time::Duration;

use estafeta_sendq::{
    EmailMessage, HttpAnswer, HttpProbe, Kind, ProbeRequest, QueueConfig, Reply, Request,
    SendError, SendQueue, SmsConfig, SmsMessage, SmsTransport, SmtpConfig, SmtpTransport,
    Transport, TypeConfig, WebhookConfig, WebhookRequest, WebhookTransport,
};

/// An alert SMS.
pub const SMS: Kind = Kind(0);
/// An alert webhook call.
pub const WEBHOOK: Kind = Kind(1);
/// A health probe.
pub const PROBE: Kind = Kind(2);
/// An alert e-mail (in the e-mail queue).
pub const EMAIL: Kind = Kind(0);

/// Probes failed in a row that mark a host down.
const PROBE_FAILURES: u32 = 3;
/// A queued alert not sent within this fails and goes back to the repeat
/// scheduler (so a host that stays down does not hold a worker forever).
const QUEUED_DEADLINE: Duration = Duration::from_secs(30);

/// One HTTP call of the shared queue.
#[derive(Debug)]
pub enum HttpOut {
    /// An SMS through the gateway.
    Sms(SmsMessage),
    /// A JSON POST.
    Webhook(WebhookRequest),
    /// A health probe GET.
    Probe(ProbeRequest),
}

/// Hands each [`HttpOut`] to its transport; all answer with [`HttpAnswer`],
/// so the reply is passed through untouched.
pub struct HttpTransport {
    sms: Option<SmsTransport>,
    webhook: WebhookTransport,
    probe: HttpProbe,
}

impl Transport<String, HttpOut> for HttpTransport {
    type Answer = HttpAnswer;

    async fn send(
        &self,
        request: Request<String, HttpOut>,
        reply: Reply<HttpAnswer>,
    ) -> Result<(), SendError> {
        let Request {
            host,
            kind,
            payload,
        } = request;
        match &*payload {
            HttpOut::Sms(sms) => match &self.sms {
                Some(t) => {
                    let payload = Arc::new(sms.clone());
                    t.send(
                        Request {
                            host,
                            kind,
                            payload,
                        },
                        reply,
                    )
                    .await
                }
                None => Err(SendError::Config(estafeta_sendq::ConfigError::Invalid {
                    what: "SMS gateway",
                    reason: "not configured".into(),
                })),
            },
            HttpOut::Webhook(w) => {
                let payload = Arc::new(w.clone());
                self.webhook
                    .send(
                        Request {
                            host,
                            kind,
                            payload,
                        },
                        reply,
                    )
                    .await
            }
            HttpOut::Probe(p) => {
                let payload = Arc::new(p.clone());
                self.probe
                    .send(
                        Request {
                            host,
                            kind,
                            payload,
                        },
                        reply,
                    )
                    .await
            }
        }
    }
}

/// The alert send queues.
#[derive(Clone)]
pub struct Outbound {
    /// E-mail, when configured.
    pub email: Option<SendQueue<String, EmailMessage, SmtpTransport>>,
    /// SMS, webhooks and probes.
    pub http: SendQueue<String, HttpOut, HttpTransport>,
}

impl Outbound {
    /// Builds the queues; must run inside the Tokio runtime.
    pub fn new(
        smtp: Option<&SmtpConfig>,
        sms: Option<&SmsConfig>,
    ) -> Result<Self, estafeta_sendq::ConfigError> {
        let email = match smtp {
            Some(c) => Some(SendQueue::new(
                QueueConfig::new(vec![
                    TypeConfig::new("alert-email", 2)
                        .queueable_if_down()
                        .deadline(QUEUED_DEADLINE),
                ]),
                SmtpTransport::new(c)?,
            )?),
            None => None,
        };
        let transport = HttpTransport {
            sms: sms.cloned().map(SmsTransport::new).transpose()?,
            webhook: WebhookTransport::new(&WebhookConfig::default())?,
            probe: HttpProbe::new(Duration::from_secs(5))?,
        };
        let http = SendQueue::new(
            QueueConfig::new(vec![
                TypeConfig::new("alert-sms", 4)
                    .queueable_if_down()
                    .deadline(QUEUED_DEADLINE),
                TypeConfig::new("alert-webhook", 4)
                    .queueable_if_down()
                    .deadline(QUEUED_DEADLINE),
                TypeConfig::probe("probe", PROBE_FAILURES),
            ]),
            transport,
        )?;
        Ok(Outbound { email, http })
    }

    /// Fails what is queued and stops the queues' tasks.
    pub async fn shutdown(&self) {
        if let Some(q) = &self.email {
            q.shutdown().await;
        }
        self.http.shutdown().await;
    }
}

/// The queue's host key of a URL: `scheme://host:port`.
pub fn host_of(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    Some(format!(
        "{}://{}:{}",
        u.scheme(),
        u.host_str()?,
        u.port_or_known_default()?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_name_the_origin() {
        assert_eq!(
            host_of("http://127.0.0.1:9000/a?b=c").as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(
            host_of("https://gw.example/send").as_deref(),
            Some("https://gw.example:443")
        );
        assert_eq!(host_of("nonsense"), None);
    }
}
