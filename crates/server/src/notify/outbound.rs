//! [`Outbound`]: the send queues alerts and push notifications go out
//! through. E-mail has a queue of its own (its transport answers with SMTP
//! replies); the HTTP channels (the SMS gateway, alert webhooks and push
//! webhooks) share one queue whose transport forwards each payload to the
//! matching `estafeta_sendq` transport, with a health probe type so a host
//! that fails its probes is marked down and what waits for it stays queued.
//! The HTTP hosts in use are remembered, for the probes and the figures
//! ([`Outbound::figures`]) that the dashboard and `/metrics` show.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
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
/// A push notification to a database's or device's webhook.
pub const PUSH: Kind = Kind(3);
/// An alert e-mail (in the e-mail queue).
pub const EMAIL: Kind = Kind(0);

/// The HTTP queue's types by kind, as named in figures.
const HTTP_TYPES: [(Kind, &str); 4] = [
    (SMS, "alert-sms"),
    (WEBHOOK, "alert-webhook"),
    (PROBE, "probe"),
    (PUSH, "push"),
];
/// The name of the queue of the HTTP channels, in figures.
pub const HTTP_QUEUE: &str = "http";
/// The host key of the e-mail queue (one relay).
pub const SMTP_HOST: &str = "smtp";
/// Push notifications in flight per webhook host.
const PUSH_WINDOW: usize = 8;

/// Probes failed in a row that mark a host down.
const PROBE_FAILURES: u32 = 3;
/// The longest a probe may take, from connect to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
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
/// so the reply is passed through untouched. A host is probed with the
/// policy of what is sent to it: the SMS gateway's host (the operator's
/// own setting) as its transport reaches it, every webhook host through
/// the checked resolver, as webhooks are.
pub struct HttpTransport {
    sms: Option<SmsTransport>,
    webhook: WebhookTransport,
    /// Probes of webhook hosts.
    probe: HttpProbe,
    /// Probes of the SMS gateway's host.
    gateway_probe: HttpProbe,
    /// The SMS gateway's host key, if there is a gateway.
    gateway_host: Option<String>,
}

impl Transport<String, HttpOut> for HttpTransport {
    type Answer = HttpAnswer;

    async fn send(
        &self,
        request: Request<'_, String, HttpOut>,
        reply: Reply<HttpAnswer>,
    ) -> Result<(), SendError> {
        match request.payload {
            HttpOut::Sms(sms) => match &self.sms {
                Some(t) => t.send(request.with_payload(sms), reply).await,
                None => Err(SendError::Config(estafeta_sendq::ConfigError::Invalid {
                    what: "SMS gateway",
                    reason: "not configured".into(),
                })),
            },
            HttpOut::Webhook(w) => self.webhook.send(request.with_payload(w), reply).await,
            HttpOut::Probe(p) => {
                let probe = match self.gateway_host.as_deref() == Some(request.host.as_str()) {
                    true => &self.gateway_probe,
                    false => &self.probe,
                };
                probe.send(request.with_payload(p), reply).await
            }
        }
    }
}

/// The send queues of alerts and pushes.
#[derive(Clone)]
pub struct Outbound {
    /// E-mail, when configured.
    pub email: Option<SendQueue<String, EmailMessage, SmtpTransport>>,
    /// SMS, webhooks, pushes and probes.
    pub http: SendQueue<String, HttpOut, HttpTransport>,
    /// The HTTP hosts in use (configured, or sent to since the start).
    hosts: Arc<Mutex<BTreeSet<String>>>,
    /// Whether webhook targets may be in private address ranges.
    pub webhook_private: super::targets::PrivateTargets,
}

/// One request type's figures at one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeFigures {
    /// The type's name (`push`, `alert-webhook`, `probe`, …).
    pub name: &'static str,
    /// Waiting for the window, or for the host to come up.
    pub queued: usize,
    /// Counted against the window: being sent or unanswered.
    pub in_flight: usize,
    /// The window.
    pub window: usize,
}

/// One host of a send queue and its types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFigures {
    /// `http` or `email`.
    pub queue: &'static str,
    /// The host key (`scheme://host:port`, or `smtp`).
    pub host: String,
    /// Whether its health probes marked it down (`false` when unprobed).
    pub down: bool,
    /// Its types that it has seen, in kind order.
    pub types: Vec<TypeFigures>,
}

impl Outbound {
    /// Builds the queues; must run inside the Tokio runtime.
    pub fn new(
        smtp: Option<&SmtpConfig>,
        sms: Option<&SmsConfig>,
        webhook_private: super::targets::PrivateTargets,
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
        // Every address a webhook host resolves to is checked first, for
        // its webhooks and for its probes alike.
        let checked = std::sync::Arc::new(super::targets::CheckedResolver {
            private: webhook_private,
        });
        let gateway_host = sms.and_then(|s| host_of(&s.url));
        let transport = HttpTransport {
            sms: sms.cloned().map(SmsTransport::new).transpose()?,
            webhook: WebhookTransport::with_resolver(&WebhookConfig::default(), checked.clone())?,
            // Webhook origins and gateways have no health URL: any HTTP
            // answer below 500 means the host is there.
            probe: HttpProbe::reachability_with_resolver(PROBE_TIMEOUT, checked)?,
            gateway_probe: HttpProbe::reachability(PROBE_TIMEOUT)?,
            gateway_host: gateway_host.clone(),
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
                TypeConfig::new("push", PUSH_WINDOW)
                    .queueable_if_down()
                    .deadline(QUEUED_DEADLINE),
            ]),
            transport,
        )?;
        let hosts = gateway_host.into_iter().collect::<BTreeSet<_>>();
        Ok(Outbound {
            email,
            http,
            hosts: Arc::new(Mutex::new(hosts)),
            webhook_private,
        })
    }

    /// Remembers an HTTP host in use (its probes start with the next round).
    pub fn note_host(&self, host: &str) {
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        if !hosts.contains(host) {
            hosts.insert(host.to_owned());
        }
    }

    /// The HTTP hosts in use.
    pub fn http_hosts(&self) -> Vec<String> {
        let hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        hosts.iter().cloned().collect()
    }

    /// Each host's state and, per type it has seen, its depth, entries in
    /// flight and window.
    pub fn figures(&self) -> Vec<HostFigures> {
        let mut out = Vec::new();
        if let Some(q) = &self.email {
            let host = SMTP_HOST.to_owned();
            out.push(HostFigures {
                queue: "email",
                down: q.is_down(&host).unwrap_or(false),
                types: q
                    .stats(&host, EMAIL)
                    .map(|s| figures("alert-email", &s))
                    .into_iter()
                    .collect(),
                host,
            });
        }
        for host in self.http_hosts() {
            let types = HTTP_TYPES
                .iter()
                .filter_map(|(kind, name)| Some(figures(name, &self.http.stats(&host, *kind)?)))
                .collect();
            out.push(HostFigures {
                queue: HTTP_QUEUE,
                down: self.http.is_down(&host).unwrap_or(false),
                host,
                types,
            });
        }
        out
    }

    /// Fails what is queued and stops the queues' tasks.
    pub async fn shutdown(&self) {
        if let Some(q) = &self.email {
            q.shutdown().await;
        }
        self.http.shutdown().await;
    }
}

fn figures(name: &'static str, s: &estafeta_sendq::TypeStats) -> TypeFigures {
    TypeFigures {
        name,
        queued: s.queued,
        in_flight: s.in_flight,
        window: s.window,
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
