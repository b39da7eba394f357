//! Recording a workload's file-system operations: the `estafeta` server
//! runs under `strace -f`, which stops the whole process (an injected
//! SIGSTOP) right after every `fsync`/`fdatasync`; the recorder copies the
//! file just synced (its durable contents) and, once the trace is quiet,
//! lets it go on (SIGCONT). The namespace operations (creates, renames,
//! unlinks, mkdirs) come from the same trace, in order.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, kill_process};

/// The system calls traced.
const TRACE: &str = "trace=open,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,\
    unlink,unlinkat,rmdir,fsync,fdatasync";

/// One recorded file-system event, in the order the kernel did them.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// A regular file created (or opened with `O_CREAT`).
    Create(PathBuf),
    /// A folder created.
    Mkdir(PathBuf),
    /// A rename.
    Rename(PathBuf, PathBuf),
    /// A file or an empty folder removed.
    Remove(PathBuf),
    /// A successful `fsync`/`fdatasync` of this path; `snapshot` holds a
    /// copy of the file's bytes at that moment (none for a folder).
    Sync {
        path: PathBuf,
        /// Seconds since the epoch (strace's clock, the wall clock).
        at: f64,
        snapshot: Option<PathBuf>,
    },
}

/// What the trace reader collected.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    pub(crate) events: Vec<Event>,
    /// Lines that named a traced call the reader could not parse.
    pub(crate) unparsed: u64,
}

/// The `strace` command that runs `binary serve`, writing its trace to
/// `fifo`.
pub(crate) fn strace_command(binary: &Path, fifo: &Path) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-ttt", "-y", "-qq", "-e", TRACE])
        .args(["-e", "inject=fsync,fdatasync:signal=SIGSTOP", "-o"])
        .arg(fifo)
        .arg(binary)
        .arg("serve");
    cmd
}

/// Makes the named pipe strace writes to.
pub(crate) fn make_fifo(path: &Path) -> anyhow::Result<()> {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .context("running mkfifo")?;
    if !status.success() {
        bail!("mkfifo {} failed: {status}", path.display());
    }
    Ok(())
}

/// How long the trace must stay quiet before stopped threads are let go
/// on. strace writes a sync's line before it injects that thread's SIGSTOP,
/// and a SIGCONT discards every stop still pending in the process: waiting
/// for a quiet moment lets a sync another thread just finished be read
/// (and its file copied) before the SIGCONT could let that thread run on.
const QUIET: Duration = Duration::from_millis(2);

/// Reads the trace from `fifo` until strace closes it, keeping the events
/// under `root` and copying synced files into `snapshots`.
pub(crate) fn read_trace(
    fifo: &Path,
    root: &Path,
    snapshots: &Path,
    out: Arc<Mutex<Trace>>,
) -> anyhow::Result<()> {
    let file = File::open(fifo).context("opening the trace pipe")?;
    // Lines reach this loop as soon as strace writes them, so a quiet
    // moment can be waited for.
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(file).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut reader = Reader {
        root,
        snapshots,
        out,
        unfinished: HashMap::new(),
        synced: HashSet::new(),
        stopped: HashSet::new(),
        uncopied: HashMap::new(),
    };
    loop {
        let line = if reader.stopped.is_empty() {
            match lines.recv() {
                Ok(line) => line?,
                Err(_) => break,
            }
        } else {
            match lines.recv_timeout(QUIET) {
                Ok(line) => line?,
                Err(RecvTimeoutError::Timeout) => {
                    for tid in std::mem::take(&mut reader.stopped) {
                        resume(tid)?;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        reader.line(&line);
    }
    Ok(())
}

/// The trace reader's state between lines.
struct Reader<'a> {
    root: &'a Path,
    snapshots: &'a Path,
    out: Arc<Mutex<Trace>>,
    /// A call another thread interrupted: its first half, by thread.
    unfinished: HashMap<u32, String>,
    /// Threads that synced and are about to stop.
    synced: HashSet<u32>,
    /// Threads stopped after their sync, to let go on once the trace is
    /// quiet.
    stopped: HashSet<u32>,
    /// Synced files that were gone when copied (their thread ran on before
    /// the copy), by path: a rename of one copies its new name, as a
    /// written file's bytes do not change when it is renamed.
    uncopied: HashMap<PathBuf, usize>,
}

impl Reader<'_> {
    fn line(&mut self, line: &str) {
        let Some((tid, at, rest)) = split_line(line) else {
            return;
        };
        if rest.starts_with("--- stopped by SIGSTOP") {
            if self.synced.remove(&tid) {
                self.stopped.insert(tid);
            }
            return;
        }
        if rest.starts_with("---") || rest.starts_with("+++") {
            return;
        }
        let call = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            self.unfinished.insert(tid, head.to_owned());
            return;
        } else if let Some(tail) = rest.strip_prefix("<... ") {
            let Some((_, tail)) = tail.split_once(" resumed>") else {
                return;
            };
            match self.unfinished.remove(&tid) {
                Some(head) => format!("{head}{tail}"),
                None => return,
            }
        } else {
            rest.to_owned()
        };
        let Some(parsed) = parse_call(&call) else {
            self.out.lock().expect("trace lock").unparsed += 1;
            return;
        };
        match parsed {
            Parsed::Sync(path) => {
                self.synced.insert(tid);
                if path.starts_with(self.root) {
                    self.sync(path, at);
                }
            }
            Parsed::FailedSync => {
                self.synced.insert(tid);
            }
            Parsed::Op(event) => {
                let inside = match &event {
                    Event::Create(p) | Event::Mkdir(p) | Event::Remove(p) => {
                        p.starts_with(self.root)
                    }
                    Event::Rename(a, b) => a.starts_with(self.root) || b.starts_with(self.root),
                    Event::Sync { .. } => false,
                };
                if let Event::Rename(from, to) = &event
                    && let Some(index) = self.uncopied.remove(from)
                {
                    self.copy(index, to);
                }
                if inside {
                    self.out.lock().expect("trace lock").events.push(event);
                }
            }
            Parsed::Ignored => {}
        }
    }

    /// Records a sync of `path` and copies the file's bytes now, while the
    /// thread that synced it is stopping (a folder has none to copy).
    fn sync(&mut self, path: PathBuf, at: f64) {
        let index = {
            let mut trace = self.out.lock().expect("trace lock");
            trace.events.push(Event::Sync {
                path: path.clone(),
                at,
                snapshot: None,
            });
            trace.events.len() - 1
        };
        if path.is_dir() {
            return;
        }
        if !self.copy(index, &path) {
            self.uncopied.insert(path, index);
        }
    }

    /// Copies `path` as the snapshot of event `index`; false if it is gone.
    fn copy(&self, index: usize, path: &Path) -> bool {
        let target = self.snapshots.join(index.to_string());
        if std::fs::copy(path, &target).is_err() {
            return false;
        }
        let mut trace = self.out.lock().expect("trace lock");
        if let Some(Event::Sync { snapshot, .. }) = trace.events.get_mut(index) {
            *snapshot = Some(target);
        }
        true
    }
}

/// Lets a process stopped after its sync go on. A thread that is gone
/// needs nothing: the workload's end kills the server, and a sync stopped
/// at that moment (the event log's, say) is read from the trace after.
fn resume(tid: u32) -> anyhow::Result<()> {
    let Some(pid) = i32::try_from(tid).ok().and_then(Pid::from_raw) else {
        bail!("no such thread id {tid}");
    };
    match kill_process(pid, Signal::CONT) {
        Ok(()) | Err(Errno::SRCH) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("kill -CONT {tid}")),
    }
}

/// `TID SECONDS.MICROS rest`.
fn split_line(line: &str) -> Option<(u32, f64, &str)> {
    let line = line.trim_start();
    let (tid, rest) = line.split_once(' ')?;
    let (at, rest) = rest.trim_start().split_once(' ')?;
    Some((tid.parse().ok()?, at.parse().ok()?, rest))
}

/// A traced call, read.
#[derive(Debug)]
enum Parsed {
    Op(Event),
    Sync(PathBuf),
    FailedSync,
    Ignored,
}

/// Reads `name(args) = ret` as strace prints it with `-y`.
fn parse_call(call: &str) -> Option<Parsed> {
    let (name, rest) = call.split_once('(')?;
    let cut = rest.rfind(") = ")?;
    let args = split_args(&rest[..cut]);
    let ret = &rest[cut + 4..];
    let ok = !ret.starts_with('-');
    if matches!(name, "fsync" | "fdatasync") {
        return Some(if ok {
            Parsed::Sync(fd_path(args.first()?)?)
        } else {
            Parsed::FailedSync
        });
    }
    if !ok {
        return Some(Parsed::Ignored);
    }
    let at = |dirfd: &str, path: &str| -> Option<PathBuf> {
        let path = unquote(path)?;
        if path.starts_with('/') {
            Some(PathBuf::from(path))
        } else {
            Some(fd_path(dirfd)?.join(path))
        }
    };
    let event = match name {
        "open" | "openat" | "creat" => {
            let flags = if name == "openat" {
                args.get(2)
            } else {
                args.get(1)
            };
            let creates = name == "creat" || flags.is_some_and(|f| f.contains("O_CREAT"));
            if !creates || flags.is_some_and(|f| f.contains("O_DIRECTORY")) {
                return Some(Parsed::Ignored);
            }
            Event::Create(fd_path(ret)?)
        }
        "mkdir" => Event::Mkdir(at("AT_FDCWD<>", args.first()?)?),
        "mkdirat" => Event::Mkdir(at(args.first()?, args.get(1)?)?),
        "rename" => Event::Rename(
            at("AT_FDCWD<>", args.first()?)?,
            at("AT_FDCWD<>", args.get(1)?)?,
        ),
        "renameat" | "renameat2" => Event::Rename(
            at(args.first()?, args.get(1)?)?,
            at(args.get(2)?, args.get(3)?)?,
        ),
        "unlink" | "rmdir" => Event::Remove(at("AT_FDCWD<>", args.first()?)?),
        "unlinkat" => Event::Remove(at(args.first()?, args.get(1)?)?),
        _ => return Some(Parsed::Ignored),
    };
    Some(Parsed::Op(event))
}

/// The path strace's `-y` prints after a descriptor: `7</a/b>`.
fn fd_path(arg: &str) -> Option<PathBuf> {
    let start = arg.find('<')?;
    let end = arg.rfind('>')?;
    (end > start + 1).then(|| PathBuf::from(&arg[start + 1..end]))
}

/// A C string as strace prints it.
fn unquote(arg: &str) -> Option<String> {
    let inner = arg.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.push(chars.next()?);
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Splits an argument list at top-level commas (not inside quotes or
/// brackets).
fn split_args(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    let mut quoted = false;
    let mut escaped = false;
    for c in args.chars() {
        if quoted {
            current.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                quoted = false;
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '<' | '[' | '{' | '(' => depth += 1,
            '>' | ']' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(current.trim().to_owned());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_calls_the_model_needs() {
        let p = |s: &str| format!("{:?}", parse_call(s));
        assert_eq!(
            p(
                r#"openat(AT_FDCWD</w>, "/w/d/a.redb", O_RDWR|O_CREAT|O_CLOEXEC, 0666) = 9</w/d/a.redb>"#
            ),
            r#"Some(Op(Create("/w/d/a.redb")))"#
        );
        assert_eq!(
            p(r#"renameat2(7</w/d/tmp>, "x", 8</w/d/Messages>, "y", RENAME_NOREPLACE) = 0"#),
            r#"Some(Op(Rename("/w/d/tmp/x", "/w/d/Messages/y")))"#
        );
        assert_eq!(
            p(r#"mkdirat(AT_FDCWD</w>, "d/.estafeta", 0700) = 0"#),
            r#"Some(Op(Mkdir("/w/d/.estafeta")))"#
        );
        assert_eq!(
            p(r#"fsync(9</w/d/a.redb>) = 0"#),
            r#"Some(Sync("/w/d/a.redb"))"#
        );
        assert_eq!(
            p(r#"unlinkat(5</w/d>, "x", 0) = -1 ENOENT (No such file or directory)"#),
            "Some(Ignored)"
        );
        assert_eq!(
            split_line("123  1.5 fsync(3</x>) = 0"),
            Some((123, 1.5, "fsync(3</x>) = 0"))
        );
    }

    fn reader<'a>(root: &'a Path, snapshots: &'a Path) -> Reader<'a> {
        Reader {
            root,
            snapshots,
            out: Arc::default(),
            unfinished: HashMap::new(),
            synced: HashSet::new(),
            stopped: HashSet::new(),
            uncopied: HashMap::new(),
        }
    }

    #[test]
    fn a_synced_file_is_copied_when_its_line_is_read_and_its_thread_let_go_once_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let (root, snapshots) = (dir.path().join("fs"), dir.path().join("snapshots"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&snapshots).unwrap();
        let file = root.join("a.msg");
        std::fs::write(&file, "synced").unwrap();
        let mut r = reader(&root, &snapshots);
        r.line(&format!("7 1.0 fsync(3<{}>) = 0", file.display()));
        // Written again before the thread stopped: the copy holds what
        // was synced.
        std::fs::write(&file, "later").unwrap();
        assert!(r.stopped.is_empty());
        r.line("7 1.1 --- stopped by SIGSTOP ---");
        // Another thread's group stop is not this recorder's to end.
        r.line("8 1.1 --- stopped by SIGSTOP ---");
        assert_eq!(r.stopped, HashSet::from([7]));
        let trace = r.out.lock().unwrap();
        let Some(Event::Sync {
            snapshot: Some(copy),
            ..
        }) = trace.events.first()
        else {
            panic!("no snapshot: {:?}", trace.events);
        };
        assert_eq!(std::fs::read_to_string(copy).unwrap(), "synced");
    }

    #[test]
    fn a_synced_file_renamed_before_it_was_copied_is_copied_under_its_new_name() {
        // A SIGCONT for one thread's stop discards another thread's stop
        // still pending: that thread runs on and renames its file before
        // the recorder reads its sync.
        let dir = tempfile::tempdir().unwrap();
        let (root, snapshots) = (dir.path().join("fs"), dir.path().join("snapshots"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&snapshots).unwrap();
        let (tmp, file) = (root.join(".a.msg.tmp"), root.join("a.msg"));
        std::fs::write(&file, "message").unwrap();
        let mut r = reader(&root, &snapshots);
        r.line(&format!("7 1.0 fsync(3<{}>) = 0", tmp.display()));
        r.line(&format!(
            r#"7 1.1 rename("{}", "{}") = 0"#,
            tmp.display(),
            file.display()
        ));
        let trace = r.out.lock().unwrap();
        let Some(Event::Sync {
            snapshot: Some(copy),
            ..
        }) = trace.events.first()
        else {
            panic!("no snapshot: {:?}", trace.events);
        };
        assert_eq!(std::fs::read_to_string(copy).unwrap(), "message");
    }
}
