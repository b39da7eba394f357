//! [`NotifySettings`]: the alert channels and timings, checked once at start
//! from the server's [`Settings`], so a typo in an SMTP URL or an address is
//! an error when the server starts, not when the first alert is due.

use std::path::PathBuf;
use std::time::Duration;

use estafeta_sendq::{SmsConfig, SmtpConfig};

use crate::config::Settings;

/// An alert setting is invalid.
#[derive(Debug, thiserror::Error)]
pub enum NotifyConfigError {
    /// `smtp_url` does not parse, or has the wrong scheme or options (the
    /// reason never repeats the URL, which may hold a password).
    #[error("smtp_url: {0}")]
    SmtpUrl(String),
    /// E-mail recipients were given but no relay (or the other way round).
    #[error("alert_email and smtp_url must be given together")]
    EmailIncomplete,
    /// SMS recipients were given but no gateway (or the other way round).
    #[error("alert_sms_url and alert_sms_to must be given together")]
    SmsIncomplete,
    /// A transport refused its configuration (address, URL, method).
    #[error("{0}")]
    Transport(#[from] estafeta_sendq::ConfigError),
}

/// The alert e-mail channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmailChannel {
    /// The relay and sender.
    pub smtp: SmtpConfig,
    /// The recipients.
    pub to: Vec<String>,
}

/// The alert SMS channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmsChannel {
    /// The gateway.
    pub gateway: SmsConfig,
    /// The phone numbers.
    pub to: Vec<String>,
}

/// Everything the notifier needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifySettings {
    /// The data folder (its `.estafeta/` keeps the notifier's state; its
    /// free space is watched).
    pub data_dir: PathBuf,
    /// E-mail, if configured.
    pub email: Option<EmailChannel>,
    /// SMS, if configured.
    pub sms: Option<SmsChannel>,
    /// The alert webhook URL, if configured.
    pub webhook: Option<String>,
    /// First wait before a failed delivery is retried (doubling up to an hour).
    pub retry: Duration,
    /// Probe period of the HTTP alert hosts; zero: no probes.
    pub probe: Duration,
    /// Free-disk threshold in bytes; zero: no disk alert.
    pub disk_alert_bytes: u64,
    /// Period of the free-disk check.
    pub disk_check: Duration,
    /// Whether webhook targets may be in private address ranges.
    pub webhook_private: super::targets::PrivateTargets,
}

/// Limit on each step of the SMTP dialogue.
const SMTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Splits a comma-separated list, dropping blanks.
fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl NotifySettings {
    /// No channels and no probes: alerts are only logged; the disk is still
    /// watched (at the settings' default period, with no alert threshold).
    pub fn log_only(data_dir: impl Into<PathBuf>) -> Self {
        let defaults = Settings::default();
        NotifySettings {
            data_dir: data_dir.into(),
            email: None,
            sms: None,
            webhook: None,
            retry: defaults.alert_retry,
            probe: Duration::ZERO,
            disk_alert_bytes: 0,
            disk_check: defaults.disk_check,
            webhook_private: defaults.webhook_private,
        }
    }

    /// Checks and converts the alert settings.
    pub fn from_settings(s: &Settings) -> Result<Self, NotifyConfigError> {
        let email = match (&s.alert_email, &s.smtp_url) {
            (None, None) => None,
            (Some(to), Some(url)) => Some(EmailChannel {
                smtp: SmtpConfig {
                    url: url.expose().to_owned(),
                    root_certificate_pem: None,
                    from: s.smtp_from.clone(),
                    timeout: SMTP_TIMEOUT,
                },
                to: list(to),
            }),
            _ => return Err(NotifyConfigError::EmailIncomplete),
        };
        if let Some(e) = &email {
            // Build once to check the URL (as lettre reads it), the sender
            // address and the TLS settings.
            estafeta_sendq::SmtpTransport::new(&e.smtp).map_err(|e| match e {
                estafeta_sendq::ConfigError::Invalid {
                    what: "SMTP URL",
                    reason,
                } => NotifyConfigError::SmtpUrl(reason),
                other => NotifyConfigError::Transport(other),
            })?;
        }
        let sms = match (&s.alert_sms_url, &s.alert_sms_to) {
            (None, None) => None,
            (Some(url), Some(to)) => {
                let gateway = SmsConfig {
                    url: url.expose().to_owned(),
                    method: s.alert_sms_method.clone(),
                    body: Some(s.alert_sms_body.clone()).filter(|b| !b.is_empty()),
                    content_type: s.alert_sms_content_type.clone(),
                    ..SmsConfig::default()
                };
                estafeta_sendq::SmsTransport::new(gateway.clone())?;
                Some(SmsChannel {
                    gateway,
                    to: list(to),
                })
            }
            _ => return Err(NotifyConfigError::SmsIncomplete),
        };
        let webhook = s.alert_webhook.as_ref().map(|url| url.expose().to_owned());
        if let Some(url) = &webhook {
            reqwest::Url::parse(url).map_err(|e| estafeta_sendq::ConfigError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(NotifySettings {
            data_dir: s.data_dir.clone(),
            email,
            sms,
            webhook,
            retry: s.alert_retry.max(Duration::from_secs(1)),
            probe: s.alert_probe,
            disk_alert_bytes: s.disk_alert_mb.saturating_mul(1 << 20),
            disk_check: s.disk_check.max(Duration::from_secs(1)),
            webhook_private: s.webhook_private,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings with the e-mail channel on `url`.
    fn email(url: &str) -> Settings {
        Settings {
            alert_email: Some("ops@example.org".into()),
            smtp_url: Some(url.into()),
            ..Settings::default()
        }
    }

    #[test]
    fn smtp_urls_are_read_by_lettre_with_tls_modes_and_login() {
        for url in [
            "smtp://127.0.0.1",
            "smtp://ops%40example.org:p%3Ass@mail.example.org:587?tls=required",
            "smtp://mail.example.org?tls=opportunistic",
            "smtps://ops:secret@mail.example.org",
            "smtps://mail.example.org:2465/ehlo.example.org",
        ] {
            let n = NotifySettings::from_settings(&email(url)).unwrap();
            assert_eq!(n.email.unwrap().smtp.url, url);
        }
    }

    #[test]
    fn bad_smtp_urls_are_refused_with_the_reason_and_without_the_password() {
        for url in [
            "http://ops:secret@mail.example.org",
            "smtp://ops:secret@mail.example.org?starttls=on",
            "smtp://ops:secret@mail.example.org?tls=maybe",
            "not a url",
        ] {
            let e = NotifySettings::from_settings(&email(url)).unwrap_err();
            assert!(matches!(e, NotifyConfigError::SmtpUrl(_)), "{url}: {e}");
            let text = e.to_string();
            assert!(text.starts_with("smtp_url: "), "{text}");
            assert!(!text.contains("secret"), "{text}");
        }
    }

    #[test]
    fn channels_need_both_halves() {
        let mut s = Settings {
            alert_email: Some("ops@example.org".into()),
            ..Settings::default()
        };
        assert!(matches!(
            NotifySettings::from_settings(&s),
            Err(NotifyConfigError::EmailIncomplete)
        ));
        s.smtp_url = Some("smtp://127.0.0.1:2525".into());
        s.alert_sms_to = Some("+100, +200".into());
        assert!(matches!(
            NotifySettings::from_settings(&s),
            Err(NotifyConfigError::SmsIncomplete)
        ));
        s.alert_sms_url = Some("http://127.0.0.1:1/send".into());
        s.alert_webhook = Some("http://127.0.0.1:2/hook".into());
        let n = NotifySettings::from_settings(&s).unwrap();
        assert_eq!(n.email.unwrap().to, vec!["ops@example.org"]);
        assert_eq!(n.sms.unwrap().to, vec!["+100", "+200"]);
        assert_eq!(n.disk_alert_bytes, 100 << 20);
    }
}
