//! The file system as a power loss may leave it, replayed from the
//! recorded [`Event`]s, and the crash states explored at every cut.
//!
//! What is durable, which no crash state may undo:
//! - a file's data and size, at its `fsync` or `fdatasync`;
//! - a folder's entries, at an `fsync` of the folder; a rename is atomic
//!   and becomes durable whole at an fsync of either folder it touches
//!   (as ext4, XFS and Btrfs commit it);
//! - everything, at `syncfs` or `sync`.
//!
//! Nothing else is taken as given: the folder the data folder is made in
//! starts empty, and nothing in it is durable. Of what is not durable at a
//! cut (after any operation), a crash may keep:
//! - of each folder's entry changes, a prefix in the order they were made
//!   (a rename only with both its folders' prefixes);
//! - of each file's data, in whole pages of 4 KiB, any mix of old and new
//!   bytes (torn writes), with the old size or the new one; pages past
//!   the old size that did not reach the disk read as zeros.
//!
//! Every such subset is too many: at each cut [`Fs::crash_states`] builds,
//! bounded and seeded ([`Bounds`]), the states ALICE and CrashMonkey look
//! at: everything kept (the page cache survived), nothing kept, prefixes
//! of the operations in the order they were made, each folder's changes
//! alone lost, each file's data alone lost, zeroed or torn (even pages,
//! odd pages), and random mixes of folder prefixes and pages.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hasher;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::record::{Event, Op};

/// The unit in which unsynced data reaches the disk or not.
pub(crate) const PAGE: u64 = 4096;

/// An inode of the model.
type Ino = usize;

/// The root folder (the one the data folder is made in).
const ROOT: Ino = 0;

/// A 128-bit digest: two SipHashes of the same bytes, told apart by a
/// first byte. It tells crash states apart (not against an adversary).
#[derive(Clone)]
struct Digest([std::hash::DefaultHasher; 2]);

impl Digest {
    fn new() -> Digest {
        let mut hashers = [
            std::hash::DefaultHasher::new(),
            std::hash::DefaultHasher::new(),
        ];
        for (salt, h) in hashers.iter_mut().enumerate() {
            h.write_u8(salt as u8);
        }
        Digest(hashers)
    }

    fn update(&mut self, bytes: &[u8]) {
        for h in &mut self.0 {
            h.write(bytes);
        }
    }

    fn finish(&self) -> u128 {
        (u128::from(self.0[0].finish()) << 64) | u128::from(self.0[1].finish())
    }
}

/// One page of a file and the digest that names it in a crash state.
#[derive(Debug)]
pub(crate) struct Page {
    bytes: Box<[u8]>,
    digest: u128,
}

impl Page {
    fn new(bytes: Box<[u8]>) -> Arc<Page> {
        let mut d = Digest::new();
        d.update(&bytes);
        let digest = d.finish();
        Arc::new(Page { bytes, digest })
    }
}

/// A file's bytes: its size and its pages (a page not held is zeros).
#[derive(Clone, Debug, Default)]
pub(crate) struct Data {
    size: u64,
    pages: BTreeMap<u64, Arc<Page>>,
}

impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        self.size == other.size
            && self.pages.len() == other.pages.len()
            && self
                .pages
                .iter()
                .zip(&other.pages)
                .all(|((a, x), (b, y))| a == b && x.digest == y.digest)
    }
}

impl Data {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        let end = offset + bytes.len() as u64;
        let mut at = offset;
        while at < end {
            let page = at / PAGE;
            let start = (at % PAGE) as usize;
            let take = ((PAGE as usize) - start).min((end - at) as usize);
            let mut buf: Box<[u8]> = match self.pages.get(&page) {
                Some(p) => p.bytes.clone(),
                None => vec![0u8; PAGE as usize].into(),
            };
            let from = (at - offset) as usize;
            buf[start..start + take].copy_from_slice(&bytes[from..from + take]);
            self.pages.insert(page, Page::new(buf));
            at += take as u64;
        }
        self.size = self.size.max(end);
    }

    /// The file cut or grown to `len`: no page, nor part of one, is kept
    /// past it (a mix of pages may hold newer pages than its size reaches).
    fn set_len(&mut self, len: u64) {
        let keep = len.div_ceil(PAGE);
        self.pages.retain(|p, _| *p < keep);
        let tail = (len % PAGE) as usize;
        if tail != 0
            && let Some(page) = self.pages.get_mut(&(len / PAGE))
            && page.bytes[tail..].iter().any(|b| *b != 0)
        {
            let mut buf = page.bytes.clone();
            buf[tail..].fill(0);
            *page = Page::new(buf);
        }
        self.size = len;
    }

    fn apply(&mut self, op: &DataOp) {
        match op {
            DataOp::Write { offset, bytes } => self.write(*offset, bytes),
            DataOp::SetLen(len) => self.set_len(*len),
        }
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; usize::try_from(self.size).unwrap_or(0)];
        for (p, page) in &self.pages {
            let start = (*p * PAGE) as usize;
            if start >= out.len() {
                continue;
            }
            let take = (out.len() - start).min(PAGE as usize);
            out[start..start + take].copy_from_slice(&page.bytes[..take]);
        }
        out
    }

    /// The pages whose bytes differ between `self` and `other`, within
    /// either's size.
    fn differing(&self, other: &Data) -> BTreeSet<u64> {
        let pages = self.size.max(other.size).div_ceil(PAGE);
        (0..pages)
            .filter(|p| {
                let a = self.pages.get(p).map(|x| x.digest);
                let b = other.pages.get(p).map(|x| x.digest);
                a != b
            })
            .collect()
    }
}

/// A change of a file's data.
#[derive(Clone, Debug)]
enum DataOp {
    Write { offset: u64, bytes: Arc<[u8]> },
    SetLen(u64),
}

/// One folder entry set (to an inode) or removed.
#[derive(Clone, Debug)]
struct Change {
    dir: Ino,
    name: String,
    to: Option<Ino>,
}

/// A change not yet durable, in the order it was made.
#[derive(Clone, Debug)]
enum Pending {
    /// An atomic change of folder entries (a rename touches two).
    Entries(Vec<Change>),
    Data {
        ino: Ino,
        op: DataOp,
    },
}

impl Pending {
    /// The folders an entry change touches.
    fn dirs(&self) -> Vec<Ino> {
        match self {
            Pending::Entries(changes) => {
                let mut dirs: Vec<Ino> = changes.iter().map(|c| c.dir).collect();
                dirs.dedup();
                dirs
            }
            Pending::Data { .. } => Vec::new(),
        }
    }
}

/// The folders' entries.
type Names = HashMap<Ino, BTreeMap<String, Ino>>;

fn set(names: &mut Names, changes: &[Change]) {
    for c in changes {
        let entries = names.entry(c.dir).or_default();
        match c.to {
            Some(ino) => entries.insert(c.name.clone(), ino),
            None => entries.remove(&c.name),
        };
    }
}

/// One entry of a crash state.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Node {
    Dir,
    File(Data),
}

/// A crash state: every path under the root and what it is.
pub(crate) type State = BTreeMap<PathBuf, Node>;

/// The digest that tells crash states apart.
pub(crate) fn digest(state: &State) -> u128 {
    let mut h = Digest::new();
    for (path, node) in state {
        h.update(path.as_os_str().as_encoded_bytes());
        h.update(&[0]);
        match node {
            Node::Dir => h.update(&[1]),
            Node::File(data) => {
                h.update(&[2]);
                h.update(&data.size.to_le_bytes());
                for (p, page) in &data.pages {
                    h.update(&p.to_le_bytes());
                    h.update(&page.digest.to_le_bytes());
                }
            }
        }
    }
    h.finish()
}

/// How many crash states a cut gives beyond the fixed ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Prefixes of the unsynced operations, spread over them.
    pub(crate) prefixes: usize,
    /// Random mixes of folder prefixes and pages.
    pub(crate) random: usize,
    /// The seed of the random mixes (with the cut's number).
    pub(crate) seed: u64,
}

/// What a crash state keeps of the unsynced changes.
#[derive(Clone, Debug)]
struct Choice {
    /// Per pending change: kept.
    keep: Vec<bool>,
    /// Files whose data is a mix of pages instead of the kept changes.
    pages: HashMap<Ino, Mix>,
}

/// A file's data as a mix of its durable and its current pages.
#[derive(Clone, Debug)]
struct Mix {
    /// The current size (else the durable one).
    new_size: bool,
    /// The pages with their current bytes.
    new: BTreeSet<u64>,
}

/// The model: what the system sees, what is durable, and what is pending.
#[derive(Clone, Debug)]
pub(crate) struct Fs {
    root: PathBuf,
    next: Ino,
    dirs: HashSet<Ino>,
    current: Names,
    durable: Names,
    data: HashMap<Ino, Data>,
    durable_data: HashMap<Ino, Data>,
    pending: Vec<Pending>,
}

impl Fs {
    /// An empty root at `root` (nothing in it durable).
    pub(crate) fn new(root: &Path) -> Fs {
        Fs {
            root: root.to_owned(),
            next: ROOT + 1,
            dirs: HashSet::from([ROOT]),
            current: Names::from([(ROOT, BTreeMap::new())]),
            durable: Names::from([(ROOT, BTreeMap::new())]),
            data: HashMap::new(),
            durable_data: HashMap::new(),
            pending: Vec::new(),
        }
    }

    /// The folder and name of `path`, which must be under the root.
    fn split(&self, path: &Path) -> Result<(Ino, String), String> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| format!("{} is not under the root", path.display()))?;
        let name = rel
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{} has no name", path.display()))?
            .to_owned();
        let parent = self.walk(rel.parent().unwrap_or(Path::new("")))?;
        if !self.dirs.contains(&parent) {
            return Err(format!("{}'s parent is not a folder", path.display()));
        }
        Ok((parent, name))
    }

    fn walk(&self, rel: &Path) -> Result<Ino, String> {
        let mut ino = ROOT;
        for part in rel.components() {
            let name = part.as_os_str().to_str().unwrap_or_default();
            ino = *self
                .current
                .get(&ino)
                .and_then(|e| e.get(name))
                .ok_or_else(|| format!("no {} in the model", rel.display()))?;
        }
        Ok(ino)
    }

    fn resolve(&self, path: &Path) -> Result<Ino, String> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| format!("{} is not under the root", path.display()))?;
        self.walk(rel)
    }

    fn entries(&mut self, changes: Vec<Change>) {
        set(&mut self.current, &changes);
        self.pending.push(Pending::Entries(changes));
    }

    fn change_data(&mut self, ino: Ino, op: DataOp) {
        self.data.entry(ino).or_default().apply(&op);
        self.pending.push(Pending::Data { ino, op });
    }

    fn new_ino(&mut self) -> Ino {
        self.next += 1;
        self.next - 1
    }

    /// Replays one operation; `Err` when the model cannot place it.
    pub(crate) fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Create { path, truncate } => {
                let (dir, name) = self.split(path)?;
                match self.current[&dir].get(&name).copied() {
                    Some(ino) if *truncate => self.change_data(ino, DataOp::SetLen(0)),
                    Some(_) => {}
                    None => {
                        let ino = self.new_ino();
                        self.data.insert(ino, Data::default());
                        self.durable_data.insert(ino, Data::default());
                        self.entries(vec![Change {
                            dir,
                            name,
                            to: Some(ino),
                        }]);
                    }
                }
            }
            Op::Truncate(path) => {
                let ino = self.resolve(path)?;
                self.change_data(ino, DataOp::SetLen(0));
            }
            Op::Mkdir(path) => {
                let (dir, name) = self.split(path)?;
                let ino = self.new_ino();
                self.dirs.insert(ino);
                self.current.insert(ino, BTreeMap::new());
                self.durable.insert(ino, BTreeMap::new());
                self.entries(vec![Change {
                    dir,
                    name,
                    to: Some(ino),
                }]);
            }
            Op::Rename(from, to) => {
                let (a, from_name) = self.split(from)?;
                let (b, to_name) = self.split(to)?;
                let ino = self.current[&a]
                    .get(&from_name)
                    .copied()
                    .ok_or_else(|| format!("no {} to rename", from.display()))?;
                if (a, &from_name) != (b, &to_name) {
                    self.entries(vec![
                        Change {
                            dir: a,
                            name: from_name,
                            to: None,
                        },
                        Change {
                            dir: b,
                            name: to_name,
                            to: Some(ino),
                        },
                    ]);
                }
            }
            Op::Link(from, to) => {
                let ino = self.resolve(from)?;
                let (dir, name) = self.split(to)?;
                self.entries(vec![Change {
                    dir,
                    name,
                    to: Some(ino),
                }]);
            }
            Op::Remove(path) => {
                let (dir, name) = self.split(path)?;
                if !self.current[&dir].contains_key(&name) {
                    return Err(format!("no {} to remove", path.display()));
                }
                self.entries(vec![Change {
                    dir,
                    name,
                    to: None,
                }]);
            }
            Op::Write {
                path,
                offset,
                bytes,
            } => {
                let ino = self.resolve(path)?;
                if self.dirs.contains(&ino) {
                    return Err(format!("a write to the folder {}", path.display()));
                }
                let op = DataOp::Write {
                    offset: *offset,
                    bytes: bytes.clone(),
                };
                self.change_data(ino, op);
            }
            Op::SetLen { path, len } => {
                let ino = self.resolve(path)?;
                self.change_data(ino, DataOp::SetLen(*len));
            }
            Op::Sync(path) => {
                let ino = self.resolve(path)?;
                if self.dirs.contains(&ino) {
                    let now = self.synced_with(ino);
                    let mut later = Vec::with_capacity(self.pending.len() - now.len());
                    for (i, p) in std::mem::take(&mut self.pending).into_iter().enumerate() {
                        match p {
                            Pending::Entries(changes) if now.contains(&i) => {
                                set(&mut self.durable, &changes);
                            }
                            p => later.push(p),
                        }
                    }
                    self.pending = later;
                } else {
                    let data = self.data.get(&ino).cloned().unwrap_or_default();
                    self.durable_data.insert(ino, data);
                    self.pending
                        .retain(|p| !matches!(p, Pending::Data { ino: i, .. } if *i == ino));
                }
            }
            Op::SyncAll => {
                self.durable = self.current.clone();
                self.durable_data = self.data.clone();
                self.pending.clear();
            }
        }
        Ok(())
    }

    /// The pending entry changes an fsync of folder `dir` makes durable:
    /// those touching it, and with each of them every earlier change of
    /// the other folder it touches (a rename), since a folder's durable
    /// changes are a prefix of its changes. A rename out of a folder made
    /// durable through the folder it goes to brings the changes that made
    /// its name there with it: the file is never in both.
    fn synced_with(&self, dir: Ino) -> BTreeSet<usize> {
        // Per folder, the last of its pending changes that becomes durable.
        // Walked from the last change back, a change taken marks each
        // folder it touches that has no mark yet at itself: a mark only
        // takes changes still to be walked.
        let mut need: HashMap<Ino, usize> = HashMap::new();
        let mut now = BTreeSet::new();
        for (i, p) in self.pending.iter().enumerate().rev() {
            let dirs = p.dirs();
            let taken = dirs
                .iter()
                .any(|d| *d == dir || need.get(d).is_some_and(|n| i <= *n));
            if !taken {
                continue;
            }
            for d in dirs {
                need.entry(d).or_insert(i);
            }
            now.insert(i);
        }
        now
    }

    /// The state the running system sees (every change kept).
    pub(crate) fn current(&self) -> State {
        self.build(&Choice {
            keep: vec![true; self.pending.len()],
            pages: HashMap::new(),
        })
    }

    /// The crash states of a cut after the last operation replayed, each
    /// with what it is; `rng` picks the random ones.
    pub(crate) fn crash_states(
        &self,
        bounds: &Bounds,
        rng: &mut StdRng,
    ) -> Vec<(&'static str, State)> {
        let n = self.pending.len();
        let all = Choice {
            keep: vec![true; n],
            pages: HashMap::new(),
        };
        let mut choices = vec![
            ("page cache", all.clone()),
            (
                "nothing unsynced",
                Choice {
                    keep: vec![false; n],
                    pages: HashMap::new(),
                },
            ),
        ];
        // Prefixes in the order the changes were made.
        if n >= 2 {
            let mut cuts: BTreeSet<usize> = (1..=bounds.prefixes)
                .map(|i| i * n / (bounds.prefixes + 1))
                .filter(|j| (1..n).contains(j))
                .collect();
            cuts.insert(n - 1);
            for j in cuts {
                let keep = (0..n).map(|i| i < j).collect();
                choices.push((
                    "a prefix",
                    Choice {
                        keep,
                        pages: HashMap::new(),
                    },
                ));
            }
        }
        // Each folder's changes alone lost.
        let dirs: BTreeSet<Ino> = self.pending.iter().flat_map(Pending::dirs).collect();
        for d in &dirs {
            let limits = HashMap::from([(*d, 0)]);
            choices.push((
                "a folder's changes lost",
                Choice {
                    keep: self.consistent(&limits, &vec![true; n]),
                    pages: HashMap::new(),
                },
            ));
        }
        // Each file's data alone lost, zeroed, or torn.
        let files: BTreeSet<Ino> = self
            .pending
            .iter()
            .filter_map(|p| match p {
                Pending::Data { ino, .. } => Some(*ino),
                Pending::Entries(_) => None,
            })
            .collect();
        for f in &files {
            let differing = self.differing(*f);
            let mix = |new_size: bool, new: BTreeSet<u64>| Choice {
                keep: all.keep.clone(),
                pages: HashMap::from([(*f, Mix { new_size, new })]),
            };
            choices.push(("a file's data lost", mix(false, BTreeSet::new())));
            choices.push(("a file's data zeroed", mix(true, BTreeSet::new())));
            let (even, odd): (BTreeSet<u64>, BTreeSet<u64>) =
                differing.iter().partition(|p| *p % 2 == 0);
            choices.push(("a file's data torn", mix(true, even)));
            choices.push(("a file's data torn", mix(true, odd)));
        }
        // Random mixes.
        for _ in 0..bounds.random {
            let limits: HashMap<Ino, usize> = dirs
                .iter()
                .map(|d| (*d, rng.random_range(0..=self.changes_of(*d))))
                .collect();
            let data_keep: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
            let mut choice = Choice {
                keep: self.consistent(&limits, &data_keep),
                pages: HashMap::new(),
            };
            for f in &files {
                if rng.random_bool(0.5) {
                    let new = self
                        .differing(*f)
                        .into_iter()
                        .filter(|_| rng.random_bool(0.5))
                        .collect();
                    let new_size = rng.random_bool(0.5);
                    choice.pages.insert(*f, Mix { new_size, new });
                }
            }
            choices.push(("a random mix", choice));
        }
        choices
            .into_iter()
            .map(|(what, choice)| (what, self.build(&choice)))
            .collect()
    }

    /// How many pending entry changes touch folder `d`.
    fn changes_of(&self, d: Ino) -> usize {
        self.pending
            .iter()
            .filter(|p| p.dirs().contains(&d))
            .count()
    }

    /// The pages of file `f` whose current bytes differ from its durable
    /// ones.
    fn differing(&self, f: Ino) -> BTreeSet<u64> {
        let current = self.data.get(&f).cloned().unwrap_or_default();
        let durable = self.durable_data.get(&f).cloned().unwrap_or_default();
        current.differing(&durable)
    }

    /// Which pending changes to keep when each folder in `limits` keeps
    /// only its first so many entry changes: a change touching two
    /// folders is kept only within both prefixes, and a folder's later
    /// changes go with it. Data changes are kept as `data_keep` says.
    fn consistent(&self, limits: &HashMap<Ino, usize>, data_keep: &[bool]) -> Vec<bool> {
        let mut limits = limits.clone();
        let mut seen: HashMap<Ino, usize> = HashMap::new();
        let mut keep = Vec::with_capacity(self.pending.len());
        for (i, p) in self.pending.iter().enumerate() {
            if let Pending::Data { .. } = p {
                keep.push(data_keep.get(i).copied().unwrap_or(true));
                continue;
            }
            let positions: Vec<(Ino, usize)> = p
                .dirs()
                .into_iter()
                .map(|d| {
                    let at = seen.entry(d).or_default();
                    *at += 1;
                    (d, *at - 1)
                })
                .collect();
            let kept = positions
                .iter()
                .all(|(d, at)| limits.get(d).is_none_or(|l| at < l));
            if !kept {
                // Lost, so every later change of its folders is lost too
                // (a prefix of each folder's changes persists).
                for (d, at) in positions {
                    let limit = limits.entry(d).or_insert(usize::MAX);
                    *limit = (*limit).min(at);
                }
            }
            keep.push(kept);
        }
        keep
    }

    /// The state a choice leaves.
    fn build(&self, choice: &Choice) -> State {
        let mut names = self.durable.clone();
        // A file keeping all its pending data changes has its current
        // data, one keeping none its durable data; only the others are
        // replayed.
        let mut kept: HashMap<Ino, (usize, usize)> = HashMap::new();
        for (p, keep) in self.pending.iter().zip(&choice.keep) {
            if let Pending::Data { ino, .. } = p {
                let k = kept.entry(*ino).or_default();
                k.0 += usize::from(*keep);
                k.1 += 1;
            }
        }
        let mut data = self.durable_data.clone();
        for (ino, (keep, all)) in &kept {
            if keep == all && !choice.pages.contains_key(ino) {
                data.insert(*ino, self.data.get(ino).cloned().unwrap_or_default());
            }
        }
        for (p, keep) in self.pending.iter().zip(&choice.keep) {
            if !keep {
                continue;
            }
            match p {
                Pending::Entries(changes) => set(&mut names, changes),
                Pending::Data { ino, op }
                    if !choice.pages.contains_key(ino)
                        && kept.get(ino).is_some_and(|(k, a)| k != a) =>
                {
                    data.entry(*ino).or_default().apply(op);
                }
                Pending::Data { .. } => {}
            }
        }
        for (ino, mix) in &choice.pages {
            let current = self.data.get(ino).cloned().unwrap_or_default();
            let mut mixed = self.durable_data.get(ino).cloned().unwrap_or_default();
            let size = if mix.new_size {
                current.size
            } else {
                mixed.size
            };
            for p in &mix.new {
                match current.pages.get(p) {
                    Some(page) => mixed.pages.insert(*p, page.clone()),
                    None => mixed.pages.remove(p),
                };
            }
            // Pages past the durable size that did not reach the disk are
            // zeros: the durable data holds none there.
            mixed.set_len(size);
            data.insert(*ino, mixed);
        }
        let mut state = State::new();
        self.collect(&names, &data, ROOT, PathBuf::new(), &mut state, 0);
        state
    }

    fn collect(
        &self,
        names: &Names,
        data: &HashMap<Ino, Data>,
        dir: Ino,
        prefix: PathBuf,
        out: &mut State,
        depth: usize,
    ) {
        let Some(entries) = names.get(&dir) else {
            return;
        };
        for (name, ino) in entries {
            let path = prefix.join(name);
            if self.dirs.contains(ino) {
                out.insert(path.clone(), Node::Dir);
                if depth < 32 {
                    self.collect(names, data, *ino, path, out, depth + 1);
                }
            } else {
                let bytes = data.get(ino).cloned().unwrap_or_default();
                out.insert(path, Node::File(bytes));
            }
        }
    }
}

/// One crash state to check.
pub(crate) struct Candidate {
    /// The number of operations before the cut.
    pub(crate) cut: usize,
    /// The crash can happen until the next operation completes: what was
    /// acknowledged before this counts.
    pub(crate) until: f64,
    /// Which of the cut's states it is.
    pub(crate) what: &'static str,
    pub(crate) state: State,
}

/// Replays `events` under `root`, calling `visit` with every crash state
/// of every cut; the model after the last event. `Err` names an operation
/// the model could not place.
pub(crate) fn explore(
    root: &Path,
    events: &[Event],
    bounds: &Bounds,
    mut visit: impl FnMut(Candidate),
) -> anyhow::Result<Fs> {
    let mut fs = Fs::new(root);
    let mut until = f64::MIN;
    for (k, event) in events.iter().enumerate() {
        fs.apply(&event.op)
            .map_err(|e| anyhow::anyhow!("operation {k} ({:?}): {e}", event.op))?;
        until = until.max(events.get(k + 1).map_or(f64::INFINITY, |e| e.at));
        let mut rng = StdRng::seed_from_u64(bounds.seed ^ (k as u64).wrapping_mul(0x9e37_79b9));
        for (what, state) in fs.crash_states(bounds, &mut rng) {
            visit(Candidate {
                cut: k + 1,
                until,
                what,
                state,
            });
        }
    }
    Ok(fs)
}

/// Makes `state` real under `dest` (folders 0700, files 0600).
pub(crate) fn materialize(state: &State, dest: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dest)?;
    for (path, node) in state {
        let target = dest.join(path);
        match node {
            Node::Dir => std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&target)
                .with_context(|| format!("creating {}", target.display()))?,
            Node::File(data) => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&target)
                    .with_context(|| format!("creating {}", target.display()))?;
                use std::os::unix::fs::FileExt;
                file.set_len(data.size)?;
                for (p, page) in &data.pages {
                    let start = p * PAGE;
                    let take = (data.size - start).min(PAGE) as usize;
                    file.write_all_at(&page.bytes[..take], start)?;
                }
            }
        }
    }
    Ok(())
}

/// Where the model's current state and the folder `real` (the root, after
/// the server was killed: its page cache intact) differ; empty when the
/// model saw every change.
pub(crate) fn differences(model: &State, real: &Path) -> anyhow::Result<Vec<String>> {
    let mut on_disk = BTreeMap::new();
    read_tree(real, PathBuf::new(), &mut on_disk)?;
    let mut out = Vec::new();
    for (path, node) in model {
        match (node, on_disk.remove(path)) {
            (_, None) => out.push(format!("{} is in the model, not on disk", path.display())),
            (Node::Dir, Some(None)) => {}
            (Node::File(data), Some(Some(bytes))) if data.bytes() == bytes => {}
            (Node::File(data), Some(Some(bytes))) => out.push(format!(
                "{}: the model has {} bytes, the disk {} (first difference at {})",
                path.display(),
                data.size,
                bytes.len(),
                data.bytes()
                    .iter()
                    .zip(&bytes)
                    .position(|(a, b)| a != b)
                    .unwrap_or(bytes.len().min(data.size as usize))
            )),
            (_, Some(_)) => out.push(format!(
                "{}: a file on one side, a folder on the other",
                path.display()
            )),
        }
    }
    for path in on_disk.keys() {
        out.push(format!("{} is on disk, not in the model", path.display()));
    }
    Ok(out)
}

/// Every path under `dir`: `None` for a folder, a file's bytes.
fn read_tree(
    dir: &Path,
    prefix: PathBuf,
    out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>,
) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = prefix.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            out.insert(path.clone(), None);
            read_tree(&entry.path(), path, out)?;
        } else {
            out.insert(path, Some(std::fs::read(entry.path())?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(op: Op) -> Event {
        Event { at: 0.0, op }
    }

    fn write(path: &str, offset: u64, bytes: &[u8]) -> Event {
        at(Op::Write {
            path: path.into(),
            offset,
            bytes: bytes.into(),
        })
    }

    fn create(path: &str) -> Event {
        at(Op::Create {
            path: path.into(),
            truncate: false,
        })
    }

    fn sync(path: &str) -> Event {
        at(Op::Sync(path.into()))
    }

    fn bounds() -> Bounds {
        Bounds {
            prefixes: 4,
            random: 4,
            seed: 1,
        }
    }

    /// The states of the last cut of `events`, without their names.
    fn last_states(events: &[Event]) -> Vec<State> {
        let mut states = Vec::new();
        let fs = explore(Path::new("/w"), events, &bounds(), |_| {}).unwrap();
        for (_, s) in fs.crash_states(&bounds(), &mut StdRng::seed_from_u64(1)) {
            if !states.contains(&s) {
                states.push(s);
            }
        }
        states
    }

    fn file(state: &State, path: &str) -> Option<Vec<u8>> {
        match state.get(Path::new(path)) {
            Some(Node::File(d)) => Some(d.bytes()),
            _ => None,
        }
    }

    #[test]
    fn a_file_renamed_into_place_keeps_the_syncs_made_under_its_new_name() {
        // What `open_redb` does: made as `.new`, synced, renamed, the
        // folder synced, reopened under the final name and written again.
        let events = vec![
            at(Op::Mkdir("/w/d".into())),
            sync("/w"),
            create("/w/d/r.redb.new"),
            write("/w/d/r.redb.new", 0, b"first"),
            sync("/w/d/r.redb.new"),
            at(Op::Rename("/w/d/r.redb.new".into(), "/w/d/r.redb".into())),
            sync("/w/d"),
            write("/w/d/r.redb", 0, b"later"),
            sync("/w/d/r.redb"),
        ];
        let states = last_states(&events);
        assert_eq!(states.len(), 1, "{states:#?}");
        assert_eq!(file(&states[0], "d/r.redb").as_deref(), Some(&b"later"[..]));
    }

    #[test]
    fn an_entry_whose_folder_was_never_synced_can_be_lost() {
        let events = vec![
            at(Op::Mkdir("/w/d".into())),
            create("/w/d/a.redb"),
            write("/w/d/a.redb", 0, b"x"),
            sync("/w/d/a.redb"),
            sync("/w"),
        ];
        let states = last_states(&events);
        assert!(states.iter().any(|s| file(s, "d/a.redb").is_some()));
        assert!(
            states
                .iter()
                .any(|s| s.len() == 1 && s.contains_key(Path::new("d")))
        );
        // Before the root's fsync, `d` itself may be gone.
        let before = last_states(&events[..4]);
        assert!(before.contains(&State::new()));
    }

    #[test]
    fn unsynced_data_is_torn_or_zeroed_in_whole_pages_and_synced_data_is_not() {
        let page = PAGE as usize;
        let events = vec![
            create("/w/f"),
            sync("/w"),
            write("/w/f", 0, &vec![1u8; 2 * page]),
            sync("/w/f"),
            // Unsynced: both pages rewritten, a third added.
            write("/w/f", 0, &vec![2u8; 3 * page]),
        ];
        let states = last_states(&events);
        let contents: Vec<Vec<u8>> = states.iter().filter_map(|s| file(s, "f")).collect();
        let old = vec![1u8; 2 * page];
        let new = vec![2u8; 3 * page];
        assert!(contents.contains(&old), "the data as synced");
        assert!(contents.contains(&new), "the page cache");
        // Torn: the even pages new, the odd ones old; or the odd pages
        // new, and page 2 (past the old size) zeros.
        let pages = |p: [u8; 3]| -> Vec<u8> { p.iter().flat_map(|b| vec![*b; page]).collect() };
        assert!(contents.contains(&pages([2, 1, 2])), "torn in whole pages");
        assert!(
            contents.contains(&pages([1, 2, 0])),
            "torn, zeros past the old size"
        );
        // Zeroed: the new size, no new page reached the disk.
        let mut zeroed = old.clone();
        zeroed.extend(vec![0u8; page]);
        assert!(contents.contains(&zeroed), "zeroed past the old size");
        // Never less than what was synced, never a partial page.
        for c in &contents {
            assert!(c.len() == 2 * page || c.len() == 3 * page);
            for chunk in c.chunks(page) {
                assert!(chunk.iter().all(|b| *b == chunk[0]), "a torn page");
            }
        }
    }

    #[test]
    fn pages_written_past_a_durable_size_short_of_a_page_are_not_kept_with_it() {
        let page = PAGE as usize;
        let events = vec![
            create("/w/f"),
            sync("/w"),
            write("/w/f", 0, &[1u8; 16]),
            sync("/w/f"),
            // Unsynced: the file grown by three pages, as a log grows.
            write("/w/f", 16, &vec![2u8; 3 * page]),
        ];
        let states = last_states(&events);
        let dir = tempfile::tempdir().unwrap();
        for (i, state) in states.iter().enumerate() {
            let dest = dir.path().join(i.to_string());
            materialize(state, &dest).unwrap();
            let bytes = std::fs::read(dest.join("f")).unwrap();
            assert!(
                bytes.len() == 16 || bytes.len() == 16 + 3 * page,
                "{}",
                bytes.len()
            );
            assert_eq!(file(state, "f"), Some(bytes));
        }
        assert!(
            states
                .iter()
                .any(|s| file(s, "f").is_some_and(|f| f.len() == 16))
        );
    }

    #[test]
    fn a_rename_is_kept_whole_and_with_an_fsync_of_either_folder() {
        let events = vec![
            at(Op::Mkdir("/w/a".into())),
            at(Op::Mkdir("/w/b".into())),
            sync("/w"),
            create("/w/a/x"),
            sync("/w/a"),
            at(Op::Rename("/w/a/x".into(), "/w/b/x".into())),
            create("/w/a/y"),
        ];
        let states = last_states(&events);
        for s in &states {
            let in_a = s.contains_key(Path::new("a/x"));
            let in_b = s.contains_key(Path::new("b/x"));
            assert!(in_a ^ in_b, "half a rename: {s:?}");
        }
        assert!(states.iter().any(|s| s.contains_key(Path::new("a/x"))));
        assert!(states.iter().any(|s| s.contains_key(Path::new("b/x"))));
        // `a`'s later change needs the rename before it in `a`.
        assert!(
            !states
                .iter()
                .any(|s| s.contains_key(Path::new("a/y")) && s.contains_key(Path::new("a/x")))
        );
        // Synced through the target folder: the rename stays.
        let mut synced = events.clone();
        synced.push(sync("/w/b"));
        for s in last_states(&synced) {
            assert!(s.contains_key(Path::new("b/x")) && !s.contains_key(Path::new("a/x")));
        }
    }

    #[test]
    fn a_rename_made_durable_through_its_target_folder_takes_what_named_it_along() {
        // A spare renamed to its name in `a` (not synced), then moved to
        // `b`, and `b` synced before `a`: the order of a server's fsyncs on
        // two threads.
        let events = vec![
            at(Op::Mkdir("/w/a".into())),
            at(Op::Mkdir("/w/b".into())),
            sync("/w"),
            create("/w/a/.t"),
            sync("/w/a"),
            at(Op::Rename("/w/a/.t".into(), "/w/a/x".into())),
            at(Op::Rename("/w/a/x".into(), "/w/b/x".into())),
            sync("/w/b"),
        ];
        let after_b = last_states(&events);
        let mut both = events.clone();
        both.push(sync("/w/a"));
        let after_a = last_states(&both);
        for s in after_b.iter().chain(&after_a) {
            assert!(
                s.contains_key(Path::new("b/x"))
                    && !s.contains_key(Path::new("a/x"))
                    && !s.contains_key(Path::new("a/.t")),
                "the moved file is in b alone: {:?}",
                s.keys().collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_model_and_the_disk_are_compared_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"abc").unwrap();
        let r = |p: &str| root.join(p);
        let events = vec![
            Event {
                at: 0.0,
                op: Op::Mkdir(r("d")),
            },
            Event {
                at: 0.0,
                op: Op::Create {
                    path: r("d/f"),
                    truncate: false,
                },
            },
            Event {
                at: 0.0,
                op: Op::Write {
                    path: r("d/f"),
                    offset: 0,
                    bytes: b"abd"[..].into(),
                },
            },
        ];
        let fs = explore(root, &events, &bounds(), |_| {}).unwrap();
        let found = differences(&fs.current(), root).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("d/f: "), "{found:?}");
    }
}
