//! The `estafeta` server as a child process: started on a fixed loopback
//! port (so the proxy and the clients survive its restarts), its log
//! appended to a file, killed with SIGKILL, paused with SIGSTOP.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use estafeta_client::Client;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The admin token the harness gives the server.
pub(crate) const ADMIN_TOKEN: &str = "harness-admin-token-0123456789abcdef";

/// How long the server may take to answer `/readyz` after a (re)start
/// before the run fails.
pub(crate) const READY_BOUND: Duration = Duration::from_secs(30);

/// A running (or killed) server child.
pub(crate) struct Server {
    binary: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    child: Option<Child>,
    /// The admin client, straight to the server (not through the proxy).
    pub(crate) admin: Client,
}

impl Server {
    /// Starts the server and waits until it is ready; the time it took.
    pub(crate) async fn start(
        binary: &Path,
        data: &Path,
        log: &Path,
        port: u16,
    ) -> anyhow::Result<(Server, Duration)> {
        let admin = Client::with_timeout(
            &format!("http://127.0.0.1:{port}"),
            ADMIN_TOKEN,
            Duration::from_secs(3),
        )?;
        let mut server = Server {
            binary: binary.to_owned(),
            data: data.to_owned(),
            log: log.to_owned(),
            port,
            child: None,
            admin,
        };
        let took = server.restart().await?;
        Ok((server, took))
    }

    /// Starts the server process (after a kill) and waits for `/readyz`.
    pub(crate) async fn restart(&mut self) -> anyhow::Result<Duration> {
        let began = Instant::now();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
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
            .env("ESTAFETA_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next_line().await? {
                Some(line) if line.starts_with("listening on ") => break,
                Some(_) => {}
                None => bail!(
                    "the server exited before listening: {:?}",
                    child.wait().await
                ),
            }
        }
        // Keep reading stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.child = Some(child);
        while began.elapsed() < READY_BOUND {
            if let Ok(true) = self.admin.readyz().await {
                return Ok(began.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("the server was not ready within {READY_BOUND:?}")
    }

    /// `kill -9` and wait for the process to be gone.
    pub(crate) async fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?;
            child.wait().await?;
        }
        Ok(())
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

    /// Whether the server process has exited by itself.
    pub(crate) fn exited(&mut self) -> anyhow::Result<bool> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?.is_some()),
            None => Ok(true),
        }
    }

    /// The log file of every start.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }
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
