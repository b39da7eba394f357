//! A TCP proxy on loopback between the simulated clients and the server
//! that injects network faults on a share of the connections it accepts:
//! drop a request, drop a response after the server acted on it, delay,
//! reset. The clients keep no idle connections, so each call has a
//! connection of its own and a fault touches one call. With several
//! upstreams (cluster nodes) it is also the load balancer: each connection
//! goes to one picked at random, or to the next when that one refuses
//! (a killed node).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy's shared state.
struct State {
    upstreams: Vec<SocketAddr>,
    /// Faulty connections per thousand.
    rate: AtomicU32,
    faults: AtomicU64,
    rng: Mutex<StdRng>,
}

/// A fault for one connection.
#[derive(Clone, Copy, Debug)]
enum Fault {
    DropRequest,
    DropResponse,
    Delay(Duration),
    Reset,
}

/// A running proxy.
pub(crate) struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards each connection to one of
    /// `upstreams`.
    pub(crate) async fn start(upstreams: Vec<SocketAddr>, seed: u64) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            upstreams,
            rate: AtomicU32::new(0),
            faults: AtomicU64::new(0),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        });
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let fault = shared.pick();
                let state = shared.clone();
                tokio::spawn(async move { state.serve(tcp, fault).await });
            }
        });
        Ok(Proxy { addr, state })
    }

    /// The proxy's URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets the share of faulty connections (0.0 turns faults off).
    pub(crate) fn set_fault_rate(&self, rate: f64) {
        let per_mille = (rate.clamp(0.0, 1.0) * 1000.0).round() as u32;
        self.state.rate.store(per_mille, Ordering::Relaxed);
    }

    /// Faults injected so far.
    pub(crate) fn faults(&self) -> u64 {
        self.state.faults.load(Ordering::Relaxed)
    }
}

impl State {
    fn pick(&self) -> Option<Fault> {
        let rate = self.rate.load(Ordering::Relaxed);
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        if rate == 0 || rng.random_range(0..1000) >= rate {
            return None;
        }
        Some(match rng.random_range(0..4) {
            0 => Fault::DropRequest,
            1 => Fault::DropResponse,
            2 => Fault::Delay(Duration::from_millis(rng.random_range(200..3000))),
            _ => Fault::Reset,
        })
    }

    async fn serve(&self, mut client: TcpStream, fault: Option<Fault>) {
        if let Some(fault) = fault {
            self.faults.fetch_add(1, Ordering::Relaxed);
            tracing::info!(?fault, "injecting a network fault");
        }
        let mut first = vec![0u8; 64 * 1024];
        match fault {
            Some(Fault::DropRequest) => {
                let _ = client.read(&mut first).await;
            }
            Some(Fault::Reset) => {
                let _ = client.read(&mut first).await;
                let _ = client.set_zero_linger();
            }
            Some(Fault::DropResponse) => {
                let Some(mut server) = self.connect().await else {
                    return;
                };
                let (mut from_client, _to_client) = client.split();
                let (mut from_server, mut to_server) = server.split();
                // Forward the request until the server starts answering
                // (it answers only after it acted), then drop the answer.
                let forward = tokio::io::copy(&mut from_client, &mut to_server);
                let answered = from_server.read(&mut first);
                tokio::select! {
                    _ = forward => {}
                    _ = answered => {}
                }
            }
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                self.pass(client).await;
            }
            None => self.pass(client).await,
        }
    }

    /// A connection to a random upstream, or to the next that accepts.
    async fn connect(&self) -> Option<TcpStream> {
        let first = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            rng.random_range(0..self.upstreams.len())
        };
        for i in 0..self.upstreams.len() {
            let upstream = self.upstreams[(first + i) % self.upstreams.len()];
            if let Ok(server) = TcpStream::connect(upstream).await {
                return Some(server);
            }
        }
        None
    }

    async fn pass(&self, mut client: TcpStream) {
        let Some(mut server) = self.connect().await else {
            return;
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        let _ = client.shutdown().await;
    }
}
