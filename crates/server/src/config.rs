//! [`Settings`]: the server's configuration, read from built-in defaults, an
//! optional TOML file and `ESTAFETA_*` environment variables (in that order,
//! later ones winning), and turned into the exchange's [`ExchangeConfig`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use estafeta_exchange::ExchangeConfig;
use estafeta_exchange::mailbox::Limits;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::notify::{NotifyConfigError, NotifySettings};

/// The prefix of every environment variable the server reads.
pub const ENV_PREFIX: &str = "ESTAFETA_";

/// The configuration file read when `--config` is not given and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "estafeta.toml";

/// The shortest admin token the settings may give, in characters.
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// Settings whose values are text: the environment gives them as they are,
/// so that a token or a folder name made of digits stays text.
const TEXT_KEYS: [&str; 12] = [
    "data_dir",
    "listen",
    "admin_token",
    "alert_email",
    "smtp_url",
    "smtp_from",
    "alert_sms_url",
    "alert_sms_to",
    "alert_sms_method",
    "alert_sms_body",
    "alert_sms_content_type",
    "alert_webhook",
];

/// Every setting, its environment variable and default, for `--help`.
pub const SETTINGS_HELP: &str = "\
Settings (environment variables; a TOML file may set the same keys in lower case without the prefix):
  ESTAFETA_DATA_DIR         data folder: mailboxes and .estafeta/ [default: ./estafeta-data]
  ESTAFETA_LISTEN           address to listen on [default: 127.0.0.1:8080]
  ESTAFETA_ADMIN_TOKEN      admin token, at least 32 characters; when unset, one is made at first
                            start, printed once and kept in <data>/.estafeta/admin-token
  ESTAFETA_MAX_FILES        most messages a process start hands out [default: 10]
  ESTAFETA_MAX_MB           most megabytes a process start hands out [default: 20]
  ESTAFETA_STARTED_TIMEOUT  a STARTED process older than this times out [default: 10m]
  ESTAFETA_READY_TIMEOUT    a READY_TO_COMMIT process older than this is in doubt [default: 5m]
  ESTAFETA_RETENTION        files in Log, Prepared, Unknown, Error older than this are removed [default: 90d]
  ESTAFETA_MAX_BODY_MB      a larger request body is answered 413 [default: 32]
  ESTAFETA_REQUEST_TIMEOUT  a request head not received within this drops the connection, a body
                            is answered 408 [default: 30s]
  ESTAFETA_LOG              log filter on stderr, tracing EnvFilter syntax [default: info]
Alerts to administrators (each channel is used when its settings are given; without any, alerts
are only logged):
  ESTAFETA_ALERT_EMAIL      e-mail recipients of alerts, comma-separated
  ESTAFETA_SMTP_URL         the SMTP relay: smtp://[user[:password]@]host[:port][?starttls=on|off]
                            (user and password percent-encoded) [default port: 25; starttls: off]
  ESTAFETA_SMTP_FROM        the sender address of alert e-mail [default: estafeta@localhost]
  ESTAFETA_ALERT_SMS_URL    the SMS gateway URL template; {recipient} and {text} are filled in
  ESTAFETA_ALERT_SMS_TO     phone numbers to send alerts to, comma-separated
  ESTAFETA_ALERT_SMS_METHOD HTTP method of the gateway call [default: POST]
  ESTAFETA_ALERT_SMS_BODY   body template of the gateway call, with {recipient} and {text}
                            [default: {\"to\":\"{recipient}\",\"text\":\"{text}\"}]
  ESTAFETA_ALERT_SMS_CONTENT_TYPE  content type of that body [default: application/json]
  ESTAFETA_ALERT_WEBHOOK    a URL that gets each alert as a JSON POST
  ESTAFETA_ALERT_RETRY      first wait before a failed alert delivery is tried again; it doubles
                            on each failure up to an hour; pending deliveries survive a restart
                            [default: 5s]
  ESTAFETA_ALERT_PROBE      how often the SMS gateway, alert webhook and push webhook hosts are
                            probed (a GET of the URL's origin; any answer below 500 is up; a
                            host failing 3 probes in a row is marked down and its alerts and
                            pushes wait until it is up) [default: 30s; 0: no probes]
  ESTAFETA_DISK_ALERT_MB    alert when free space in the data folder falls under this many MB
                            [default: 100; 0: never]
  ESTAFETA_DISK_CHECK       how often free disk space is checked [default: 1m]
Durations in humantime form: 2s, 10m, 90d. Precedence: defaults < TOML file < environment.";

/// The configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source has a bad value or the file does not parse.
    #[error("configuration: {0}")]
    Invalid(#[from] Box<figment::Error>),
    /// The message-start limits are out of range.
    #[error("configuration: {0}")]
    Limits(#[from] estafeta_exchange::LimitError),
    /// The admin token is shorter than [`MIN_ADMIN_TOKEN_LEN`].
    #[error(
        "configuration: admin_token (ESTAFETA_ADMIN_TOKEN) is {0} characters long; it must be at least {MIN_ADMIN_TOKEN_LEN} (for example `openssl rand -hex 16`), or unset to have one made"
    )]
    WeakAdminToken(usize),
    /// `max_body_mb` is zero.
    #[error("configuration: max_body_mb must be at least 1")]
    NoBody,
    /// An alert setting is invalid.
    #[error("configuration: {0}")]
    Notify(#[from] NotifyConfigError),
}

/// The server's settings (see [`SETTINGS_HELP`]).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// The data folder.
    pub data_dir: PathBuf,
    /// The address to listen on (`host:port`).
    pub listen: String,
    /// The admin token; made and kept in the data folder when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// The server's file-count limit of a process start.
    pub max_files: usize,
    /// The server's megabyte limit of a process start.
    pub max_mb: f64,
    /// A STARTED process older than this times out.
    #[serde(with = "humantime_text")]
    pub started_timeout: Duration,
    /// A READY_TO_COMMIT process older than this is in doubt.
    #[serde(with = "humantime_text")]
    pub ready_timeout: Duration,
    /// Age after which files in `Log`, `Prepared`, `Unknown`, `Error` go.
    #[serde(with = "humantime_text")]
    pub retention: Duration,
    /// The largest request body, in megabytes.
    pub max_body_mb: u64,
    /// How long a client may take to send its request head, and its body.
    #[serde(with = "humantime_text")]
    pub request_timeout: Duration,
    /// E-mail recipients of alerts, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_email: Option<String>,
    /// The SMTP relay as a URL (see [`SETTINGS_HELP`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_url: Option<String>,
    /// The sender address of alert e-mail.
    pub smtp_from: String,
    /// The SMS gateway's URL template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_sms_url: Option<String>,
    /// Phone numbers that get alerts, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_sms_to: Option<String>,
    /// The SMS gateway call's method.
    pub alert_sms_method: String,
    /// The SMS gateway call's body template.
    pub alert_sms_body: String,
    /// The SMS gateway call's content type.
    pub alert_sms_content_type: String,
    /// A webhook URL that gets each alert as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_webhook: Option<String>,
    /// The first wait before a failed alert delivery is retried.
    #[serde(with = "humantime_text")]
    pub alert_retry: Duration,
    /// How often alert HTTP hosts are probed (0: never).
    #[serde(with = "humantime_text")]
    pub alert_probe: Duration,
    /// Free-disk threshold in MB for the disk alert (0: off).
    pub disk_alert_mb: u64,
    /// How often free disk is checked.
    #[serde(with = "humantime_text")]
    pub disk_check: Duration,
}

impl Default for Settings {
    /// The defaults of API.md: `estafeta serve` runs with no configuration.
    fn default() -> Self {
        let exchange = ExchangeConfig::new("./estafeta-data");
        Settings {
            data_dir: exchange.data_dir,
            listen: "127.0.0.1:8080".to_owned(),
            admin_token: None,
            max_files: 10,
            max_mb: 20.0,
            started_timeout: exchange.started_timeout,
            ready_timeout: exchange.ready_timeout,
            retention: exchange.retention,
            max_body_mb: 32,
            request_timeout: Duration::from_secs(30),
            alert_email: None,
            smtp_url: None,
            smtp_from: "estafeta@localhost".to_owned(),
            alert_sms_url: None,
            alert_sms_to: None,
            alert_sms_method: "POST".to_owned(),
            alert_sms_body: r#"{"to":"{recipient}","text":"{text}"}"#.to_owned(),
            alert_sms_content_type: "application/json".to_owned(),
            alert_webhook: None,
            alert_retry: Duration::from_secs(5),
            alert_probe: Duration::from_secs(30),
            disk_alert_mb: 100,
            disk_check: Duration::from_secs(60),
        }
    }
}

/// The admin token stays out of logs.
impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("data_dir", &self.data_dir)
            .field("listen", &self.listen)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("max_files", &self.max_files)
            .field("max_mb", &self.max_mb)
            .field("started_timeout", &self.started_timeout)
            .field("ready_timeout", &self.ready_timeout)
            .field("retention", &self.retention)
            .field("max_body_mb", &self.max_body_mb)
            .field("request_timeout", &self.request_timeout)
            .field("alert_email", &self.alert_email)
            .field(
                "smtp_url",
                &self
                    .smtp_url
                    .as_ref()
                    .map(|_| "<redacted: may hold a password>"),
            )
            .field("smtp_from", &self.smtp_from)
            .field("alert_sms_url", &self.alert_sms_url)
            .field("alert_sms_to", &self.alert_sms_to)
            .field("alert_webhook", &self.alert_webhook)
            .field("alert_retry", &self.alert_retry)
            .field("alert_probe", &self.alert_probe)
            .field("disk_alert_mb", &self.disk_alert_mb)
            .field("disk_check", &self.disk_check)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The layered sources: defaults, then the TOML file (`file` if given,
    /// which must exist; else `estafeta.toml` in the working folder if it
    /// exists), then the `ESTAFETA_*` environment.
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        match file {
            Some(path) => figment = figment.merge(Toml::file_exact(path)),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let env = Env::prefixed(ENV_PREFIX);
        figment = figment.merge(env.clone().ignore(&TEXT_KEYS));
        for (key, value) in env.only(&TEXT_KEYS).iter() {
            figment = figment.merge(Serialized::default(key.as_str(), value));
        }
        figment
    }

    /// Reads and checks the settings (see [`Settings::figment`]).
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        let settings: Settings = Self::figment(file).extract().map_err(Box::new)?;
        settings.exchange_config()?;
        if let Some(token) = &settings.admin_token
            && token.chars().count() < MIN_ADMIN_TOKEN_LEN
        {
            return Err(ConfigError::WeakAdminToken(token.chars().count()));
        }
        if settings.max_body_mb == 0 {
            return Err(ConfigError::NoBody);
        }
        settings.notify()?;
        Ok(settings)
    }

    /// The exchange's part of the settings.
    pub fn exchange_config(&self) -> Result<ExchangeConfig, ConfigError> {
        let mut config = ExchangeConfig::new(&self.data_dir);
        config.admin_token = self.admin_token.clone();
        config.limits = Limits::new(self.max_files, self.max_mb)?;
        config.started_timeout = self.started_timeout;
        config.ready_timeout = self.ready_timeout;
        config.retention = self.retention;
        Ok(config)
    }

    /// The alert notifier's part of the settings, checked: a bad SMTP URL,
    /// e-mail address or gateway template is an error here, at start.
    pub fn notify(&self) -> Result<NotifySettings, NotifyConfigError> {
        NotifySettings::from_settings(self)
    }

    /// The HTTP layer's part of the settings.
    pub fn http(&self) -> HttpSettings {
        HttpSettings {
            max_body_bytes: usize::try_from(self.max_body_mb.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            request_timeout: self.request_timeout,
            retention_interval: RETENTION_INTERVAL,
        }
    }
}

/// How often the retention sweep runs after the one at start-up.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// What the HTTP layer itself needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSettings {
    /// A larger request body is answered 413.
    pub max_body_bytes: usize,
    /// A request head not received within this drops the connection; a
    /// body not received within it is answered 408.
    pub request_timeout: Duration,
    /// The period of the retention sweep.
    pub retention_interval: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Settings::default().http()
    }
}

/// Durations as humantime text (`10m`, `90d`), as API.md writes them.
mod humantime_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format_args!(
                "bad duration {text:?} ({e}); write it like 30s, 10m or 90d"
            ))
        })
    }
}

#[cfg(test)]
// figment's Jail closures return figment's (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_are_those_of_the_api() {
        Jail::expect_with(|_| {
            let s = Settings::load(None).unwrap();
            assert_eq!(s, Settings::default());
            assert_eq!(s.data_dir, PathBuf::from("./estafeta-data"));
            assert_eq!(s.listen, "127.0.0.1:8080");
            assert_eq!(s.started_timeout, Duration::from_secs(600));
            assert_eq!(s.ready_timeout, Duration::from_secs(300));
            assert_eq!(s.retention, Duration::from_secs(90 * 86400));
            assert_eq!(s.http().max_body_bytes, 32 << 20);
            let x = s.exchange_config().unwrap();
            assert_eq!(x.limits, Limits::default());
            assert_eq!(x.admin_token, None);
            Ok(())
        });
    }

    #[test]
    fn environment_overrides_file_overrides_defaults() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "estafeta.toml",
                r#"
                    data_dir = "/srv/from-file"
                    listen = "0.0.0.0:9000"
                    max_files = 3
                    max_mb = 1.5
                    ready_timeout = "7m"
                "#,
            )?;
            jail.set_env("ESTAFETA_MAX_FILES", "4");
            jail.set_env("ESTAFETA_LISTEN", "127.0.0.1:0");
            jail.set_env("ESTAFETA_RETENTION", "2d");
            let s = Settings::load(None).unwrap();
            assert_eq!(s.data_dir, PathBuf::from("/srv/from-file"));
            assert_eq!(s.listen, "127.0.0.1:0");
            assert_eq!(s.max_files, 4);
            assert_eq!(s.max_mb, 1.5);
            assert_eq!(s.ready_timeout, Duration::from_secs(420));
            assert_eq!(s.retention, Duration::from_secs(2 * 86400));
            assert_eq!(s.started_timeout, Duration::from_secs(600));
            Ok(())
        });
    }

    #[test]
    fn text_settings_stay_text_even_when_they_look_like_numbers() {
        Jail::expect_with(|jail| {
            let digits = "00123456789012345678901234567890";
            jail.set_env("ESTAFETA_ADMIN_TOKEN", digits);
            jail.set_env("ESTAFETA_DATA_DIR", "1e5");
            let s = Settings::load(None).unwrap();
            assert_eq!(s.admin_token.as_deref(), Some(digits));
            assert_eq!(s.data_dir, PathBuf::from("1e5"));
            assert!(!format!("{s:?}").contains(digits));
            Ok(())
        });
    }

    #[test]
    fn an_explicit_file_must_exist_and_bad_values_are_errors() {
        Jail::expect_with(|jail| {
            assert!(Settings::load(Some(Path::new("missing.toml"))).is_err());
            jail.create_file("other.toml", "max_mb = 2")?;
            assert_eq!(
                Settings::load(Some(Path::new("other.toml")))
                    .unwrap()
                    .max_mb,
                2.0
            );

            jail.set_env("ESTAFETA_STARTED_TIMEOUT", "ten minutes");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("bad duration"), "{err}");

            jail.set_env("ESTAFETA_STARTED_TIMEOUT", "10m");
            jail.set_env("ESTAFETA_MAX_FILES", "0");
            assert!(matches!(Settings::load(None), Err(ConfigError::Limits(_))));

            jail.set_env("ESTAFETA_MAX_FILES", "10");
            jail.set_env("ESTAFETA_MAX_BODY_MB", "0");
            assert!(matches!(Settings::load(None), Err(ConfigError::NoBody)));

            jail.set_env("ESTAFETA_MAX_BODY_MB", "32");
            jail.set_env("ESTAFETA_ADMIN_TOKEN", "x".repeat(MIN_ADMIN_TOKEN_LEN - 1));
            let err = Settings::load(None).unwrap_err();
            assert!(matches!(err, ConfigError::WeakAdminToken(31)), "{err}");
            assert!(err.to_string().contains("at least 32"), "{err}");
            jail.set_env("ESTAFETA_ADMIN_TOKEN", "x".repeat(MIN_ADMIN_TOKEN_LEN));
            assert!(Settings::load(None).is_ok());
            Ok(())
        });
    }

    #[test]
    fn alert_settings_come_from_file_and_environment() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "estafeta.toml",
                r#"
                    alert_email = "ops@example.org"
                    smtp_url = "smtp://ops:secret@mail.example.org:587?starttls=on"
                    alert_retry = "2s"
                "#,
            )?;
            jail.set_env("ESTAFETA_ALERT_SMS_URL", "http://127.0.0.1:1/send");
            jail.set_env("ESTAFETA_ALERT_SMS_TO", "0012345");
            jail.set_env("ESTAFETA_ALERT_WEBHOOK", "http://127.0.0.1:2/hook");
            jail.set_env("ESTAFETA_DISK_ALERT_MB", "5");
            let s = Settings::load(None).unwrap();
            assert!(!format!("{s:?}").contains("secret"));
            let n = s.notify().unwrap();
            let email = n.email.unwrap();
            assert_eq!(email.smtp.port, 587);
            assert_eq!(email.to, vec!["ops@example.org"]);
            assert_eq!(n.sms.unwrap().to, vec!["0012345"]);
            assert_eq!(n.webhook.as_deref(), Some("http://127.0.0.1:2/hook"));
            assert_eq!(n.retry, Duration::from_secs(2));
            assert_eq!(n.disk_alert_bytes, 5 << 20);

            jail.set_env(
                "ESTAFETA_SMTP_URL",
                "smtp://mail.example.org?starttls=perhaps",
            );
            assert!(matches!(Settings::load(None), Err(ConfigError::Notify(_))));
            Ok(())
        });
    }
}
