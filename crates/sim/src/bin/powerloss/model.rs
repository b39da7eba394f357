//! The file system as POSIX promises it across a power loss, replayed from
//! a recorded trace: a file's contents are durable at its `fsync` (the
//! copy the recorder took then); a folder's entries (creates, renames,
//! unlinks, mkdirs in it) are durable at an `fsync` of that folder; what
//! is not durable at the cut may be lost. Every cut at or between sync
//! barriers gives a few crash states ([`Cut::states`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::record::Event;

/// An inode of the model.
type Ino = usize;

/// A folder's entries.
type Entries = BTreeMap<String, Ino>;

/// The root folder (the one the data folder is made in).
const ROOT: Ino = 0;

/// One entry of a crash state, by its path under the root.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Entry {
    /// A folder.
    Dir,
    /// A file with the contents of this copy; empty when it was never
    /// synced.
    File(Option<PathBuf>),
}

/// A crash state: every path under the root and what it is.
pub(crate) type State = BTreeMap<PathBuf, Entry>;

/// The model at a cut: what the running system saw, and what was durable.
#[derive(Clone, Debug)]
pub(crate) struct Cut {
    /// The crash can happen until this moment (the next barrier's time;
    /// infinite after the last): what was acknowledged before it counts.
    pub(crate) until: f64,
    /// How many barriers are durable.
    pub(crate) barriers: usize,
    dirs: BTreeSet<Ino>,
    current: HashMap<Ino, Entries>,
    durable: HashMap<Ino, Entries>,
    contents: HashMap<Ino, PathBuf>,
}

/// Replays the events under `root`; the cut before every barrier and the
/// one after the last; the events the model could not place.
pub(crate) fn cuts(root: &Path, events: &[Event]) -> (Vec<Cut>, u64) {
    let mut fs = Cut {
        until: f64::INFINITY,
        barriers: 0,
        dirs: BTreeSet::from([ROOT]),
        current: HashMap::from([(ROOT, Entries::new())]),
        durable: HashMap::from([(ROOT, Entries::new())]),
        contents: HashMap::new(),
    };
    let mut next: Ino = 1;
    let mut cuts = Vec::new();
    let mut misplaced = 0;
    for event in events {
        let placed = match event {
            Event::Create(path) => match fs.resolve(root, path) {
                Some(_) => true,
                None => fs
                    .insert(root, path, next, false)
                    .map(|()| next += 1)
                    .is_some(),
            },
            Event::Mkdir(path) => fs
                .insert(root, path, next, true)
                .map(|()| next += 1)
                .is_some(),
            Event::Rename(from, to) => fs.rename(root, from, to).is_some(),
            Event::Remove(path) => fs.remove(root, path).is_some(),
            Event::Sync { path, at, snapshot } => {
                let mut cut = fs.clone();
                cut.until = *at;
                cuts.push(cut);
                fs.barriers += 1;
                match fs.resolve(root, path) {
                    Some(ino) if fs.dirs.contains(&ino) => {
                        let entries = fs.current[&ino].clone();
                        fs.durable.insert(ino, entries);
                        true
                    }
                    Some(ino) => {
                        if let Some(copy) = snapshot {
                            fs.contents.insert(ino, copy.clone());
                        }
                        true
                    }
                    None => false,
                }
            }
        };
        if !placed {
            misplaced += 1;
        }
    }
    cuts.push(fs);
    (cuts, misplaced)
}

impl Cut {
    fn split(&self, root: &Path, path: &Path) -> Option<(Ino, String)> {
        let rel = path.strip_prefix(root).ok()?;
        let name = rel.file_name()?.to_str()?.to_owned();
        let parent = self.walk(rel.parent()?)?;
        self.dirs.contains(&parent).then_some((parent, name))
    }

    fn walk(&self, rel: &Path) -> Option<Ino> {
        let mut ino = ROOT;
        for part in rel.components() {
            ino = *self.current.get(&ino)?.get(part.as_os_str().to_str()?)?;
        }
        Some(ino)
    }

    fn resolve(&self, root: &Path, path: &Path) -> Option<Ino> {
        self.walk(path.strip_prefix(root).ok()?)
    }

    fn insert(&mut self, root: &Path, path: &Path, ino: Ino, dir: bool) -> Option<()> {
        let (parent, name) = self.split(root, path)?;
        self.current.get_mut(&parent)?.insert(name, ino);
        if dir {
            self.dirs.insert(ino);
            self.current.insert(ino, Entries::new());
            self.durable.insert(ino, Entries::new());
        }
        Some(())
    }

    fn rename(&mut self, root: &Path, from: &Path, to: &Path) -> Option<()> {
        let (from_dir, from_name) = self.split(root, from)?;
        let (to_dir, to_name) = self.split(root, to)?;
        let ino = self.current.get_mut(&from_dir)?.remove(&from_name)?;
        self.current.get_mut(&to_dir)?.insert(to_name, ino);
        Some(())
    }

    fn remove(&mut self, root: &Path, path: &Path) -> Option<()> {
        let (dir, name) = self.split(root, path)?;
        self.current.get_mut(&dir)?.remove(&name).map(|_| ())
    }

    /// The crash states of this cut: every folder with all its entries as
    /// the system saw them (the page cache survived), every folder as at
    /// its last fsync (all unsynced entries lost), and each folder whose
    /// entries differ alone as at its last fsync. Files have their
    /// contents of their last fsync either way.
    pub(crate) fn states(&self) -> Vec<State> {
        let differing: Vec<Ino> = self
            .dirs
            .iter()
            .copied()
            .filter(|d| self.current.get(d) != self.durable.get(d))
            .collect();
        let mut states = vec![self.state(&|_| false), self.state(&|_| true)];
        for d in differing {
            states.push(self.state(&|ino| ino == d));
        }
        let mut seen = BTreeSet::new();
        states.retain(|s| seen.insert(s.clone()));
        states
    }

    fn state(&self, durable: &dyn Fn(Ino) -> bool) -> State {
        let mut out = State::new();
        self.collect(ROOT, PathBuf::new(), durable, &mut out, 0);
        out
    }

    fn collect(
        &self,
        dir: Ino,
        prefix: PathBuf,
        durable: &dyn Fn(Ino) -> bool,
        out: &mut State,
        depth: usize,
    ) {
        let map = if durable(dir) {
            &self.durable
        } else {
            &self.current
        };
        let Some(entries) = map.get(&dir) else {
            return;
        };
        for (name, &ino) in entries {
            let path = prefix.join(name);
            if self.dirs.contains(&ino) {
                out.insert(path.clone(), Entry::Dir);
                if depth < 32 {
                    self.collect(ino, path, durable, out, depth + 1);
                }
            } else {
                out.insert(path, Entry::File(self.contents.get(&ino).cloned()));
            }
        }
    }
}

/// Makes `state` real under `dest` (folders 0700, files copied).
pub(crate) fn materialize(state: &State, dest: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dest)?;
    for (path, entry) in state {
        let target = dest.join(path);
        match entry {
            Entry::Dir => std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&target)
                .with_context(|| format!("creating {}", target.display()))?,
            Entry::File(Some(copy)) => {
                std::fs::copy(copy, &target)
                    .with_context(|| format!("copying {}", copy.display()))?;
            }
            Entry::File(None) => {
                std::fs::File::create(&target)
                    .with_context(|| format!("creating {}", target.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_renamed_into_place_keeps_the_syncs_made_under_its_new_name() {
        // What `open_redb` does: made as `.new`, synced, renamed, the
        // folder synced, reopened under the final name and written again.
        let root = Path::new("/w");
        let sync = |path: &str, at: f64, snapshot: Option<&str>| Event::Sync {
            path: path.into(),
            at,
            snapshot: snapshot.map(PathBuf::from),
        };
        let events = vec![
            Event::Mkdir("/w/d".into()),
            sync("/w", 1.0, None),
            Event::Create("/w/d/r.redb.new".into()),
            sync("/w/d/r.redb.new", 2.0, Some("/snap/first")),
            Event::Rename("/w/d/r.redb.new".into(), "/w/d/r.redb".into()),
            sync("/w/d", 3.0, None),
            Event::Create("/w/d/r.redb".into()),
            sync("/w/d/r.redb", 4.0, Some("/snap/later")),
        ];
        let (cuts, misplaced) = cuts(root, &events);
        assert_eq!(misplaced, 0);
        let whole = State::from([
            ("d".into(), Entry::Dir),
            ("d/r.redb".into(), Entry::File(Some("/snap/later".into()))),
        ]);
        assert_eq!(cuts.last().unwrap().states(), vec![whole]);
    }

    #[test]
    fn an_entry_whose_folder_was_never_synced_can_be_lost() {
        let root = Path::new("/w");
        let events = vec![
            Event::Mkdir("/w/d".into()),
            Event::Create("/w/d/a.redb".into()),
            Event::Sync {
                path: "/w/d/a.redb".into(),
                at: 1.0,
                snapshot: Some("/snap/1".into()),
            },
            Event::Sync {
                path: "/w".into(),
                at: 2.0,
                snapshot: None,
            },
        ];
        let (cuts, misplaced) = cuts(root, &events);
        assert_eq!(misplaced, 0);
        assert_eq!(cuts.len(), 3);
        let last = cuts[2].states();
        // The page cache survived; `d`'s entries lost; (nothing else differs).
        assert!(last.contains(&State::from([
            ("d".into(), Entry::Dir),
            ("d/a.redb".into(), Entry::File(Some("/snap/1".into()))),
        ])));
        assert!(last.contains(&State::from([("d".into(), Entry::Dir)])));
        // Before the root's fsync, `d` itself may be gone.
        assert!(cuts[1].states().contains(&State::new()));
    }
}
