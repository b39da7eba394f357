//! `estafeta-powerloss`: a power-loss checker.
//!
//! It runs a short workload against the real `estafeta` server running
//! under `strace` ([`record`]): every `fsync`/`fdatasync` stops the server
//! for a moment while the file's durable contents are copied, and the
//! namespace operations are recorded in order. It then replays the trace
//! in a model of what POSIX makes durable ([`model`]), builds the crash
//! states a power loss may leave at every cut at or between sync
//! barriers, makes each a real folder, starts the real server on it
//! (start-up recovery) and checks ([`verify`]) that nothing acknowledged
//! before the cut is lost, nothing is duplicated and nothing is stuck.
//! It prints one summary line and exits 1 when it found a violation.

mod model;
mod record;
mod verify;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use clap::Parser;

use crate::record::Trace;
use crate::verify::{Acks, Server};

/// Power-loss checker for Estafeta.
#[derive(Debug, Parser)]
#[command(name = "estafeta-powerloss")]
struct Cli {
    /// The `estafeta` binary (default: next to this executable).
    #[arg(long, value_name = "PATH")]
    estafeta: Option<PathBuf>,
    /// Uploads in the workload (half before the processor's cycle).
    #[arg(long, default_value_t = 4)]
    uploads: usize,
    /// Check at most this many crash states (spread over the whole run).
    #[arg(long)]
    max_states: Option<usize>,
    /// Crash states checked at the same time (each runs its own server).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// The working folder (trace, copies, crash states); a temporary one
    /// when not given.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
}

/// What a run found.
struct Summary {
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
    match runtime.block_on(run(cli)) {
        Ok(s) => {
            for (state, violation) in &s.violations {
                eprintln!("crash state {state}: {violation}");
            }
            let distinct: BTreeSet<&str> = s.violations.iter().map(|v| v.1.as_str()).collect();
            println!(
                "workloads=1 barriers={} acknowledged={} crash_states={} checked={} violations={} distinct={}",
                s.barriers,
                s.acknowledged,
                s.states,
                s.checked,
                s.violations.len(),
                distinct.len()
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
    let snapshots = work.join("snapshots");
    let states_dir = work.join("states");
    for dir in [&root, &snapshots, &states_dir] {
        std::fs::create_dir_all(dir)?;
    }
    let root = root.canonicalize()?;
    let fifo = work.join("trace.fifo");
    record::make_fifo(&fifo)?;

    let trace = Arc::new(Mutex::new(Trace::default()));
    let reader = {
        let (fifo, root, snapshots, trace) =
            (fifo.clone(), root.clone(), snapshots.clone(), trace.clone());
        std::thread::spawn(move || record::read_trace(&fifo, &root, &snapshots, trace))
    };
    let port = free_port()?;
    let mut cmd = tokio::process::Command::from(record::strace_command(&binary, &fifo));
    cmd.current_dir(&root);
    let server = Server::start(cmd, &root.join("data"), port, &work.join("recorded.log")).await?;
    let acks: anyhow::Result<Acks> = verify::workload(&server.admin, cli.uploads).await;
    // The server is strace's child: kill it, and strace ends with it.
    if let Some(strace) = server.id() {
        kill_children(strace)?;
    }
    server.wait().await?;
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the trace reader panicked"))??;
    let acks = acks?;
    let acknowledged = acks.count();
    let trace = std::mem::take(&mut *trace.lock().expect("trace lock"));
    if trace.unparsed > 0 {
        eprintln!("{} traced calls could not be read", trace.unparsed);
    }
    // The recorded events, for reading a violation against them.
    let listing: String = trace.events.iter().map(|e| format!("{e:?}\n")).collect();
    std::fs::write(work.join("events.txt"), listing)?;
    let (cuts, misplaced) = model::cuts(&root, &trace.events);
    if misplaced > 0 {
        eprintln!("{misplaced} recorded operations did not fit the model");
    }
    let barriers = cuts.len() - 1;

    // Every (crash state, what was acknowledged) pair once.
    let mut seen = BTreeSet::new();
    let mut todo = Vec::new();
    for cut in &cuts {
        let signature = acks.signature(cut.until);
        for state in cut.states() {
            if seen.insert((state.clone(), signature.clone())) {
                todo.push((cut.barriers, cut.until, state));
            }
        }
    }
    let states = todo.len();
    if let Some(max) = cli.max_states.filter(|&m| m > 0 && m < states) {
        let step = states as f64 / max as f64;
        todo = (0..max)
            .map(|i| todo[(i as f64 * step) as usize].clone())
            .collect();
        // The last cut (everything done) is always among them.
        if let Some(last) = strictest_last(&cuts) {
            todo.push(last);
        }
    }
    let checked = todo.len();
    let mut outcomes =
        check_all(todo, cli.jobs.max(1), &binary, &states_dir, Arc::new(acks)).await?;
    outcomes.sort_by_key(|o| o.index);
    let mut violations = Vec::new();
    for o in outcomes.into_iter().filter(|o| !o.found.is_empty()) {
        let files: Vec<String> = o.state.keys().map(|p| p.display().to_string()).collect();
        let files = if files.is_empty() {
            "(none: the data folder is gone)".to_owned()
        } else {
            files.join(" ")
        };
        eprintln!(
            "crash state {} (after {} of {barriers} barriers): files {files}",
            o.index, o.at_barrier
        );
        violations.extend(o.found.into_iter().map(|v| (o.index, v)));
    }
    if !violations.is_empty() {
        let kept = temp.map_or(work, tempfile::TempDir::keep);
        eprintln!("work folder kept: {}", kept.display());
    }
    Ok(Summary {
        barriers,
        acknowledged,
        states,
        checked,
        violations,
    })
}

/// A crash state to check: its number, the barriers durable in it, the
/// moment until which the crash can happen, and its files.
type Todo = (usize, f64, model::State);

/// What checking one crash state found.
struct Outcome {
    index: usize,
    at_barrier: usize,
    state: model::State,
    found: Vec<String>,
}

/// Checks every state of `todo`, `jobs` at a time, each on its own port
/// and in its own folder under `states_dir` (removed when clean).
async fn check_all(
    todo: Vec<Todo>,
    jobs: usize,
    binary: &Path,
    states_dir: &Path,
    acks: Arc<Acks>,
) -> anyhow::Result<Vec<Outcome>> {
    let mut queue = todo.into_iter().enumerate();
    let mut running = tokio::task::JoinSet::new();
    let mut ports = BTreeSet::new();
    let mut outcomes = Vec::new();
    loop {
        while running.len() < jobs {
            let Some((index, (at_barrier, until, state))) = queue.next() else {
                break;
            };
            // A port no running server of this run holds.
            let port = loop {
                let port = free_port()?;
                if ports.insert(port) {
                    break port;
                }
            };
            let (binary, dir, acks) = (
                binary.to_owned(),
                states_dir.join(index.to_string()),
                acks.clone(),
            );
            running.spawn(async move {
                let fs = dir.join("fs");
                model::materialize(&state, &fs)?;
                let found = verify::check_state(&binary, &fs, &acks, until, port).await?;
                if found.is_empty() {
                    std::fs::remove_dir_all(&dir)?;
                }
                anyhow::Ok((
                    port,
                    Outcome {
                        index,
                        at_barrier,
                        state,
                        found,
                    },
                ))
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (port, outcome) = done??;
        ports.remove(&port);
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The last cut's strictest state (every unsynced entry lost).
fn strictest_last(cuts: &[model::Cut]) -> Option<Todo> {
    let last = cuts.last()?;
    let mut states = last.states();
    states.truncate(2);
    let state = states.pop()?;
    Some((last.barriers, last.until, state))
}

/// `kill -9` of the children of `pid` (the traced server).
fn kill_children(pid: u32) -> anyhow::Result<()> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .context("the server under strace")?;
    for child in children.split_whitespace() {
        std::process::Command::new("kill")
            .args(["-KILL", child])
            .status()
            .context("running kill")?;
    }
    Ok(())
}

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
