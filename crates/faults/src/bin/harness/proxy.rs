//! A TCP proxy on loopback that injects network faults, in one of two
//! modes ([`Mode`]):
//!
//! - Between the simulated clients and the server ([`Proxy::balancer`]):
//!   a share of the connections it accepts get a fault: drop a request,
//!   drop a response after the server acted on it, delay, reset. The
//!   clients keep no idle connections, so each call has a connection of
//!   its own and a fault touches one call. With several upstreams (cluster
//!   nodes) it is also the load balancer: each connection goes to one
//!   picked at random, or to the next when that one refuses (a killed
//!   node).
//! - Between the nodes and PostgreSQL ([`Proxy::links`]): one listener per
//!   PostgreSQL server, each forwarding to its own server, so a multi-host
//!   URL naming the listeners follows a failover as it would without the
//!   proxy. The nodes' connections are long-lived pooled ones, so a fault
//!   episode arms a share of the established connections as well as of the
//!   new ones, and an armed connection's fault fires a few chunks later,
//!   in whichever direction data flows then: mid-session, between two
//!   statements of a step or between a `COMMIT` and its answer. The
//!   faults: a reset (RST both ways), a partition (nothing forwarded
//!   either way for a while, then a reset), a delay (the chunk held for a
//!   while, then the connection goes on). Each fault fired is recorded as
//!   an outage of the store ([`Outages`]). Apart from the episodes, each
//!   link follows the protocol ([`Conversation`]) and, at a rate of its
//!   own, loses the answer to a `COMMIT` of a transaction that wrote: the
//!   server committed, the node sees its connection reset instead; each
//!   loss is counted by the kind of transaction (the node's pool and the
//!   tables it wrote).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use estafeta_postgres::testing::{Commit, Conversation};

use crate::outage::Outages;

/// Where the proxy sits, which decides its faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Clients to server nodes: a fault per accepted connection.
    Balancer,
    /// Nodes to PostgreSQL: faults fired on established connections.
    Links,
}

/// The proxy's shared state.
struct State {
    mode: Mode,
    /// Faulty connections per thousand.
    rate: AtomicU32,
    faults: AtomicU64,
    rng: Mutex<StdRng>,
    /// With [`Mode::Links`]: the open connections, by number, with the
    /// fault each is armed with, if any.
    links: Mutex<Links>,
    /// With [`Mode::Links`]: where the faults fired are recorded, for the
    /// bound on a node's start.
    outages: Outages,
    /// With [`Mode::Links`]: how long PostgreSQL lets a node's session sit
    /// idle inside a transaction (a long partition outlasts it).
    hold_limit: Duration,
    /// With [`Mode::Links`]: answers to writing `COMMIT`s lost, per
    /// million.
    commit_loss_rate: AtomicU32,
    /// The answers lost so far, by kind of transaction.
    commits_lost: Mutex<BTreeMap<String, u64>>,
}

/// The open links and their armed faults.
#[derive(Default)]
struct Links {
    next: u64,
    armed: HashMap<u64, Option<Armed>>,
}

/// A fault for one client connection.
#[derive(Clone, Copy, Debug)]
enum Fault {
    DropRequest,
    DropResponse,
    Delay(Duration),
    Reset,
}

/// A fault waiting on one link: it fires before the link forwards its
/// `after`-th next chunk (0: the very next), in either direction.
#[derive(Clone, Copy, Debug)]
struct Armed {
    after: u32,
    fault: LinkFault,
}

/// A fault of a link between a node and PostgreSQL.
#[derive(Clone, Copy, Debug)]
enum LinkFault {
    /// Both sides reset at once.
    Reset,
    /// Nothing forwarded either way for this long (the chunk at hand
    /// dropped), then both sides reset.
    Partition(Duration),
    /// The chunk at hand held this long, then forwarded; the link goes on.
    Delay(Duration),
}

/// A running proxy (a clone is a handle on the same one).
#[derive(Clone)]
pub(crate) struct Proxy {
    addrs: Vec<SocketAddr>,
    state: Arc<State>,
}

impl Proxy {
    /// Between clients and server nodes: listens on one loopback port and
    /// forwards each connection to one of `upstreams`.
    pub(crate) async fn balancer(upstreams: Vec<SocketAddr>, seed: u64) -> std::io::Result<Proxy> {
        let state = State::new(Mode::Balancer, seed, Outages::default(), Duration::ZERO);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addrs = vec![listener.local_addr()?];
        tokio::spawn(state.clone().accept(listener, upstreams));
        Ok(Proxy { addrs, state })
    }

    /// Between nodes and PostgreSQL: one loopback port per upstream,
    /// forwarding to it alone ([`Proxy::addrs`], in the order of
    /// `upstreams`); the faults it fires are recorded in `outages`;
    /// `hold_limit`: how long PostgreSQL lets a node's session sit idle
    /// inside a transaction.
    pub(crate) async fn links(
        upstreams: &[SocketAddr],
        seed: u64,
        outages: Outages,
        hold_limit: Duration,
    ) -> std::io::Result<Proxy> {
        let state = State::new(Mode::Links, seed, outages, hold_limit);
        let mut addrs = Vec::new();
        for upstream in upstreams {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?);
            tokio::spawn(state.clone().accept(listener, vec![*upstream]));
        }
        Ok(Proxy { addrs, state })
    }

    /// The balancer's URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addrs[0])
    }

    /// The listening addresses, one per upstream for [`Proxy::links`].
    pub(crate) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Sets the share of faulty connections (0.0 turns faults off). For
    /// links, a share of the open connections is armed at once as well,
    /// and turning faults off disarms those whose fault has not fired.
    pub(crate) fn set_fault_rate(&self, rate: f64) {
        let per_mille = (rate.clamp(0.0, 1.0) * 1000.0).round() as u32;
        self.state.rate.store(per_mille, Ordering::Relaxed);
        if self.state.mode == Mode::Links {
            let mut links = self.state.links.lock().unwrap_or_else(|e| e.into_inner());
            for armed in links.armed.values_mut() {
                *armed = if per_mille == 0 {
                    None
                } else {
                    self.state.pick_link().or(*armed)
                };
            }
        }
    }

    /// Faults injected so far (for links: fired, not only armed).
    pub(crate) fn faults(&self) -> u64 {
        self.state.faults.load(Ordering::Relaxed)
    }

    /// Sets the share (0–1) of the answers to writing `COMMIT`s that links
    /// lose (0.0 turns losses off).
    pub(crate) fn set_commit_loss_rate(&self, rate: f64) {
        let per_million = (rate.clamp(0.0, 1.0) * 1_000_000.0).round() as u32;
        self.state
            .commit_loss_rate
            .store(per_million, Ordering::Relaxed);
    }

    /// The answers to `COMMIT`s lost so far, by kind of transaction: the
    /// node's pool, then the tables it wrote.
    pub(crate) fn commits_lost(&self) -> BTreeMap<String, u64> {
        self.state
            .commits_lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl State {
    fn new(mode: Mode, seed: u64, outages: Outages, hold_limit: Duration) -> Arc<State> {
        Arc::new(State {
            mode,
            rate: AtomicU32::new(0),
            faults: AtomicU64::new(0),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            links: Mutex::new(Links::default()),
            outages,
            hold_limit,
            commit_loss_rate: AtomicU32::new(0),
            commits_lost: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether the next connection is faulty, at the current rate.
    fn roll(&self, rng: &mut StdRng) -> bool {
        let rate = self.rate.load(Ordering::Relaxed);
        rate != 0 && rng.random_range(0..1000) < rate
    }

    async fn accept(self: Arc<State>, listener: TcpListener, upstreams: Vec<SocketAddr>) {
        let upstreams = Arc::new(upstreams);
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let state = self.clone();
            let upstreams = upstreams.clone();
            match self.mode {
                Mode::Balancer => {
                    let fault = self.pick();
                    tokio::spawn(async move { state.serve(tcp, fault, &upstreams).await });
                }
                Mode::Links => {
                    let id = self.open_link();
                    tokio::spawn(async move {
                        state.link(id, tcp, upstreams[0]).await;
                        let mut links = state.links.lock().unwrap_or_else(|e| e.into_inner());
                        links.armed.remove(&id);
                    });
                }
            }
        }
    }

    fn pick(&self) -> Option<Fault> {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        if !self.roll(&mut rng) {
            return None;
        }
        Some(match rng.random_range(0..4) {
            0 => Fault::DropRequest,
            1 => Fault::DropResponse,
            2 => Fault::Delay(Duration::from_millis(rng.random_range(200..3000))),
            _ => Fault::Reset,
        })
    }

    /// A fault for one link, at the current rate: it fires within the next
    /// 8 chunks; a partition lasts 0.5–4 s, or one time in eight 1–3 s
    /// past the hold limit (how long a node's session may sit idle in a
    /// transaction before PostgreSQL ends it and frees its locks); a delay
    /// 0.2–2 s.
    fn pick_link(&self) -> Option<Armed> {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        if !self.roll(&mut rng) {
            return None;
        }
        let fault = match rng.random_range(0..3) {
            0 => LinkFault::Reset,
            1 if rng.random_bool(0.125) => LinkFault::Partition(
                self.hold_limit + Duration::from_millis(rng.random_range(1000..3000)),
            ),
            1 => LinkFault::Partition(Duration::from_millis(rng.random_range(500..4000))),
            _ => LinkFault::Delay(Duration::from_millis(rng.random_range(200..2000))),
        };
        Some(Armed {
            after: rng.random_range(0..8),
            fault,
        })
    }

    /// Registers a new link, armed at the current rate.
    fn open_link(&self) -> u64 {
        let armed = self.pick_link();
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.next += 1;
        let id = links.next;
        links.armed.insert(id, armed);
        id
    }

    /// The link's fault, if it fires at this chunk (counted then).
    fn fires(&self, id: u64) -> Option<LinkFault> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let slot = links.armed.get_mut(&id)?;
        let armed = slot.as_mut()?;
        if armed.after > 0 {
            armed.after -= 1;
            return None;
        }
        let fault = armed.fault;
        *slot = None;
        self.faults.fetch_add(1, Ordering::Relaxed);
        let held = match fault {
            LinkFault::Reset => Duration::ZERO,
            LinkFault::Partition(d) | LinkFault::Delay(d) => d,
        };
        self.outages.record(Instant::now(), held);
        tracing::info!(
            link = id,
            ?fault,
            "injecting a fault between a node and PostgreSQL"
        );
        Some(fault)
    }

    /// Whether the answer to a writing `COMMIT` is lost, at the current
    /// rate (counted by its kind then).
    fn loses(&self, commit: &Commit) -> bool {
        let rate = self.commit_loss_rate.load(Ordering::Relaxed);
        if rate == 0 {
            return false;
        }
        let lose = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            rng.random_range(0..1_000_000) < rate
        };
        if lose {
            let pool = commit.application.trim_start_matches("estafeta ");
            let tables: Vec<&str> = commit.tables.iter().map(String::as_str).collect();
            let kind = format!("{pool}:{}", tables.join("+"));
            tracing::info!(%kind, "losing the answer to a COMMIT");
            *self
                .commits_lost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(kind)
                .or_default() += 1;
            self.outages.record(Instant::now(), Duration::ZERO);
        }
        lose
    }

    /// Forwards one link chunk by chunk both ways, firing its fault when
    /// it is due and losing the answers to `COMMIT`s at their rate; ends
    /// when either side closes or fails.
    async fn link(&self, id: u64, mut node: TcpStream, upstream: SocketAddr) {
        let Ok(mut db) = TcpStream::connect(upstream).await else {
            // The server is down (killed, or being rebuilt): refused, as
            // it would be without the proxy.
            let _ = node.set_zero_linger();
            return;
        };
        let mut up = vec![0u8; 64 * 1024];
        let mut down = vec![0u8; 64 * 1024];
        let mut conversation = Conversation::new();
        loop {
            let (read, to_db) = {
                let (mut node_r, _) = node.split();
                let (mut db_r, _) = db.split();
                tokio::select! {
                    r = node_r.read(&mut up) => (r, true),
                    r = db_r.read(&mut down) => (r, false),
                }
            };
            let n = match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            match self.fires(id) {
                Some(LinkFault::Reset) => return reset(&node, &db),
                Some(LinkFault::Partition(d)) => {
                    tokio::time::sleep(d).await;
                    return reset(&node, &db);
                }
                Some(LinkFault::Delay(d)) => tokio::time::sleep(d).await,
                None => {}
            }
            let written = if to_db {
                conversation.client_sent(&up[..n]);
                db.write_all(&up[..n]).await
            } else {
                let commits = conversation.server_sent(&down[..n]);
                if let Some(lost) = commits.iter().find(|c| self.loses(c)) {
                    // The answers before it go on; it and what follows
                    // are lost with the connection.
                    let _ = node.write_all(&down[..lost.at]).await;
                    return reset(&node, &db);
                }
                node.write_all(&down[..n]).await
            };
            if written.is_err() {
                break;
            }
        }
        let _ = node.shutdown().await;
        let _ = db.shutdown().await;
    }

    async fn serve(&self, mut client: TcpStream, fault: Option<Fault>, upstreams: &[SocketAddr]) {
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
                let Some(mut server) = self.connect(upstreams).await else {
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
                self.pass(client, upstreams).await;
            }
            None => self.pass(client, upstreams).await,
        }
    }

    /// A connection to a random upstream, or to the next that accepts.
    async fn connect(&self, upstreams: &[SocketAddr]) -> Option<TcpStream> {
        let first = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            rng.random_range(0..upstreams.len())
        };
        for i in 0..upstreams.len() {
            let upstream = upstreams[(first + i) % upstreams.len()];
            if let Ok(server) = TcpStream::connect(upstream).await {
                return Some(server);
            }
        }
        None
    }

    async fn pass(&self, mut client: TcpStream, upstreams: &[SocketAddr]) {
        let Some(mut server) = self.connect(upstreams).await else {
            return;
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        let _ = client.shutdown().await;
    }
}

/// Both sides of a link reset (RST): their next read or write fails.
fn reset(node: &TcpStream, db: &TcpStream) {
    let _ = node.set_zero_linger();
    let _ = db.set_zero_linger();
}

#[cfg(test)]
mod tests {
    use super::*;

    impl State {
        /// Arms every open link with `armed`.
        fn arm_all(&self, armed: Armed) {
            let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
            for slot in links.armed.values_mut() {
                *slot = Some(armed);
            }
        }
    }

    /// A loopback server that sends back whatever it gets.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = tcp.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Sends one chunk and reads its echo.
    async fn round_trip(tcp: &mut TcpStream) -> std::io::Result<()> {
        tcp.write_all(b"ping").await?;
        let mut got = [0u8; 4];
        tcp.read_exact(&mut got).await?;
        assert_eq!(&got, b"ping");
        Ok(())
    }

    #[tokio::test]
    async fn an_established_link_is_reset_mid_stream_when_its_fault_is_due() {
        let proxy = Proxy::links(&[echo().await], 1, Outages::default(), Duration::ZERO)
            .await
            .unwrap();
        let mut tcp = TcpStream::connect(proxy.addrs()[0]).await.unwrap();
        round_trip(&mut tcp).await.unwrap();

        // Two chunks go on (the next request and its answer), the third
        // (the request after) meets the reset.
        proxy.state.arm_all(Armed {
            after: 2,
            fault: LinkFault::Reset,
        });
        round_trip(&mut tcp).await.unwrap();
        assert_eq!(proxy.faults(), 0);
        assert!(round_trip(&mut tcp).await.is_err());
        assert_eq!(proxy.faults(), 1);

        // New links pass again.
        let mut tcp = TcpStream::connect(proxy.addrs()[0]).await.unwrap();
        round_trip(&mut tcp).await.unwrap();
    }

    /// A real PostgreSQL behind the links, every writing `COMMIT`'s
    /// answer lost: the node's `COMMIT` fails while the server committed;
    /// the loss is counted by the node's pool and the table written; a
    /// transaction that wrote nothing is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_answer_to_a_writing_commit_is_lost_after_the_server_committed() {
        let pg = tokio::task::spawn_blocking(estafeta_postgres::testing::Postgres::start)
            .await
            .unwrap()
            .unwrap();
        let upstream = SocketAddr::from(([127, 0, 0, 1], pg.port()));
        let proxy = Proxy::links(&[upstream], 1, Outages::default(), Duration::ZERO)
            .await
            .unwrap();
        proxy.set_commit_loss_rate(1.0);
        let url = format!(
            "postgres://postgres@{}/postgres?sslmode=disable&application_name=estafeta%20steps",
            proxy.addrs()[0]
        );
        let store = estafeta_postgres::Store::connect(&url).unwrap();
        let node = store.client().await.unwrap();
        node.batch_execute("CREATE TABLE orders (n int)")
            .await
            .unwrap();
        node.batch_execute("BEGIN").await.unwrap();
        node.execute("INSERT INTO orders VALUES ($1)", &[&7i32])
            .await
            .unwrap();
        assert!(node.batch_execute("COMMIT").await.is_err(), "answered");
        assert_eq!(pg.psql("SELECT n FROM orders").unwrap().trim(), "7");
        assert_eq!(
            proxy.commits_lost(),
            BTreeMap::from([("steps:orders".to_owned(), 1)])
        );

        let node = store.client().await.unwrap();
        node.batch_execute("BEGIN").await.unwrap();
        node.query("SELECT n FROM orders", &[]).await.unwrap();
        node.batch_execute("COMMIT").await.unwrap();
        assert_eq!(proxy.commits_lost().values().sum::<u64>(), 1);
    }

    #[tokio::test]
    async fn faults_turned_off_disarm_the_links_whose_fault_has_not_fired() {
        let proxy = Proxy::links(&[echo().await], 1, Outages::default(), Duration::ZERO)
            .await
            .unwrap();
        let mut tcp = TcpStream::connect(proxy.addrs()[0]).await.unwrap();
        round_trip(&mut tcp).await.unwrap();
        proxy.state.arm_all(Armed {
            after: 3,
            fault: LinkFault::Reset,
        });
        proxy.set_fault_rate(0.0);
        for _ in 0..4 {
            round_trip(&mut tcp).await.unwrap();
        }
        assert_eq!(proxy.faults(), 0);
    }
}
