//! [`CommitLoss`]: a TCP proxy in front of a PostgreSQL server that can
//! lose the answer to a `COMMIT` the server made, as a network that fails
//! at the wrong moment does: the transaction is committed, and the client
//! sees its connection reset instead of the answer.
//!
//! The proxy follows the protocol's framing in both directions (the
//! startup, with its optional SSL or GSS request, then typed messages),
//! so that it knows each connection's `application_name` (which pool of a
//! node it belongs to) and each transaction's command tags. Armed, it
//! picks a `COMMIT` of a transaction that wrote (an `INSERT`, `UPDATE` or
//! `DELETE` before it) on a connection of the application named, lets the
//! server answer it, then cuts both sides without passing the answer on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The request codes of an SSL and a GSS encryption request (a startup
/// message the server answers with one byte).
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

/// What an armed proxy waits for.
struct Arm {
    /// The `application_name` of the connections it acts on.
    application: String,
    /// Writing `COMMIT`s of such connections still to let through.
    skip: usize,
}

/// The proxy's state, shared by its connections.
#[derive(Default)]
struct Shared {
    arm: Mutex<Option<Arm>>,
    /// Answers dropped so far.
    dropped: AtomicUsize,
    dropping: Notify,
}

impl Shared {
    /// Whether the writing `COMMIT` just answered on a connection of
    /// `application` is the one to lose (the arm is spent then).
    fn take(&self, application: &str) -> bool {
        let mut arm = self.arm.lock().unwrap_or_else(|e| e.into_inner());
        let Some(a) = arm.as_mut().filter(|a| a.application == application) else {
            return false;
        };
        if a.skip > 0 {
            a.skip -= 1;
            return false;
        }
        *arm = None;
        true
    }
}

/// A proxy to a PostgreSQL server that loses a chosen `COMMIT` answer.
/// Stops when dropped.
pub struct CommitLoss {
    port: u16,
    shared: Arc<Shared>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CommitLoss {
    /// A proxy on a free loopback port to the server at `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<CommitLoss> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accepting = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(upstream).await {
                            relay(client, server, shared).await;
                        }
                    });
                }
            }
        });
        Ok(CommitLoss {
            port,
            shared,
            accepting,
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the answer to the `nth` (from 1) writing `COMMIT` from now on
    /// a connection whose `application_name` is `application`.
    pub fn arm(&self, application: &str, nth: usize) {
        *self.shared.arm.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arm {
            application: application.to_owned(),
            skip: nth.saturating_sub(1),
        });
    }

    /// How many answers were lost so far.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Waits until one more answer than `seen` was lost.
    pub async fn wait_dropped(&self, seen: usize) {
        loop {
            let notified = self.shared.dropping.notified();
            if self.dropped() > seen {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for CommitLoss {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Relays one connection until either side closes or its answer is lost.
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let application = Arc::new(Mutex::new(String::new()));
    // One-byte answers owed to SSL or GSS requests.
    let owed = Arc::new(AtomicUsize::new(0));
    let upward = {
        let (application, owed) = (application.clone(), owed.clone());
        tokio::spawn(async move {
            let mut frames = Frames::startup();
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n) = client_in.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                for frame in frames.push(&buf[..n]) {
                    match frame {
                        Frame::Request(SSL_REQUEST | GSS_REQUEST) => {
                            owed.fetch_add(1, Ordering::SeqCst);
                        }
                        Frame::Startup(params) => {
                            if let Some(name) = param(&params, "application_name") {
                                *application.lock().unwrap_or_else(|e| e.into_inner()) = name;
                            }
                        }
                        _ => {}
                    }
                }
                if server_out.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut frames = Frames::typed();
    let mut wrote = false;
    let mut buf = vec![0; 64 * 1024];
    'relay: while let Ok(n) = server_in.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut bytes = &buf[..n];
        // A one-byte answer to an encryption request comes before any
        // typed message.
        while !bytes.is_empty() && owed.load(Ordering::SeqCst) > 0 && frames.is_empty() {
            owed.fetch_sub(1, Ordering::SeqCst);
            if client_out.write_all(&bytes[..1]).await.is_err() {
                break 'relay;
            }
            bytes = &bytes[1..];
        }
        for ((_, start), frame) in frames.push_with_ends(bytes) {
            let Frame::Typed(b'C', payload) = frame else {
                continue;
            };
            let tag = String::from_utf8_lossy(payload.split(|b| *b == 0).next().unwrap_or(&[]));
            if ["INSERT", "UPDATE", "DELETE"]
                .iter()
                .any(|w| tag.starts_with(w))
            {
                wrote = true;
            } else if tag == "COMMIT" || tag == "ROLLBACK" {
                let lose = tag == "COMMIT"
                    && wrote
                    && shared.take(&application.lock().unwrap_or_else(|e| e.into_inner()));
                wrote = false;
                if lose {
                    // What came before the answer goes on; the answer and
                    // what follows it are lost with the connection.
                    let _ = client_out.write_all(&bytes[..start]).await;
                    shared.dropped.fetch_add(1, Ordering::SeqCst);
                    shared.dropping.notify_waiters();
                    break 'relay;
                }
            }
        }
        if client_out.write_all(bytes).await.is_err() {
            break;
        }
    }
    upward.abort();
}

/// The value of `key` among a startup message's parameters.
fn param(params: &[u8], key: &str) -> Option<String> {
    let mut parts = params.split(|b| *b == 0);
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        if k == key.as_bytes() {
            return Some(String::from_utf8_lossy(v).into_owned());
        }
    }
    None
}

/// A message of the protocol.
enum Frame<'a> {
    /// An SSL or GSS encryption request (its code).
    Request(u32),
    /// A startup message's parameters (key, NUL, value, NUL, ...).
    Startup(Vec<u8>),
    /// A typed message: its type byte and payload.
    Typed(u8, &'a [u8]),
}

/// Splits a byte stream into the protocol's messages as they arrive.
struct Frames {
    /// Bytes of a message not yet whole.
    pending: Vec<u8>,
    /// Whether messages are still untyped (the client's startup phase).
    startup: bool,
    /// Whole messages of the last push, each with where it ends.
    whole: Vec<u8>,
}

impl Frames {
    fn startup() -> Frames {
        Frames {
            pending: Vec::new(),
            startup: true,
            whole: Vec::new(),
        }
    }

    fn typed() -> Frames {
        Frames {
            startup: false,
            ..Frames::startup()
        }
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The messages `bytes` completes.
    fn push(&mut self, bytes: &[u8]) -> Vec<Frame<'_>> {
        self.push_with_ends(bytes)
            .into_iter()
            .map(|(_, f)| f)
            .collect()
    }

    /// The messages `bytes` completes, each with the offset in `bytes`
    /// where it ends (and where it began, when it began in `bytes`).
    fn push_with_ends(&mut self, bytes: &[u8]) -> Vec<((usize, usize), Frame<'_>)> {
        let carried = self.pending.len();
        self.whole = std::mem::take(&mut self.pending);
        self.whole.extend_from_slice(bytes);
        let mut spans = Vec::new();
        let mut at = 0;
        loop {
            let rest = &self.whole[at..];
            let (header, untyped) = match self.startup {
                true => (4, true),
                false => (5, false),
            };
            if rest.len() < header {
                break;
            }
            let len_at = usize::from(!untyped);
            let len = u32::from_be_bytes([
                rest[len_at],
                rest[len_at + 1],
                rest[len_at + 2],
                rest[len_at + 3],
            ]) as usize;
            let total = len + len_at;
            if len < 4 || rest.len() < total {
                break;
            }
            spans.push((at, total, untyped));
            if untyped {
                let code = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
                if code != SSL_REQUEST && code != GSS_REQUEST {
                    self.startup = false;
                }
            }
            at += total;
        }
        self.pending = self.whole[at..].to_vec();
        spans
            .into_iter()
            .map(|(start, total, untyped)| {
                let message = &self.whole[start..start + total];
                let end = (start + total).saturating_sub(carried);
                let frame = match untyped {
                    true => {
                        let code =
                            u32::from_be_bytes([message[4], message[5], message[6], message[7]]);
                        match code {
                            SSL_REQUEST | GSS_REQUEST => Frame::Request(code),
                            _ => Frame::Startup(message[8..].to_vec()),
                        }
                    }
                    false => Frame::Typed(message[0], &message[5..]),
                };
                ((end, start.saturating_sub(carried)), frame)
            })
            .collect()
    }
}
