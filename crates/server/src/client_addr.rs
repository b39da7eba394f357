//! [`ClientAddr`]: the address of the client that sent a request, for the
//! throttle of wrong tokens. It is the connection's peer, unless the peer
//! is one of the `trusted_proxies`: then it is the last address of
//! `X-Forwarded-For` that is not a trusted proxy (each proxy appends the
//! address it was reached from, so the addresses a client wrote itself
//! come before those and are never believed).

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use crate::config::Networks;
use crate::state::AppState;

/// The client's address; unspecified when the router runs without a
/// socket.
pub struct ClientAddr(pub IpAddr);

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(ClientAddr(client_addr(
            parts,
            state.http().trusted_proxies.as_ref(),
        )))
    }
}

/// The client's address of the request `parts`, believing the
/// `X-Forwarded-For` of `proxies`.
pub fn client_addr(parts: &Parts, proxies: Option<&Networks>) -> IpAddr {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let Some(proxies) = proxies.filter(|p| p.contains(peer)) else {
        return peer;
    };
    let forwarded: Vec<IpAddr> = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    forwarded
        .into_iter()
        .rev()
        .find(|a| !proxies.contains(*a))
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Value;

    fn parts(peer: &str, forwarded: &[&str]) -> Parts {
        let mut request = axum::http::Request::new(());
        let addr: SocketAddr = format!("{peer}:1234").parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(addr));
        for f in forwarded {
            request
                .headers_mut()
                .append("x-forwarded-for", f.parse().unwrap());
        }
        request.into_parts().0
    }

    #[test]
    fn only_trusted_proxies_name_the_client() {
        let proxies = Networks::parse("10.0.0.0/8").unwrap();
        let p = Some(&proxies);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            client_addr(&parts("10.0.0.5", &["203.0.113.9"]), p),
            ip("203.0.113.9")
        );
        // What the client wrote itself comes first and is not believed.
        let spoofed = parts("10.0.0.5", &["1.2.3.4, 203.0.113.9", "10.0.0.7"]);
        assert_eq!(client_addr(&spoofed, p), ip("203.0.113.9"));
        // An untrusted peer is the client, whatever it says.
        assert_eq!(
            client_addr(&parts("198.51.100.1", &["1.2.3.4"]), p),
            ip("198.51.100.1")
        );
        assert_eq!(
            client_addr(&parts("10.0.0.5", &["1.2.3.4"]), None),
            ip("10.0.0.5")
        );
        assert_eq!(client_addr(&parts("10.0.0.5", &[]), p), ip("10.0.0.5"));
    }
}
