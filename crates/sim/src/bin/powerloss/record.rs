//! Recording a workload's file-system operations: the `estafeta` server
//! runs under `strace -f`, which stops the whole process (an injected
//! SIGSTOP) right after every `fsync`/`fdatasync`; while it is stopped the
//! recorder copies the file just synced (its durable contents) and then
//! lets it go on (SIGCONT). The namespace operations (creates, renames,
//! unlinks, mkdirs) come from the same trace, in order.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};

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

/// Reads the trace from `fifo` until strace closes it, keeping the events
/// under `root` and copying synced files into `snapshots`.
pub(crate) fn read_trace(
    fifo: &Path,
    root: &Path,
    snapshots: &Path,
    out: Arc<Mutex<Trace>>,
) -> anyhow::Result<()> {
    let reader = BufReader::new(File::open(fifo).context("opening the trace pipe")?);
    // A call another thread interrupted: its first half, by thread.
    let mut unfinished: HashMap<u32, String> = HashMap::new();
    // The sync a thread just made, to copy once the process is stopped.
    let mut to_copy: HashMap<u32, Option<(usize, PathBuf)>> = HashMap::new();
    for line in reader.lines() {
        let line = line?;
        let Some((tid, at, rest)) = split_line(&line) else {
            continue;
        };
        if rest.starts_with("--- stopped by SIGSTOP") {
            if let Some(copy) = to_copy.remove(&tid) {
                if let Some((index, path)) = copy {
                    let target = snapshots.join(index.to_string());
                    // A file removed meanwhile has nothing to keep.
                    if std::fs::copy(&path, &target).is_ok() {
                        let mut trace = out.lock().expect("trace lock");
                        if let Some(Event::Sync { snapshot, .. }) = trace.events.get_mut(index) {
                            *snapshot = Some(target);
                        }
                    }
                }
                resume(tid)?;
            }
            continue;
        }
        if rest.starts_with("---") || rest.starts_with("+++") {
            continue;
        }
        let call = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            unfinished.insert(tid, head.to_owned());
            continue;
        } else if let Some(tail) = rest.strip_prefix("<... ") {
            let Some((_, tail)) = tail.split_once(" resumed>") else {
                continue;
            };
            match unfinished.remove(&tid) {
                Some(head) => format!("{head}{tail}"),
                None => continue,
            }
        } else {
            rest.to_owned()
        };
        let Some(parsed) = parse_call(&call) else {
            out.lock().expect("trace lock").unparsed += 1;
            continue;
        };
        match parsed {
            Parsed::Sync(path) => {
                let copy = if path.starts_with(root) {
                    let is_file = path.is_file();
                    let mut trace = out.lock().expect("trace lock");
                    let index = trace.events.len();
                    trace.events.push(Event::Sync {
                        path: path.clone(),
                        at,
                        snapshot: None,
                    });
                    is_file.then_some((index, path))
                } else {
                    None
                };
                to_copy.insert(tid, copy);
            }
            Parsed::FailedSync => {
                to_copy.insert(tid, None);
            }
            Parsed::Op(event) => {
                let inside = match &event {
                    Event::Create(p) | Event::Mkdir(p) | Event::Remove(p) => p.starts_with(root),
                    Event::Rename(a, b) => a.starts_with(root) || b.starts_with(root),
                    Event::Sync { .. } => false,
                };
                if inside {
                    out.lock().expect("trace lock").events.push(event);
                }
            }
            Parsed::Ignored => {}
        }
    }
    Ok(())
}

/// Lets a process stopped after its sync go on.
fn resume(tid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-CONT", &tid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -CONT {tid} failed: {status}");
    }
    Ok(())
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
}
