//! A harness run: provisioning, the rounds of faults, the drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_sim::{Device, Processor, Step};
use estafeta_wire::{Folder, Id, ProcessId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::check::{self, Summary};
use crate::child::{self, CLIENT_TIMEOUT, ProcessorChild};
use crate::disk::Tmpfs;
use crate::faults::Faults;
use crate::outage::Outages;
use crate::proxy::Proxy;
use crate::server::{Arming, Server, Started};
use crate::{RunArgs, Store};
use estafeta_exchange::failpoints::{POINTS, STORE_POINTS};
use estafeta_postgres::testing::Postgres;

/// The longest the drain may take before what is left counts as stuck.
const DRAIN_BOUND: Duration = Duration::from_secs(60);

/// One database and its processor child.
struct Slot {
    db: Id,
    token: String,
    sqlite: PathBuf,
    child: Option<ProcessorChild>,
}

/// How the run injects faults into the server itself.
struct Injection {
    /// The binary has failpoints: arm crash points at restarts.
    failpoints: bool,
    /// The points the server passes on its store, armed in turn.
    points: &'static [&'static str],
    /// Stalls at the points: at least how long (the hold limit), none
    /// when the run asks for none.
    pauses: Option<Duration>,
    /// An armed server dies on its 1st to this many-th pass of its point.
    passes: u64,
    /// A full disk by injected `ENOSPC` at failpoints (no tmpfs: not root).
    disk_errors: bool,
}

impl Injection {
    /// What the next start of the server is armed with: half of the starts
    /// die at a named point (each point in turn, on one of its first
    /// passes); with pauses, half of the others stall at one (each in
    /// turn, on one of its first passes) for 1–3 s past the hold limit;
    /// and without a tmpfs a quarter of the others see a full disk.
    fn next(&self, rng: &mut StdRng, faults: &mut Faults) -> Arming {
        if self.failpoints && rng.random_bool(0.5) {
            let point = self.points[(faults.armed_crashes as usize) % self.points.len()];
            faults.armed_crashes += 1;
            return Arming {
                crash_at: Some((point, rng.random_range(1..=self.passes))),
                ..Arming::default()
            };
        }
        if let Some(hold) = self.pauses
            && rng.random_bool(0.5)
        {
            let point = self.points[(faults.armed_pauses as usize) % self.points.len()];
            faults.armed_pauses += 1;
            let pause = hold + Duration::from_millis(rng.random_range(1000..3000));
            return Arming {
                pause_at: Some((point, rng.random_range(1..=self.passes), pause)),
                ..Arming::default()
            };
        }
        if self.disk_errors && rng.random_bool(0.25) {
            faults.disk_full += 1;
            return Arming {
                disk_errors: true,
                ..Arming::default()
            };
        }
        Arming::default()
    }
}

/// Starts the server again, armed as `injection` picks, until a start
/// gets to `/readyz` (a start that dies at its point in start-up recovery
/// counts as a crash there and is started again).
async fn restart(
    server: &mut Server,
    injection: &Injection,
    rng: &mut StdRng,
    faults: &mut Faults,
) -> anyhow::Result<()> {
    loop {
        let arming = injection.next(rng, faults);
        match server.restart(arming).await? {
            Started::Ready(took) => {
                faults.ready_times.push(took);
                return Ok(());
            }
            Started::DiedAtFailpoint(point) => faults.crashed_at(point),
        }
    }
}

/// Counts an end `server` came to by itself with `status`: at its armed
/// point, or a death the harness did not cause (its log's tail shown).
fn ended_by_itself(server: &Server, status: ExitStatus, faults: &mut Faults) {
    match server.died_at_failpoint(status) {
        Some(point) => faults.crashed_at(point),
        None => {
            eprintln!(
                "the server exited by itself ({status})\n{}",
                server.log_tail()
            );
            faults.unexpected_exits += 1;
        }
    }
}

/// Counts a server that ended by itself and starts it again; nothing when
/// it is running.
async fn revive(
    server: &mut Server,
    injection: &Injection,
    rng: &mut StdRng,
    faults: &mut Faults,
) -> anyhow::Result<()> {
    let Some(status) = server.exit_status()? else {
        return Ok(());
    };
    ended_by_itself(server, status, faults);
    restart(server, injection, rng, faults).await
}

/// `kill -9` of `server`, counted as a crash the harness caused; when it
/// had ended by itself first, counted as that instead.
async fn kill(server: &mut Server, faults: &mut Faults) -> anyhow::Result<()> {
    match server.kill9().await? {
        None => faults.server_crashes += 1,
        Some(status) => ended_by_itself(server, status, faults),
    }
    Ok(())
}

/// `kill -9` of a processor child; an end it came to by itself first is
/// counted (it fails the run) and shown.
async fn kill_processor(child: ProcessorChild, faults: &mut Faults) -> anyhow::Result<()> {
    if let Some(ended) = child.kill9().await? {
        eprintln!("{ended}");
        faults.processor_exits += 1;
    }
    Ok(())
}

/// Runs the harness as `args` say; the summary of its checks.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<Summary> {
    let binary = match &args.estafeta {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the harness executable has no folder")?
            .join("estafeta"),
    };
    if !binary.is_file() {
        bail!(
            "no estafeta binary at {} (build it, or give --estafeta PATH)",
            binary.display()
        );
    }
    let temp = match &args.workdir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            None
        }
        None => Some(
            tempfile::Builder::new()
                .prefix("estafeta-harness-")
                .tempdir()?,
        ),
    };
    let work: PathBuf = match (&temp, &args.workdir) {
        (Some(t), _) => t.path().to_owned(),
        (None, Some(dir)) => dir.clone(),
        (None, None) => bail!("no work folder"),
    };
    let cluster = args.store == Store::Postgres;
    if args.nodes > 1 && !cluster {
        bail!(
            "--nodes {} needs --store postgres: the embedded store serves one node",
            args.nodes
        );
    }
    let failovers = args.failovers();
    if failovers > 0 && !cluster {
        bail!("--failovers needs --store postgres");
    }
    if args.db_faults > 0.0 && !cluster {
        bail!("--db-faults needs --store postgres");
    }
    if !cluster
        && (args.commit_losses > 0.0
            || args.failpoint_pauses > 0
            || args.hold_limit.is_some()
            || args.skewed_node.is_some())
    {
        bail!(
            "--commit-losses, --failpoint-pauses, --hold-limit and --skewed-node need --store postgres"
        );
    }
    // How long PostgreSQL lets a node's session sit idle in a transaction.
    let hold_limit = args
        .hold_limit
        .unwrap_or(estafeta_postgres::Options::default().hold_limit);
    // The skewed node's environment: libfaketime's wall clock, its
    // monotonic clock untouched.
    let skew = match args.skewed_node {
        Some(minutes) => {
            if !Path::new(FAKETIME).exists() {
                bail!("--skewed-node needs {FAKETIME}: install Debian's faketime package");
            }
            vec![
                ("LD_PRELOAD".to_owned(), FAKETIME.to_owned()),
                ("FAKETIME".to_owned(), format!("{minutes:+}m")),
                ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
            ]
        }
        None => Vec::new(),
    };
    if cluster && args.disk_full {
        bail!("--disk-full fills the embedded store's disk; it does not apply to --store postgres");
    }
    // Every node's store: one PostgreSQL made for the run (and its
    // synchronous standby), dropped (stopped and removed) at its end.
    let mut postgres = if cluster {
        let pg = tokio::task::spawn_blocking(move || Database::start(failovers > 0))
            .await
            .context("starting PostgreSQL")??;
        Some(pg)
    } else {
        None
    };
    // The nodes reach PostgreSQL through the fault-injecting links when
    // the run asks for faults there or for lost COMMIT answers.
    // When the harness holds the store out of the nodes' reach: a node
    // starting meanwhile waits for it, and that is not its own time.
    let outages = Outages::default();
    let links = match &postgres {
        Some(pg) if args.db_faults > 0.0 || args.commit_losses > 0.0 => Some(
            Proxy::links(
                &pg.addrs(),
                args.seed ^ 0xdb_f0_17,
                outages.clone(),
                hold_limit,
            )
            .await?,
        ),
        _ => None,
    };
    let store = postgres
        .as_ref()
        .map(|pg| pg.url(links.as_ref().map(Proxy::addrs), args.hold_limit));
    let data = work.join("data");
    let sqlite_dir = work.join("processors");
    std::fs::create_dir_all(&data)?;
    std::fs::create_dir_all(&sqlite_dir)?;
    let tmpfs = if args.disk_full && !args.inject_disk_errors {
        match Tmpfs::mount(&data) {
            Ok(t) => Some(t),
            Err(e) if !args.no_failpoints => {
                eprintln!("{e:#}; injecting ENOSPC at the failpoints instead");
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let injection = Injection {
        failpoints: !args.no_failpoints,
        points: if cluster { STORE_POINTS } else { POINTS },
        pauses: (args.failpoint_pauses > 0).then_some(hold_limit),
        // A node passes a point less often than a lone server (the calls
        // are spread over the nodes) and is killed at random as often.
        passes: if cluster { 4 } else { 8 },
        disk_errors: args.disk_full && tmpfs.is_none(),
    };
    child::remember_exe()?;
    let mut faults = Faults::default();
    let mut nodes = Vec::new();
    let mut upstreams = Vec::new();
    for i in 0..args.nodes {
        let (dir, log) = if cluster {
            (
                work.join(format!("node-{i}")),
                work.join(format!("node-{i}.log")),
            )
        } else {
            (data.clone(), work.join("server.log"))
        };
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        // The last node's wall clock is off when the run asks for it.
        let env = match i + 1 == args.nodes {
            true => skew.clone(),
            false => Vec::new(),
        };
        let (node, ready) = Server::start(
            &binary,
            store.as_deref(),
            env,
            &dir,
            &log,
            port,
            outages.clone(),
        )
        .await?;
        faults.ready_times.push(ready);
        nodes.push(node);
        upstreams.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let proxy = Proxy::balancer(upstreams, args.seed).await?;

    let (mut slots, devices) = provision(&nodes[0].admin, &proxy, &args, &sqlite_dir).await?;
    // COMMIT answers are lost from here on: a create whose answer was lost
    // leaves a database or device whose token only its answer carried.
    if let Some(links) = &links {
        links.set_commit_loss_rate(args.commit_losses);
    }
    for (i, slot) in slots.iter_mut().enumerate() {
        slot.child = Some(spawn(&proxy, slot, args.seed + i as u64, None)?);
    }
    let stop_devices = Arc::new(AtomicBool::new(false));
    let db_ids: Vec<Id> = slots.iter().map(|s| s.db.clone()).collect();
    let device_task = tokio::spawn(devices_loop(
        devices,
        db_ids,
        args.seed,
        stop_devices.clone(),
    ));

    // Faults between the nodes and PostgreSQL come in episodes of their
    // own, whatever the rounds do meanwhile (a node's restart, a failover).
    let stop_db_faults = Arc::new(AtomicBool::new(false));
    let db_fault_task = links.clone().map(|links| {
        tokio::spawn(db_fault_episodes(
            links,
            args.db_faults,
            args.seed ^ 0xdb,
            stop_db_faults.clone(),
        ))
    });

    let mut rng = StdRng::seed_from_u64(args.seed);
    let began = Instant::now();
    loop {
        for node in &mut nodes {
            revive(node, &injection, &mut rng, &mut faults).await?;
        }
        let out_of_time = args.duration.is_some_and(|d| began.elapsed() >= d);
        let pauses: u64 = nodes.iter().flat_map(|n| n.paused().into_values()).sum();
        let targets_met = faults.rounds >= args.rounds
            && faults.server_crashes >= args.server_crashes
            && faults.failpoint_crashes.values().sum::<u64>() >= args.failpoint_crashes
            && pauses >= args.failpoint_pauses
            && faults.failovers >= failovers;
        if out_of_time || targets_met {
            break;
        }
        faults.rounds += 1;
        while failover_due(faults.rounds, args.rounds, faults.failovers, failovers)
            && let Some(pg) = &mut postgres
        {
            tracing::info!(
                round = faults.rounds,
                "kill -9 of the PostgreSQL primary, standby promoted"
            );
            // Blocking (pg_ctl waits for the promotion, the new standby's
            // base backup): the traffic goes on on the runtime's other
            // threads meanwhile.
            let began = Instant::now();
            tokio::task::block_in_place(|| pg.fail_over())?;
            outages.record(began, began.elapsed());
            faults.failovers += 1;
        }
        let node = rng.random_range(0..nodes.len());
        let server = &mut nodes[node];
        // Restarts are what arm failpoints.
        let want_crashes = faults.server_crashes < args.server_crashes
            || faults.failpoint_crashes.values().sum::<u64>() < args.failpoint_crashes
            || pauses < args.failpoint_pauses;
        let fault = if want_crashes && rng.random_bool(0.5) {
            0
        } else {
            loop {
                let f = rng.random_range(0..6);
                let off = (f == 4 && args.no_random_processor_kills) || (f == 5 && tmpfs.is_none());
                if !off {
                    break f;
                }
            }
        };
        match fault {
            0 => {
                // At a random moment of the traffic.
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
                tracing::info!(round = faults.rounds, "kill -9 of the server");
                kill(server, &mut faults).await?;
                restart(server, &injection, &mut rng, &mut faults).await?;
            }
            1 => {
                let i = rng.random_range(0..slots.len());
                // Every step in turn, so a short run covers them all.
                let step = Step::ALL[(faults.processor_crashes as usize) % Step::ALL.len()];
                let seed = rng.random();
                let stopped =
                    stop_processor(&proxy, &mut slots[i], step, seed, &mut faults).await?;
                faults.processor_crashes += 1;
                // Stopped with its prepare answered and its commit not
                // sent: with the server killed before its successor can
                // commit, start-up processing puts the process in doubt.
                // (A node of a shared store runs none.)
                if let Some(pid) = stopped.filter(|_| !cluster && withholds_commit(step)) {
                    tracing::info!(round = faults.rounds, process = %pid, "kill -9 of the server with a commit withheld");
                    kill(server, &mut faults).await?;
                    faults.withheld.push(pid);
                    restart(server, &injection, &mut rng, &mut faults).await?;
                }
                slots[i].child = Some(spawn(&proxy, &slots[i], seed.wrapping_add(1), None)?);
            }
            2 => {
                tracing::info!(round = faults.rounds, "network faults");
                proxy.set_fault_rate(0.3);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
                proxy.set_fault_rate(0.0);
            }
            3 => {
                tracing::info!(round = faults.rounds, "server paused");
                server
                    .pause(CLIENT_TIMEOUT + Duration::from_secs(1))
                    .await?;
                faults.pauses += 1;
            }
            4 => {
                // Wherever it is, possibly in the middle of a call.
                let i = rng.random_range(0..slots.len());
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                tracing::info!(round = faults.rounds, db = %slots[i].db, "kill -9 of a processor at a random moment");
                if let Some(child) = slots[i].child.take() {
                    kill_processor(child, &mut faults).await?;
                }
                slots[i].child = Some(spawn(&proxy, &slots[i], rng.random(), None)?);
                faults.processor_crashes += 1;
            }
            _ => {
                if let Some(disk) = &tmpfs {
                    let filled = disk.fill()?;
                    tracing::info!(round = faults.rounds, filled, "disk full");
                    tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
                    disk.free()?;
                    faults.disk_full += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..300))).await;
    }

    // Drain: no more faults; processors and devices finish, against
    // servers armed with nothing.
    stop_db_faults.store(true, Ordering::Relaxed);
    if let Some(links) = &links {
        links.set_commit_loss_rate(0.0);
    }
    if let Some(task) = db_fault_task {
        faults.db_episodes = task.await.context("the database fault task")?;
    }
    for server in &mut nodes {
        revive(server, &injection, &mut rng, &mut faults).await?;
        if server.armed() != Arming::default() {
            kill(server, &mut faults).await?;
            restart(
                server,
                &Injection {
                    failpoints: false,
                    points: &[],
                    pauses: None,
                    passes: 1,
                    disk_errors: false,
                },
                &mut rng,
                &mut faults,
            )
            .await?;
        }
    }
    let server = &nodes[0];
    proxy.set_fault_rate(0.0);
    stop_devices.store(true, Ordering::Relaxed);
    let mut devices = device_task.await.context("the device task")?;
    for slot in &mut slots {
        if let Some(child) = slot.child.take()
            && let Some(ended) = child.stop(Duration::from_secs(30)).await?
        {
            eprintln!("{ended}");
            faults.processor_exits += 1;
        }
    }
    let direct = server.admin.base_url().to_owned();
    let mut processors = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let client = child::sim_client(&direct, &slot.token)?;
        let config = child::config(slot.db.clone(), args.seed + 1000 + i as u64);
        processors.push((
            slot.db.clone(),
            Processor::open(&slot.sqlite, client, config)?,
        ));
    }
    drain(&server.admin, &mut processors, &mut devices).await;
    for node in &nodes {
        for (point, n) in node.paused() {
            *faults.failpoint_pauses.entry(point).or_default() += n;
        }
    }
    if let Some(links) = &links {
        faults.commits_lost = links.commits_lost();
    }
    if args.skewed_node.is_some()
        && let Some(skewed) = nodes.last()
    {
        let warnings = std::fs::read_to_string(skewed.log())?
            .matches(SKEW_WARNING)
            .count();
        if warnings == 0 {
            eprintln!(
                "the skewed node's log ({}) never says {SKEW_WARNING:?}: its clock was not off",
                skewed.log().display()
            );
        }
        faults.skew_warnings = Some(warnings);
    }
    let mut summary = check::check(
        &nodes,
        &processors,
        &devices,
        &faults,
        proxy.faults(),
        links.as_ref().map_or(0, Proxy::faults),
    )
    .await?;
    for server in &mut nodes {
        if let Some(status) = server.kill9().await? {
            ended_by_itself(server, status, summary.faults_mut());
        }
    }
    drop(tmpfs);
    drop(postgres);
    if !summary.passed() {
        // Keep the evidence of a failed run.
        let kept = temp.map_or(work, tempfile::TempDir::keep);
        eprintln!("work folder kept: {}", kept.display());
    }
    Ok(summary)
}

/// libfaketime, which gives a process a wall clock of its own (Debian's
/// `faketime` package).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// What a node's log says when its wall clock is off from the database
/// server's.
const SKEW_WARNING: &str = "this node's clock is off from the database server's";

/// The PostgreSQL under the nodes: a primary, and for failovers its
/// synchronous standby.
struct Database {
    /// One server, or two (a primary and its standby).
    servers: Vec<Postgres>,
    /// Which of `servers` is the primary.
    primary: usize,
}

impl Database {
    /// A fresh primary, with a synchronous standby if `standby`.
    fn start(standby: bool) -> anyhow::Result<Database> {
        let primary = Postgres::start()?;
        let mut servers = Vec::new();
        if standby {
            servers.push(primary.standby()?);
        }
        servers.insert(0, primary);
        Ok(Database {
            servers,
            primary: 0,
        })
    }

    /// The servers' addresses, in their order (the primary's first).
    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers
            .iter()
            .map(|s| SocketAddr::from(([127, 0, 0, 1], s.port())))
            .collect()
    }

    /// The nodes' store URL: with a standby, both hosts, the writable one
    /// picked at each connection (the same URL through every failover).
    /// `via`: the addresses to reach the servers at instead of their own
    /// (a proxy's, one per server, in [`Database::addrs`]'s order).
    /// `hold_limit`: PostgreSQL's bound on a session idle in a transaction
    /// or leaving data unacknowledged (the server's default when none).
    fn url(&self, via: Option<&[SocketAddr]>, hold_limit: Option<Duration>) -> String {
        let hosts: Vec<String> = match via {
            Some(addrs) => addrs.iter().map(SocketAddr::to_string).collect(),
            None => self.servers.iter().map(Postgres::host_port).collect(),
        };
        let mut params = Vec::new();
        let hosts = match hosts.as_slice() {
            [a, b] => {
                params.push("target_session_attrs=read-write".to_owned());
                format!("{a},{b}")
            }
            _ => hosts[self.primary].clone(),
        };
        if let Some(hold) = hold_limit {
            let ms = hold.as_millis();
            params.push(format!(
                "options=-c%20idle_in_transaction_session_timeout%3D{ms}%20-c%20tcp_user_timeout%3D{ms}"
            ));
        }
        match params.is_empty() {
            true => format!("postgres://postgres@{hosts}/postgres"),
            false => format!("postgres://postgres@{hosts}/postgres?{}", params.join("&")),
        }
    }

    /// `kill -9` of the primary, its standby promoted, and the old primary
    /// made the new one's synchronous standby (a base backup at its old
    /// address), ready for the next failover.
    fn fail_over(&mut self) -> anyhow::Result<()> {
        let [a, b] = self.servers.as_slice() else {
            bail!("a failover needs a standby");
        };
        let (old, new) = if self.primary == 0 { (a, b) } else { (b, a) };
        old.kill()?;
        new.promote()?;
        new.rebuild_standby(old)
            .context("making the old primary a standby of the new one")?;
        self.primary = 1 - self.primary;
        Ok(())
    }
}

/// Episodes of faults between the nodes and PostgreSQL until `stop`: 1–5 s
/// without, then 0.5–2 s in which `share` of the connections, open or new,
/// get one ([`Proxy::links`]); how many episodes there were.
async fn db_fault_episodes(links: Proxy, share: f64, seed: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut episodes = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..5000))).await;
        if stop.load(Ordering::Relaxed) {
            return episodes;
        }
        tracing::info!(
            episode = episodes + 1,
            "faults between the nodes and PostgreSQL"
        );
        links.set_fault_rate(share);
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
        links.set_fault_rate(0.0);
        episodes += 1;
    }
}

/// Whether a failover is due at `round` of `rounds` (at least), `done` of
/// `wanted` made: the k-th of K at round k·rounds/(K+1), spread evenly
/// with time to drain around each; more than one in a round when the
/// rounds are fewer than the failovers.
fn failover_due(round: u64, rounds: u64, done: u64, wanted: u64) -> bool {
    done < wanted && round * (wanted + 1) >= (done + 1) * rounds.max(1)
}

/// A port that was free a moment ago (the server binds it at every start).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// One enterprise with `args.databases` databases and `args.devices` devices.
async fn provision(
    admin: &Client,
    proxy: &Proxy,
    args: &RunArgs,
    sqlite_dir: &Path,
) -> anyhow::Result<(Vec<Slot>, Vec<Device>)> {
    let ent: Id = "harness".parse()?;
    let sales: Id = "sales".parse()?;
    admin.create_enterprise(&ent).await?;
    admin.create_subsystem(&ent, &sales).await?;
    let mut slots = Vec::new();
    for i in 0..args.databases.max(1) {
        let db: Id = format!("db-{i}").parse()?;
        let creds = admin.create_database(&ent, &db).await?;
        slots.push(Slot {
            sqlite: sqlite_dir.join(format!("{db}.sqlite")),
            db,
            token: creds.token,
            child: None,
        });
    }
    let mut devices = Vec::new();
    for i in 0..args.devices.max(1) {
        let id: Id = format!("dev-{i}").parse()?;
        let creds = admin.create_device(&ent, &id, &sales).await?;
        let client = child::sim_client(&proxy.url(), &creds.token)?;
        let mut device = Device::new(client, id, &format!("s{}", args.seed));
        device.set_retries(3, Duration::from_millis(200));
        devices.push(device);
    }
    Ok((slots, devices))
}

fn spawn(
    proxy: &Proxy,
    slot: &Slot,
    seed: u64,
    stop_at: Option<Step>,
) -> anyhow::Result<ProcessorChild> {
    ProcessorChild::spawn(
        &proxy.url(),
        &slot.token,
        &slot.db,
        &slot.sqlite,
        seed,
        stop_at,
    )
}

/// Whether a processor stopped after `step` holds back the commit of a
/// process whose prepare was answered (READY_TO_COMMIT on the server).
fn withholds_commit(step: Step) -> bool {
    matches!(step, Step::Prepared | Step::CommittedLocally)
}

/// Replaces the slot's processor with one that stops at `step` and kills
/// it there (or, when it does not get there in time, wherever it is),
/// leaving the slot without one; the process it stopped in, if it got
/// there.
async fn stop_processor(
    proxy: &Proxy,
    slot: &mut Slot,
    step: Step,
    seed: u64,
    faults: &mut Faults,
) -> anyhow::Result<Option<ProcessId>> {
    if let Some(child) = slot.child.take() {
        kill_processor(child, faults).await?;
    }
    let mut doomed = spawn(proxy, slot, seed, Some(step))?;
    let reached = doomed.reached(Duration::from_secs(5)).await?;
    tracing::info!(db = %slot.db, step = step.name(), process = ?reached, "killing a processor");
    kill_processor(doomed, faults).await?;
    Ok(reached)
}

/// The devices' traffic: each uploads to a random database, then reads
/// and acknowledges its inbox, until `stop`. Failures are left to the next
/// turn (an upload stays in the outbox with its key).
async fn devices_loop(
    mut devices: Vec<Device>,
    dbs: Vec<Id>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Vec<Device> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xde71ce);
    while !stop.load(Ordering::Relaxed) {
        for device in &mut devices {
            let to = &dbs[rng.random_range(0..dbs.len())];
            if let Err(e) = device.compose(to) {
                tracing::warn!(error = %e, "composing a message");
            }
            if let Err(e) = device.flush().await {
                tracing::debug!(error = %e, "upload failed; kept in the outbox");
            }
            if let Err(e) = device.poll(50).await {
                tracing::debug!(error = %e, "inbox read failed");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    devices
}

/// Lets processors and devices finish: uploads flushed, queues empty,
/// processes settled, scheduled replies delivered, replies read. Returns
/// when everything is quiet or after [`DRAIN_BOUND`] (what is left then
/// counts as stuck).
async fn drain(admin: &Client, processors: &mut [(Id, Processor)], devices: &mut [Device]) {
    let began = Instant::now();
    while began.elapsed() < DRAIN_BOUND {
        let mut quiet = true;
        for device in devices.iter_mut() {
            if let Err(e) = device.flush().await {
                tracing::warn!(device = %device.id(), error = %e, "drain: upload failed");
            }
            if device.unsent() > 0 {
                quiet = false;
            }
        }
        for (db, p) in processors.iter_mut() {
            if let Err(e) = p.run_until_idle().await {
                tracing::warn!(%db, error = %e, "drain: processor cycle failed");
                quiet = false;
            }
            let waiting = admin
                .folder(db, Folder::Messages)
                .await
                .map(|l| l.files.len());
            if !matches!(waiting, Ok(0)) || !matches!(p.unsettled(), Ok(0)) {
                quiet = false;
            }
        }
        let live = admin
            .processes()
            .await
            .map(|l| l.processes.iter().any(|p| p.state.is_live()));
        if !matches!(live, Ok(false)) {
            quiet = false;
        }
        // Asked before the devices read their inboxes: nothing scheduled
        // then means every scheduled reply was delivered, so the reads
        // below see it. Asked after them, a delivery between the two
        // would end the drain with its reply unread.
        if !matches!(admin.scheduled_messages().await, Ok(Some(0))) {
            quiet = false;
        }
        for device in devices.iter_mut() {
            while let Ok(n) = device.poll(100).await {
                if n == 0 {
                    break;
                }
                quiet = false;
            }
        }
        if quiet {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::failover_due;

    /// The rounds at which failovers happen, and how many at each.
    fn schedule(rounds: u64, wanted: u64) -> Vec<(u64, u64)> {
        let mut done = 0;
        let mut at = Vec::new();
        for round in 1..=rounds {
            let before = done;
            while failover_due(round, rounds, done, wanted) {
                done += 1;
            }
            if done > before {
                at.push((round, done - before));
            }
        }
        at
    }

    #[test]
    fn failovers_are_spread_over_the_rounds() {
        assert_eq!(schedule(20, 0), vec![]);
        assert_eq!(schedule(20, 1), vec![(10, 1)]);
        assert_eq!(schedule(20, 2), vec![(7, 1), (14, 1)]);
        assert_eq!(schedule(60, 3), vec![(15, 1), (30, 1), (45, 1)]);
        assert_eq!(schedule(2, 3), vec![(1, 2), (2, 1)]);
    }
}
