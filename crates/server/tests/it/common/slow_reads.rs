//! A slow disk under one file of a running server: `strace`, attached to
//! the server's process and every thread it has or makes, delays each
//! `read(2)` of the file and refuses the in-kernel copies of it
//! (`copy_file_range`, `sendfile`, `splice` fail with `ENOSYS`), so that a
//! copy of the file goes by reads of 8 KiB (the standard library's
//! fallback) and takes as long as it would on a slow disk. Nothing else
//! the server reads or writes is touched (`-P`). Attaching needs root (or
//! ptrace allowed between the test's children), as CI runs; elsewhere it
//! fails.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::PATIENCE;

/// `strace` attached to a server; it lets go when dropped (or when the
/// server ends).
pub(crate) struct SlowReads {
    _strace: Child,
}

impl SlowReads {
    /// Attaches to the process `pid`, each read of `file` then taking
    /// `delay` longer; returns once every thread is attached.
    pub(crate) async fn attach(pid: u32, file: &Path, delay: Duration) -> SlowReads {
        let mut strace = Command::new("strace")
            .args(["-f", "-o", "/dev/null"])
            .args(["-e", "trace=read,copy_file_range,sendfile,splice"])
            .args(["-e", "inject=copy_file_range,sendfile,splice:error=ENOSYS"])
            .arg("-e")
            .arg(format!("inject=read:delay_exit={}", delay.as_micros()))
            .arg("-P")
            .arg(file)
            .arg("-p")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run strace (CI installs it)");
        let mut said = BufReader::new(strace.stderr.take().unwrap()).lines();
        let attached = async {
            loop {
                match said.next_line().await.unwrap() {
                    Some(line) if line.contains("attached") => return,
                    Some(_) => {}
                    None => panic!(
                        "strace could not attach to {pid}: {:?}",
                        strace.wait().await
                    ),
                }
            }
        };
        tokio::time::timeout(PATIENCE, attached)
            .await
            .expect("strace did not attach in time");
        // What strace says later (the threads it follows) must not block it.
        tokio::spawn(async move { while let Ok(Some(_)) = said.next_line().await {} });
        SlowReads { _strace: strace }
    }
}
