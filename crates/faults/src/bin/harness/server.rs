//! The `estafeta` server as a child process: started on a fixed loopback
//! port (so the proxy and the clients survive its restarts), its log
//! appended to a file, killed with SIGKILL, paused with SIGSTOP, and armed
//! at each start to kill itself at a named failpoint, to stall there, or
//! to see a full disk there ([`Arming`]; needs a server built with
//! `--features failpoints`); the stalls it reports are counted, and
//! recorded as outages of the store (a stalled node holds its database's
//! lock). A start is held to [`READY_BOUND`] of its own time: what the
//! harness's outages of the store ([`Outages`]) cover of it does not count.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use estafeta_client::Client;
use estafeta_exchange::failpoints::crash_line;

use crate::exit;
use crate::outage::Outages;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The admin token the harness gives the server.
pub(crate) const ADMIN_TOKEN: &str = "harness-admin-token-0123456789abcdef";

/// The free space (MB) of the data folder's file system under which the
/// server raises its `disk_low` alert: a quarter of the harness's tmpfs
/// ([`crate::disk`]), so that a disk-full episode crosses it both ways.
pub(crate) const DISK_ALERT_MB: u64 = 16;

/// How often the server looks at its free disk space: often enough that
/// its `disk_low` alert follows the episodes.
const DISK_CHECK: &str = "1s";

/// How long the server may take of its own time to answer `/readyz` after
/// a (re)start before the run fails.
pub(crate) const READY_BOUND: Duration = Duration::from_secs(30);

/// The points where an injected full disk (`ENOSPC`) can hit a write, one
/// time in twenty.
const DISK_ERRORS: &str = "mailbox::temp_write=5%return;mailbox::temp_fsync=5%return;\
    mailbox::rename=5%return;mailbox::dir_fsync=5%return;session::commit=5%return";

/// What one start of the server is armed with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Arming {
    /// Kill itself (SIGKILL) the n-th time it passes this point.
    pub(crate) crash_at: Option<(&'static str, u64)>,
    /// Block the thread that passes this point the n-th time for this
    /// long.
    pub(crate) pause_at: Option<(&'static str, u64, Duration)>,
    /// Writes fail now and then as on a full disk.
    pub(crate) disk_errors: bool,
}

impl Arming {
    fn is_armed(self) -> bool {
        self.crash_at.is_some() || self.pause_at.is_some() || self.disk_errors
    }
}

/// How a start ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Started {
    /// Answering `/readyz`, after this long of its own time.
    Ready(Duration),
    /// It killed itself at its armed point before it was ready (start-up
    /// recovery writes too).
    DiedAtFailpoint(&'static str),
}

/// A running (or killed) server child.
pub(crate) struct Server {
    binary: PathBuf,
    /// The cluster store's URL (`ESTAFETA_STORE`); none: the embedded store.
    store: Option<String>,
    /// Variables of its own environment (libfaketime's, for a node whose
    /// wall clock is off).
    env: Vec<(String, String)>,
    /// The stalls at failpoints its processes reported, by point.
    paused: Arc<Mutex<BTreeMap<String, u64>>>,
    data: PathBuf,
    log: PathBuf,
    /// Where the running process's part of the log begins.
    log_from: u64,
    port: u16,
    /// When the harness held the store out of reach.
    outages: Outages,
    child: Option<Child>,
    /// What the running process was armed with.
    armed: Arming,
    /// The admin client, straight to the server (not through the proxy).
    pub(crate) admin: Client,
}

impl Server {
    /// Starts the server (with `env` in its environment) and waits until
    /// it is ready; the time it took.
    pub(crate) async fn start(
        binary: &Path,
        store: Option<&str>,
        env: Vec<(String, String)>,
        data: &Path,
        log: &Path,
        port: u16,
        outages: Outages,
    ) -> anyhow::Result<(Server, Duration)> {
        let admin = Client::with_timeout(
            &format!("http://127.0.0.1:{port}"),
            ADMIN_TOKEN,
            Duration::from_secs(3),
        )?;
        let mut server = Server {
            binary: binary.to_owned(),
            store: store.map(str::to_owned),
            env,
            paused: Arc::default(),
            data: data.to_owned(),
            log: log.to_owned(),
            log_from: 0,
            port,
            outages,
            child: None,
            armed: Arming::default(),
            admin,
        };
        match server.restart(Arming::default()).await? {
            Started::Ready(took) => Ok((server, took)),
            Started::DiedAtFailpoint(point) => bail!("an unarmed server died at {point}"),
        }
    }

    /// The file the server's log is appended to.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// The server's data folder.
    pub(crate) fn data(&self) -> &Path {
        &self.data
    }

    /// The last lines the running (or last) process wrote to its log.
    pub(crate) fn log_tail(&self) -> String {
        exit::log_tail(&self.log, self.log_from)
    }

    /// The stalls at failpoints its processes reported so far, by point.
    pub(crate) fn paused(&self) -> BTreeMap<String, u64> {
        self.paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the running process is armed with.
    pub(crate) fn armed(&self) -> Arming {
        self.armed
    }

    /// Starts the server process (after a kill) armed with `arming`, and
    /// waits for `/readyz`.
    pub(crate) async fn restart(&mut self, arming: Arming) -> anyhow::Result<Started> {
        let began = Instant::now();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        self.log_from = log.metadata()?.len();
        let mut cmd = Command::new(&self.binary);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ESTAFETA_") {
                cmd.env_remove(key);
            }
        }
        cmd.arg("serve")
            .current_dir(&self.data)
            .env("ESTAFETA_DATA_DIR", &self.data)
            .env("ESTAFETA_LISTEN", format!("127.0.0.1:{}", self.port))
            .env("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("ESTAFETA_STARTED_TIMEOUT", "3s")
            .env("ESTAFETA_READY_TIMEOUT", "4s")
            .env("ESTAFETA_MAX_FILES", "5")
            .env("ESTAFETA_DISK_ALERT_MB", DISK_ALERT_MB.to_string())
            .env("ESTAFETA_DISK_CHECK", DISK_CHECK)
            .env("ESTAFETA_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        if let Some(store) = &self.store {
            cmd.env("ESTAFETA_STORE", store);
        }
        if let Some((point, nth)) = arming.crash_at {
            cmd.env("ESTAFETA_CRASH_AT", format!("{point}@{nth}"));
        }
        if let Some((point, nth, pause)) = arming.pause_at {
            cmd.env(
                "ESTAFETA_PAUSE_AT",
                format!("{point}@{nth}={}", pause.as_millis()),
            );
        }
        if arming.disk_errors {
            cmd.env("ESTAFETA_FAILPOINTS", DISK_ERRORS);
        }
        self.armed = arming;
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut has_failpoints = false;
        loop {
            // A node waits for its store before it listens: the bound
            // covers that wait too, but for the harness's outages.
            if self.outages.own_time(began) > READY_BOUND {
                bail!(
                    "the server was not listening within {READY_BOUND:?} of its own\n{}",
                    self.log_tail()
                );
            }
            let Ok(line) =
                tokio::time::timeout(Duration::from_millis(200), lines.next_line()).await
            else {
                continue;
            };
            match line? {
                Some(line) if line.starts_with("listening on ") => break,
                Some(line) if line.starts_with("failpoints armed") => has_failpoints = true,
                Some(line) => note_stall(&line, &self.paused, &self.outages),
                None => {
                    let status = child.wait().await?;
                    if let Some(point) = self.died_at_failpoint(status) {
                        return Ok(Started::DiedAtFailpoint(point));
                    }
                    bail!(
                        "the server exited before listening: {status}\n{}",
                        self.log_tail()
                    )
                }
            }
        }
        if arming.is_armed() && !has_failpoints {
            bail!(
                "{} has no failpoints: build it with \
                 `cargo build -p estafeta-server --features failpoints`, or run with --no-failpoints",
                self.binary.display()
            );
        }
        // Keep reading stdout so the child never blocks on a full pipe,
        // noting the stalls it reports.
        let (paused, outages) = (self.paused.clone(), self.outages.clone());
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                note_stall(&line, &paused, &outages);
            }
        });
        self.child = Some(child);
        while self.outages.own_time(began) <= READY_BOUND {
            if let Ok(true) = self.admin.readyz().await {
                let own = self.outages.own_time(began);
                tracing::info!(port = self.port, ?own, wall = ?began.elapsed(), "the server is ready");
                return Ok(Started::Ready(own));
            }
            if let Some(status) = self.exit_status()? {
                if let Some(point) = self.died_at_failpoint(status) {
                    return Ok(Started::DiedAtFailpoint(point));
                }
                bail!(
                    "the server exited before it was ready: {status}\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "the server was not ready within {READY_BOUND:?} of its own\n{}",
            self.log_tail()
        )
    }

    /// The armed point, when the process killed itself there.
    pub(crate) fn died_at_failpoint(&self, status: ExitStatus) -> Option<&'static str> {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = usize::try_from(self.log_from).unwrap_or(0).min(text.len());
        killed_itself(self.armed, status, &String::from_utf8_lossy(&text[from..]))
    }

    /// `kill -9` and wait for the process to be gone: `None` when the
    /// signal ended it (or none was running), or how it ended by itself
    /// before the signal could (see [`exit::kill9`]).
    pub(crate) async fn kill9(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match self.child.take() {
            Some(mut child) => Ok(exit::kill9(&mut child).await?),
            None => Ok(None),
        }
    }

    /// SIGSTOP for `pause`, then SIGCONT: a hung server.
    pub(crate) async fn pause(&mut self, pause: Duration) -> anyhow::Result<()> {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return Ok(());
        };
        signal("-STOP", pid)?;
        tokio::time::sleep(pause).await;
        signal("-CONT", pid)
    }

    /// How the server process ended, if it has (by itself: a process the
    /// harness killed is no longer watched).
    pub(crate) fn exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }
}

/// The point an armed process (`armed`) that ended with `status` and
/// wrote `log` killed itself at: a SIGKILL with the server's own line for
/// that point before it; a SIGKILL without it came from elsewhere.
fn killed_itself(armed: Arming, status: ExitStatus, log: &str) -> Option<&'static str> {
    match (status.signal(), armed.crash_at) {
        (Some(9), Some((point, _))) if log.lines().any(|l| l == crash_line(point)) => Some(point),
        _ => None,
    }
}

/// The point a server's stdout line says it stalls at, and for how long
/// (`failpoint <point>: pausing for <ms> ms`).
fn stalled_at(line: &str) -> Option<(&str, Duration)> {
    let (point, rest) = line.strip_prefix("failpoint ")?.split_once(": ")?;
    let ms = rest.strip_prefix("pausing for ")?.strip_suffix(" ms")?;
    Some((point, Duration::from_millis(ms.parse().ok()?)))
}

/// Counts the stall a node's stdout `line` reports, if it reports one, in
/// `paused`, and records it in `outages`: the stalled node holds its
/// database's lock until PostgreSQL ends its transaction (at the hold
/// limit, within the stall), so a node starting meanwhile waits for it.
fn note_stall(line: &str, paused: &Mutex<BTreeMap<String, u64>>, outages: &Outages) {
    let Some((point, length)) = stalled_at(line) else {
        return;
    };
    tracing::info!(point, ?length, "a node stalled at its failpoint");
    outages.record(Instant::now(), length);
    let mut paused = paused.lock().unwrap_or_else(|e| e.into_inner());
    *paused.entry(point.to_owned()).or_default() += 1;
}

fn signal(signal: &str, pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill {signal} {pid} failed: {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARMED: Arming = Arming {
        crash_at: Some(("mailbox::rename", 2)),
        pause_at: None,
        disk_errors: false,
    };

    #[test]
    fn a_sigkill_is_the_armed_point_only_after_the_servers_own_line() {
        let killed = ExitStatus::from_raw(9);
        let own = format!("a line\n{}\n", crash_line("mailbox::rename"));
        assert_eq!(killed_itself(ARMED, killed, &own), Some("mailbox::rename"));
        // Another sender's SIGKILL, or a line of another point: not it.
        assert_eq!(killed_itself(ARMED, killed, "a line\n"), None);
        let other = crash_line("mailbox::unlink");
        assert_eq!(killed_itself(ARMED, killed, &other), None);
        // Not armed, or not a SIGKILL.
        assert_eq!(killed_itself(Arming::default(), killed, &own), None);
        assert_eq!(
            killed_itself(ARMED, ExitStatus::from_raw(1 << 8), &own),
            None
        );
    }

    #[test]
    fn a_stall_is_read_from_the_servers_line() {
        assert_eq!(
            stalled_at("failpoint messages::apply: pausing for 4000 ms"),
            Some(("messages::apply", Duration::from_secs(4)))
        );
        assert_eq!(
            stalled_at("failpoint messages::apply: going on after 4000 ms"),
            None
        );
        assert_eq!(stalled_at("listening on 127.0.0.1:1"), None);
    }
}
