//! Push notifications: a database or device may have a webhook address
//! (kept by the registry, set by the admin), and when a message lands in
//! its `Messages` the exchange hands its id to a [`PushSink`].
//!
//! The exchange does not send anything itself, so a protocol call never
//! waits for, or fails because of, a push: the sink is called after the
//! message file is durable and must return at once (the server's sink
//! records the recipient and lets its own tasks do the rest).
//!
//! The webhooks are kept with the databases and devices themselves
//! ([`Registry::set_webhook`]): every server's registry holds them in its
//! copy, so an arrival for a recipient without one costs a lookup in
//! memory, and with a store several servers share it reloads the copy when
//! another server changed the store, which it checks before each
//! authenticated call and, for arrivals no call brought (a scheduled
//! message, a deadline), before announcing them. So an arrival through any
//! server is pushed to the webhook set last through any server. A webhook
//! that an earlier version kept in its recipient's session record is moved
//! into the registry by start-up processing.
//!
//! [`Registry::set_webhook`]: crate::tenancy::Registry::set_webhook

use super::error::ExchangeError;
use crate::Id;
use crate::wire::ErrorCode;
use std::net::{IpAddr, Ipv6Addr};

/// The longest webhook URL accepted.
const MAX_URL: usize = 2048;

/// Whether a push recipient is a database or a device.
pub use crate::wire::Kind as RecipientKind;

/// Where the exchange hands arrivals for recipients with a webhook.
pub trait PushSink: Send + Sync + 'static {
    /// A message is durably waiting in `recipient`'s `Messages`. Called from
    /// inside protocol calls: it must not block or wait for I/O.
    fn arrived(&self, recipient: &Id, kind: RecipientKind);
}

/// The default sink: arrivals are not pushed anywhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPush;

impl PushSink for NoPush {
    fn arrived(&self, _recipient: &Id, _kind: RecipientKind) {}
}

/// Checks a webhook URL: `http://` or `https://`, a host, an optional
/// numeric port, no spaces or control characters, at most [`MAX_URL`] bytes.
/// The host is a name (letters, digits, `-`, `.`, `_`) or an IP address,
/// and not a link-local one (169.254.0.0/16, fe80::/10, where cloud
/// metadata services answer, such as 169.254.169.254) nor the IPv6
/// metadata address fd00:ec2::254.
pub(crate) fn check_url(url: &str) -> Result<(), ExchangeError> {
    let bad = |why: &str| {
        ExchangeError::bad_request(
            ErrorCode::BadWebhookUrl,
            format!("webhook url {url:?}: {why}"),
        )
    };
    if url.len() > MAX_URL {
        return Err(bad(&format!("longer than {MAX_URL} bytes")));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("contains spaces or control characters"));
    }
    let lower = url.to_ascii_lowercase();
    let rest = ["http://", "https://"]
        .iter()
        .find_map(|s| lower.strip_prefix(s))
        .ok_or_else(|| bad("the scheme must be http:// or https://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = match host_port.rsplit_once(':') {
        // An IPv6 literal holds colons of its own.
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (host_port, None),
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("a host is required"));
    }
    if let Some(p) = port
        && p.parse::<u16>().is_err()
    {
        return Err(bad("the port must be a number up to 65535"));
    }
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => Some(
            v6.parse::<Ipv6Addr>()
                .map(IpAddr::V6)
                .map_err(|_| bad("the host is not a valid IPv6 address"))?,
        ),
        None => host.parse::<IpAddr>().ok(),
    };
    match ip {
        Some(ip) if is_link_local_or_metadata(ip) => Err(bad(
            "link-local and metadata addresses (169.254.0.0/16, fe80::/10) are refused",
        )),
        Some(_) => Ok(()),
        None if host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) =>
        {
            Ok(())
        }
        None => Err(bad(
            "the host must be a name of letters, digits, '-', '.' and '_', or an IP address",
        )),
    }
}

/// Link-local addresses (where cloud metadata services answer) and the
/// IPv6 metadata address, also when an IPv4 one is mapped into IPv6: never
/// a webhook's target.
pub fn is_link_local_or_metadata(ip: IpAddr) -> bool {
    const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_link_local(),
            None => v6.is_unicast_link_local() || v6 == METADATA_V6,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_need_http_a_host_and_a_good_port() {
        for good in [
            "http://127.0.0.1:9000/hook",
            "https://hooks.example.org/a?b=c",
            "HTTP://Example.org",
            "http://user:pw@example.org:8080/",
            "http://[::1]:8080/x",
            "http://10.0.0.5/hook",
            "http://[fd00::1]/",
            "http://my_host.internal:81/",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "ftp://example.org/",
            "http://",
            "http:///path",
            "http://example.org:99999/",
            "http://example.org:port/",
            "http://exa mple.org/",
            "example.org/hook",
            "http://\"evil\"/",
            "http://<script>/",
            "http://a'b.org/",
            "http://a\\b/",
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.1.1:8080/",
            "http://[fe80::1]/",
            "http://[FE80::1%25eth0]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[fd00:ec2::254]/",
            "http://[not-v6]/",
        ] {
            let e = check_url(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::BadWebhookUrl, "{bad}");
        }
        assert!(check_url(&format!("http://a.b/{}", "x".repeat(MAX_URL))).is_err());
    }
}
