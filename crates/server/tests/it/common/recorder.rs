//! An HTTP endpoint on loopback that records every request (path and body):
//! the SMS gateway and the alert webhook of the notify tests.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Bytes;
use axum::http::Uri;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// One recorded request: its path and query, and its body as text.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) uri: String,
    pub(crate) body: String,
}

/// Serves on `listener` until the test ends; every request answers 200.
pub(crate) fn serve(listener: TcpListener) -> mpsc::UnboundedReceiver<Hit> {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = Router::new().fallback(move |uri: Uri, body: Bytes| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(Hit {
                uri: uri.to_string(),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            "ok"
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    rx
}

/// A recorder on a fresh loopback port.
pub(crate) async fn start() -> (SocketAddr, mpsc::UnboundedReceiver<Hit>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, serve(listener))
}

/// A loopback port with nothing listening on it (for a gateway that is
/// down); bind it later with [`serve`] to bring the gateway up.
pub(crate) fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
