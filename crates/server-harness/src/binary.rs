//! The real `estafeta` binary as a child process: started on a loopback
//! port with its own data folder and none of the caller's `ESTAFETA_*`
//! settings, then stopped by a signal. The server's tests and benches both
//! run it.
//!
//! Only the server crate's own tests and benches know where cargo built the
//! binary (`CARGO_BIN_EXE_estafeta`), so the caller names it: a marker type
//! implementing [`Program`], usually behind a type alias,
//! `type Binary = binary::Binary<Estafeta>;`.

use std::ffi::OsString;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Which server binary a [`Binary`] runs, named by the crate that builds
/// it.
pub trait Program {
    /// The binary built with the caller: `env!("CARGO_BIN_EXE_estafeta")`.
    /// The environment variable `ESTAFETA_TEST_BINARY` names another one
    /// at run time (a measurement against an optimized build).
    const BUILT: &'static str;
}

/// The real binary named by `P`, started by [`Binary::serve`].
pub struct Binary<P> {
    /// The running server.
    pub child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// `http://` and [`Binary::addr`].
    pub base: String,
    /// The admin token, when this start generated one and printed it.
    pub printed_token: Option<String>,
    stdout: BufReader<ChildStdout>,
    program: PhantomData<fn() -> P>,
}

impl<P: Program> Binary<P> {
    /// A command for the binary with no `ESTAFETA_*` setting inherited from
    /// the caller's environment, run in `cwd` (so no stray
    /// `estafeta.toml`), killed when dropped.
    pub fn command(cwd: &Path) -> Command {
        isolated(Command::new(program::<P>()), cwd)
    }

    /// [`Binary::command`] started by `sh -c` after the shell commands
    /// `prelude` (`ulimit -n 256`, `umask 000`): what the binary inherits
    /// from them.
    pub fn command_after(cwd: &Path, prelude: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{prelude} && exec \"$0\" \"$@\""))
            .arg(program::<P>());
        isolated(cmd, cwd)
    }

    /// Starts `estafeta serve` (plus `args`) in `cwd`, listening on
    /// 127.0.0.1:0 with data in `data`, `env` added, and waits for its
    /// `listening on` line.
    pub async fn serve(cwd: &Path, data: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::serve_on(None, cwd, data, args, env).await
    }

    /// [`Binary::serve`] with the `store` setting `store` (none: the
    /// embedded store under `data`) given as `ESTAFETA_STORE`.
    pub async fn serve_on(
        store: Option<&str>,
        cwd: &Path,
        data: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::serve_as(Self::command(cwd), store, data, args, env).await
    }

    /// [`Binary::serve_on`] through `cmd`, a command for the binary made by
    /// [`Binary::command`] or [`Binary::command_after`].
    pub async fn serve_as(
        mut cmd: Command,
        store: Option<&str>,
        data: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        cmd.arg("serve")
            .args(args)
            .env("ESTAFETA_LISTEN", "127.0.0.1:0")
            .env("ESTAFETA_DATA_DIR", data)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(url) = store {
            cmd.env("ESTAFETA_STORE", url);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut printed_token = None;
        let addr = loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).await.unwrap();
            assert!(
                n > 0,
                "the server exited before listening: {:?}",
                child.wait().await
            );
            if let Some(rest) = line.trim().strip_prefix("admin token: ") {
                printed_token = rest.split_whitespace().next().map(str::to_owned);
            }
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.parse::<SocketAddr>().unwrap();
            }
        };
        Binary {
            child,
            addr,
            base: format!("http://{addr}"),
            printed_token,
            stdout,
            program: PhantomData,
        }
    }

    /// Sends SIGTERM and waits for the exit code.
    pub async fn terminate(self) -> Option<i32> {
        self.signal("-TERM").await
    }

    /// Kills the server with SIGKILL (no chance to save anything) and waits for it.
    pub async fn kill9(self) {
        assert_eq!(self.signal("-KILL").await, None);
    }

    async fn signal(mut self, signal: &str) -> Option<i32> {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
        let exit = self.child.wait().await.unwrap();
        // Drain what is left of stdout so nothing blocks the child.
        let mut rest = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut self.stdout, &mut rest).await;
        exit.code()
    }
}

/// The binary to run: `ESTAFETA_TEST_BINARY` if set, else `P`'s.
fn program<P: Program>() -> OsString {
    std::env::var_os("ESTAFETA_TEST_BINARY").unwrap_or_else(|| P::BUILT.into())
}

/// `cmd` without the caller's `ESTAFETA_*` variables, in `cwd`, killed when
/// dropped.
fn isolated(mut cmd: Command, cwd: &Path) -> Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ESTAFETA_") {
            cmd.env_remove(key);
        }
    }
    cmd.current_dir(cwd).kill_on_drop(true);
    cmd
}
