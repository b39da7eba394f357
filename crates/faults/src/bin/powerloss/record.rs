//! Recording a workload's file-system calls: the `estafeta` server runs
//! under `strace -f`, which writes every call that can change a file, a
//! folder or what is durable, with its data (`-s` large enough for any
//! write, `-xx`: every string and path in hex, so nothing in them can be
//! misread), the time it began and how long it took. [`Reader`] turns the
//! lines into [`Event`]s, in the order the calls completed; a traced call
//! on a file under the root that the model does not know, a line that
//! cannot be read, or data cut short fails the recording.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::Context;

/// The calls traced: everything that creates, removes, renames, writes,
/// truncates or syncs a file or folder, and what moves a descriptor's
/// offset (for `write`), or could change a file behind the model's back
/// (shared writable mappings, copies between descriptors, io_uring).
const TRACE: &str = "trace=open,openat,openat2,creat,mkdir,mkdirat,mknod,mknodat,\
    rename,renameat,renameat2,link,linkat,symlink,symlinkat,unlink,unlinkat,rmdir,\
    truncate,ftruncate,fallocate,write,pwrite64,writev,pwritev,pwritev2,lseek,read,readv,\
    close,dup,dup2,dup3,fcntl,fsync,fdatasync,syncfs,sync,sync_file_range,msync,mmap,\
    copy_file_range,sendfile,splice,io_uring_setup";

/// The longest string strace prints whole (a write's data): larger than
/// any write the server makes; a longer one is reported cut, which fails.
const STRING_LIMIT: &str = "67108864";

/// One file-system change, in the order the calls completed, with the time
/// each completed (seconds since the epoch, strace's clock: the wall
/// clock).
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) at: f64,
    pub(crate) op: Op,
}

/// What a call did, as the model needs it.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// A regular file opened with `O_CREAT` (new or not), and with
    /// `O_TRUNC` truncated.
    Create { path: PathBuf, truncate: bool },
    /// An existing file opened with `O_TRUNC`.
    Truncate(PathBuf),
    /// A folder created.
    Mkdir(PathBuf),
    /// A rename (replacing what was at `to`).
    Rename(PathBuf, PathBuf),
    /// A hard link made.
    Link(PathBuf, PathBuf),
    /// A file or an empty folder removed.
    Remove(PathBuf),
    /// Bytes written at an offset.
    Write {
        path: PathBuf,
        offset: u64,
        bytes: Arc<[u8]>,
    },
    /// The size set (`ftruncate`, `truncate`, a growing `fallocate`).
    SetLen { path: PathBuf, len: u64 },
    /// An `fsync` or `fdatasync` of a file or folder.
    Sync(PathBuf),
    /// `syncfs` or `sync`: everything durable.
    SyncAll,
}

/// What the trace reader collected.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    pub(crate) events: Vec<Event>,
    /// Lines of calls the reader could not read or the model does not
    /// know, touching the root; any fails the run.
    pub(crate) unmodelled: Vec<String>,
}

/// The `strace` command that runs `binary serve`, writing its trace to
/// `out`.
pub(crate) fn strace_command(binary: &Path, out: &Path) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-ttt", "-T", "-y", "-qq", "-xx", "-s", STRING_LIMIT])
        .args(["-e", TRACE, "-o"])
        .arg(out)
        .arg(binary)
        .arg("serve");
    cmd
}

/// Reads the trace in `file`, keeping what touches `root`; `cwd` is the
/// server's working folder (relative paths of calls that take no folder
/// descriptor are under it).
pub(crate) fn read_trace(file: &Path, root: &Path, cwd: &Path) -> anyhow::Result<Trace> {
    let file = File::open(file).context("opening the trace")?;
    let mut reader = Reader::new(root, cwd);
    for line in BufReader::new(file).lines() {
        reader.line(&line?);
    }
    Ok(reader.trace)
}

/// A descriptor's state, for `write` (which writes at the offset).
#[derive(Clone, Debug)]
struct Fd {
    offset: u64,
    append: bool,
}

/// The trace reader's state between lines.
pub(crate) struct Reader {
    root: PathBuf,
    /// The server's working folder.
    cwd: PathBuf,
    trace: Trace,
    /// A call another thread interrupted: its first half and the time it
    /// began, by thread.
    unfinished: HashMap<u32, (String, f64)>,
    /// Descriptors open on files under the root.
    fds: HashMap<i64, Fd>,
    /// The size each file under the root has, for `O_APPEND` writes.
    sizes: HashMap<PathBuf, u64>,
}

impl Reader {
    pub(crate) fn new(root: &Path, cwd: &Path) -> Reader {
        Reader {
            root: root.to_owned(),
            cwd: cwd.to_owned(),
            trace: Trace::default(),
            unfinished: HashMap::new(),
            fds: HashMap::new(),
            sizes: HashMap::new(),
        }
    }

    pub(crate) fn line(&mut self, line: &str) {
        let Some((tid, began, rest)) = split_line(line) else {
            if !line.trim().is_empty() {
                self.unmodelled(line);
            }
            return;
        };
        if rest.starts_with("---") || rest.starts_with("+++") {
            return;
        }
        let (call, began) = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            // The kernel frees a closed descriptor's number as the close
            // begins, so another thread's open may take it, and write
            // through it, before this close is reported done.
            if let Some(fd) = head.strip_prefix("close(").and_then(fd_number) {
                self.fds.remove(&fd);
            }
            self.unfinished.insert(tid, (head.to_owned(), began));
            return;
        } else if let Some(tail) = rest.strip_prefix("<... ") {
            let Some((_, tail)) = tail.split_once(" resumed>") else {
                return self.unmodelled(line);
            };
            match self.unfinished.remove(&tid) {
                Some((head, _)) if head.starts_with("close(") => return,
                Some((head, began)) => (format!("{head}{tail}"), began),
                None => return self.unmodelled(line),
            }
        } else {
            (rest.to_owned(), began)
        };
        // `name(args) = ret <seconds>`; a call that never returned (the
        // process killed in it) changed nothing the model can know of.
        let Some((call, took)) = call.rsplit_once(" <").and_then(|(c, t)| {
            let took: f64 = t.strip_suffix('>')?.parse().ok()?;
            Some((c.to_owned(), took))
        }) else {
            if call.ends_with("= ?") {
                return;
            }
            return self.unmodelled(line);
        };
        let Some(call) = Call::parse(&call) else {
            return self.unmodelled(line);
        };
        match self.apply(&call) {
            Ok(ops) => {
                for op in ops {
                    self.trace.events.push(Event {
                        at: began + took,
                        op,
                    });
                }
            }
            Err(why) => self.unmodelled(&format!("{why}: {line}")),
        }
    }

    fn unmodelled(&mut self, line: &str) {
        // Long lines are writes: their head says enough.
        let shown: String = line.chars().take(300).collect();
        self.trace.unmodelled.push(shown);
    }

    fn inside(&self, path: &Path) -> bool {
        path.starts_with(&self.root)
    }

    /// The model's operations for one call; `Err` for a call touching the
    /// root that the model does not know.
    fn apply(&mut self, c: &Call) -> Result<Vec<Op>, String> {
        let failed = c.ret.starts_with('-');
        let fd_arg = |i: usize| c.args.get(i).and_then(|a| fd_path(a));
        let inside_fd = |i: usize| fd_arg(i).is_some_and(|p| p.starts_with(&self.root));
        match c.name.as_str() {
            "open" | "openat" | "openat2" | "creat" => {
                let (path_arg, flags) = match c.name.as_str() {
                    "open" => (c.args.first(), c.args.get(1).cloned()),
                    "creat" => (c.args.first(), Some("O_CREAT|O_WRONLY|O_TRUNC".to_owned())),
                    _ => (c.args.get(1), c.args.get(2).cloned()),
                };
                let flags = flags.unwrap_or_default();
                if failed {
                    return Ok(Vec::new());
                }
                let Some(path) = fd_path(&c.ret) else {
                    // A descriptor on something that is not a path.
                    return match path_arg.and_then(|p| unquote(p)) {
                        Some(p)
                            if self
                                .inside(Path::new(&String::from_utf8_lossy(&p).into_owned())) =>
                        {
                            Err("an open under the root without its path".into())
                        }
                        _ => Ok(Vec::new()),
                    };
                };
                let fd = fd_number(&c.ret).ok_or("an open without a descriptor")?;
                if !self.inside(&path) {
                    self.fds.remove(&fd);
                    return Ok(Vec::new());
                }
                if flags.contains("O_PATH") {
                    return Ok(Vec::new());
                }
                let append = flags.contains("O_APPEND");
                self.fds.insert(fd, Fd { offset: 0, append });
                if flags.contains("O_DIRECTORY") {
                    return Ok(Vec::new());
                }
                let truncate = flags.contains("O_TRUNC");
                if truncate {
                    self.sizes.insert(path.clone(), 0);
                }
                if flags.contains("O_CREAT") {
                    Ok(vec![Op::Create { path, truncate }])
                } else if truncate {
                    Ok(vec![Op::Truncate(path)])
                } else {
                    Ok(Vec::new())
                }
            }
            "close" => {
                if let Some(fd) = c.args.first().and_then(|a| fd_number(a)) {
                    self.fds.remove(&fd);
                }
                Ok(Vec::new())
            }
            "lseek" => {
                if !inside_fd(0) || failed {
                    return Ok(Vec::new());
                }
                let fd = fd_number(&c.args[0]).ok_or("lseek without a descriptor")?;
                let offset: u64 = c.ret.parse().map_err(|_| "lseek's result")?;
                self.fd(fd)?.offset = offset;
                Ok(Vec::new())
            }
            "read" | "readv" => {
                if !inside_fd(0) || failed {
                    return Ok(Vec::new());
                }
                let fd = fd_number(&c.args[0]).ok_or("a read without a descriptor")?;
                let n: u64 = c.ret.parse().map_err(|_| "a read's result")?;
                self.fd(fd)?.offset += n;
                Ok(Vec::new())
            }
            "write" | "writev" | "pwrite64" | "pwritev" | "pwritev2" => {
                if !inside_fd(0) || failed {
                    return Ok(Vec::new());
                }
                let path = fd_arg(0).ok_or("a write without a path")?;
                let fd = fd_number(&c.args[0]).ok_or("a write without a descriptor")?;
                let mut bytes = if c.name.ends_with('v') || c.name == "pwritev2" {
                    iovec_bytes(c.args.get(1).ok_or("no iovec")?)?
                } else {
                    unquote(c.args.get(1).ok_or("no buffer")?).ok_or("a buffer not read")?
                };
                let n: usize = c.ret.parse().map_err(|_| "a write's result")?;
                if bytes.len() < n {
                    return Err("a write's data cut short".into());
                }
                bytes.truncate(n);
                let size = self.sizes.get(&path).copied().unwrap_or(0);
                let offset = match c.name.as_str() {
                    "pwrite64" => parse_u64(c.args.get(3).ok_or("no offset")?)?,
                    "pwritev" | "pwritev2" => parse_u64(c.args.get(3).ok_or("no offset")?)?,
                    _ => {
                        let fd = self.fd(fd)?;
                        let at = if fd.append { size } else { fd.offset };
                        fd.offset = at + n as u64;
                        at
                    }
                };
                if c.name == "pwritev2" && c.args.get(4).is_some_and(|f| f != "0") {
                    return Err("pwritev2 with flags".into());
                }
                self.sizes.insert(path.clone(), size.max(offset + n as u64));
                Ok(vec![Op::Write {
                    path,
                    offset,
                    bytes: bytes.into(),
                }])
            }
            "ftruncate" | "truncate" => {
                if failed {
                    return Ok(Vec::new());
                }
                let path = if c.name == "ftruncate" {
                    match fd_arg(0) {
                        Some(p) if self.inside(&p) => p,
                        _ => return Ok(Vec::new()),
                    }
                } else {
                    match self.at_path("AT_FDCWD", c.args.first()) {
                        Some(p) if self.inside(&p) => p,
                        Some(_) => return Ok(Vec::new()),
                        None => return Err("truncate's path".into()),
                    }
                };
                let len = parse_u64(c.args.get(1).ok_or("no length")?)?;
                self.sizes.insert(path.clone(), len);
                Ok(vec![Op::SetLen { path, len }])
            }
            "fallocate" => {
                if !inside_fd(0) || failed {
                    return Ok(Vec::new());
                }
                let path = fd_arg(0).ok_or("fallocate without a path")?;
                let mode = c.args.get(1).ok_or("no mode")?;
                let offset = parse_u64(c.args.get(2).ok_or("no offset")?)?;
                let len = parse_u64(c.args.get(3).ok_or("no length")?)?;
                if mode == "0" {
                    let size = self.sizes.get(&path).copied().unwrap_or(0);
                    if offset + len > size {
                        self.sizes.insert(path.clone(), offset + len);
                        return Ok(vec![Op::SetLen {
                            path,
                            len: offset + len,
                        }]);
                    }
                    return Ok(Vec::new());
                }
                if mode == "FALLOC_FL_KEEP_SIZE" {
                    return Ok(Vec::new());
                }
                Err(format!("fallocate mode {mode}"))
            }
            "mkdir" | "mkdirat" => {
                if failed {
                    return Ok(Vec::new());
                }
                let path = if c.name == "mkdir" {
                    self.at_path("AT_FDCWD", c.args.first())
                } else {
                    self.at_path(c.args.first().map_or("", String::as_str), c.args.get(1))
                }
                .ok_or("mkdir's path")?;
                Ok(if self.inside(&path) {
                    vec![Op::Mkdir(path)]
                } else {
                    Vec::new()
                })
            }
            "rename" | "renameat" | "renameat2" | "link" | "linkat" => {
                if failed {
                    return Ok(Vec::new());
                }
                let (from, to) = if matches!(c.name.as_str(), "rename" | "link") {
                    (
                        self.at_path("AT_FDCWD", c.args.first()),
                        self.at_path("AT_FDCWD", c.args.get(1)),
                    )
                } else {
                    (
                        self.at_path(c.args.first().map_or("", String::as_str), c.args.get(1)),
                        self.at_path(c.args.get(2).map_or("", String::as_str), c.args.get(3)),
                    )
                };
                let (from, to) = (from.ok_or("its source")?, to.ok_or("its target")?);
                if !self.inside(&from) && !self.inside(&to) {
                    return Ok(Vec::new());
                }
                let flags = c.args.get(4).map_or("0", String::as_str);
                if c.name == "renameat2"
                    && (flags.contains("RENAME_EXCHANGE") || flags.contains("RENAME_WHITEOUT"))
                    || c.name == "linkat" && flags != "0"
                {
                    return Err(format!("{} with {flags}", c.name));
                }
                if !self.inside(&from) || !self.inside(&to) {
                    return Err("a rename or link across the root's edge".into());
                }
                if c.name.starts_with("link") {
                    return Ok(vec![Op::Link(from, to)]);
                }
                if let Some(size) = self.sizes.remove(&from) {
                    self.sizes.insert(to.clone(), size);
                }
                Ok(vec![Op::Rename(from, to)])
            }
            "unlink" | "unlinkat" | "rmdir" => {
                if failed {
                    return Ok(Vec::new());
                }
                let path = if c.name == "unlinkat" {
                    self.at_path(c.args.first().map_or("", String::as_str), c.args.get(1))
                } else {
                    self.at_path("AT_FDCWD", c.args.first())
                }
                .ok_or("its path")?;
                if !self.inside(&path) {
                    return Ok(Vec::new());
                }
                self.sizes.remove(&path);
                Ok(vec![Op::Remove(path)])
            }
            "fsync" | "fdatasync" => {
                if !inside_fd(0) || failed {
                    return Ok(Vec::new());
                }
                Ok(vec![Op::Sync(fd_arg(0).ok_or("fsync's path")?)])
            }
            "syncfs" | "sync" => Ok(if failed {
                Vec::new()
            } else {
                vec![Op::SyncAll]
            }),
            // No promise of durability (no metadata, no cache flush).
            "sync_file_range" => Ok(Vec::new()),
            "dup" | "dup2" | "dup3" => {
                if inside_fd(0) && !failed {
                    return Err("a descriptor under the root duplicated".into());
                }
                Ok(Vec::new())
            }
            "fcntl" => {
                let cmd = c.args.get(1).map_or("", String::as_str);
                if inside_fd(0) && cmd.starts_with("F_DUPFD") && !failed {
                    return Err("a descriptor under the root duplicated".into());
                }
                Ok(Vec::new())
            }
            "mmap" | "msync" => {
                let shared_writable = c.args.iter().any(|a| a.contains("PROT_WRITE"))
                    && c.args.iter().any(|a| a.contains("MAP_SHARED"));
                let file = c
                    .args
                    .get(4)
                    .is_some_and(|a| fd_path(a).is_some_and(|p| p.starts_with(&self.root)));
                if c.name == "mmap" && shared_writable && file {
                    return Err("a file under the root mapped shared and writable".into());
                }
                Ok(Vec::new())
            }
            "copy_file_range" | "sendfile" | "splice" => {
                // copy_file_range(in, off, out, …), splice(in, off, out, …),
                // sendfile(out, in, …).
                let target = if c.name == "sendfile" { 0 } else { 2 };
                if inside_fd(target) && !failed {
                    return Err("data copied into a file under the root".into());
                }
                Ok(Vec::new())
            }
            "io_uring_setup" => Err("io_uring: its operations are not traced".into()),
            "mknod" | "mknodat" | "symlink" | "symlinkat" => {
                let touches = c.args.iter().filter_map(|a| unquote(a)).any(|p| {
                    String::from_utf8_lossy(&p).starts_with(&*self.root.to_string_lossy())
                }) || c
                    .args
                    .iter()
                    .any(|a| fd_path(a).is_some_and(|p| p.starts_with(&self.root)));
                if touches && !failed {
                    return Err(format!("{} under the root", c.name));
                }
                Ok(Vec::new())
            }
            _ => Err(format!("{}: a call the reader does not know", c.name)),
        }
    }

    fn fd(&mut self, fd: i64) -> Result<&mut Fd, String> {
        self.fds
            .get_mut(&fd)
            .ok_or_else(|| format!("descriptor {fd} under the root, not seen opened"))
    }

    /// A path argument resolved against its folder descriptor (`dirfd`,
    /// with its path as `-y` prints it; `AT_FDCWD` alone, for a call that
    /// takes none, is the working folder).
    fn at_path(&self, dirfd: &str, arg: Option<&String>) -> Option<PathBuf> {
        let raw = unquote(arg?)?;
        let path = PathBuf::from(String::from_utf8(raw).ok()?);
        if path.is_absolute() {
            return Some(path);
        }
        if dirfd == "AT_FDCWD" {
            return Some(self.cwd.join(path));
        }
        Some(fd_path(dirfd)?.join(path))
    }
}

/// `TID SECONDS.MICROS rest`.
fn split_line(line: &str) -> Option<(u32, f64, &str)> {
    let line = line.trim_start();
    let (tid, rest) = line.split_once(' ')?;
    let (at, rest) = rest.trim_start().split_once(' ')?;
    Some((tid.parse().ok()?, at.parse().ok()?, rest))
}

/// A call read from its line: `name(args) = ret`.
#[derive(Debug)]
struct Call {
    name: String,
    args: Vec<String>,
    ret: String,
}

impl Call {
    fn parse(call: &str) -> Option<Call> {
        let (name, rest) = call.split_once('(')?;
        let cut = rest.rfind(") = ")?;
        let ret = rest[cut + 4..].split(' ').next()?.to_owned();
        Some(Call {
            name: name.to_owned(),
            args: split_args(&rest[..cut]),
            ret,
        })
    }
}

/// The path `-y` prints after a descriptor, `7<\x2f…>`, decoded.
fn fd_path(arg: &str) -> Option<PathBuf> {
    let start = arg.find('<')?;
    let end = arg.rfind('>')?;
    if end <= start + 1 {
        return None;
    }
    let bytes = unescape(&arg[start + 1..end])?;
    let text = String::from_utf8(bytes).ok()?;
    // A descriptor on a file removed since: not a path any more.
    if text.ends_with(" (deleted)") || !text.starts_with('/') {
        return None;
    }
    Some(PathBuf::from(text))
}

/// The number of a descriptor argument (`7<…>` or `7`).
fn fd_number(arg: &str) -> Option<i64> {
    arg.split('<').next()?.trim().parse().ok()
}

/// A number argument.
fn parse_u64(arg: &str) -> Result<u64, String> {
    arg.trim()
        .parse()
        .map_err(|_| format!("not a number: {arg}"))
}

/// A string argument as strace prints it with `-xx` (`"\x41\x42"`); `None`
/// when it is not one whole string (cut short strings end in `...`).
fn unquote(arg: &str) -> Option<Vec<u8>> {
    let inner = arg.strip_prefix('"')?.strip_suffix('"')?;
    unescape(inner)
}

/// `\xHH` escapes (and the other escapes strace may use) decoded.
fn unescape(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4);
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes.get(i + 1)? {
            b'x' => {
                let hex = std::str::from_utf8(bytes.get(i + 2..i + 4)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            b'n' => {
                out.push(b'\n');
                i += 2;
            }
            b't' => {
                out.push(b'\t');
                i += 2;
            }
            c => {
                out.push(*c);
                i += 2;
            }
        }
    }
    Some(out)
}

/// The bytes of an iovec array, `[{iov_base="…", iov_len=N}, …]`, in order.
fn iovec_bytes(arg: &str) -> Result<Vec<u8>, String> {
    let inner = arg
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .ok_or("an iovec array")?;
    let mut out = Vec::new();
    for element in split_args(inner) {
        let element = element
            .strip_prefix('{')
            .and_then(|e| e.strip_suffix('}'))
            .ok_or("an iovec")?;
        let base = split_args(element)
            .into_iter()
            .find_map(|f| f.strip_prefix("iov_base=").map(str::to_owned))
            .ok_or("an iovec's base")?;
        out.extend(unquote(&base).ok_or("an iovec's data cut short")?);
    }
    Ok(out)
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

    /// `s` as strace prints it with `-xx`.
    fn hex(s: &str) -> String {
        s.bytes().map(|b| format!("\\x{b:02x}")).collect()
    }

    fn read(lines: &[String]) -> Trace {
        let mut r = Reader::new(Path::new("/w"), Path::new("/w"));
        for l in lines {
            r.line(l);
        }
        r.trace
    }

    #[test]
    fn reads_the_calls_the_model_needs_with_their_data_and_completion_times() {
        let d = hex("/w/d");
        let f = hex("/w/d/a.msg");
        let lines = vec![
            format!(
                r#"7 10.0 mkdirat(AT_FDCWD<{}>, "{d}", 0700) = 0 <0.5>"#,
                hex("/w")
            ),
            format!(
                r#"7 11.0 openat(AT_FDCWD<{}>, "{f}", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0600) = 9<{f}> <0.1>"#,
                hex("/w")
            ),
            format!(r#"7 12.0 write(9<{f}>, "{}", 5) = 3 <0.1>"#, hex("hello")),
            format!(r#"7 12.5 write(9<{f}>, "{}", 2) = 2 <0.1>"#, hex("lo")),
            format!(
                r#"8 13.0 pwrite64(9<{f}>, "{}", 2, 4096) = 2 <0.1>"#,
                hex("zz")
            ),
            format!("7 14.0 fsync(9<{f}>) = 0 <0.25>"),
            format!(
                r#"7 15.0 renameat2(AT_FDCWD<{}>, "{f}", AT_FDCWD<{}>, "{}", RENAME_NOREPLACE) = 0 <0.1>"#,
                hex("/w"),
                hex("/w"),
                hex("/w/d/b.msg")
            ),
            format!(
                r#"7 16.0 openat(AT_FDCWD<{}>, "{}", O_RDONLY|O_CLOEXEC) = 3<{}> <0.1>"#,
                hex("/"),
                hex("/etc/hosts"),
                hex("/etc/hosts")
            ),
            format!(
                r#"7 17.0 write(3<{}>, "{}", 1) = 1 <0.1>"#,
                hex("/etc/hosts"),
                hex("x")
            ),
        ];
        let t = read(&lines);
        assert!(t.unmodelled.is_empty(), "{:?}", t.unmodelled);
        let ops: Vec<String> = t
            .events
            .iter()
            .map(|e| format!("{} {:?}", e.at, e.op))
            .collect();
        assert_eq!(
            ops,
            vec![
                r#"10.5 Mkdir("/w/d")"#.to_owned(),
                r#"11.1 Create { path: "/w/d/a.msg", truncate: true }"#.to_owned(),
                r#"12.1 Write { path: "/w/d/a.msg", offset: 0, bytes: [104, 101, 108] }"#
                    .to_owned(),
                r#"12.6 Write { path: "/w/d/a.msg", offset: 3, bytes: [108, 111] }"#.to_owned(),
                r#"13.1 Write { path: "/w/d/a.msg", offset: 4096, bytes: [122, 122] }"#.to_owned(),
                r#"14.25 Sync("/w/d/a.msg")"#.to_owned(),
                r#"15.1 Rename("/w/d/a.msg", "/w/d/b.msg")"#.to_owned(),
            ]
        );
    }

    #[test]
    fn an_interrupted_call_completes_when_it_resumes() {
        let f = hex("/w/a");
        let lines = vec![
            format!("5 1.0 fsync(3<{f}> <unfinished ...>"),
            format!("6 1.5 fsync(4<{f}>) = 0 <0.1>"),
            "5 2.0 <... fsync resumed>) = 0 <1.5>".to_owned(),
        ];
        let t = read(&lines);
        assert!(t.unmodelled.is_empty(), "{:?}", t.unmodelled);
        let at: Vec<f64> = t.events.iter().map(|e| e.at).collect();
        assert_eq!(at, vec![1.6, 2.5]);
    }

    #[test]
    fn a_descriptor_number_reused_before_its_close_is_reported() {
        let (a, b) = (hex("/w/a"), hex("/w/b"));
        let lines = vec![
            format!("5 1.0 close(20<{a}> <unfinished ...>"),
            format!(
                r#"6 1.1 openat(AT_FDCWD<{0}>, "{b}", O_WRONLY|O_CREAT, 0600) = 20<{b}> <0.1>"#,
                hex("/w")
            ),
            format!(
                r#"6 1.3 write(20<{b}>, "{}", 3 <unfinished ...>"#,
                hex("abc")
            ),
            "5 1.4 <... close resumed>) = 0 <0.4>".to_owned(),
            "6 1.5 <... write resumed>) = 3 <0.2>".to_owned(),
        ];
        let t = read(&lines);
        assert!(t.unmodelled.is_empty(), "{:?}", t.unmodelled);
        assert_eq!(
            format!("{:?}", t.events[1].op),
            r#"Write { path: "/w/b", offset: 0, bytes: [97, 98, 99] }"#
        );
    }

    #[test]
    fn what_the_model_does_not_know_under_the_root_is_reported() {
        let f = hex("/w/a");
        let lines = vec![
            format!("5 1.0 dup(3<{f}>) = 4<{f}> <0.1>"),
            format!(
                "5 1.0 mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, 3<{f}>, 0) = 0x7f00 <0.1>"
            ),
            format!(r#"5 1.0 write(3<{f}>, "{}"..., 9) = 9 <0.1>"#, hex("abc")),
            format!(r#"5 1.0 write(12<{f}>, "{}", 3) = 3 <0.1>"#, hex("abc")),
            "5 1.0 not a call".to_owned(),
            format!("5 1.0 io_uring_setup(8, {{}}) = 5 <0.1>"),
        ];
        let t = read(&lines);
        assert_eq!(t.unmodelled.len(), 6, "{:#?}", t.unmodelled);
        assert!(t.events.is_empty());
    }

    #[test]
    fn vectored_writes_are_read_whole() {
        let f = hex("/w/a");
        let lines = vec![
            format!(
                r#"5 1.0 openat(AT_FDCWD<{0}>, "{f}", O_RDWR|O_CREAT, 0600) = 3<{f}> <0.1>"#,
                hex("/w")
            ),
            format!(
                r#"5 1.0 pwritev(3<{f}>, [{{iov_base="{}", iov_len=2}}, {{iov_base="{}", iov_len=1}}], 2, 8) = 3 <0.1>"#,
                hex("ab"),
                hex("c")
            ),
        ];
        let t = read(&lines);
        assert!(t.unmodelled.is_empty(), "{:?}", t.unmodelled);
        assert_eq!(
            format!("{:?}", t.events[1].op),
            r#"Write { path: "/w/a", offset: 8, bytes: [97, 98, 99] }"#
        );
    }
}
