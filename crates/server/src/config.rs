//! [`Settings`]: the server's configuration, from built-in defaults, then a
//! TOML file, then `ESTAFETA_*` environment variables, then command-line
//! flags (later ones winning), turned into the exchange's [`ExchangeConfig`]
//! and the notifier's [`NotifySettings`].
//!
//! Each setting is declared once, in the `settings!` list below: its key
//! (the TOML key; its environment variable is `ESTAFETA_` and the key in
//! upper case), its type, its default, its help text and, for a number or a
//! duration, what zero means (zero is refused where nothing is said). The
//! struct, its defaults, `--help`, the reading of the file and of the
//! environment and the listing of `estafeta config` all come from that
//! list; a secret's type ([`Secret`], [`SecretUrl`]) keeps it out of every
//! listing and log. Adding a setting is adding one entry.

pub(crate) mod value;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use estafeta_exchange::ExchangeConfig;
use estafeta_exchange::mailbox::Limits;

use crate::notify::{NotifyConfigError, NotifySettings};
pub use value::{
    LogFilter, LogFormat, Networks, PrivateTargets, Secret, SecretUrl, Shown, Value, duration_text,
};

/// The prefix of every environment variable the server reads.
pub const ENV_PREFIX: &str = "ESTAFETA_";

/// The configuration file read when none is named and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "estafeta.toml";

/// The environment variable naming the configuration file.
pub const CONFIG_VARIABLE: &str = "ESTAFETA_CONFIG";

/// `ESTAFETA_*` variables that are not settings but are read elsewhere (the
/// admin CLI's server address, the harness's failpoints): not refused.
const OTHER_VARIABLES: [&str; 5] = [
    CONFIG_VARIABLE,
    "ESTAFETA_URL",
    "ESTAFETA_CRASH_AT",
    "ESTAFETA_PAUSE_AT",
    "ESTAFETA_FAILPOINTS",
];

/// Declares the settings: the [`Settings`] struct, its `Default`, the
/// [`SETTINGS`] table and the per-key parsing and showing.
macro_rules! settings {
    (@option) => { None };
    (@option $text:literal) => { Some($text) };
    (@default $ty:ty) => { <$ty>::default() };
    (@default $ty:ty, $text:literal) => { declared_default::<$ty>($text) };
    ($(
        section $section:literal {
            $(
                $(#[doc = $help:literal])+
                $key:ident: $ty:ty $(= $default:literal)? $(, zero $zero:literal)?;
            )+
        }
    )+) => {
        /// The server's settings: see `estafeta --help` ([`help`]).
        #[derive(Clone, Debug, PartialEq)]
        pub struct Settings {
            $($(
                // The help text is plain text (brackets, `<data>`): a code
                // span keeps rustdoc from reading it as links or HTML.
                #[doc = concat!("`", $($help,)+ "`")]
                pub $key: $ty,
            )+)+
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings {
                    $($($key: settings!(@default $ty $(, $default)?),)+)+
                }
            }
        }

        /// Every setting, in the order of `--help`.
        pub const SETTINGS: &[Setting] = &[
            $($(Setting {
                key: stringify!($key),
                section: $section,
                help: concat!($($help),+),
                default: settings!(@option $($default)?),
                zero: settings!(@option $($zero)?),
            },)+)+
        ];

        impl Settings {
            /// Parses `text` into `setting`.
            fn set(&mut self, setting: &Setting, text: &str) -> Result<(), String> {
                match setting.key {
                    $($(stringify!($key) => self.$key = parse_setting(setting, text)?,)+)+
                    _ => unreachable!("every Setting is declared with its field"),
                }
                Ok(())
            }

            /// The value of `setting`, as `estafeta config` shows it.
            fn show(&self, setting: &Setting) -> Shown {
                match setting.key {
                    $($(stringify!($key) => self.$key.show(),)+)+
                    _ => unreachable!("every Setting is declared with its field"),
                }
            }
        }
    };
}

settings! {
    section "Settings (environment variables; a TOML file may set the same keys in lower case without the prefix):" {
        /// data folder: mailboxes and .estafeta/
        data_dir: PathBuf = "./estafeta-data";
        /// address to listen on
        listen: String = "127.0.0.1:8080";
        /// admin token, at least 32 characters; when unset, one is made at first start and
        /// printed once; only its hash is kept, in <data>/.estafeta/admin-token (in cluster
        /// mode, by the cluster's first node, in the store)
        admin_token: Option<Secret>;
        /// where state is kept: unset, the embedded store under data_dir; a postgres:// URL
        /// (libpq syntax, several hosts with target_session_attrs=read-write), cluster mode:
        /// every node started with the same URL serves the same tenants
        store: Option<SecretUrl>;
        /// cluster mode: most connections in each of this node's three pools to PostgreSQL
        /// (steps, process steps, statements; its registry and event log keep one more each:
        /// 3 × store_pool + 2 in all, for every node within max_connections)
        store_pool: usize = "16";
        /// most messages a process start hands out
        max_files: usize = "10";
        /// most megabytes a process start hands out
        max_mb: f64 = "20";
        /// a STARTED process older than this times out
        started_timeout: Duration = "10m";
        /// a READY_TO_COMMIT process older than this is in doubt
        ready_timeout: Duration = "5m";
        /// files in Log, Prepared, Unknown, Error older than this are removed
        retention: Duration = "90d";
        /// a larger upload or prepare body is answered 413 (megabytes); every other API body is
        /// limited to 256 KB, a dashboard form to 16 KB
        max_body_mb: u64 = "32";
        /// upload and prepare bodies held in memory at once (megabytes, each counted at its
        /// declared length); past it, further ones wait up to request_timeout, then 503
        bodies_in_flight_mb: u64 = "128";
        /// a request head not received within this (on a new connection, or after an answer on a
        /// kept-alive one: the idle timeout) drops the connection; a body is answered 408
        request_timeout: Duration = "30s";
        /// an answer of which the client takes no byte for this long ends its connection
        write_timeout: Duration = "30s";
        /// most connections served at once (at most half the open-file limit, less 32); past it,
        /// 32 more serve one request each of /healthz, /readyz, the admin API and the dashboard,
        /// and any further connection is closed at once
        max_connections: usize = "4096";
        /// on SIGTERM or SIGINT, calls in flight get this long to finish; connections still open
        /// then are closed, sessions are saved and the server exits
        stop_timeout: Duration = "30s";
        /// proxies (addresses or networks, comma-separated: 10.0.0.0/8, 127.0.0.1) whose
        /// X-Forwarded-For names the client: its last address not in this list is the client's,
        /// for the throttle of wrong tokens; unset, the connection's own address
        trusted_proxies: Option<Networks>;
        /// log filter on stderr, tracing EnvFilter syntax
        log: LogFilter = "info";
        /// form of the log lines on stderr: text, or json (one object per line)
        log_format: LogFormat = "text";
        /// event log (<data>/.estafeta/events.redb): events older than this are removed
        events_max_age: Duration = "30d";
        /// event log: the oldest events are removed while their records pass this many megabytes
        events_max_mb: u64 = "256";
    }
    section "Alerts to administrators (each channel is used when its settings are given; without any, alerts are only logged):" {
        /// e-mail recipients of alerts, comma-separated
        alert_email: Option<String>;
        /// the SMTP relay: smtp://[user[:password]@]host[:port] in plain text (port 25),
        /// ?tls=required or ?tls=opportunistic for STARTTLS (port 587), smtps://… for TLS
        /// from the first byte (port 465); user and password percent-encoded
        smtp_url: Option<SecretUrl>;
        /// the sender address of alert e-mail
        smtp_from: String = "estafeta@localhost";
        /// the SMS gateway URL template; {recipient} and {text} are filled in
        alert_sms_url: Option<SecretUrl>;
        /// phone numbers to send alerts to, comma-separated
        alert_sms_to: Option<String>;
        /// HTTP method of the gateway call
        alert_sms_method: String = "POST";
        /// body template of the gateway call, with {recipient} and {text}; empty: no body
        alert_sms_body: String = r#"{"to":"{recipient}","text":"{text}"}"#;
        /// content type of that body
        alert_sms_content_type: String = "application/json";
        /// a URL that gets each alert as a JSON POST
        alert_webhook: Option<SecretUrl>;
        /// first wait before a failed alert delivery is tried again; it doubles on each failure
        /// up to an hour; pending deliveries survive a restart
        alert_retry: Duration = "5s";
        /// how often the SMS gateway, alert webhook and push webhook hosts are probed (a GET of
        /// the URL's origin; any answer below 500 is up; a host failing 3 probes in a row is
        /// marked down and its alerts and pushes wait until it is up)
        alert_probe: Duration = "30s", zero "no probes";
        /// webhook targets (push and alert) in private ranges (10/8, 172.16/12, 192.168/16,
        /// 100.64/10, loopback, fc00::/7): allow or deny; link-local and metadata addresses
        /// (169.254/16, fe80::/10) are always refused, also when a host name resolves to one;
        /// a refused webhook is not stored, sent to or probed, and redirects are never followed
        webhook_private: PrivateTargets = "allow";
        /// alert when free space in the data folder falls under this many MB
        disk_alert_mb: u64 = "100", zero "never";
        /// how often free disk space is checked
        disk_check: Duration = "1m";
        /// /metrics: messages waiting per database for at most this many databases (the
        /// first by id); every other figure is a total, whatever the number of mailboxes
        metrics_per_database: usize = "0", zero "totals only";
    }
}

/// A setting's declaration.
#[derive(Debug)]
pub struct Setting {
    /// Its key in the TOML file.
    pub key: &'static str,
    /// The `--help` section that lists it.
    pub section: &'static str,
    /// What it does.
    pub help: &'static str,
    /// Its default as text; `None`: unset.
    pub default: Option<&'static str>,
    /// What zero means for it; `None`: zero is refused.
    pub zero: Option<&'static str>,
}

impl Setting {
    /// Its environment variable: the prefix and the key in upper case.
    pub fn env(&self) -> String {
        format!("{ENV_PREFIX}{}", self.key.to_ascii_uppercase())
    }

    /// The setting whose key is `key` (in any case).
    pub fn find(key: &str) -> Option<&'static Setting> {
        SETTINGS.iter().find(|s| s.key.eq_ignore_ascii_case(key))
    }
}

/// A declared default, which the tests check parses.
fn declared_default<T: Value>(text: &str) -> T {
    match T::parse(text) {
        Ok(value) => value,
        Err(e) => panic!("the declared default {text:?} does not parse: {e}"),
    }
}

/// `text` parsed as `setting`'s value; zero only where it means something.
fn parse_setting<T: Value>(setting: &Setting, text: &str) -> Result<T, String> {
    let value = T::parse(text)?;
    if value.is_zero() && setting.zero.is_none() {
        return Err("must be more than 0".to_owned());
    }
    Ok(value)
}

/// The `--help` text of the settings, from their declarations.
pub fn help() -> String {
    const WIDTH: usize = 100;
    // Keeps a bracketed note on one line: wrapping splits at spaces only.
    const NO_BREAK: char = '\u{a0}';
    let name_width = SETTINGS.iter().map(|s| s.env().len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    let mut section = "";
    for setting in SETTINGS {
        if setting.section != section {
            if !section.is_empty() {
                out.push('\n');
            }
            section = setting.section;
            out.push_str(&wrap(section, 0, WIDTH));
        }
        let mut notes = Vec::new();
        if let Some(default) = setting.default {
            notes.push(format!("default: {default}"));
        }
        if let Some(zero) = setting.zero {
            notes.push(format!("0: {zero}"));
        }
        let mut text = setting.help.trim().to_owned();
        if !notes.is_empty() {
            let notes = notes.join("; ").replace(' ', &NO_BREAK.to_string());
            text = format!("{text} [{notes}]");
        }
        let body = wrap(&text, 2 + name_width, WIDTH).replace(NO_BREAK, " ");
        let first_line = body.trim_start();
        let name = setting.env();
        out.push_str(&format!("  {name:<name_width$}{first_line}"));
    }
    out.push('\n');
    out.push_str(&wrap(
        &format!(
            "Durations: 30s, 10m, 90d, or a number of seconds. The file: --config PATH, else \
             {CONFIG_VARIABLE}, else ./{DEFAULT_CONFIG_FILE} if present. Precedence: defaults < \
             file < environment < the flags of serve (--listen, --data-dir). Unknown keys in the \
             file and unknown {ENV_PREFIX}* variables are refused. `estafeta config` prints the \
             effective settings."
        ),
        0,
        WIDTH,
    ));
    out.trim_end().to_owned()
}

/// `text` in lines of at most `width` columns (longer words stay whole),
/// each indented by `indent` spaces and ended by a newline.
fn wrap(text: &str, indent: usize, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split([' ', '\n']).filter(|w| !w.is_empty()) {
        if !line.is_empty() && indent + line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&format!("{:indent$}{line}\n", ""));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&format!("{:indent$}{line}\n", ""));
    out
}

/// The shortest admin token the settings may give, in characters.
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// The fewest guesses (as a power of ten) an admin token the settings give
/// must take by zxcvbn's estimate, which counts repeats, sequences,
/// keyboard patterns and dictionary words (and stops counting past about
/// 10^19): 32 random hex digits reach that; `x` 32 times (10^2.6), the
/// alphabet in a row (10^4.3) or a word repeated (10^1.1) are far below.
pub const MIN_ADMIN_TOKEN_GUESSES_LOG10: f64 = 12.0;

/// Refuses an admin token that is short or, by its estimated strength,
/// easy to guess.
pub fn check_admin_token(token: &str) -> Result<(), ConfigError> {
    let len = token.chars().count();
    if len < MIN_ADMIN_TOKEN_LEN {
        return Err(ConfigError::WeakAdminToken(len));
    }
    let guesses = zxcvbn::zxcvbn(token, &[]).guesses_log10();
    if guesses < MIN_ADMIN_TOKEN_GUESSES_LOG10 {
        return Err(ConfigError::GuessableAdminToken(guesses.floor() as u32));
    }
    Ok(())
}

/// The configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The admin token is shorter than [`MIN_ADMIN_TOKEN_LEN`].
    #[error(
        "configuration: admin_token (ESTAFETA_ADMIN_TOKEN) is {0} characters long; it must be at least {MIN_ADMIN_TOKEN_LEN} (for example `openssl rand -hex 16`), or unset to have one made"
    )]
    WeakAdminToken(usize),
    /// The admin token is long enough but easy to guess (about 10 to the
    /// given power guesses, below [`MIN_ADMIN_TOKEN_GUESSES_LOG10`]).
    #[error(
        "configuration: admin_token (ESTAFETA_ADMIN_TOKEN) is easy to guess (about 10^{0} guesses: repeats, sequences or words); use a random one (for example `openssl rand -hex 16`), or unset it to have one made"
    )]
    GuessableAdminToken(u32),
    /// The configuration file cannot be read.
    #[error("configuration file {}: {source}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration file is not TOML.
    #[error("configuration file {}: {message}", path.display())]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The configuration file has a key that is no setting.
    #[error(
        "configuration file {}: unknown setting {key:?}; did you mean {nearest:?}? \
         (`estafeta --help` lists every setting)",
        path.display()
    )]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The setting with the nearest key.
        nearest: &'static str,
    },
    /// An `ESTAFETA_*` environment variable is no setting.
    #[error(
        "unknown environment variable {name}; did you mean {nearest}? \
         (`estafeta --help` lists every setting)"
    )]
    UnknownVariable {
        /// The variable.
        name: String,
        /// The variable with the nearest name.
        nearest: String,
    },
    /// An `ESTAFETA_*` environment variable is not UTF-8.
    #[error("environment variable {0}: not valid UTF-8")]
    NotUtf8(String),
    /// A setting has a bad value.
    #[error("{origin} = {text:?}: {reason}")]
    BadValue {
        /// Where it was set.
        origin: Origin,
        /// The value as given.
        text: String,
        /// What is wrong and what a good value looks like.
        reason: String,
    },
    /// The message-start limits are out of range.
    #[error("configuration: {0}")]
    Limits(#[from] estafeta_exchange::LimitError),
    /// An alert setting is invalid.
    #[error("configuration: {0}")]
    Notify(#[from] NotifyConfigError),
}

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Its declared default.
    Default,
    /// A key of the configuration file.
    File {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// An environment variable.
    Env(String),
    /// A command-line flag (`--listen`).
    Flag(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File { path, key } => write!(f, "{}: {key}", path.display()),
            Origin::Env(name) => f.write_str(name),
            Origin::Flag(flag) => f.write_str(flag),
        }
    }
}

impl Origin {
    /// The source alone: `default`, the file, the variable or the flag.
    fn source(&self) -> String {
        match self {
            Origin::File { path, .. } => path.display().to_string(),
            other => other.to_string(),
        }
    }
}

/// Where the settings are read from.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The configuration file that must exist (named by `--config` or
    /// `ESTAFETA_CONFIG`); when `None`, `./estafeta.toml` is read if it exists.
    pub file: Option<PathBuf>,
    /// The environment; only `ESTAFETA_*` variables are looked at.
    pub env: Vec<(OsString, OsString)>,
    /// Command-line flags: the flag, its setting's key and its text.
    pub flags: Vec<(&'static str, &'static str, String)>,
}

impl Sources {
    /// `file` (or `./estafeta.toml` if present) and the process environment.
    pub fn process(file: Option<&Path>) -> Sources {
        Sources {
            file: file.map(Path::to_owned),
            env: std::env::vars_os().collect(),
            flags: Vec::new(),
        }
    }

    /// Reads every source in turn and checks the result.
    pub fn resolve(&self) -> Result<Effective, ConfigError> {
        let mut effective = Effective {
            settings: Settings::default(),
            origins: BTreeMap::new(),
            file: None,
        };
        let file = match &self.file {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(DEFAULT_CONFIG_FILE)).filter(|p| p.is_file()),
        };
        if let Some(path) = file {
            read_file(&path, &mut effective)?;
            effective.file = Some(path);
        }
        let mut env: Vec<_> = self.env.iter().collect();
        env.sort();
        for (name, text) in env {
            read_variable(name, text, &mut effective)?;
        }
        for (flag, key, text) in &self.flags {
            let setting = Setting::find(key).ok_or_else(|| ConfigError::BadValue {
                origin: Origin::Flag(flag),
                text: text.clone(),
                reason: "no such setting".to_owned(),
            })?;
            effective.set(setting, text, Origin::Flag(flag))?;
        }
        if let Some(token) = &effective.settings.admin_token {
            check_admin_token(token.expose())?;
        }
        effective.settings.exchange_config()?;
        effective.settings.notify()?;
        Ok(effective)
    }
}

/// Applies the keys of the TOML file at `path`.
fn read_file(path: &Path, effective: &mut Effective) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::ParseFile {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
    for (key, value) in table {
        let origin = Origin::File {
            path: path.to_owned(),
            key: key.clone(),
        };
        let Some(setting) = SETTINGS.iter().find(|s| s.key == key) else {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                nearest: nearest(&key, SETTINGS.iter().map(|s| s.key)),
                key,
            });
        };
        let text = match value {
            toml::Value::String(text) => text,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(ConfigError::BadValue {
                    origin,
                    text: other.to_string(),
                    reason: "expected a single value: text in quotes or a number".to_owned(),
                });
            }
        };
        effective.set(setting, &text, origin)?;
    }
    Ok(())
}

/// Applies the environment variable `name` if it is an `ESTAFETA_*` setting;
/// refuses other `ESTAFETA_*` variables.
fn read_variable(
    name: &OsString,
    text: &OsString,
    effective: &mut Effective,
) -> Result<(), ConfigError> {
    let Some(name) = name.to_str() else {
        let lossy = name.to_string_lossy();
        return match lossy.starts_with(ENV_PREFIX) {
            true => Err(ConfigError::NotUtf8(lossy.into_owned())),
            false => Ok(()),
        };
    };
    let Some(key) = name.strip_prefix(ENV_PREFIX) else {
        return Ok(());
    };
    if OTHER_VARIABLES.contains(&name) {
        return Ok(());
    }
    let Some(setting) = Setting::find(key) else {
        let names: Vec<String> = SETTINGS.iter().map(Setting::env).collect();
        let candidates = names.iter().map(String::as_str).chain(OTHER_VARIABLES);
        return Err(ConfigError::UnknownVariable {
            name: name.to_owned(),
            nearest: nearest(name, candidates).to_owned(),
        });
    };
    let text = text
        .to_str()
        .ok_or_else(|| ConfigError::NotUtf8(name.to_owned()))?;
    effective.set(setting, text, Origin::Env(name.to_owned()))
}

/// The candidate with the fewest edits from `given` (case aside).
fn nearest<'a>(given: &str, candidates: impl Iterator<Item = &'a str>) -> &'a str {
    let given = given.to_ascii_lowercase();
    candidates
        .min_by_key(|c| strsim::levenshtein(&given, &c.to_ascii_lowercase()))
        .unwrap_or_default()
}

/// The settings in effect and where each came from (`estafeta config`).
#[derive(Clone, Debug)]
pub struct Effective {
    /// The settings.
    pub settings: Settings,
    /// Where each setting that is not at its default was set, by key.
    origins: BTreeMap<&'static str, Origin>,
    /// The configuration file read, if any.
    pub file: Option<PathBuf>,
}

impl Effective {
    fn set(
        &mut self,
        setting: &'static Setting,
        text: &str,
        origin: Origin,
    ) -> Result<(), ConfigError> {
        match self.settings.set(setting, text) {
            Ok(()) => {
                self.origins.insert(setting.key, origin);
                Ok(())
            }
            Err(reason) => Err(ConfigError::BadValue {
                origin,
                text: text.to_owned(),
                reason,
            }),
        }
    }

    /// Where `key`'s value came from.
    pub fn origin(&self, key: &str) -> Origin {
        self.origins.get(key).cloned().unwrap_or(Origin::Default)
    }
}

/// One line per setting, as TOML (`key = value  # where from`); secrets and
/// unset settings as comments, so the listing reads back as a file.
impl fmt::Display for Effective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = match &self.file {
            Some(path) => path.display().to_string(),
            None => "none".to_owned(),
        };
        writeln!(
            f,
            "# The effective settings (defaults < file < environment < flags); secrets masked."
        )?;
        writeln!(f, "# Configuration file: {file}")?;
        let lines: Vec<(String, Origin)> = SETTINGS
            .iter()
            .map(|s| {
                let line = match self.settings.show(s) {
                    Shown::Plain(value) => format!("{} = {value}", s.key),
                    Shown::Redacted(masked) => format!("# {} = {masked}", s.key),
                    Shown::Unset => format!("# {} is unset", s.key),
                };
                (line, self.origin(s.key))
            })
            .collect();
        let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        for (line, origin) in lines {
            writeln!(f, "{line:<width$}  # {}", origin.source())?;
        }
        Ok(())
    }
}

/// A node's `store` setting in cluster mode: the database's URL and how
/// the node uses it (its pool's size and limits). Not `Debug`: the URL
/// may carry a password.
#[derive(Clone)]
pub struct ClusterStore {
    /// A `postgres://` URL (libpq syntax).
    pub url: String,
    /// The node's pool over it.
    pub options: estafeta_postgres::Options,
}

impl ClusterStore {
    /// `url` with the default pool.
    pub fn new(url: impl Into<String>) -> ClusterStore {
        ClusterStore {
            url: url.into(),
            options: estafeta_postgres::Options::default(),
        }
    }
}

impl Settings {
    /// Reads and checks the settings from defaults, `file` (which must exist;
    /// without it, `./estafeta.toml` if it exists) and the process environment.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Ok(Sources::process(file).resolve()?.settings)
    }

    /// The defaults with the `log` and `log_format` settings from the
    /// environment alone, for the commands that read no configuration file
    /// (`admin`, `demo`): each at its default when its variable is unset or
    /// bad.
    pub fn logging_from_env() -> Settings {
        let mut settings = Settings::default();
        for setting in SETTINGS
            .iter()
            .filter(|s| matches!(s.key, "log" | "log_format"))
        {
            if let Ok(text) = std::env::var(setting.env()) {
                // A bad value leaves the default: these commands still run.
                let _ = settings.set(setting, &text);
            }
        }
        settings
    }

    /// The exchange's part of the settings.
    pub fn exchange_config(&self) -> Result<ExchangeConfig, ConfigError> {
        let mut config = ExchangeConfig::new(&self.data_dir);
        config.admin_token = self.admin_token.as_ref().map(|t| t.expose().to_owned());
        config.limits = Limits::new(self.max_files, self.max_mb)?;
        config.started_timeout = self.started_timeout;
        config.ready_timeout = self.ready_timeout;
        config.retention = self.retention;
        Ok(config)
    }

    /// The cluster store the `store` setting names, with this node's pool;
    /// `None`: the embedded store.
    pub fn cluster_store(&self) -> Option<ClusterStore> {
        let url = self.store.as_ref()?;
        Some(ClusterStore {
            url: url.expose().to_owned(),
            options: estafeta_postgres::Options {
                pool_size: self.store_pool,
                ..estafeta_postgres::Options::default()
            },
        })
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
            bodies_in_flight_bytes: usize::try_from(
                self.bodies_in_flight_mb.saturating_mul(1 << 20),
            )
            .unwrap_or(usize::MAX),
            request_timeout: self.request_timeout,
            write_timeout: self.write_timeout,
            max_connections: self.max_connections,
            stop_timeout: self.stop_timeout,
            trusted_proxies: self.trusted_proxies.clone(),
            retention_interval: RETENTION_INTERVAL,
            metrics_per_database: self.metrics_per_database,
        }
    }
}

/// How often the retention sweep runs after the one at start-up.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// What the HTTP layer itself needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSettings {
    /// A larger upload or prepare body is answered 413.
    pub max_body_bytes: usize,
    /// Upload and prepare bodies held at once, in bytes.
    pub bodies_in_flight_bytes: usize,
    /// A request head not received within this drops the connection; a
    /// body not received within it is answered 408.
    pub request_timeout: Duration,
    /// An answer the client takes no byte of for this long ends its connection.
    pub write_timeout: Duration,
    /// The most connections served at once with every route
    /// ([`crate::admission`]).
    pub max_connections: usize,
    /// How long a graceful stop waits for the calls in flight before it
    /// closes the connections still open.
    pub stop_timeout: Duration,
    /// The proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Option<Networks>,
    /// The period of the retention sweep.
    pub retention_interval: Duration,
    /// `/metrics` gives the messages waiting of at most this many databases.
    pub metrics_per_database: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Settings::default().http()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sources with no file (unless `file` names one), the `env` given and
    /// no flags: the process environment stays out of these tests.
    fn sources(file: Option<&Path>, env: &[(&str, &str)]) -> Sources {
        Sources {
            file: file.map(Path::to_owned),
            env: env.iter().map(|(k, v)| (k.into(), v.into())).collect(),
            flags: Vec::new(),
        }
    }

    fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Ok(sources(None, env).resolve()?.settings)
    }

    #[test]
    fn a_short_admin_token_is_refused_with_the_length_it_needs() {
        let short = "x".repeat(MIN_ADMIN_TOKEN_LEN - 1);
        let err = load(&[("ESTAFETA_ADMIN_TOKEN", &short)]).unwrap_err();
        assert!(matches!(err, ConfigError::WeakAdminToken(31)), "{err}");
        assert!(err.to_string().contains("at least 32"), "{err}");
        let repeated = "x".repeat(MIN_ADMIN_TOKEN_LEN);
        let err = load(&[("ESTAFETA_ADMIN_TOKEN", &repeated)]).unwrap_err();
        assert!(matches!(err, ConfigError::GuessableAdminToken(_)), "{err}");
        for guessable in [
            "abcdefghijklmnopqrstuvwxyz012345",
            "passwordpasswordpasswordpassword",
        ] {
            let err = load(&[("ESTAFETA_ADMIN_TOKEN", guessable)]).unwrap_err();
            assert!(
                matches!(err, ConfigError::GuessableAdminToken(_)),
                "{guessable}: {err}"
            );
        }
        let random = "9f2c4e71b08ad3566e1f0c97a4b2d83e";
        assert!(load(&[("ESTAFETA_ADMIN_TOKEN", random)]).is_ok());
    }

    /// A folder with `estafeta.toml` holding `text`, and its path.
    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DEFAULT_CONFIG_FILE);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn defaults_are_those_of_the_api_and_of_the_exchange() {
        let s = load(&[]).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.data_dir, PathBuf::from("./estafeta-data"));
        assert_eq!(s.listen, "127.0.0.1:8080");
        assert_eq!(s.http().max_body_bytes, 32 << 20);
        assert_eq!(s.http().request_timeout, Duration::from_secs(30));
        let mut exchange = ExchangeConfig::new("./estafeta-data");
        exchange.limits = Limits::default();
        let ours = s.exchange_config().unwrap();
        assert_eq!(ours.limits, exchange.limits);
        assert_eq!(ours.started_timeout, exchange.started_timeout);
        assert_eq!(ours.ready_timeout, exchange.ready_timeout);
        assert_eq!(ours.retention, exchange.retention);
        assert_eq!(ours.admin_token, None);
        let notify = s.notify().unwrap();
        assert_eq!(notify.retry, Duration::from_secs(5));
        assert_eq!(notify.probe, Duration::from_secs(30));
        assert_eq!(notify.disk_alert_bytes, 100 << 20);
        assert_eq!(notify.disk_check, Duration::from_secs(60));
    }

    #[test]
    fn store_pool_sizes_the_cluster_pool_and_zero_is_refused() {
        let s = load(&[]).unwrap();
        assert!(s.cluster_store().is_none());
        // The declared default is the cluster store's own.
        assert_eq!(
            s.store_pool,
            estafeta_postgres::Options::default().pool_size
        );
        let url = "postgres://estafeta@db1/estafeta";
        let s = load(&[("ESTAFETA_STORE", url), ("ESTAFETA_STORE_POOL", "3")]).unwrap();
        let cluster = s.cluster_store().unwrap();
        assert_eq!(cluster.url, url);
        assert_eq!(cluster.options.pool_size, 3);
        assert!(load(&[("ESTAFETA_STORE_POOL", "0")]).is_err());
    }

    #[test]
    fn every_declared_default_is_a_value_its_setting_takes() {
        let mut settings = Settings::default();
        for setting in SETTINGS {
            if let Some(text) = setting.default {
                settings.set(setting, text).unwrap();
            }
        }
        assert_eq!(settings, Settings::default());
    }

    #[test]
    fn every_setting_is_read_from_its_variable_and_its_key() {
        let (_dir, path) = file("");
        for setting in SETTINGS {
            let text = match Settings::default().show(setting) {
                Shown::Plain(toml::Value::String(text)) => text,
                Shown::Plain(value) => value.to_string(),
                Shown::Unset if setting.key == "trusted_proxies" => "10.0.0.0/8".to_owned(),
                // Strong enough for the admin token.
                Shown::Redacted(_) | Shown::Unset => "9f2c4e71b08ad3566e1f0c97a4b2d83e".to_owned(),
            };
            let from_env = sources(None, &[(&setting.env(), &text)]).resolve();
            // Channels need their other half; the variable was still read.
            if let Err(ConfigError::Notify(_)) = from_env {
                continue;
            }
            assert_eq!(
                from_env.unwrap().origin(setting.key),
                Origin::Env(setting.env())
            );
            std::fs::write(&path, format!("{} = {:?}", setting.key, text)).unwrap();
            let from_file = sources(Some(&path), &[]).resolve().unwrap();
            assert!(
                matches!(from_file.origin(setting.key), Origin::File { .. }),
                "{}",
                setting.key
            );
        }
    }

    #[test]
    fn flags_override_environment_overrides_file_overrides_defaults() {
        let (_dir, path) = file(
            r#"
                data_dir = "/srv/from-file"
                listen = "0.0.0.0:9000"
                max_files = 3
                max_mb = 1.5
                ready_timeout = "7m"
            "#,
        );
        let mut sources = sources(
            Some(&path),
            &[
                ("ESTAFETA_MAX_FILES", "4"),
                ("ESTAFETA_LISTEN", "127.0.0.1:0"),
                ("ESTAFETA_RETENTION", "2d"),
                ("ESTAFETA_DATA_DIR", "/srv/from-env"),
                ("PATH", "/usr/bin"),
            ],
        );
        sources
            .flags
            .push(("--data-dir", "data_dir", "/srv/from-flag".to_owned()));
        let effective = sources.resolve().unwrap();
        let s = &effective.settings;
        assert_eq!(s.data_dir, PathBuf::from("/srv/from-flag"));
        assert_eq!(effective.origin("data_dir"), Origin::Flag("--data-dir"));
        assert_eq!(s.listen, "127.0.0.1:0");
        assert_eq!(s.max_files, 4);
        assert_eq!(s.max_mb, 1.5);
        assert_eq!(s.ready_timeout, Duration::from_secs(420));
        assert_eq!(s.retention, Duration::from_secs(2 * 86400));
        assert_eq!(s.started_timeout, Duration::from_secs(600));
        assert_eq!(effective.origin("started_timeout"), Origin::Default);
        assert_eq!(
            effective.origin("ready_timeout"),
            Origin::File {
                path: path.clone(),
                key: "ready_timeout".to_owned()
            }
        );
    }

    #[test]
    fn text_settings_stay_text_even_when_they_look_like_numbers() {
        let (_dir, path) = file("listen = 12345\nsmtp_from = \"0012@example.org\"");
        let s = sources(Some(&path), &[("ESTAFETA_DATA_DIR", "1e5")])
            .resolve()
            .unwrap()
            .settings;
        assert_eq!(s.listen, "12345");
        assert_eq!(s.data_dir, PathBuf::from("1e5"));
        let digits = "73018492650173946205819374650283";
        let s = load(&[("ESTAFETA_ADMIN_TOKEN", digits)]).unwrap();
        assert_eq!(s.admin_token.as_ref().map(Secret::expose), Some(digits));
        assert!(!format!("{s:?}").contains(digits));
    }

    #[test]
    fn durations_may_be_bare_seconds_and_zero_is_taken_only_where_it_means_off() {
        let s = load(&[
            ("ESTAFETA_ALERT_PROBE", "0"),
            ("ESTAFETA_READY_TIMEOUT", "5"),
        ])
        .unwrap();
        assert_eq!(s.alert_probe, Duration::ZERO);
        assert_eq!(s.notify().unwrap().probe, Duration::ZERO);
        assert_eq!(s.ready_timeout, Duration::from_secs(5));
        let (_dir, path) = file("ready_timeout = 5\nalert_probe = 0\ndisk_alert_mb = 0");
        let s = sources(Some(&path), &[]).resolve().unwrap().settings;
        assert_eq!(s.ready_timeout, Duration::from_secs(5));
        assert_eq!(s.alert_probe, Duration::ZERO);
        assert_eq!(s.disk_alert_mb, 0);

        for (name, text) in [
            ("ESTAFETA_READY_TIMEOUT", "0"),
            ("ESTAFETA_DISK_CHECK", "0s"),
            ("ESTAFETA_MAX_BODY_MB", "0"),
            ("ESTAFETA_MAX_FILES", "0"),
        ] {
            let err = load(&[(name, text)]).unwrap_err().to_string();
            assert_eq!(err, format!("{name} = {text:?}: must be more than 0"));
        }
        let err = load(&[("ESTAFETA_STARTED_TIMEOUT", "ten minutes")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ESTAFETA_STARTED_TIMEOUT = \"ten minutes\": "),
            "{err}"
        );
        assert!(
            err.contains("write a duration like 30s, 10m or 90d, or a number of seconds"),
            "{err}"
        );
        let (_dir, path) = file("ready_timeout = 1.5");
        let err = sources(Some(&path), &[]).resolve().unwrap_err().to_string();
        assert!(err.contains("ready_timeout = \"1.5\""), "{err}");
    }

    #[test]
    fn unknown_keys_and_variables_are_refused_with_the_nearest_name() {
        let err = load(&[("ESTAFETA_READY_TIMOUT", "5m")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown environment variable ESTAFETA_READY_TIMOUT; did you mean \
             ESTAFETA_READY_TIMEOUT? (`estafeta --help` lists every setting)"
        );
        let (_dir, path) = file("max_file = 3");
        let err = sources(Some(&path), &[]).resolve().unwrap_err();
        assert!(
            matches!(&err, ConfigError::UnknownKey { key, nearest: "max_files", .. } if key == "max_file"),
            "{err}"
        );
        let (_dir, path) = file("[alerts]\nalert_email = \"ops@example.org\"");
        let err = sources(Some(&path), &[]).resolve().unwrap_err();
        assert!(
            matches!(&err, ConfigError::UnknownKey { key, .. } if key == "alerts"),
            "{err}"
        );
        // Variables read elsewhere are not settings but not unknown either.
        load(&[
            ("ESTAFETA_URL", "http://127.0.0.1:1"),
            ("ESTAFETA_CONFIG", "x.toml"),
            ("ESTAFETA_CRASH_AT", "mailbox::rename"),
            ("ESTAFETA_PAUSE_AT", "messages::apply=100"),
            ("ESTAFETA_FAILPOINTS", ""),
        ])
        .unwrap();
        // Variables are matched in any case, as they always were.
        assert_eq!(load(&[("ESTAFETA_max_files", "3")]).unwrap().max_files, 3);
    }

    #[test]
    fn an_explicit_file_must_exist_and_must_be_toml() {
        let err = sources(Some(Path::new("/nonexistent/estafeta.toml")), &[])
            .resolve()
            .unwrap_err();
        assert!(matches!(err, ConfigError::ReadFile { .. }), "{err}");
        let (_dir, path) = file("max_files = ");
        let err = sources(Some(&path), &[]).resolve().unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let (_dir, path) = file("listen = [\"a\", \"b\"]");
        let err = sources(Some(&path), &[]).resolve().unwrap_err().to_string();
        assert!(err.contains("expected a single value"), "{err}");
    }

    #[test]
    fn alert_settings_come_from_file_and_environment() {
        let (_dir, path) = file(
            r#"
                alert_email = "ops@example.org"
                smtp_url = "smtp://ops:secret@mail.example.org:587?tls=required"
                alert_retry = "2s"
            "#,
        );
        let env = [
            ("ESTAFETA_ALERT_SMS_URL", "http://127.0.0.1:1/send"),
            ("ESTAFETA_ALERT_SMS_TO", "0012345"),
            ("ESTAFETA_ALERT_WEBHOOK", "http://127.0.0.1:2/hook"),
            ("ESTAFETA_DISK_ALERT_MB", "5"),
        ];
        let s = sources(Some(&path), &env).resolve().unwrap().settings;
        assert!(!format!("{s:?}").contains("secret"));
        let n = s.notify().unwrap();
        let email = n.email.unwrap();
        assert_eq!(
            email.smtp.url,
            "smtp://ops:secret@mail.example.org:587?tls=required"
        );
        assert_eq!(email.to, vec!["ops@example.org"]);
        assert_eq!(n.sms.unwrap().to, vec!["0012345"]);
        assert_eq!(n.webhook.as_deref(), Some("http://127.0.0.1:2/hook"));
        assert_eq!(n.retry, Duration::from_secs(2));
        assert_eq!(n.disk_alert_bytes, 5 << 20);

        let bad = [("ESTAFETA_SMTP_URL", "smtp://mail.example.org?tls=perhaps")];
        assert!(matches!(
            sources(Some(&path), &bad).resolve(),
            Err(ConfigError::Notify(_))
        ));
    }

    #[test]
    fn the_listing_masks_secrets_names_sources_and_reads_back_as_a_file() {
        let (_dir, path) =
            file("alert_webhook = \"https://hook:pa55@hooks.example.org/in?key=k3y\"");
        let effective = sources(
            Some(&path),
            &[
                ("ESTAFETA_ADMIN_TOKEN", "t0ken-e83b1f-c47d9a-05e2b6-f19c3"),
                ("ESTAFETA_MAX_FILES", "4"),
            ],
        )
        .resolve()
        .unwrap();
        let listing = effective.to_string();
        for secret in ["t0ken", "pa55", "k3y"] {
            assert!(!listing.contains(secret), "{listing}");
        }
        assert!(
            listing.contains("# alert_webhook = \"https://***@hooks.example.org/in?***\""),
            "{listing}"
        );
        let line = |key: &str| {
            listing
                .lines()
                .find(|l| l.starts_with(key))
                .unwrap()
                .to_owned()
        };
        assert!(
            line("max_files = 4 ").ends_with("# ESTAFETA_MAX_FILES"),
            "{listing}"
        );
        assert!(line("data_dir = ").ends_with("# default"), "{listing}");
        assert!(
            line("# admin_token = <redacted>").ends_with("# ESTAFETA_ADMIN_TOKEN"),
            "{listing}"
        );
        assert!(
            line("# alert_email is unset").ends_with("# default"),
            "{listing}"
        );

        let (_copy_dir, copy) = file(&listing);
        let reread = sources(Some(&copy), &[]).resolve().unwrap().settings;
        let expected = Settings {
            admin_token: None,
            alert_webhook: None,
            ..effective.settings
        };
        assert_eq!(reread, expected);
    }

    #[test]
    fn help_lists_every_setting_with_its_default_and_the_meaning_of_zero() {
        let help = help();
        for setting in SETTINGS {
            let line = help
                .lines()
                .position(|l| l.trim_start().starts_with(&format!("{} ", setting.env())))
                .unwrap_or_else(|| panic!("{} is not in --help:\n{help}", setting.env()));
            let entry: String = help
                .lines()
                .skip(line)
                .take(6)
                .collect::<Vec<_>>()
                .join(" ");
            if let Some(default) = setting.default {
                assert!(entry.contains(&format!("[default: {default}")), "{entry}");
            }
            if let Some(zero) = setting.zero {
                assert!(entry.contains(&format!("0: {zero}]")), "{entry}");
            }
        }
        assert!(help.lines().all(|l| l.chars().count() <= 100), "{help}");
    }
}
