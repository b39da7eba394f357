//! A push webhook on loopback that the test steers: it records every POST
//! (path and JSON body), answers with scripted statuses (then 200), and can
//! hold its answers until the test opens a gate. Health probes (GETs)
//! always answer 200 at once and are not recorded.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{Method, StatusCode, Uri};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// One POST the webhook received.
#[derive(Debug, Clone)]
pub(crate) struct Post {
    pub(crate) uri: String,
    pub(crate) json: serde_json::Value,
}

/// How the webhook answers.
#[derive(Default)]
pub(crate) struct Script {
    /// Statuses of the first POSTs, in order; later ones get 200.
    pub(crate) statuses: Vec<u16>,
    /// Hold every POST's answer until [`Hook::open`].
    pub(crate) held: bool,
}

/// The running webhook.
pub(crate) struct Hook {
    pub(crate) posts: mpsc::UnboundedReceiver<Post>,
    gate: watch::Sender<bool>,
}

impl Hook {
    /// Lets held answers (and all later ones) go.
    pub(crate) fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// Serves on `listener` until the test ends.
pub(crate) fn serve(listener: TcpListener, script: Script) -> Hook {
    let (tx, posts) = mpsc::unbounded_channel();
    let (gate, gate_rx) = watch::channel(!script.held);
    let statuses = Arc::new(Mutex::new(VecDeque::from(script.statuses)));
    let app = Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
        let (tx, statuses, mut gate) = (tx.clone(), statuses.clone(), gate_rx.clone());
        async move {
            if method != Method::POST {
                return StatusCode::OK;
            }
            let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            let _ = tx.send(Post {
                uri: uri.to_string(),
                json,
            });
            let _ = gate.wait_for(|open| *open).await;
            let status = statuses.lock().unwrap().pop_front().unwrap_or(200);
            StatusCode::from_u16(status).unwrap()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Hook { posts, gate }
}

/// A webhook on a fresh loopback port.
pub(crate) async fn start(script: Script) -> (SocketAddr, Hook) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, serve(listener, script))
}
