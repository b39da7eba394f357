//! Messages per second through the whole cycle over real HTTP (device
//! upload → start → prepare with one reply each → commit → the devices fetch
//! and acknowledge their replies), with full durability, against the disk's
//! batch ceiling measured in the same run on the same disk, before and
//! after (`estafeta_durable::limits`): as many files as a cycle has
//! messages created, written and fsynced at once, then their folder fsynced.
//!
//! The same cycle runs on the embedded store and in cluster mode: one node
//! over a throwaway PostgreSQL, and three nodes over one, each call sent to
//! the nodes in turn; for these, the statements per message are counted
//! (`pg_stat_statements`) over a few cycles run before the timed ones.
//! Before the timed runs, the three take turns cycle by cycle for 30 s
//! ([`interleaved`]): the ratios between them, on the same machine; a
//! fourth turn sends the three nodes' calls as a load balancer with client
//! affinity would ([`affine`]).
//!
//! `cargo bench -p estafeta-server --bench cycle`; the ratio (messages/s ÷
//! ceiling files/s) goes to BENCHMARKS.md. `BENCH_DIR` picks the disk;
//! `CYCLE_EMBEDDED=N` runs instead N rounds of the ceiling and the
//! embedded store's cycles in turn ([`embedded`]).

/// The `estafeta` binary's allocator: the server is measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use estafeta_client::Client;
use estafeta_durable::limits::{Batch, Probe};
use estafeta_exchange::mailbox::Limits;
use estafeta_exchange::wire::{
    CallStatus, Message, MessageId, ProcessId, StartRequest, StartStatus,
};
use estafeta_exchange::{ExchangeConfig, Id};
use estafeta_postgres::testing::Postgres;
use estafeta_server::config::ClusterStore;
use estafeta_server::notify::NotifySettings;
use estafeta_server::{HttpSettings, Server};
use estafeta_server_harness::api::{answer_each, id, message, provision_db_a, start_request};
use estafeta_server_harness::measure::{TICK, bench_dir, load_average, machine_ticks};
use tokio_util::sync::CancellationToken;

/// About the size of a small order message.
const BODY: &str = r#"{"order":{"lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"note":"deliver before noon"}}"#;
/// Devices sending in parallel (each device's calls run one at a time).
const DEVICES: usize = 10;

struct World {
    /// The processor's client on each node; its calls go to them in turn.
    processor: Vec<Client>,
    /// Each device's client, on the nodes in turn.
    devices: Vec<(Id, Client)>,
    /// Which node the processor's next call goes to.
    turn: AtomicU64,
    /// The database's token and each device's.
    tokens: (String, Vec<String>),
}

impl World {
    fn processor(&self) -> &Client {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        &self.processor[turn as usize % self.processor.len()]
    }
}

/// A node on `data`, on the embedded store or the cluster store `store`;
/// its base URL once ready. The node runs until the bench process exits.
async fn node(data: &Path, store: Option<&str>) -> String {
    let mut config = ExchangeConfig::new(data);
    config.admin_token = Some("bench-admin".to_owned());
    config.limits = Limits::new(100, 20.0).unwrap();
    let (server, _) = Server::open_with(
        config,
        Arc::new(estafeta_session::SystemClock),
        HttpSettings::default(),
        NotifySettings::log_only(data),
        store.map(ClusterStore::new).as_ref(),
        None,
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(server.run(listener, CancellationToken::new()));
    let admin = Client::new(&base, "bench-admin").unwrap();
    while !admin.readyz().await.unwrap() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    base
}

/// `nodes` nodes (folders under `data`) on one store, provisioned.
async fn world(data: &Path, store: Option<&str>, nodes: usize) -> World {
    let mut bases = Vec::new();
    for n in 0..nodes {
        bases.push(node(&data.join(format!("node-{n}")), store).await);
    }
    let admin = Client::new(&bases[0], "bench-admin").unwrap();
    let names: Vec<Id> = (0..DEVICES).map(|n| id(&format!("phone-{n}"))).collect();
    let (db, tokens) = provision_db_a(&admin, &names).await;
    let devices = names.into_iter().zip(&tokens).enumerate();
    World {
        processor: bases.iter().map(|b| Client::new(b, &db).unwrap()).collect(),
        devices: devices
            .map(|(n, (dev, token))| (dev, Client::new(&bases[n % nodes], token).unwrap()))
            .collect(),
        turn: AtomicU64::new(0),
        tokens: (db, tokens),
    }
}

/// The tenancy of `w` served by a new node on `data` over `store` (the
/// store `w`'s nodes use, reached another way).
async fn joined(w: &World, data: &Path, store: &str) -> World {
    let base = node(data, Some(store)).await;
    World {
        processor: vec![Client::new(&base, &w.tokens.0).unwrap()],
        devices: w
            .devices
            .iter()
            .zip(&w.tokens.1)
            .map(|((dev, _), token)| (dev.clone(), Client::new(&base, token).unwrap()))
            .collect(),
        turn: AtomicU64::new(0),
        tokens: w.tokens.clone(),
    }
}

/// The nodes of `w` behind a load balancer that keeps each client on one
/// node (affinity, for example a hash of the token): the processor's calls
/// all go to its first node instead of to each node in turn; each device
/// stays on its node, as in `w`.
fn affine(w: &World) -> World {
    World {
        processor: w.processor[..1].to_vec(),
        devices: w.devices.clone(),
        turn: AtomicU64::new(0),
        tokens: w.tokens.clone(),
    }
}

/// A PostgreSQL for the cluster benches, counting statements.
fn postgres() -> Postgres {
    let pg = Postgres::start().unwrap();
    pg.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .unwrap();
    pg.stop().unwrap();
    pg.restart().unwrap();
    pg.psql("CREATE EXTENSION pg_stat_statements").unwrap();
    pg
}

/// Statements run so far (every database), leaving out the bench's own
/// queries of `pg_stat_statements`.
fn pg_statements(pg: &Postgres) -> u64 {
    pg.psql(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE query NOT LIKE '%pg_stat_statements%'",
    )
    .unwrap()
    .trim()
    .parse::<u64>()
    .unwrap()
}

/// Statements per message over `cycles` cycles of `batch`, printed for
/// BENCHMARKS.md. (Transactions are not counted here: PostgreSQL's
/// `pg_stat_database` takes a backend's counts at most once a second, so
/// a run this short reads none; `BEGIN` and `COMMIT` show in the list.)
fn count_per_message(rt: &tokio::runtime::Runtime, pg: &Postgres, w: &World, what: &str) {
    let (cycles, batch) = (5u64, 100usize);
    // BENCH_PG_STATEMENTS=1 also prints each statement's calls per message.
    let each = std::env::var_os("BENCH_PG_STATEMENTS").is_some();
    if each {
        pg.psql("SELECT pg_stat_statements_reset()").unwrap();
    }
    let before = pg_statements(pg);
    for _ in 0..cycles {
        rt.block_on(cycle(w, batch));
    }
    let after = pg_statements(pg);
    let messages = (cycles * batch as u64) as f64;
    println!(
        "{what}: {:.1} statements per message (batch {batch}, {cycles} cycles)",
        (after - before) as f64 / messages,
    );
    if each {
        let rows = pg
            .psql(&format!(
                "SELECT round(calls / {messages}::numeric, 2) || ' ' ||
                        left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
                 FROM pg_stat_statements ORDER BY calls DESC LIMIT 30"
            ))
            .unwrap();
        println!("{rows}");
    }
}

/// One whole cycle of `batch` messages.
async fn cycle(w: &World, batch: usize) {
    upload(w, batch).await;
    let (pid, messages) = start(w, batch).await;
    prepare(w, &pid, &messages).await;
    commit(w, &pid).await;
    let mut fetches = tokio::task::JoinSet::new();
    for (_, client) in w.devices.iter().take(DEVICES.min(batch)) {
        let client = client.clone();
        fetches.spawn(async move {
            let ids = inbox(&client, batch).await;
            ack(&client, &ids).await
        });
    }
    let acked: u64 = fetches.join_all().await.into_iter().sum();
    assert_eq!(acked, batch as u64);
}

/// The devices upload `batch` messages, each device one at a time.
async fn upload(w: &World, batch: usize) {
    let mut uploads = tokio::task::JoinSet::new();
    for d in 0..DEVICES.min(batch) {
        let client = w.devices[d].1.clone();
        let count = batch / DEVICES.min(batch) + usize::from(d < batch % DEVICES.min(batch));
        uploads.spawn(async move {
            for _ in 0..count {
                client.send(&message("db-a", BODY, None)).await.unwrap();
            }
        });
    }
    uploads.join_all().await;
}

/// The processor starts a process of `batch` messages.
async fn start(w: &World, batch: usize) -> (ProcessId, Vec<Message>) {
    let start = StartRequest {
        max_files: Some(batch as u64),
        ..start_request("db-a")
    };
    let started = w.processor().start(&start).await.unwrap();
    assert_eq!(started.status, StartStatus::Ok);
    let messages = started.messages.unwrap();
    assert_eq!(messages.len(), batch);
    (started.process_id.unwrap(), messages)
}

/// The processor prepares `messages` processed, with one reply each.
async fn prepare(w: &World, pid: &ProcessId, messages: &[Message]) {
    let prepare = answer_each(messages, r#"{"accepted":true}"#);
    assert_eq!(
        w.processor().prepare(pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
}

/// The processor commits its process.
async fn commit(w: &World, pid: &ProcessId) {
    assert_eq!(
        w.processor().commit(pid).await.unwrap().status,
        CallStatus::Ok
    );
}

/// A device fetches its inbox: the ids of its messages.
async fn inbox(client: &Client, batch: usize) -> Vec<MessageId> {
    let inbox = client.inbox(Some(batch)).await.unwrap();
    inbox.messages.iter().map(|m| m.id).collect()
}

/// A device acknowledges `ids`: how many were.
async fn ack(client: &Client, ids: &[MessageId]) -> u64 {
    client.ack(ids).await.unwrap().acked
}

/// The phases of a cycle, in order.
const PHASES: [&str; 6] = ["upload", "start", "prepare", "commit", "inbox", "ack"];

/// Counts of a PostgreSQL for [`phases`]: statements, and round trips
/// through the counting proxy.
struct Counted<'a> {
    pg: &'a Postgres,
    proxy: &'a Proxy,
}

/// `CYCLE_PHASES=N`: `N` cycles of `batch` on `w`, the phases run one
/// after the other (the devices' inboxes all fetched before any is
/// acknowledged); prints each phase's wall time per message (the median
/// over the cycles), and, with `counted` (a world whose nodes reach
/// PostgreSQL through the counting proxy), each phase's statements and
/// round trips per message over one more cycle.
fn phases(
    rt: &tokio::runtime::Runtime,
    w: &World,
    batch: usize,
    cycles: usize,
    what: &str,
    counted: Option<(&World, Counted<'_>)>,
) {
    async fn run(w: &World, batch: usize, mut mark: impl FnMut(usize)) {
        upload(w, batch).await;
        mark(0);
        let (pid, messages) = start(w, batch).await;
        mark(1);
        prepare(w, &pid, &messages).await;
        mark(2);
        commit(w, &pid).await;
        mark(3);
        let clients: Vec<Client> = w.devices.iter().map(|(_, c)| c.clone()).collect();
        let fetching: Vec<_> = clients
            .iter()
            .cloned()
            .map(|c| tokio::spawn(async move { inbox(&c, batch).await }))
            .collect();
        let mut fetched = Vec::new();
        for f in fetching {
            fetched.push(f.await.unwrap());
        }
        mark(4);
        let acking: Vec<_> = clients
            .into_iter()
            .zip(fetched)
            .map(|(c, ids)| tokio::spawn(async move { ack(&c, &ids).await }))
            .collect();
        let mut acked = 0;
        for a in acking {
            acked += a.await.unwrap();
        }
        assert_eq!(acked, batch as u64);
        mark(5);
    }
    let mut times = vec![Vec::new(); PHASES.len()];
    let mut busy = [0u64; PHASES.len()];
    for _ in 0..cycles {
        let mut last = (std::time::Instant::now(), machine_ticks().busy);
        rt.block_on(run(w, batch, |phase| {
            let now = (std::time::Instant::now(), machine_ticks().busy);
            times[phase].push(now.0 - last.0);
            busy[phase] += now.1 - last.1;
            last = now;
        }));
    }
    let per_message = |d: Duration| d.as_secs_f64() * 1e6 / batch as f64;
    let mut total = 0.0;
    let mut line = format!("{what}, µs per message (median of {cycles}):");
    for (phase, t) in PHASES.iter().zip(&mut times) {
        t.sort();
        let median = per_message(t[t.len() / 2]);
        total += median;
        line += &format!(" {phase} {median:.0}");
    }
    println!("{line}; sum {total:.0} ({:.0} msgs/s)", 1e6 / total);
    // The machine's CPU (every process: the nodes, the bench's clients,
    // PostgreSQL), in µs per message, over all the cycles.
    let messages = (cycles * batch) as f64;
    let micros = |ticks: u64| ticks as f64 * TICK.as_secs_f64() * 1e6 / messages;
    let mut line = format!("{what}, machine CPU µs per message:");
    for (phase, ticks) in PHASES.iter().zip(busy) {
        line += &format!(" {phase} {:.0}", micros(ticks));
    }
    let all: u64 = busy.iter().sum();
    println!("{line}; all {:.0}", micros(all));
    let Some((w, counted)) = counted else {
        return;
    };
    // CYCLE_PHASES_STATEMENTS=1 also prints each phase's statements.
    let each = std::env::var_os("CYCLE_PHASES_STATEMENTS").is_some();
    let mut phase = 0;
    let mut counts = || {
        // Read before the reset below: with a reset at each mark, the
        // statements since the last mark.
        let statements = pg_statements(counted.pg);
        if each && phase > 0 {
            let rows = counted
                .pg
                .psql(
                    "SELECT calls || ' ' || round(total_exec_time::numeric, 2) || 'ms '
                            || left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
                     FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
                     ORDER BY calls DESC LIMIT 12",
                )
                .unwrap();
            println!("{}:\n{rows}", PHASES[phase - 1]);
        }
        if each {
            counted
                .pg
                .psql("SELECT pg_stat_statements_reset()")
                .unwrap();
        }
        phase += 1;
        (statements, counted.proxy.round_trips())
    };
    let mut marks = vec![counts()];
    rt.block_on(run(w, batch, |_| marks.push(counts())));
    let mut line = format!("{what}, per message (statements / round trips):");
    for (phase, pair) in PHASES.iter().zip(marks.windows(2)) {
        let statements = match each {
            true => pair[1].0,
            false => pair[1].0 - pair[0].0,
        };
        let trips = pair[1].1 - pair[0].1;
        line += &format!(
            " {phase} {:.2} / {:.2}",
            statements as f64 / batch as f64,
            trips as f64 / batch as f64
        );
    }
    let all = match each {
        true => marks[1..].iter().map(|m| m.0).sum::<u64>(),
        false => marks[6].0 - marks[0].0,
    } as f64
        / batch as f64;
    let trips = (marks[6].1 - marks[0].1) as f64 / batch as f64;
    println!("{line}; all {all:.2} / {trips:.2}");
}

/// How long [`interleaved`] runs.
const INTERLEAVED: Duration = Duration::from_secs(30);

/// Whole cycles at batch 100 on each of `worlds` in turn, one cycle each
/// per turn, for `time`; prints each world's messages/s and its ratio to
/// each world before it: the total time of each, and the median of the
/// turns' ratios. On a shared machine whose speed drifts
/// over seconds, taking turns cycle by cycle gives every world the same
/// machine, which one timed run after another does not.
fn interleaved(rt: &tokio::runtime::Runtime, worlds: &[(&str, &World)], time: Duration) {
    let batch = 100;
    let mut totals = vec![Duration::ZERO; worlds.len()];
    let mut turns: Vec<Vec<Duration>> = Vec::new();
    let began = std::time::Instant::now();
    while began.elapsed() < time {
        // Each turn begins one world further on, so that no world always
        // follows the same one (and inherits its leftover work).
        let mut turn = vec![Duration::ZERO; worlds.len()];
        for k in 0..worlds.len() {
            let i = (turns.len() + k) % worlds.len();
            let t = std::time::Instant::now();
            rt.block_on(cycle(worlds[i].1, batch));
            turn[i] = t.elapsed();
        }
        for (total, t) in totals.iter_mut().zip(&turn) {
            *total += *t;
        }
        turns.push(turn);
    }
    let rate = |d: Duration| (turns.len() * batch) as f64 / d.as_secs_f64();
    let median_ratio = |i: usize, j: usize| {
        let mut r: Vec<f64> = turns
            .iter()
            .map(|t| t[j].as_secs_f64() / t[i].as_secs_f64())
            .collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    println!("interleaved, {} turns of batch {batch}:", turns.len());
    for (i, (what, _)) in worlds.iter().enumerate() {
        let mut line = format!("  {what}: {:.0} msgs/s", rate(totals[i]));
        for (j, (name, _)) in worlds.iter().enumerate().take(i) {
            line += &format!(
                "\n    ÷ {name}: {:.2} (median of turns {:.2})",
                totals[j].as_secs_f64() / totals[i].as_secs_f64(),
                median_ratio(i, j),
            );
        }
        println!("{line}");
    }
}

/// A loopback TCP proxy in front of a PostgreSQL that counts round trips:
/// on each connection, every time the client sends after the server last
/// spoke (pipelined statements sent together count once).
struct Proxy {
    port: u16,
    trips: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let trips = Arc::new(AtomicU64::new(0));
        let counter = trips.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let spoke = Arc::new(std::sync::atomic::AtomicBool::new(true));
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, spoke.clone(), Some(counter.clone())));
                tokio::spawn(pipe(sr, cw, spoke, None));
            }
        });
        Proxy { port, trips }
    }

    fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes. Client to server (with
/// `trips`): a read after the server `spoke` is a round trip; server to
/// client: every read sets `spoke`.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    spoke: Arc<std::sync::atomic::AtomicBool>,
    trips: Option<Arc<AtomicU64>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match &trips {
            Some(trips) if spoke.swap(false, Ordering::SeqCst) => {
                trips.fetch_add(1, Ordering::SeqCst);
            }
            Some(_) => {}
            None => spoke.store(true, Ordering::SeqCst),
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `CYCLE_EMBEDDED=N`: N rounds on the embedded store alone, each the
/// ceiling for 100 (for 5 s), then whole cycles of 100 (for 5 s); prints
/// each round's rates and ratio, the load average, and the median ratio.
fn embedded(rt: &tokio::runtime::Runtime, w: &World, probe: &Probe, rounds: usize) {
    let time = Duration::from_secs(5);
    let mut batch = probe.files_at_once(100).unwrap();
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let load_before = load_average();
        let ceiling = probe.measure(|| batch.run(), 100, time).unwrap();
        let began = std::time::Instant::now();
        let mut cycles = 0;
        while began.elapsed() < time {
            rt.block_on(cycle(w, 100));
            cycles += 1;
        }
        let rate = (cycles * 100) as f64 / began.elapsed().as_secs_f64();
        let ratio = rate / ceiling.files_per_second();
        ratios.push(ratio);
        println!(
            "round {round}: whole cycle at batch 100 {rate:.0} msgs/s, ceiling for 100 {:.0} files/s: \
             {ratio:.2}; load average {load_before:.2} → {:.2}",
            ceiling.files_per_second(),
            load_average()
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median ratio over {rounds} rounds: {:.2} (range {:.2}-{:.2})",
        ratios[rounds / 2],
        ratios[0],
        ratios[rounds - 1]
    );
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir_in(bench_dir()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let w = rt.block_on(world(&tmp.path().join("data"), None, 1));
    let probe = Probe::new(tmp.path().join("probe"), 300).unwrap();
    if let Some(rounds) = std::env::var("CYCLE_EMBEDDED")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        return embedded(&rt, &w, &probe, rounds);
    }
    let pg_one = postgres();
    let one = rt.block_on(world(&tmp.path().join("one"), Some(&pg_one.url()), 1));
    count_per_message(&rt, &pg_one, &one, "one node over PostgreSQL");
    if let Some(cycles) = std::env::var("CYCLE_PHASES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        let proxy = rt.block_on(Proxy::start(pg_one.port()));
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);
        let through = rt.block_on(joined(&one, &tmp.path().join("counted"), &url));
        let pg_three = postgres();
        let three = rt.block_on(world(&tmp.path().join("three"), Some(&pg_three.url()), 3));
        // The embedded store, one node and three, interleaved, so that all
        // see the same load on a shared machine.
        for _ in 0..2 {
            phases(&rt, &w, 100, cycles, "embedded", None);
            let counted = Counted {
                pg: &pg_one,
                proxy: &proxy,
            };
            phases(
                &rt,
                &one,
                100,
                cycles,
                "one node over PostgreSQL",
                Some((&through, counted)),
            );
            phases(
                &rt,
                &three,
                100,
                cycles,
                "three nodes over PostgreSQL",
                None,
            );
        }
        return;
    }
    let pg_three = postgres();
    let three = rt.block_on(world(&tmp.path().join("three"), Some(&pg_three.url()), 3));
    count_per_message(&rt, &pg_three, &three, "three nodes over PostgreSQL");
    interleaved(
        &rt,
        &[
            ("embedded", &w),
            ("one node over PostgreSQL", &one),
            ("three nodes over PostgreSQL", &three),
            ("three nodes, each client on one node", &affine(&three)),
        ],
        INTERLEAVED,
    );
    let mut ceilings: Vec<(usize, Batch)> = [10, 100]
        .into_iter()
        .map(|n| (n, probe.files_at_once(n).unwrap()))
        .collect();

    let mut group = c.benchmark_group("cycle");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    // The ceilings before and after the cycles: on a shared machine the
    // disk's speed drifts, and the two bracket it.
    for (n, batch) in &mut ceilings {
        group.throughput(Throughput::Elements(*n as u64));
        group.bench_function(format!("ceiling_{n}_files_at_once"), |b| {
            b.iter(|| batch.run().unwrap())
        });
    }
    for batch in [10usize, 100] {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(format!("whole_cycle_batch_{batch}"), |b| {
            b.to_async(&rt).iter(|| cycle(&w, batch))
        });
    }
    group.throughput(Throughput::Elements(100));
    group.bench_function("whole_cycle_batch_100_postgres_one_node", |b| {
        b.to_async(&rt).iter(|| cycle(&one, 100))
    });
    group.bench_function("whole_cycle_batch_100_postgres_three_nodes", |b| {
        b.to_async(&rt).iter(|| cycle(&three, 100))
    });
    for (n, batch) in &mut ceilings {
        group.throughput(Throughput::Elements(*n as u64));
        group.bench_function(format!("ceiling_{n}_files_at_once_after"), |b| {
            b.iter(|| batch.run().unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
