//! The types a setting can have ([`Value`]): each parses its text (from the
//! environment, a flag or the file) and shows itself for `estafeta config`,
//! secrets hidden ([`Secret`], [`SecretUrl`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A type a setting can have.
pub trait Value: Sized {
    /// Parses a setting's text; the error says what a good value looks like.
    fn parse(text: &str) -> Result<Self, String>;

    /// The value as `estafeta config` prints it.
    fn show(&self) -> Shown;

    /// Whether this is zero, which a setting takes only when its declaration
    /// says what zero means.
    fn is_zero(&self) -> bool {
        false
    }
}

/// A value as `estafeta config` prints it.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// The value, as TOML.
    Plain(toml::Value),
    /// A secret, or a value with secrets masked: a comment, not a setting.
    Redacted(String),
    /// No value.
    Unset,
}

impl Value for String {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(text.to_owned())
    }

    fn show(&self) -> Shown {
        Shown::Plain(toml::Value::String(self.clone()))
    }
}

impl Value for PathBuf {
    fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("expected a path".to_owned());
        }
        Ok(PathBuf::from(text))
    }

    fn show(&self) -> Shown {
        Shown::Plain(toml::Value::String(self.display().to_string()))
    }
}

impl Value for u64 {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| "expected a whole number, like 10".to_owned())
    }

    fn show(&self) -> Shown {
        Shown::Plain(match i64::try_from(*self) {
            Ok(n) => toml::Value::Integer(n),
            Err(_) => toml::Value::String(self.to_string()),
        })
    }

    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl Value for usize {
    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|_| "expected a whole number, like 10".to_owned())
    }

    fn show(&self) -> Shown {
        u64::try_from(*self).unwrap_or(u64::MAX).show()
    }

    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl Value for f64 {
    fn parse(text: &str) -> Result<Self, String> {
        match text.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err("expected a number, like 20 or 1.5".to_owned()),
        }
    }

    fn show(&self) -> Shown {
        Shown::Plain(toml::Value::Float(*self))
    }

    fn is_zero(&self) -> bool {
        *self == 0.0
    }
}

/// A bare number is seconds; otherwise humantime's form (`30s`, `10m`, `90d`).
impl Value for Duration {
    fn parse(text: &str) -> Result<Self, String> {
        if let Ok(seconds) = text.parse::<u64>() {
            return Ok(Duration::from_secs(seconds));
        }
        humantime::parse_duration(text).map_err(|e| {
            format!("{e}; write a duration like 30s, 10m or 90d, or a number of seconds")
        })
    }

    fn show(&self) -> Shown {
        Shown::Plain(toml::Value::String(duration_text(*self)))
    }

    fn is_zero(&self) -> bool {
        self.is_zero()
    }
}

/// `d` in the largest unit that divides it (`90d`, `10m`, `30s`), as
/// settings are written.
pub fn duration_text(d: Duration) -> String {
    if d.subsec_nanos() != 0 {
        return humantime::format_duration(d).to_string();
    }
    let seconds = d.as_secs();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if seconds >= size && seconds.is_multiple_of(size) {
            return format!("{}{unit}", seconds / size);
        }
    }
    format!("{seconds}s")
}

/// An optional setting: empty text leaves it unset.
impl<T: Value> Value for Option<T> {
    fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Ok(None);
        }
        T::parse(text).map(Some)
    }

    fn show(&self) -> Shown {
        match self {
            Some(value) => value.show(),
            None => Shown::Unset,
        }
    }
}

/// A secret (a token, a password): never shown, in `estafeta config` or in
/// any `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Secret(text.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Value for Secret {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Secret::from(text))
    }

    fn show(&self) -> Shown {
        Shown::Redacted("<redacted>".to_owned())
    }
}

/// A URL that may carry credentials in its user part or its query (an SMTP
/// login, a gateway's API key): shown with those parts masked.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its user part and query masked; `<redacted>` when it
    /// does not parse as a URL.
    pub fn masked(&self) -> String {
        let Ok(mut url) = reqwest::Url::parse(&self.0) else {
            return "<redacted>".to_owned();
        };
        if !url.username().is_empty() || url.password().is_some() {
            // Only URLs that cannot carry a user part refuse these, and
            // they have none to mask.
            let _ = url.set_username("***");
            let _ = url.set_password(None);
        }
        if url.query().is_some() {
            url.set_query(Some("***"));
        }
        url.to_string()
    }
}

impl From<&str> for SecretUrl {
    fn from(text: &str) -> Self {
        SecretUrl(text.to_owned())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl Value for SecretUrl {
    fn parse(text: &str) -> Result<Self, String> {
        Ok(SecretUrl::from(text))
    }

    fn show(&self) -> Shown {
        Shown::Redacted(toml::Value::String(self.masked()).to_string())
    }
}

/// A log filter in `tracing`'s `EnvFilter` syntax (`info`,
/// `warn,estafeta_server=debug`), checked when it is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFilter(String);

impl LogFilter {
    /// The filter's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Value for LogFilter {
    fn parse(text: &str) -> Result<Self, String> {
        tracing_subscriber::EnvFilter::builder()
            .parse(text)
            .map_err(|e| {
                format!("{e}; write a log filter like info or warn,estafeta_server=debug")
            })?;
        Ok(LogFilter(text.to_owned()))
    }

    fn show(&self) -> Shown {
        self.0.show()
    }
}

/// The form of the log lines on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event, the request's span in front.
    #[default]
    Text,
    /// One JSON object per line, the event's fields at the top level and
    /// the request's span fields under `span`.
    Json,
}

impl Value for LogFormat {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected text or json".to_owned()),
        }
    }

    fn show(&self) -> Shown {
        let word = match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        Shown::Plain(toml::Value::String(word.to_owned()))
    }
}

/// Whether webhook targets may be in private address ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivateTargets {
    /// Private ranges are allowed (a site's own hosts).
    Allow,
    /// Private ranges are refused too.
    Deny,
}

impl Value for PrivateTargets {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "allow" => Ok(PrivateTargets::Allow),
            "deny" => Ok(PrivateTargets::Deny),
            _ => Err("expected allow or deny".to_owned()),
        }
    }

    fn show(&self) -> Shown {
        let text = match self {
            PrivateTargets::Allow => "allow",
            PrivateTargets::Deny => "deny",
        };
        Shown::Plain(toml::Value::String(text.to_owned()))
    }
}

/// Addresses and networks (`10.0.0.0/8`, `127.0.0.1`, `fd00::/8`),
/// comma-separated: the proxies whose `X-Forwarded-For` is believed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Networks(Vec<(std::net::IpAddr, u8)>);

impl Networks {
    /// Whether `ip` is in one of the networks (an IPv4 address mapped into
    /// IPv6 as itself).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|&(net, len)| match (net, ip) {
            (std::net::IpAddr::V4(net), std::net::IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                net.to_bits() & mask == ip.to_bits() & mask
            }
            (std::net::IpAddr::V6(net), std::net::IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                net.to_bits() & mask == ip.to_bits() & mask
            }
            _ => false,
        })
    }
}

impl Value for Networks {
    fn parse(text: &str) -> Result<Self, String> {
        let bad = |item: &str| {
            format!("{item:?} is not an address or a network (10.0.0.0/8, 127.0.0.1, fd00::/8)")
        };
        let mut networks = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (addr, len) = match item.split_once('/') {
                Some((addr, len)) => (addr, Some(len)),
                None => (item, None),
            };
            let ip: std::net::IpAddr = addr.parse().map_err(|_| bad(item))?;
            let ip = ip.to_canonical();
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                Some(len) => len
                    .parse::<u8>()
                    .ok()
                    .filter(|l| *l <= max)
                    .ok_or_else(|| bad(item))?,
                None => max,
            };
            networks.push((ip, len));
        }
        Ok(Networks(networks))
    }

    fn show(&self) -> Shown {
        let text: Vec<String> = self
            .0
            .iter()
            .map(|(ip, len)| format!("{ip}/{len}"))
            .collect();
        Shown::Plain(toml::Value::String(text.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_hold_their_addresses() {
        let n = Networks::parse("10.0.0.0/8, 127.0.0.1 ,fd00::/8").unwrap();
        for inside in ["10.1.2.3", "127.0.0.1", "::ffff:10.0.0.1", "fd12::1"] {
            assert!(n.contains(inside.parse().unwrap()), "{inside}");
        }
        for outside in ["11.0.0.1", "127.0.0.2", "fe80::1"] {
            assert!(!n.contains(outside.parse().unwrap()), "{outside}");
        }
        assert!(Networks::parse("10.0.0.0/33").is_err());
        assert!(Networks::parse("proxy.example").is_err());
        assert_eq!(Networks::parse("").unwrap(), Networks(Vec::new()));
    }

    #[test]
    fn durations_are_bare_seconds_or_humantime() {
        assert_eq!(Duration::parse("5"), Ok(Duration::from_secs(5)));
        assert_eq!(Duration::parse("0"), Ok(Duration::ZERO));
        assert_eq!(Duration::parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(Duration::parse("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["ten minutes", "-5", "1.5", ""] {
            let err = Duration::parse(bad).unwrap_err();
            assert!(err.contains("like 30s, 10m or 90d"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_are_shown_in_their_largest_whole_unit() {
        for (secs, text) in [
            (90 * 86_400, "90d"),
            (600, "10m"),
            (7_200, "2h"),
            (90, "90s"),
            (0, "0s"),
        ] {
            assert_eq!(duration_text(Duration::from_secs(secs)), text);
            assert_eq!(Duration::parse(text), Ok(Duration::from_secs(secs)));
        }
        assert_eq!(duration_text(Duration::from_millis(1500)), "1s 500ms");
    }

    #[test]
    fn numbers_are_checked() {
        assert_eq!(usize::parse("10"), Ok(10));
        assert!(usize::parse("10.5").is_err());
        assert!(u64::parse("-1").is_err());
        assert_eq!(f64::parse("1.5"), Ok(1.5));
        for bad in ["NaN", "inf", "-2", "two"] {
            assert!(f64::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_never_show() {
        let token = Secret::parse("0012345").unwrap();
        assert_eq!(token.expose(), "0012345");
        assert!(!format!("{token:?}").contains("0012345"));
        assert!(!format!("{:?}", token.show()).contains("0012345"));

        let url = SecretUrl::parse("smtp://ops:pa55@mail.example.org:587?starttls=on").unwrap();
        assert_eq!(url.masked(), "smtp://***@mail.example.org:587?***");
        assert!(!format!("{url:?}").contains("pa55"));
        let gateway =
            SecretUrl::parse("https://sms.example.org/send?key=k3y&to={recipient}").unwrap();
        assert!(!gateway.masked().contains("k3y"), "{}", gateway.masked());
        assert_eq!(
            SecretUrl::parse("not a url").unwrap().masked(),
            "<redacted>"
        );
    }

    #[test]
    fn empty_text_leaves_an_option_unset() {
        assert_eq!(Option::<String>::parse(""), Ok(None));
        assert_eq!(Option::<String>::parse("x"), Ok(Some("x".to_owned())));
    }

    #[test]
    fn log_filters_are_checked() {
        assert!(LogFilter::parse("warn,estafeta_server=debug").is_ok());
        assert!(LogFilter::parse("info,[[").is_err());
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert!(
            LogFormat::parse("JSON")
                .unwrap_err()
                .contains("text or json")
        );
    }
}
