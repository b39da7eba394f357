//! Which addresses a webhook (push or alert) may be sent to. Link-local
//! and metadata addresses ([`is_link_local_or_metadata`]) are always
//! refused; private ones as the `webhook_private` setting says. A host name
//! is resolved and every address it resolves to is checked before a
//! connection is made ([`CheckedResolver`], the resolver of the client that
//! sends webhooks and of the one that probes their hosts), so a name that
//! points at 169.254.169.254 is refused like the address itself; an address
//! written in the URL is checked by [`refused`], which is asked before a
//! webhook is stored, sent to, or its host probed. Neither client follows
//! redirects, so no answer can send a request on to an unchecked address.

use std::net::{IpAddr, SocketAddr};

use estafeta_exchange::service::is_link_local_or_metadata;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

pub use crate::config::value::PrivateTargets;

/// Private ranges: 10/8, 172.16/12, 192.168/16, 100.64/10 (shared), the
/// loopback ranges and IPv6 unique local addresses (fc00::/7), also when
/// an IPv4 address is mapped into IPv6.
fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private() || v4.is_loopback() || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private(IpAddr::V4(v4)),
            None => v6.is_loopback() || v6.is_unique_local(),
        },
    }
}

/// Why a webhook may not be sent to `ip`, if it may not.
pub fn refusal(ip: IpAddr, private: PrivateTargets) -> Option<&'static str> {
    if is_link_local_or_metadata(ip) {
        Some("a link-local or metadata address (169.254.0.0/16, fe80::/10)")
    } else if private == PrivateTargets::Deny && is_private(ip) {
        Some("a private address, and webhook_private is deny")
    } else {
        None
    }
}

/// The addresses `host` resolved to, unless one of them is refused.
pub fn checked(
    host: &str,
    addrs: Vec<SocketAddr>,
    private: PrivateTargets,
) -> Result<Vec<SocketAddr>, String> {
    for a in &addrs {
        if let Some(why) = refusal(a.ip(), private) {
            return Err(format!(
                "webhook host {host} resolves to {}: {why}; refused",
                a.ip()
            ));
        }
    }
    Ok(addrs)
}

/// Why a webhook may not be sent to `url`, if it may not: its host is a
/// refused address, or a name that resolves to one. A name that does not
/// resolve now is not refused here: the client's resolver checks it again
/// at each connection.
pub async fn refused(url: &str, private: PrivateTargets) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let host = parsed.host_str()?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return refusal(ip, private).map(|why| format!("webhook host {ip} is {why}; refused"));
    }
    let port = parsed.port_or_known_default()?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port)).await.ok()?.collect();
    checked(bare, addrs, private).err()
}

/// The webhook client's resolver: the system's lookup, then [`checked`].
#[derive(Clone, Copy, Debug)]
pub struct CheckedResolver {
    /// The rule for private ranges.
    pub private: PrivateTargets,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let private = self.private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addrs = checked(&host, addrs, private)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn addrs(ips: &[&str]) -> Vec<SocketAddr> {
        ips.iter()
            .map(|ip| SocketAddr::new(ip.parse().unwrap(), 0))
            .collect()
    }

    #[test]
    fn a_name_resolving_to_a_metadata_address_is_refused_whatever_the_setting() {
        for private in [PrivateTargets::Allow, PrivateTargets::Deny] {
            let err = checked(
                "metadata.example",
                addrs(&["93.184.216.34", "169.254.169.254"]),
                private,
            )
            .unwrap_err();
            assert!(err.contains("169.254.169.254"), "{err}");
            assert!(checked("v6", addrs(&["fe80::1"]), private).is_err());
            assert!(checked("mapped", addrs(&["::ffff:169.254.1.1"]), private).is_err());
        }
    }

    #[test]
    fn private_ranges_follow_the_setting() {
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "127.0.0.1",
            "::1",
            "fd00::1",
        ] {
            let a = addrs(&[ip]);
            assert!(
                checked("h", a.clone(), PrivateTargets::Allow).is_ok(),
                "{ip}"
            );
            assert!(checked("h", a, PrivateTargets::Deny).is_err(), "{ip}");
        }
        let public = addrs(&["93.184.216.34", "2606:2800:220:1::1"]);
        assert!(checked("h", public, PrivateTargets::Deny).is_ok());
    }

    #[tokio::test]
    async fn urls_are_refused_by_their_address_or_the_addresses_of_their_name() {
        let deny = PrivateTargets::Deny;
        for url in [
            "http://169.254.169.254/latest",
            "http://[fe80::1]:8080/",
            "http://127.0.0.1:9/x",
            "http://localhost:9/x",
        ] {
            assert!(refused(url, deny).await.is_some(), "{url}");
        }
        assert!(
            refused("http://localhost:9/x", PrivateTargets::Allow)
                .await
                .is_none()
        );
        assert!(refused("http://93.184.216.34/x", deny).await.is_none());
    }

    #[tokio::test]
    async fn loopback_names_are_resolved_and_checked() {
        let resolve =
            |private| CheckedResolver { private }.resolve(Name::from_str("localhost").unwrap());
        assert!(resolve(PrivateTargets::Allow).await.is_ok());
        let err = resolve(PrivateTargets::Deny).await.err().unwrap();
        assert!(err.to_string().contains("webhook host localhost"), "{err}");
    }
}
