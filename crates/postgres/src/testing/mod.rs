//! Throwaway PostgreSQL instances for tests: each one is `initdb`'s fresh
//! cluster in its own temporary folder, listening on its own free loopback
//! port and on a Unix socket inside that folder, and gone when dropped.
//! Never a system service, never a fixed port.
//!
//! The server binaries are Debian's (`/usr/lib/postgresql/<version>/bin`,
//! the newest version there). PostgreSQL refuses to run as root, so a root
//! process (as in CI) runs them as the `postgres` OS user, which owns the
//! folder.
//!
//! Beyond start and stop: [`Postgres::kill`] kills the server with SIGKILL
//! (a crash), [`Postgres::restart`] starts it again on the same port, and
//! [`Postgres::standby`] makes a synchronous streaming standby that
//! [`Postgres::promote`] turns into the new primary (a failover);
//! [`Postgres::rebuild_standby`] makes the old primary the new one's
//! standby, for the next failover. [`CommitLoss`] stands between a node
//! and the server and loses the answer to a `COMMIT` the server made;
//! [`Conversation`] finds those answers in a connection's bytes, for a
//! proxy of another's that loses them.

mod commit_loss;

pub use commit_loss::{Commit, CommitLoss, Conversation};

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The query [`PgMessages::select`](crate::PgMessages) runs (parameters:
/// mailbox, folder, subsystems or NULL, senders or NULL, row limit), for
/// tests that check its plan with `EXPLAIN`.
pub const MESSAGES_SELECT: &str = crate::messages::SELECT;
/// The statement that makes every move of a batch (for plan checks).
pub const MESSAGES_MOVE: &str = crate::messages::MOVE;

/// Where Debian installs each PostgreSQL version's server binaries.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The longest a harness wait (start, stop, a standby catching up) may take.
const WAIT: Duration = Duration::from_secs(60);

/// Why a throwaway instance could not be made or driven.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// No `initdb` under `/usr/lib/postgresql/*/bin`.
    #[error(
        "PostgreSQL server binaries not found under {DEBIAN_ROOT}/*/bin (install Debian's `postgresql` package)"
    )]
    NoBinaries,
    /// Running as root, but there is no `postgres` OS user to run the server as.
    #[error("running as root and no `postgres` OS user exists to run PostgreSQL as")]
    NoUser,
    /// A file or folder operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: io::Error,
    },
    /// A PostgreSQL program failed.
    #[error("`{command}` failed: {output}")]
    Command {
        /// The program and its arguments.
        command: String,
        /// Its output and the server log's end.
        output: String,
    },
    /// A state the harness waits for did not come within its bound.
    #[error("gave up waiting: {0}")]
    Timeout(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

/// The OS user the server runs as when this process is root.
#[derive(Clone, Copy, Debug)]
struct Owner {
    uid: u32,
    gid: u32,
}

impl Owner {
    /// `None` when this process is not root (it runs the server itself).
    fn find() -> Result<Option<Owner>, HarnessError> {
        if !rustix::process::geteuid().is_root() {
            return Ok(None);
        }
        let passwd = fs::read_to_string("/etc/passwd").map_err(io_error("read /etc/passwd"))?;
        passwd
            .lines()
            .find_map(|line| {
                let mut fields = line.split(':');
                (fields.next() == Some("postgres")).then_some(())?;
                let uid = fields.nth(1)?.parse().ok()?;
                let gid = fields.next()?.parse().ok()?;
                Some(Some(Owner { uid, gid }))
            })
            .ok_or(HarnessError::NoUser)
    }
}

/// The newest installed version's binary folder.
fn binaries() -> Result<PathBuf, HarnessError> {
    let versions = fs::read_dir(DEBIAN_ROOT).map_err(|_| HarnessError::NoBinaries)?;
    versions
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
        .ok_or(HarnessError::NoBinaries)
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_error("find a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io_error("find a free port"))?
        .port();
    Ok(port)
}

/// One throwaway PostgreSQL server (a primary, or a standby made by
/// [`Postgres::standby`]). Dropping it stops the server at once and removes
/// its folder.
#[derive(Debug)]
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    owner: Option<Owner>,
    port: u16,
}

impl Postgres {
    /// Make and start a fresh instance.
    pub fn start() -> Result<Postgres, HarnessError> {
        Postgres::start_with(&[])
    }

    /// Make and start a fresh instance with `settings` (lines of
    /// `postgresql.conf`, after the harness's own) from its first start.
    pub fn start_with(settings: &[&str]) -> Result<Postgres, HarnessError> {
        let mut pg = Postgres::initialized()?;
        pg.configure(settings)?;
        pg.first_start()?;
        Ok(pg)
    }

    /// The first start: on another free port if the one picked was taken
    /// meanwhile (a loopback client's own port can be any free one), as
    /// nobody knows the port yet.
    fn first_start(&mut self) -> Result<(), HarnessError> {
        let mut tries = 0;
        loop {
            match self.restart() {
                Err(HarnessError::Command { output, .. })
                    if tries < 5 && output.contains("Address already in use") =>
                {
                    tries += 1;
                    self.port = free_port()?;
                }
                started => return started,
            }
        }
    }

    /// Make and start a fresh instance that takes TCP connections only
    /// over TLS, showing the given certificate chain (PEM) and holding its
    /// key (PEM).
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> Result<Postgres, HarnessError> {
        let mut pg = Postgres::initialized()?;
        pg.write_file("server.crt", cert_pem)?;
        pg.write_file("server.key", key_pem)?;
        pg.write_file(
            "pg_hba.conf",
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )?;
        pg.configure(&["ssl = on"])?;
        pg.first_start()?;
        Ok(pg)
    }

    /// Write a file of the server's data folder, readable by the server's
    /// user only (as it wants its private key).
    fn write_file(&self, name: &str, text: &str) -> Result<(), HarnessError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.data().join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_error(format!("write {name}")))?;
        file.write_all(text.as_bytes())
            .map_err(io_error(format!("write {name}")))?;
        if let Some(o) = self.owner {
            std::os::unix::fs::chown(&path, Some(o.uid), Some(o.gid))
                .map_err(io_error(format!("give {name} to `postgres`")))?;
        }
        Ok(())
    }

    /// A fresh, configured instance, not started yet.
    fn initialized() -> Result<Postgres, HarnessError> {
        let pg = Postgres::empty()?;
        pg.run(
            pg.tool("initdb")
                .args(["-A", "trust", "-U", "postgres", "--no-sync"])
                .arg("-E")
                .arg("UTF8")
                .arg("--locale=C")
                .arg("-D")
                .arg(pg.data()),
        )?;
        pg.configure(&[
            "listen_addresses = '127.0.0.1'",
            "shared_buffers = '16MB'",
            "max_connections = 60",
            "max_wal_senders = 4",
            "wal_level = replica",
        ])?;
        Ok(pg)
    }

    /// A folder owned by the server's user, with nothing in it yet.
    fn empty() -> Result<Postgres, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("estafeta-pg.")
            .tempdir()
            .map_err(io_error("make a temporary folder"))?;
        let owner = Owner::find()?;
        if let Some(o) = owner {
            std::os::unix::fs::chown(dir.path(), Some(o.uid), Some(o.gid))
                .map_err(io_error("give the temporary folder to `postgres`"))?;
        }
        Ok(Postgres {
            dir,
            bin: binaries()?,
            owner,
            port: free_port()?,
        })
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A libpq URL for the server's `postgres` database over loopback TCP.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `host:port` of the server, for multi-host URLs.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// A command for one of the server's programs, run as its user, with a
    /// clean environment (no `PG*` variable of the caller's applies).
    fn tool(&self, name: &str) -> Command {
        let mut command = Command::new(self.bin.join(name));
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C")
            .current_dir(self.dir.path());
        if let Some(o) = self.owner {
            command.uid(o.uid).gid(o.gid);
        }
        command
    }

    fn run(&self, command: &mut Command) -> Result<String, HarnessError> {
        let shown = format!("{command:?}");
        let output = command.output().map_err(io_error(format!("run {shown}")))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            return Ok(stdout);
        }
        let log = fs::read_to_string(self.log()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        Err(HarnessError::Command {
            command: shown,
            output: format!(
                "{}\n{stdout}\n{}\n--- server log (end) ---\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ),
        })
    }

    /// Append settings to the server's configuration (later lines win).
    fn configure(&self, lines: &[&str]) -> Result<(), HarnessError> {
        let path = self.data().join("postgresql.conf");
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_error("open postgresql.conf"))?;
        let socket = format!("unix_socket_directories = '{}'", self.dir.path().display());
        for line in lines.iter().copied().chain([socket.as_str()]) {
            writeln!(file, "{line}").map_err(io_error("write postgresql.conf"))?;
        }
        Ok(())
    }

    /// Start the server (again) on its port and wait until it accepts
    /// connections: after [`Postgres::kill`] this is crash recovery.
    pub fn restart(&self) -> Result<(), HarnessError> {
        self.run(
            self.tool("pg_ctl")
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(self.data())
                .arg("-l")
                .arg(self.log())
                .arg("-o")
                .arg(format!("-p {}", self.port)),
        )?;
        Ok(())
    }

    /// Stop the server cleanly (`pg_ctl stop -m fast`).
    pub fn stop(&self) -> Result<(), HarnessError> {
        self.run(
            self.tool("pg_ctl")
                .args(["stop", "-w", "-m", "fast", "-D"])
                .arg(self.data()),
        )?;
        Ok(())
    }

    /// Kill the server with SIGKILL, the postmaster and every backend at
    /// once, as a machine failure would, and wait until they are gone.
    pub fn kill(&self) -> Result<(), HarnessError> {
        let pid_file = self.data().join("postmaster.pid");
        let text = fs::read_to_string(&pid_file).map_err(io_error("read postmaster.pid"))?;
        let postmaster: i32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| HarnessError::Timeout("postmaster.pid names no process".into()))?;
        // The postmaster first, so that it sees none of its children die
        // and starts no orderly shutdown.
        let mut victims = vec![postmaster];
        victims.extend(children(postmaster));
        for &pid in &victims {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                // A process that already exited is no failure here.
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        let started = Instant::now();
        while victims.iter().any(|&pid| alive(pid)) {
            if started.elapsed() > WAIT {
                return Err(HarnessError::Timeout(
                    "killed server processes to exit".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The dead postmaster may linger as a zombie until its parent (PID 1
        // or a subreaper) reaps it, and PostgreSQL would take the zombie for
        // a live server still holding the folder or the socket. Every
        // process is gone, as after a machine restart, so their lock files
        // go too.
        fs::remove_file(&pid_file).map_err(io_error("remove postmaster.pid"))?;
        let socket_lock = self.dir.path().join(format!(".s.PGSQL.{}.lock", self.port));
        fs::remove_file(&socket_lock).map_err(io_error("remove the socket's lock file"))?;
        Ok(())
    }

    /// Make a streaming standby of this server and make it synchronous:
    /// from when this returns, a commit on this server returns only once the
    /// standby has it. The standby is a [`Postgres`] of its own (its own
    /// folder and port), read-only until [`Postgres::promote`].
    pub fn standby(&self) -> Result<Postgres, HarnessError> {
        let standby = Postgres::empty()?;
        self.follow_by(&standby)?;
        Ok(standby)
    }

    /// Make `old`, a server that is down (killed, or stopped: a primary
    /// failed over from), a synchronous standby of this server, on its own
    /// folder and port: its data is replaced by a base backup of this
    /// server. After a promotion this gives the new primary a standby at
    /// the address the old primary had, so a multi-host URL naming both
    /// keeps working through the next failover.
    pub fn rebuild_standby(&self, old: &Postgres) -> Result<(), HarnessError> {
        fs::remove_dir_all(old.data()).map_err(io_error("remove the old server's data"))?;
        self.follow_by(old)
    }

    /// Fill `standby`'s empty data folder with a base backup of this
    /// server, start it streaming from this one, and make it synchronous.
    fn follow_by(&self, standby: &Postgres) -> Result<(), HarnessError> {
        // `-c fast`: the backup's checkpoint at once, not spread over
        // minutes as it would be on a primary under load.
        self.run(
            standby
                .tool("pg_basebackup")
                .args([
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                ])
                .arg("-p")
                .arg(self.port.to_string())
                .arg("-D")
                .arg(standby.data()),
        )?;
        // A promoted standby must not wait for a standby of its own.
        standby.configure(&["synchronous_standby_names = ''"])?;
        standby.restart()?;
        self.configure(&["synchronous_standby_names = '*'"])?;
        self.run(self.tool("pg_ctl").args(["reload", "-D"]).arg(self.data()))?;
        let started = Instant::now();
        loop {
            let state = self.psql("SELECT sync_state FROM pg_stat_replication")?;
            if state.trim() == "sync" {
                return Ok(());
            }
            if started.elapsed() > WAIT {
                return Err(HarnessError::Timeout(format!(
                    "the standby to become synchronous (state: {state:?})"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Promote this standby to a primary and wait until it accepts writes.
    pub fn promote(&self) -> Result<(), HarnessError> {
        self.run(
            self.tool("pg_ctl")
                .args(["promote", "-w", "-t", "60", "-D"])
                .arg(self.data()),
        )?;
        Ok(())
    }

    /// Run one SQL statement with `psql` and return its unaligned output.
    pub fn psql(&self, sql: &str) -> Result<String, HarnessError> {
        self.run(
            self.tool("psql")
                .args([
                    "-X",
                    "-A",
                    "-t",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                ])
                .arg("-p")
                .arg(self.port.to_string())
                .arg("-c")
                .arg(sql),
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Already stopped or killed is fine: the folder goes either way.
        let _ = self
            .tool("pg_ctl")
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .output();
    }
}

/// The processes whose parent is `pid` (a postmaster's backends).
fn children(pid: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let child: i32 = e.file_name().to_str()?.parse().ok()?;
            let (_, parent) = stat(child)?;
            (parent == pid).then_some(child)
        })
        .collect()
}

/// A process's state letter and parent, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields after it
    // start past the last `)`.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` still runs (a zombie waiting for its parent does not).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}
