//! The processor child process: `estafeta-harness processor …` runs a
//! [`Processor`] in a loop until it is killed; with `--stop-at STEP` it
//! prints `at STEP PROCESS` when it reaches that step and freezes there,
//! so that the harness kills it (`kill -9`) exactly at that point of its
//! cycle. When its standard input closes, it finishes the cycle it is in
//! and exits (the drain's gentle stop). Its standard error goes to a file,
//! whose tail the harness shows when the child ends by itself.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use estafeta_client::Client;
use estafeta_sim::{Processor, ProcessorConfig, Step};
use estafeta_wire::{Id, ProcessId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::exit;

/// The client timeout of simulated clients: shorter than a server pause.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The options of `estafeta-harness processor`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ProcessorArgs {
    /// The server (or proxy) URL.
    #[arg(long)]
    url: String,
    /// The database's token.
    #[arg(long)]
    token: String,
    /// The database id.
    #[arg(long)]
    db: String,
    /// The processor's SQLite file.
    #[arg(long)]
    sqlite: PathBuf,
    /// The seed of its random choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Freeze after this step (started, recorded, accepted, applied,
    /// prepared, committed-locally, settled) and wait to be killed.
    #[arg(long)]
    stop_at: Option<String>,
}

/// A client that keeps no idle connection and gives up after [`CLIENT_TIMEOUT`].
pub(crate) fn sim_client(url: &str, token: &str) -> anyhow::Result<Client> {
    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .pool_max_idle_per_host(0)
        .build()?;
    Ok(Client::from_reqwest(url, token, http)?)
}

/// The rates the harness's processors run with.
pub(crate) fn config(db: Id, seed: u64) -> ProcessorConfig {
    let mut config = ProcessorConfig::new(db);
    config.seed = seed;
    config.reject_rate = 0.05;
    config.deadlock_rate = 0.05;
    config.incorrect_rate = 0.05;
    config.commit_failure_rate = 0.05;
    // A share of the replies goes through the scheduler (`deliver_at`),
    // so that its hand-offs face the same faults.
    config.scheduled_reply_rate = 0.2;
    config.reply_delay = Duration::from_secs(1);
    config
}

/// The child's `main`.
pub(crate) fn processor_main(args: ProcessorArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(processor_loop(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("processor failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn processor_loop(args: ProcessorArgs) -> anyhow::Result<()> {
    let db: Id = args.db.parse()?;
    let client = sim_client(&args.url, &args.token)?;
    let mut processor = Processor::open(&args.sqlite, client, config(db, args.seed))?;
    if let Some(name) = &args.stop_at {
        let stop = Step::from_name(name).with_context(|| format!("unknown step {name:?}"))?;
        processor.set_step_hook(Box::new(move |step, pid| {
            if step == stop {
                println!("at {} {pid}", step.name());
                // Frozen here, with whatever is open, until `kill -9`.
                loop {
                    std::thread::park();
                }
            }
        }));
    }
    let closed = Arc::new(AtomicBool::new(false));
    let watch = closed.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        watch.store(true, Ordering::Relaxed);
    });
    while !closed.load(Ordering::Relaxed) {
        match processor.run_once().await {
            Ok(estafeta_sim::Cycle::Idle | estafeta_sim::Cycle::Busy) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::info!(error = %e, "cycle failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(())
}

/// This executable, as it was at the first call: on Linux the path of a
/// running binary that was replaced (rebuilt) since reads as "… (deleted)".
fn harness_exe() -> anyhow::Result<&'static Path> {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    if let Some(exe) = EXE.get() {
        return Ok(exe);
    }
    let exe = std::env::current_exe().context("finding the harness executable")?;
    Ok(EXE.get_or_init(|| exe))
}

/// Records this executable's path before anything can replace it.
pub(crate) fn remember_exe() -> anyhow::Result<()> {
    harness_exe().map(drop)
}

/// The parent's handle on a processor child.
pub(crate) struct ProcessorChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// Where its standard error is appended (its errors, a panic), to show
    /// when it ends by itself.
    log: PathBuf,
    /// Where this child's part of the log begins.
    log_from: u64,
}

impl ProcessorChild {
    /// Starts a processor child of this executable, its standard error
    /// appended to the file beside its SQLite file (`<db>.log`).
    pub(crate) fn spawn(
        url: &str,
        token: &str,
        db: &Id,
        sqlite: &Path,
        seed: u64,
        stop_at: Option<Step>,
    ) -> anyhow::Result<ProcessorChild> {
        let log = sqlite.with_extension("log");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let log_from = stderr.metadata()?.len();
        let mut cmd = Command::new(harness_exe()?);
        cmd.arg("processor")
            .args(["--url", url, "--token", token, "--db", db.as_str()])
            .arg("--sqlite")
            .arg(sqlite)
            .args(["--seed", &seed.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        if let Some(step) = stop_at {
            cmd.args(["--stop-at", step.name()]);
        }
        let mut child = cmd.spawn().context("starting a processor child")?;
        let stdout = child.stdout.take().context("the processor's stdout")?;
        let stdin = child.stdin.take();
        Ok(ProcessorChild {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            log,
            log_from,
        })
    }

    /// Waits (at most `within`) until the child says it reached its stop
    /// step; the process it stopped in, or `None` when it did not get
    /// there in time.
    pub(crate) async fn reached(&mut self, within: Duration) -> anyhow::Result<Option<ProcessId>> {
        match tokio::time::timeout(within, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => match line.strip_prefix("at ").and_then(|l| l.split_once(' ')) {
                Some((_, pid)) => Ok(Some(pid.parse()?)),
                None => bail!("unexpected line from a processor: {line}"),
            },
            Ok(Ok(None)) => bail!("a processor exited: {:?}", self.child.wait().await),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Ok(None),
        }
    }

    /// Closes its standard input and waits (at most `within`) for it to
    /// finish its cycle and exit; kills it when it does not. `None` when it
    /// exited as asked (or was killed), or how it failed and its log's
    /// tail.
    pub(crate) async fn stop(mut self, within: Duration) -> anyhow::Result<Option<String>> {
        drop(self.stdin.take());
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                Ok((!status.success()).then(|| self.ended(status)))
            }
            Err(_) => {
                self.child.start_kill()?;
                self.child.wait().await?;
                Ok(None)
            }
        }
    }

    /// `kill -9` and wait for it to be gone: `None` when the signal ended
    /// it, or how it ended by itself before the signal could (see
    /// [`exit::kill9`]) and its log's tail.
    pub(crate) async fn kill9(mut self) -> anyhow::Result<Option<String>> {
        let own = exit::kill9(&mut self.child).await?;
        Ok(own.map(|status| self.ended(status)))
    }

    /// What a processor that ended by itself with `status` says of it.
    fn ended(&self, status: ExitStatus) -> String {
        format!(
            "a processor ended by itself ({status})\n{}",
            exit::log_tail(&self.log, self.log_from)
        )
    }
}
