//! `estafeta-powerloss`: a power-loss checker in the manner of ALICE and
//! CrashMonkey.
//!
//! It runs a workload ([`workload`]) against the real `estafeta` server
//! running under `strace` ([`record`](mod@record)), which records every call that
//! changes a file or folder or makes something durable, with its data.
//! It replays them in a model of what a power loss may keep ([`model`]):
//! at a cut after every operation, the crash states the file system's
//! ordering allows, bounded and seeded. The model must end where the real
//! file system did (compared byte for byte), and every traced call under
//! the data folder must be one it knows, or the run fails. Each distinct
//! crash state (with what was acknowledged before its cut) is made a real
//! folder, the real server starts on it (its start-up recovery) and the
//! clients recover as they would ([`verify`]): nothing acknowledged may be
//! lost, nothing duplicated, nothing stuck. It prints one summary line and
//! exits 1 on a violation (2 if the run itself failed).

mod model;
mod record;
mod verify;
mod workload;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::model::{Bounds, Candidate};
use crate::verify::{Server, Timeouts};
use crate::workload::Journal;

/// Power-loss checker for Estafeta.
#[derive(Debug, Parser)]
#[command(name = "estafeta-powerloss")]
struct Cli {
    /// The `estafeta` binary (default: next to this executable).
    #[arg(long, value_name = "PATH")]
    estafeta: Option<PathBuf>,
    /// Uploads in each of the workload's three batches (at least 4: each
    /// device to each database).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(4..))]
    uploads: u64,
    /// Prefixes of the unsynced operations tried at each cut.
    #[arg(long, default_value_t = 4)]
    prefixes: usize,
    /// Random mixes of folder prefixes and torn pages tried at each cut.
    #[arg(long, default_value_t = 2)]
    random: usize,
    /// The seed of the random mixes and of the sample.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Check a sample of this many of the distinct crash states (seeded),
    /// and the last cut's; all of them when not given.
    #[arg(long)]
    max_states: Option<usize>,
    /// Crash states checked at the same time (each runs its own server).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// The working folder (trace, crash states); a temporary one when not
    /// given, removed after a clean run.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// End the recorded run with a clean stop (SIGTERM) rather than a
    /// kill, so that the cuts include the stop's own writes (the sessions'
    /// last save, the sync of the data folder, the clean stop's marker).
    #[arg(long)]
    clean_stop: bool,
}

/// What a run found.
struct Summary {
    operations: usize,
    barriers: usize,
    acknowledged: usize,
    states: usize,
    checked: usize,
    violations: Vec<(usize, String)>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let began = Instant::now();
    match runtime.block_on(run(cli)) {
        Ok(s) => {
            for (state, violation) in &s.violations {
                eprintln!("crash state {state}: {violation}");
            }
            let distinct: BTreeSet<&str> = s.violations.iter().map(|v| v.1.as_str()).collect();
            println!(
                "workloads=1 operations={} barriers={} acknowledged={} crash_states={} checked={} \
                 violations={} distinct={} seconds={}",
                s.operations,
                s.barriers,
                s.acknowledged,
                s.states,
                s.checked,
                s.violations.len(),
                distinct.len(),
                began.elapsed().as_secs()
            );
            if s.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("powerloss failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<Summary> {
    let binary = match &cli.estafeta {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the executable has no folder")?
            .join("estafeta"),
    };
    if !binary.is_file() {
        bail!(
            "no estafeta binary at {} (build it, or give --estafeta PATH)",
            binary.display()
        );
    }
    let temp = match &cli.workdir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("estafeta-powerloss-")
                .tempdir()?,
        ),
    };
    let work = match (&cli.workdir, &temp) {
        (Some(dir), _) => dir.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => bail!("no work folder"),
    };
    // The server makes its data folder inside `root`, which exists before
    // it starts (and is all the model takes as given).
    let root = work.join("fs");
    let states_dir = work.join("states");
    for dir in [&root, &states_dir] {
        std::fs::create_dir_all(dir)?;
    }
    let root = root.canonicalize()?;
    let began = Instant::now();
    let (journal, events) =
        record(&binary, &work, &root, cli.uploads as usize, cli.clean_stop).await?;
    eprintln!(
        "recorded {} operations in {:.1?}",
        events.len(),
        began.elapsed()
    );
    let barriers = events
        .iter()
        .filter(|e| matches!(e.op, record::Op::Sync(_) | record::Op::SyncAll))
        .count();
    let bounds = Bounds {
        prefixes: cli.prefixes,
        random: cli.random,
        seed: cli.seed,
    };

    // Every distinct (crash state, what was acknowledged before its cut),
    // in the order the cuts come; the model must end where the disk did.
    let mut seen = HashSet::new();
    let mut order: Vec<(usize, u128, Vec<bool>)> = Vec::new();
    let fs = model::explore(&root, &events, &bounds, |c| {
        let key = (model::digest(&c.state), journal.signature(c.until));
        if seen.insert(key.clone()) {
            order.push((c.cut, key.0, key.1));
        }
    })?;
    let differences = model::differences(&fs.current(), &root)?;
    if !differences.is_empty() {
        // The model's view beside the disk's, to compare.
        let model_dir = work.join("model");
        model::materialize(&fs.current(), &model_dir)?;
        let _ = temp.map(tempfile::TempDir::keep);
        bail!(
            "the model does not end where the file system did (a change it did not see; its \
             view is in {}):\n{}",
            model_dir.display(),
            differences.join("\n")
        );
    }
    let states = order.len();
    eprintln!(
        "{states} distinct crash states, explored in {:.1?}",
        began.elapsed()
    );
    let mut chosen: Vec<(usize, u128, Vec<bool>)> = match cli.max_states {
        Some(max) if max < states => {
            let last_cut = order.last().map_or(0, |o| o.0);
            let (mut last, mut rest): (Vec<_>, Vec<_>) =
                order.into_iter().partition(|o| o.0 == last_cut);
            rest.shuffle(&mut StdRng::seed_from_u64(cli.seed));
            rest.truncate(max);
            last.extend(rest);
            last
        }
        _ => order,
    };
    chosen.sort_by_key(|o| o.0);
    let checked = chosen.len();
    let wanted: HashSet<(u128, Vec<bool>)> = chosen.into_iter().map(|(_, d, s)| (d, s)).collect();

    let journal = Arc::new(journal);
    let violations = check_all(
        &root,
        &events,
        &bounds,
        wanted,
        &journal,
        cli.jobs.max(1),
        &binary,
        &states_dir,
    )
    .await?;
    if !violations.is_empty() {
        let kept = temp.map_or(work, tempfile::TempDir::keep);
        eprintln!("work folder kept: {}", kept.display());
    }
    Ok(Summary {
        operations: events.len(),
        barriers,
        acknowledged: journal.count(),
        states,
        checked,
        violations,
    })
}

/// Runs the workload against the server under strace, ended by a kill or
/// a `clean_stop`; the journal and the events of the trace. Fails on a
/// traced call the model does not know.
async fn record(
    binary: &Path,
    work: &Path,
    root: &Path,
    uploads: usize,
    clean_stop: bool,
) -> anyhow::Result<(Journal, Vec<record::Event>)> {
    let trace_file = work.join("trace.txt");
    let port = free_port()?;
    let mut cmd = tokio::process::Command::from(record::strace_command(binary, &trace_file));
    cmd.current_dir(root);
    let server = Server::start(
        cmd,
        &root.join("data"),
        port,
        &work.join("recorded.log"),
        Timeouts::Recorded,
    )
    .await?;
    let journal = workload::run(&server.admin, uploads).await;
    // The server is strace's child. Stopped first, so that every call
    // under way completes and is traced, then killed (strace ends with
    // it); the page cache holds what it wrote, which the model must match.
    // Or stopped cleanly, its stop traced to its end.
    if let Some(strace) = server.id() {
        if clean_stop {
            signal_children(strace, "-TERM")?;
        } else {
            signal_children(strace, "-STOP")?;
            quiet(&trace_file).await?;
            signal_children(strace, "-KILL")?;
        }
    }
    server.wait().await?;
    let journal = journal.context("the workload")?;
    let trace = record::read_trace(&trace_file, root, root)?;
    if !trace.unmodelled.is_empty() {
        bail!(
            "{} traced calls the model does not know (the trace is {}):\n{}",
            trace.unmodelled.len(),
            trace_file.display(),
            trace
                .unmodelled
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // The recorded events, for reading a violation against them.
    let listing: String = trace
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{} {:.6} {}\n", i + 1, e.at, describe(&e.op)))
        .collect();
    std::fs::write(work.join("events.txt"), listing)?;
    Ok((journal, trace.events))
}

/// One line for an event (a write's data by its length).
fn describe(op: &record::Op) -> String {
    match op {
        record::Op::Write {
            path,
            offset,
            bytes,
        } => format!(
            "Write {} at {offset}, {} bytes",
            path.display(),
            bytes.len()
        ),
        other => format!("{other:?}"),
    }
}

/// Checks the `wanted` crash states, `jobs` at a time, each on its own
/// port and in its own folder under `states_dir` (removed when clean): a
/// second replay of the model hands them over as it makes them; the
/// violations, by crash state.
#[allow(clippy::too_many_arguments)]
async fn check_all(
    root: &Path,
    events: &[record::Event],
    bounds: &Bounds,
    wanted: HashSet<(u128, Vec<bool>)>,
    journal: &Arc<Journal>,
    jobs: usize,
    binary: &Path,
    states_dir: &Path,
) -> anyhow::Result<Vec<(usize, String)>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Candidate>(jobs * 2);
    let producer = {
        let (root, events, bounds, journal) =
            (root.to_owned(), events.to_vec(), *bounds, journal.clone());
        std::thread::spawn(move || {
            let mut wanted = wanted;
            model::explore(&root, &events, &bounds, |c| {
                let key = (model::digest(&c.state), journal.signature(c.until));
                if wanted.remove(&key) {
                    // The receiver gone (a check failed) ends the replay's use.
                    let _ = tx.blocking_send(c);
                }
            })
            .map(drop)
        })
    };
    let total = events.len();
    let ports = Ports::default();
    let mut running = tokio::task::JoinSet::new();
    let mut violations = Vec::new();
    let mut index = 0;
    loop {
        while running.len() < jobs {
            let Some(c) = rx.recv().await else {
                break;
            };
            index += 1;
            let (binary, dir, journal) = (
                binary.to_owned(),
                states_dir.join(index.to_string()),
                journal.clone(),
            );
            let port = ports.take()?;
            let ports = ports.clone();
            running.spawn(async move {
                let fs = dir.join("fs");
                model::materialize(&c.state, &fs)?;
                let found = verify::check_state(&binary, &fs, &journal, c.until, port).await;
                ports.give_back(port);
                let found = found?;
                if found.is_empty() {
                    std::fs::remove_dir_all(&dir)?;
                } else {
                    let files: Vec<String> =
                        c.state.keys().map(|p| p.display().to_string()).collect();
                    let files = if files.is_empty() {
                        "(none: the data folder is gone)".to_owned()
                    } else {
                        files.join(" ")
                    };
                    eprintln!(
                        "crash state {index} (after operation {} of {total}, {}): files {files}",
                        c.cut, c.what
                    );
                }
                anyhow::Ok((index, found))
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (index, found) = done??;
        violations.extend(found.into_iter().map(|v| (index, v)));
    }
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("the model's replay panicked"))??;
    violations.sort_by_key(|v| v.0);
    Ok(violations)
}

/// Sends `signal` (`-STOP`, `-KILL`) to the children of `pid` (the
/// traced server).
fn signal_children(pid: u32, signal: &str) -> anyhow::Result<()> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .context("the server under strace")?;
    for child in children.split_whitespace() {
        std::process::Command::new("kill")
            .args([signal, child])
            .status()
            .context("running kill")?;
    }
    Ok(())
}

/// Waits until the trace in `file` has not grown for a moment (at most
/// ten seconds): the stopped server's last calls are written.
async fn quiet(file: &Path) -> anyhow::Result<()> {
    let began = Instant::now();
    let mut size = std::fs::metadata(file)?.len();
    while began.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = std::fs::metadata(file)?.len();
        if now == size {
            return Ok(());
        }
        size = now;
    }
    bail!("the trace kept growing after the server was stopped")
}

/// The ports the running checks' servers hold, so that no two get the same.
#[derive(Clone, Default)]
struct Ports(Arc<std::sync::Mutex<HashSet<u16>>>);

impl Ports {
    /// A free port no running check holds.
    fn take(&self) -> anyhow::Result<u16> {
        loop {
            let port = free_port()?;
            if self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(port)
            {
                return Ok(port);
            }
        }
    }

    fn give_back(&self, port: u16) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&port);
    }
}

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
