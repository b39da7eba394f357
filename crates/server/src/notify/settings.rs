//! [`NotifySettings`]: the alert channels and timings, checked once at start
//! from the server's [`Settings`], so a typo in an SMTP URL or an address is
//! an error when the server starts, not when the first alert is due.

use std::path::PathBuf;
use std::time::Duration;

use estafeta_sendq::{SmsConfig, SmtpConfig, SmtpCredentials, SmtpSecurity};

use crate::config::Settings;

/// An alert setting is invalid.
#[derive(Debug, thiserror::Error)]
pub enum NotifyConfigError {
    /// `smtp_url` does not parse or has the wrong scheme or options.
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
                smtp: smtp_config(url.expose(), &s.smtp_from)?,
                to: list(to),
            }),
            _ => return Err(NotifyConfigError::EmailIncomplete),
        };
        if let Some(e) = &email {
            // Build once to check the sender address and TLS settings.
            estafeta_sendq::SmtpTransport::new(&e.smtp)?;
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

/// `smtp://[user[:password]@]host[:port][?starttls=on|off]`.
fn smtp_config(url: &str, from: &str) -> Result<SmtpConfig, NotifyConfigError> {
    let bad = |m: &str| NotifyConfigError::SmtpUrl(m.to_owned());
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if parsed.scheme() != "smtp" {
        return Err(bad("the scheme must be smtp://"));
    }
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("a host is required"))?
        .to_owned();
    let mut starttls = false;
    for (k, v) in parsed.query_pairs() {
        match (k.as_ref(), v.as_ref()) {
            ("starttls", "on" | "true" | "1") => starttls = true,
            ("starttls", "off" | "false" | "0") => starttls = false,
            _ => return Err(bad(&format!("unknown option {k}={v}"))),
        }
    }
    let decode = |s: &str| -> Result<String, NotifyConfigError> {
        percent_decode(s).ok_or_else(|| bad("user or password is not valid percent-encoded UTF-8"))
    };
    let credentials = if parsed.username().is_empty() {
        None
    } else {
        Some(SmtpCredentials {
            username: decode(parsed.username())?,
            password: decode(parsed.password().unwrap_or(""))?,
        })
    };
    Ok(SmtpConfig {
        host,
        port: parsed.port().unwrap_or(25),
        security: if starttls {
            SmtpSecurity::StartTls {
                root_certificate_pem: None,
            }
        } else {
            SmtpSecurity::None
        },
        credentials,
        from: from.to_owned(),
        timeout: Duration::from_secs(30),
    })
}

/// Decodes `%XX` escapes; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls_carry_host_port_tls_and_login() {
        let c = smtp_config(
            "smtp://ops%40example.org:p%3Ass@mail.example.org:587?starttls=on",
            "a@b.c",
        )
        .unwrap();
        assert_eq!(c.host, "mail.example.org");
        assert_eq!(c.port, 587);
        assert!(matches!(c.security, SmtpSecurity::StartTls { .. }));
        let login = c.credentials.unwrap();
        assert_eq!(login.username, "ops@example.org");
        assert_eq!(login.password, "p:ss");

        let plain = smtp_config("smtp://127.0.0.1", "a@b.c").unwrap();
        assert_eq!(plain.port, 25);
        assert_eq!(plain.security, SmtpSecurity::None);
        assert_eq!(plain.credentials, None);
    }

    #[test]
    fn bad_smtp_urls_are_refused() {
        for url in [
            "http://mail.example.org",
            "smtp://mail.example.org?starttls=maybe",
            "smtp://u:%ZZ@mail.example.org",
            "not a url",
        ] {
            assert!(smtp_config(url, "a@b.c").is_err(), "{url}");
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
