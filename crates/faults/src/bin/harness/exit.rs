//! How a child process of the harness (a server node, a processor) ended:
//! by the harness's own `kill -9`, or by itself first (a crash, a panic,
//! an exit), which the harness did not cause and which fails the run,
//! shown with the tail of the child's log.
//!
//! A kill must not hide an end of its own: a child that died a moment
//! before the harness meant to kill it would otherwise pass for one more
//! crash the harness caused.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::process::Child;

/// How many lines of its log a child's unexpected end shows.
const TAIL: usize = 40;

/// `kill -9` of `child`, and its end awaited: `None` when the signal ended
/// it, or how it ended by itself before the signal could.
pub(crate) async fn kill9(child: &mut Child) -> std::io::Result<Option<ExitStatus>> {
    // Ended already (reaped here): the signal would find nothing to end.
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    child.start_kill()?;
    let status = child.wait().await?;
    Ok(ended_by_itself(status).then_some(status))
}

/// Whether a child that was sent SIGKILL and ended with `status` had
/// ended by itself first: a process that had exited keeps its own status
/// (an exit code, another signal) whatever is sent to it after.
fn ended_by_itself(status: ExitStatus) -> bool {
    status.signal() != Some(rustix::process::Signal::KILL.as_raw())
}

/// The last [`TAIL`] lines of `log` from byte `from` on (where the
/// child's part of the file begins), under a line naming the file.
pub(crate) fn log_tail(log: &Path, from: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(0).min(text.len());
    let text = String::from_utf8_lossy(&text[from..]);
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(TAIL)..];
    format!("last lines of {}:\n{}", log.display(), tail.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
    use tokio::process::Command;

    /// A child that exits with code 3 as soon as it starts, once it has
    /// exited (not reaped: its status is still there for a kill to mask).
    async fn exited_child() -> Child {
        let child = Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .expect("starting sh");
        let pid = Pid::from_raw(child.id().expect("its pid") as i32).expect("a pid");
        tokio::task::spawn_blocking(move || {
            waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            )
        })
        .await
        .expect("the wait's thread")
        .expect("waiting for its exit");
        child
    }

    #[tokio::test]
    async fn a_child_that_exited_first_is_not_taken_for_killed() {
        let mut child = exited_child().await;
        let status = kill9(&mut child).await.expect("the kill");
        assert_eq!(status.and_then(|s| s.code()), Some(3), "{status:?}");
    }

    #[tokio::test]
    async fn a_running_child_is_ended_by_the_kill() {
        let mut child = Command::new("sleep")
            .arg("600")
            .kill_on_drop(true)
            .spawn()
            .expect("starting sleep");
        assert_eq!(kill9(&mut child).await.expect("the kill"), None);
    }

    #[test]
    fn only_a_sigkill_is_the_harness_s_end() {
        assert!(!ended_by_itself(ExitStatus::from_raw(9)));
        // A panic's exit code, an abort, a segfault.
        assert!(ended_by_itself(ExitStatus::from_raw(101 << 8)));
        assert!(ended_by_itself(ExitStatus::from_raw(6)));
        assert!(ended_by_itself(ExitStatus::from_raw(11)));
        assert!(ended_by_itself(ExitStatus::from_raw(0)));
    }
}
