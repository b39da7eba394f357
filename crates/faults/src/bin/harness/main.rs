//! `estafeta-harness`: the end-to-end proof of "no loss, no double
//! processing, nothing stuck" (issue 7).
//!
//! It starts the real `estafeta` binary, provisions an enterprise with
//! databases and devices, runs simulated devices (in this process) and
//! processors (each a child process: this binary's `processor` subcommand,
//! so that a processor can be killed with a real `kill -9`), and injects
//! faults round after round (with `--store postgres --nodes N`, on N nodes
//! over one PostgreSQL, each fault on a node picked at random):
//! `kill -9` of the server at random moments and
//! a restart, the server killing itself at named failpoints around every
//! write, rename and fsync and inside a protocol step (each restart may arm
//! one; the binary must be built with `--features failpoints`), primary
//! failovers of the PostgreSQL under the nodes, `kill -9` of a processor stopped
//! exactly at a step of its cycle, network faults through its own loopback
//! TCP proxy (between the clients and the nodes, and with `--db-faults`
//! between the nodes and PostgreSQL), and a paused server (SIGSTOP past the client timeouts, then
//! SIGCONT); in cluster mode, with `--commit-losses` the answers to
//! `COMMIT`s lost after PostgreSQL committed, with `--failpoint-pauses` a
//! node stalled inside a step past the hold limit, and with
//! `--skewed-node` one node's wall clock minutes off; and with
//! `--disk-full` a full disk (the data folder on a small
//! tmpfs, filled up for a moment; without root, `ENOSPC` injected at the
//! failpoints). Then it drains and checks the invariants ([`check`]), and
//! prints one summary line.
//!
//! - [`server`]: the `estafeta` child process: start, `/readyz`, kill, pause.
//! - [`exit`]: a child's end: the harness's `kill -9`, or one of its own.
//! - [`proxy`]: the fault-injecting TCP proxy, in front of the nodes and of
//!   PostgreSQL.
//! - [`disk`]: the tmpfs and its ballast.
//! - [`outage`]: when the harness held PostgreSQL out of the nodes' reach.
//! - [`child`]: the processor child process, both sides.
//! - [`run`]: provisioning, the rounds of faults, the drain.
//! - [`check`]: the judge (counting from the clients' side) and the summary.

mod check;
mod child;
mod disk;
mod exit;
mod faults;
mod outage;
mod proxy;
mod run;
mod server;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Fault-injection harness for Estafeta.
#[derive(Debug, Parser)]
#[command(name = "estafeta-harness", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one processor until killed (used by the harness itself).
    Processor(child::ProcessorArgs),
}

/// The options of a harness run.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// The `estafeta` binary (default: next to this executable).
    #[arg(long, value_name = "PATH")]
    estafeta: Option<PathBuf>,
    /// Rounds of faults (at least).
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// The seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop injecting faults after this long even if the targets are not met.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Keep going until the server was killed this many times (within `--duration`).
    #[arg(long, default_value_t = 0)]
    server_crashes: u64,
    /// Keep going until the server killed itself at its armed failpoint
    /// this many times (part of `--server-crashes`; within `--duration`).
    #[arg(long, default_value_t = 0, conflicts_with = "no_failpoints")]
    failpoint_crashes: u64,
    /// Do not kill processors at random moments (possibly in the middle of
    /// a call); they are still killed at every step of their cycle.
    #[arg(long)]
    no_random_processor_kills: bool,
    /// Put the data folder on a 64 MB tmpfs and fill it up now and then
    /// (disk-full episodes); without root, inject `ENOSPC` at the server's
    /// failpoints instead.
    #[arg(long)]
    disk_full: bool,
    /// With `--disk-full`: inject `ENOSPC` at the failpoints even as root.
    #[arg(long, requires = "disk_full", conflicts_with = "no_failpoints")]
    inject_disk_errors: bool,
    /// The `estafeta` binary was built without `--features failpoints`:
    /// kill it at random moments only.
    #[arg(long)]
    no_failpoints: bool,
    /// Databases (one processor each).
    #[arg(long, default_value_t = 2)]
    databases: usize,
    /// Devices.
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// Where the server keeps its state: its embedded store, or a
    /// PostgreSQL the harness makes and starts for the run (initdb in the
    /// work folder's temporary sibling; Debian's `postgresql` package), the
    /// cluster store of every node.
    #[arg(long, value_enum, default_value_t = Store::Embedded)]
    store: Store,
    /// Server nodes on the one store, behind the proxy (which spreads the
    /// calls over them); faults hit a node picked at random. More than one
    /// needs `--store postgres`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    nodes: u16,
    /// With `--store postgres`: a synchronous standby, the nodes given
    /// both hosts (`target_session_attrs=read-write`), and this many times,
    /// spread evenly over the rounds, the primary killed with `kill -9` and
    /// the standby promoted while the traffic and the other faults go on;
    /// the old primary is then made the new one's synchronous standby (a
    /// fresh base backup, at its old address) for the next time.
    #[arg(long, default_value_t = 0, conflicts_with = "failover")]
    failovers: u64,
    /// `--failovers 1`.
    #[arg(long)]
    failover: bool,
    /// With `--store postgres`: the nodes reach PostgreSQL through a
    /// fault-injecting proxy, and every 1–5 s, whatever the rounds do,
    /// comes an episode of 0.5–2 s in which this share (0–1) of the
    /// connections between the nodes and PostgreSQL, open or new, gets a
    /// fault a few chunks later: a reset, a partition then a reset
    /// (0.5–4 s, one in eight 11–13 s: past the hold limit of a node's
    /// transaction), or a delay of 0.2–2 s.
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    db_faults: f64,
    /// With `--store postgres`: the nodes reach PostgreSQL through the
    /// fault-injecting proxy, which, until the drain, loses this share
    /// (0–1) of the answers to `COMMIT`s of transactions that wrote: the
    /// server committed, the node sees its connection reset instead.
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    commit_losses: f64,
    /// With `--store postgres`: keep going until the nodes stalled this
    /// many times inside a step, past the hold limit: a quarter of the
    /// starts block the thread of one of their first passes of a point a
    /// step passes between its decision and its writes
    /// (`ESTAFETA_PAUSE_AT`; the points in turn) for 1–3 s longer than the
    /// hold limit, so that PostgreSQL ends the node's transaction and
    /// another node takes the database over meanwhile (within
    /// `--duration`).
    #[arg(long, default_value_t = 0, conflicts_with = "no_failpoints")]
    failpoint_pauses: u64,
    /// With `--store postgres`: how long PostgreSQL lets a node's session
    /// sit idle inside a transaction, or leave data unacknowledged, before
    /// it ends the session and frees its locks (the nodes' URL sets
    /// `idle_in_transaction_session_timeout` and `tcp_user_timeout`); the
    /// server's own default when not given.
    #[arg(long, value_parser = humantime::parse_duration)]
    hold_limit: Option<Duration>,
    /// With `--store postgres`: the last node runs with its wall clock this
    /// many minutes off (negative: behind), under libfaketime (Debian's
    /// `faketime` package), its monotonic clock untouched; its log must
    /// say that its clock is off from the database server's.
    #[arg(long, value_name = "MINUTES", allow_negative_numbers = true)]
    skewed_node: Option<i64>,
    /// The working folder (data, processor databases, server log); a
    /// temporary one when not given.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
}

impl RunArgs {
    /// The primary failovers the run asks for.
    pub(crate) fn failovers(&self) -> u64 {
        if self.failover { 1 } else { self.failovers }
    }
}

/// A share between 0 and 1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// Where the server nodes keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Store {
    /// Files and redb under the node's data folder (one node).
    Embedded,
    /// One PostgreSQL for every node (cluster mode).
    Postgres,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HARNESS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Some(Command::Processor(args)) => child::processor_main(args),
        None => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run::run(cli.run)) {
                Ok(summary) => {
                    eprintln!("{}", summary.details());
                    println!("{}", summary.line());
                    if summary.passed() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("harness failed: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
