//! The in-memory index of a mailbox folder: its message files in order,
//! with their sizes, so that a start, an inbox answer, a count or the oldest
//! message cost the same with a million files waiting as with a thousand.
//!
//! The files stay the truth; an index is a copy of a folder's listing:
//! - built from the directory at the folder's first use (so start-up does
//!   not pay for mailboxes nobody asks about);
//! - kept up to date by the mailboxes' own changes, each told to the index
//!   only after its directory fsync (a [`Settle`](super::sync::Settle)), so a
//!   file is never listed before its entry is durable. A file being
//!   published or moved in is *pending* meanwhile, and a scan that sees it
//!   on disk leaves it out;
//! - checked against the directory again by a rescan (see
//!   [`Mailboxes::verify`](super::Mailboxes::verify)), which notices files
//!   added or removed by hand; a file found missing when it is read or
//!   sized is dropped at once.
//!
//! A rescan reads the directory without holding the index (readers keep
//! using the old listing meanwhile); changes settled during it are noted in
//! a journal and replayed on the new listing before it replaces the old.
//!
//! A folder counted in the running totals (see [`tally`](super::tally))
//! tells them its file count and oldest file whenever its listing changes,
//! under the index's own lock, so the totals always equal the sum of the
//! listings.
//!
//! Memory: an entry holds the time, the message id and a shared route
//! (sender, recipient, subsystem: one copy per distinct route), about 50
//! bytes with the map's overhead. Sizes are read lazily (a rescan reads only
//! names), when a selection or a listing first needs them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::select::{self, Filter, Limits};
use super::spares::{Kind, publish_earlier};
use super::tally::{COUNTED, Counted, MailboxKind, Share, Tally};
use super::{FileEntry, FileName, Location};
use crate::error::{FileNameError, MailboxError};
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;

/// The indexes of every folder used so far, by location, and the running
/// totals of the counted ones.
pub(crate) struct Indexes {
    /// The end of this run's temporary names: a durable spare with another
    /// end, found by a scan, is an earlier run's, published by the scan.
    ours: Arc<str>,
    folders: Mutex<HashMap<Location, Arc<FolderIndex>>>,
    /// The kind of each mailbox told to count (taken after `folders`).
    kinds: Mutex<HashMap<Id, MailboxKind>>,
    /// The counted folders not known to be built or absent: checked (an
    /// existing folder's index built) before the totals are read.
    unchecked: Mutex<HashSet<Location>>,
    /// The counted folders found absent (and given no index): checked
    /// again with the indexes, for a folder made by hand.
    absent: Mutex<HashSet<Location>>,
    pub(crate) tally: Arc<Tally>,
}

impl Indexes {
    /// No index yet; `ours` ends this run's temporary names.
    pub(crate) fn new(ours: String) -> Self {
        Indexes {
            ours: ours.into(),
            folders: Mutex::default(),
            kinds: Mutex::default(),
            unchecked: Mutex::default(),
            absent: Mutex::default(),
            tally: Arc::default(),
        }
    }

    /// The index of the folder at `dir` (`loc`), made empty and unbuilt on
    /// first call (and, if it is counted, to be checked).
    pub(crate) fn folder(&self, loc: &Location, dir: impl FnOnce() -> PathBuf) -> Arc<FolderIndex> {
        let mut folders = lock(&self.folders);
        if let Some(index) = folders.get(loc) {
            return Arc::clone(index);
        }
        let counted = self.counted(loc, lock(&self.kinds).get(&loc.mailbox).copied());
        if counted.is_some() {
            lock(&self.unchecked).insert(loc.clone());
            lock(&self.absent).remove(loc);
        }
        let index = Arc::new(FolderIndex::new(dir(), Arc::clone(&self.ours), counted));
        folders.insert(loc.clone(), Arc::clone(&index));
        index
    }

    /// The place in the totals of the folder `loc` of a mailbox of `kind`,
    /// if it is counted.
    fn counted(&self, loc: &Location, kind: Option<MailboxKind>) -> Option<Counted> {
        let kind = kind.filter(|_| COUNTED.contains(&loc.folder))?;
        Some(Counted {
            kind,
            folder: loc.folder,
            mailbox: loc.mailbox.clone(),
            tally: Arc::clone(&self.tally),
        })
    }

    /// Counts the folders of `mailbox` in the totals as a mailbox of
    /// `kind` from now on (moving what they count if its kind changes).
    pub(crate) fn count_as(&self, mailbox: &Id, kind: MailboxKind) {
        let folders = lock(&self.folders);
        if lock(&self.kinds).insert(mailbox.clone(), kind) == Some(kind) {
            return;
        }
        for folder in COUNTED {
            let loc = Location::new(mailbox.clone(), folder);
            if let Some(index) = folders.get(&loc) {
                index.count_in(self.counted(&loc, Some(kind)));
            }
            lock(&self.unchecked).insert(loc);
        }
    }

    /// The counted folders to check, taken out of the set (a folder whose
    /// index is made meanwhile is put back).
    pub(crate) fn take_unchecked(&self) -> Vec<Location> {
        lock(&self.unchecked).drain().collect()
    }

    /// Notes that the counted folder `loc` needs checking.
    pub(crate) fn uncheck(&self, loc: Location) {
        lock(&self.unchecked).insert(loc);
    }

    /// Notes that the counted folder `loc` has a built index.
    pub(crate) fn checked(&self, loc: &Location) {
        lock(&self.unchecked).remove(loc);
    }

    /// Notes that the counted folder `loc` was absent when checked.
    pub(crate) fn absent(&self, loc: Location) {
        lock(&self.absent).insert(loc);
    }

    /// The counted folders found absent go back to be checked.
    pub(crate) fn recheck_absent(&self) {
        let absent: Vec<Location> = lock(&self.absent).drain().collect();
        lock(&self.unchecked).extend(absent);
    }

    /// Whether the folder `loc` has an index (built or not).
    pub(crate) fn has(&self, loc: &Location) -> bool {
        lock(&self.folders).contains_key(loc)
    }

    /// The indexes of the folders used since their last scan, and of the
    /// counted folders too if `counted`.
    pub(crate) fn used(&self, counted: bool) -> Vec<Arc<FolderIndex>> {
        lock(&self.folders)
            .values()
            .filter(|index| {
                let state = index.state();
                state.built && (state.used || (counted && state.counted.is_some()))
            })
            .cloned()
            .collect()
    }
}

/// The sender, recipient and subsystem of a message file: shared by the
/// entries of one folder that have the same.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Route {
    from: Id,
    to: Id,
    subsystem: Id,
}

/// An entry's key. The fields are those of [`FileName`], in its order, so
/// keys sort as names do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    created_at: Timestamp,
    id: MessageId,
    route: Arc<Route>,
}

impl Key {
    /// The key of `name` with a route of its own, for a lookup.
    fn probe(name: &FileName) -> Self {
        Self {
            created_at: name.created_at,
            id: name.id,
            route: Arc::new(Route {
                from: name.from.clone(),
                to: name.to.clone(),
                subsystem: name.subsystem.clone(),
            }),
        }
    }

    fn name(&self) -> FileName {
        FileName {
            created_at: self.created_at,
            id: self.id,
            from: self.route.from.clone(),
            to: self.route.to.clone(),
            subsystem: self.route.subsystem.clone(),
        }
    }
}

/// The files of a folder, in order, with their sizes once known.
#[derive(Default)]
struct Listing {
    entries: BTreeMap<Key, Option<u64>>,
    routes: HashSet<Arc<Route>>,
}

impl Listing {
    /// The listing of the message files in a directory; a directory that
    /// does not exist (a folder not made yet) has none. Temporary files are
    /// skipped, but for the durable spares of an earlier run than the one
    /// whose names end with `ours`: each is published (see
    /// [`publish_earlier`]) and its message listed. Foreign names are
    /// skipped with a warning. A name is parsed in full (and its route
    /// kept) the first time its route is seen; later names with that route
    /// only have their time and id parsed.
    fn read(dir: &Path, ours: &str) -> Result<Self, MailboxError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(MailboxError::io(dir, e)),
        };
        let mut routes: HashMap<String, Arc<Route>> = HashMap::new();
        let mut keys = Vec::new();
        let mut earlier = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| MailboxError::io(dir, e))?;
            let os_name = entry.file_name();
            let Some(text) = os_name.to_str() else {
                tracing::warn!(dir = %dir.display(), name = ?os_name, "ignoring a non-UTF-8 file name");
                continue;
            };
            if text.starts_with('.') {
                if Kind::Durable.is_earlier(&os_name, ours) {
                    earlier.push(entry.path());
                }
                continue;
            }
            match key_of(text, &mut routes) {
                Ok(key) => keys.push(key),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), name = text, error = %e, "ignoring a foreign file")
                }
            }
        }
        // A message whose file was there already is listed twice, and the
        // map below keeps one.
        for spare in earlier {
            match publish_earlier(dir, &spare) {
                Ok(Some(name)) => match key_of(&name, &mut routes) {
                    Ok(key) => keys.push(key),
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), name, error = %e, "ignoring a foreign file")
                    }
                },
                Ok(None) => {}
                // Left for the next scan or the sweep.
                Err(e) => {
                    tracing::warn!(file = %spare.display(), error = %e, "a message written before a crash cannot be published yet")
                }
            }
        }
        keys.sort_unstable();
        Ok(Self {
            // Sorted input is bulk-built.
            entries: keys.into_iter().map(|k| (k, None)).collect(),
            routes: routes.into_values().collect(),
        })
    }

    /// The key of `name`, its route shared with the listing's.
    fn key(&mut self, name: &FileName) -> Key {
        let probe = Key::probe(name);
        let route = match self.routes.get(&probe.route) {
            Some(route) => Arc::clone(route),
            None => {
                self.routes.insert(Arc::clone(&probe.route));
                probe.route
            }
        };
        Key { route, ..probe }
    }

    fn apply(&mut self, edit: &Edit) {
        match edit {
            Edit::Insert(name, size) => {
                let key = self.key(name);
                let known = self.entries.entry(key).or_insert(*size);
                if size.is_some() {
                    *known = *size;
                }
            }
            Edit::Remove(name) => {
                self.entries.remove(&Key::probe(name));
            }
        }
    }
}

/// A change to a listing.
#[derive(Debug, Clone)]
enum Edit {
    /// A file is there, with its size if known.
    Insert(FileName, Option<u64>),
    /// A file is gone.
    Remove(FileName),
}

struct State {
    /// Whether `listing` has been read from the directory.
    built: bool,
    /// Whether the index was read since its last scan.
    used: bool,
    listing: Listing,
    /// Files being published or moved in whose fate is not settled yet,
    /// with how many changes of each are under way.
    pending: HashMap<FileName, u32>,
    /// The edits settled while a scan runs, to replay on its listing.
    journal: Option<Vec<Edit>>,
    /// Where the folder counts in the running totals, if it does.
    counted: Option<Counted>,
    /// What the listing has added to the totals.
    share: Share,
}

impl State {
    fn edit(&mut self, edit: Edit) {
        if self.built {
            self.listing.apply(&edit);
            self.report();
        }
        if let Some(journal) = &mut self.journal {
            journal.push(edit);
        }
    }

    /// Brings the totals in line with the listing: a built listing counts
    /// its files and its oldest, an unbuilt one nothing.
    fn report(&mut self) {
        let Some(counted) = &self.counted else {
            return;
        };
        let now = if self.built {
            Share {
                files: self.listing.entries.len(),
                oldest: self.listing.entries.keys().next().map(|k| k.created_at),
            }
        } else {
            Share::default()
        };
        counted.tally.replace(
            counted.kind,
            counted.folder,
            &counted.mailbox,
            self.share,
            now,
        );
        self.share = now;
    }
}

/// The index of one folder.
pub(crate) struct FolderIndex {
    dir: PathBuf,
    /// The end of this run's temporary names (see [`Listing::read`]).
    ours: Arc<str>,
    state: Mutex<State>,
    /// Held for a whole scan: one scan of a folder at a time.
    scanning: Mutex<()>,
}

impl FolderIndex {
    fn new(dir: PathBuf, ours: Arc<str>, counted: Option<Counted>) -> Self {
        Self {
            dir,
            ours,
            state: Mutex::new(State {
                built: false,
                used: false,
                listing: Listing::default(),
                pending: HashMap::new(),
                journal: None,
                counted,
                share: Share::default(),
            }),
            scanning: Mutex::new(()),
        }
    }

    /// Counts the folder at `counted` in the totals (or nowhere), taking
    /// its share out of where it counted before.
    fn count_in(&self, counted: Option<Counted>) {
        let mut state = self.state();
        if let Some(old) = &state.counted {
            old.tally.replace(
                old.kind,
                old.folder,
                &old.mailbox,
                state.share,
                Share::default(),
            );
        }
        state.share = Share::default();
        state.counted = counted;
        state.report();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Whether the index has been built, noting the use when it has.
    pub(crate) fn ready(&self) -> bool {
        let mut state = self.state();
        state.used = true;
        state.built
    }

    /// Builds the index unless that is done (blocking; the first use).
    pub(crate) fn build(&self) -> Result<(), MailboxError> {
        let _scan = lock(&self.scanning);
        if self.state().built {
            return Ok(());
        }
        self.scan_locked()
    }

    /// Reads the directory again and replaces the listing (blocking).
    pub(crate) fn rescan(&self) -> Result<(), MailboxError> {
        let _scan = lock(&self.scanning);
        self.scan_locked()
    }

    fn scan_locked(&self) -> Result<(), MailboxError> {
        self.begin_scan();
        let listing = Listing::read(&self.dir, &self.ours);
        self.end_scan(listing)
    }

    /// From now on, settled edits are also noted for the scan's listing.
    fn begin_scan(&self) {
        self.state().journal = Some(Vec::new());
    }

    /// Replaces the listing with the directory's (read since
    /// [`begin_scan`](Self::begin_scan)), less the files pending, plus the
    /// edits settled meanwhile.
    fn end_scan(&self, read: Result<Listing, MailboxError>) -> Result<(), MailboxError> {
        let mut fresh = match read {
            Ok(listing) => listing,
            Err(e) => {
                self.state().journal = None;
                return Err(e);
            }
        };
        let old = {
            let mut state = self.state();
            for name in state.pending.keys() {
                fresh.entries.remove(&Key::probe(name));
            }
            for edit in state.journal.take().unwrap_or_default() {
                fresh.apply(&edit);
            }
            state.built = true;
            state.used = false;
            let old = std::mem::replace(&mut state.listing, fresh);
            state.report();
            old
        };
        // The old listing is freed outside the lock.
        drop(old);
        Ok(())
    }

    /// Notes that `name` is being published or moved in: a scan leaves it
    /// out until its change is settled with [`settle_in`](Self::settle_in).
    pub(crate) fn expect(&self, name: &FileName) {
        *self.state().pending.entry(name.clone()).or_insert(0) += 1;
    }

    /// Settles a change announced with [`expect`](Self::expect): the file
    /// is there (with its size if known) if it is durable, else not.
    pub(crate) fn settle_in(&self, name: &FileName, durable: Option<Option<u64>>) {
        let mut state = self.state();
        if let Some(count) = state.pending.get_mut(name) {
            *count -= 1;
            if *count == 0 {
                state.pending.remove(name);
            }
        }
        state.edit(match durable {
            Some(size) => Edit::Insert(name.clone(), size),
            None => Edit::Remove(name.clone()),
        });
    }

    /// Notes that `name` is gone from the folder.
    pub(crate) fn remove(&self, name: &FileName) {
        self.state().edit(Edit::Remove(name.clone()));
    }

    /// The size of `name` if the index knows it.
    pub(crate) fn size_of(&self, name: &FileName) -> Option<u64> {
        let state = self.state();
        state
            .listing
            .entries
            .get(&Key::probe(name))
            .copied()
            .flatten()
    }

    /// How many files the folder holds.
    pub(crate) fn count(&self) -> usize {
        self.state().listing.entries.len()
    }

    /// The names of the `n` oldest files.
    pub(crate) fn oldest(&self, n: usize) -> Vec<FileName> {
        let state = self.state();
        state
            .listing
            .entries
            .keys()
            .take(n)
            .map(Key::name)
            .collect()
    }

    /// Every name that passes `keep`, in order.
    pub(crate) fn names_where(&self, mut keep: impl FnMut(&FileName) -> bool) -> Vec<FileName> {
        let state = self.state();
        state
            .listing
            .entries
            .keys()
            .map(Key::name)
            .filter(|n| keep(n))
            .collect()
    }

    /// The oldest files that pass `filter`, within `limits` (blocking: the
    /// sizes not known yet are read from the files, which are then known).
    pub(crate) fn select(
        &self,
        filter: &Filter,
        limits: Limits,
    ) -> Result<Vec<FileEntry>, MailboxError> {
        let mut state = self.state();
        let mut learned = Vec::new();
        let mut stat_error = None;
        let candidates = state
            .listing
            .entries
            .iter()
            .filter(|(key, _)| filter.admits(&key.route.subsystem, &key.route.from));
        let taken = select::take_within(
            candidates,
            |(key, size)| match size {
                Some(size) => Some(*size),
                None => {
                    let name = key.name();
                    match size_on_disk(&self.dir, &name) {
                        Ok(found) => {
                            learned.push((name, found));
                            found
                        }
                        Err(e) => {
                            stat_error.get_or_insert(e);
                            None
                        }
                    }
                }
            },
            limits,
        );
        let taken: Vec<_> = taken
            .into_iter()
            .map(|((key, _), size)| FileEntry {
                name: key.name(),
                size,
            })
            .collect();
        for (name, size) in learned {
            state.edit(match size {
                Some(size) => Edit::Insert(name, Some(size)),
                None => Edit::Remove(name),
            });
        }
        match stat_error {
            Some(e) => Err(e),
            None => Ok(taken),
        }
    }

    /// Every file with its size (blocking: sizes not known yet are read
    /// from the files outside the index's lock, and then known).
    pub(crate) fn entries(&self) -> Result<Vec<FileEntry>, MailboxError> {
        let listed: Vec<(FileName, Option<u64>)> = {
            let state = self.state();
            state
                .listing
                .entries
                .iter()
                .map(|(key, size)| (key.name(), *size))
                .collect()
        };
        let mut entries = Vec::with_capacity(listed.len());
        let mut learned = Vec::new();
        for (name, size) in listed {
            match size {
                Some(size) => entries.push(FileEntry { name, size }),
                None => match size_on_disk(&self.dir, &name)? {
                    Some(size) => {
                        learned.push(Edit::Insert(name.clone(), Some(size)));
                        entries.push(FileEntry { name, size });
                    }
                    None => learned.push(Edit::Remove(name)),
                },
            }
        }
        let mut state = self.state();
        for edit in learned {
            // Only what is still listed: the file may have moved meanwhile.
            let listed = state.listing.entries.contains_key(&Key::probe(edit.name()));
            if listed {
                state.edit(edit);
            }
        }
        Ok(entries)
    }
}

impl Edit {
    fn name(&self) -> &FileName {
        match self {
            Edit::Insert(name, _) | Edit::Remove(name) => name,
        }
    }
}

/// Locks a mutex; a panic elsewhere while holding it leaves a listing that
/// is still a valid listing, so the lock is taken over.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The key of the message file named `text`. `routes` holds the routes
/// seen so far by the text after the message id: a name whose route is
/// known needs only its time and id checked (both parse only from their
/// canonical spelling), any other is parsed in full.
fn key_of(text: &str, routes: &mut HashMap<String, Arc<Route>>) -> Result<Key, FileNameError> {
    const TIME: usize = 19;
    const ID_END: usize = TIME + 1 + MessageId::LEN;
    let known = text
        .get(ID_END + 1..)
        .filter(|_| text.as_bytes()[TIME] == b'_' && text.as_bytes()[ID_END] == b'_')
        .and_then(|route| routes.get(route));
    if let Some(route) = known
        && let (Ok(created_at), Ok(id)) = (
            Timestamp::parse_compact(&text[..TIME]),
            text[TIME + 1..ID_END].parse::<MessageId>(),
        )
    {
        return Ok(Key {
            created_at,
            id,
            route: Arc::clone(route),
        });
    }
    let name: FileName = text.parse()?;
    let key = Key::probe(&name);
    routes.insert(text[ID_END + 1..].to_owned(), Arc::clone(&key.route));
    Ok(key)
}

/// The size of a message file, or `None` if it is gone.
fn size_on_disk(dir: &Path, name: &FileName) -> Result<Option<u64>, MailboxError> {
    let path = dir.join(name.to_string());
    match std::fs::metadata(&path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MailboxError::io(&path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of the temporary names of the tests' run.
    const OURS: &str = ".ab12.tmp";

    fn name(seq: u128) -> FileName {
        FileName {
            created_at: Timestamp::from_millis(1_000),
            id: MessageId::from_parts(1_000, seq),
            from: Id::new("phone-1").unwrap(),
            to: Id::new("db-a").unwrap(),
            subsystem: Id::new("sales").unwrap(),
        }
    }

    fn put(dir: &Path, n: &FileName) {
        std::fs::write(dir.join(n.to_string()), b"{}").unwrap();
    }

    #[test]
    fn changes_settled_during_a_scan_are_not_lost_and_pending_files_stay_out() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let index = FolderIndex::new(dir.to_owned(), OURS.into(), None);
        let (kept, deleted, published, arriving) = (name(1), name(2), name(3), name(4));
        for n in [&kept, &deleted, &arriving] {
            put(dir, n);
        }
        // Renamed in, its folder fsync not done.
        index.expect(&arriving);
        index.begin_scan();
        let listed = Listing::read(dir, OURS);
        // Settled while the scan ran, after the directory was read.
        std::fs::remove_file(dir.join(deleted.to_string())).unwrap();
        index.remove(&deleted);
        put(dir, &published);
        index.expect(&published);
        index.settle_in(&published, Some(Some(2)));
        index.end_scan(listed).unwrap();
        assert_eq!(
            index.names_where(|_| true),
            vec![kept.clone(), published.clone()]
        );
        assert_eq!(index.size_of(&published), Some(2));
        assert_eq!(index.size_of(&kept), None, "read when first needed");

        index.settle_in(&arriving, Some(None));
        assert_eq!(index.count(), 3);
        // A scan now sees the same as the index.
        index.rescan().unwrap();
        assert_eq!(index.names_where(|_| true), vec![kept, published, arriving]);
    }

    #[test]
    fn names_with_a_known_route_are_checked_as_strictly_as_others() {
        let mut routes = HashMap::new();
        let first = name(1).to_string();
        assert_eq!(key_of(&first, &mut routes).unwrap(), Key::probe(&name(1)));
        assert_eq!(routes.len(), 1);
        let second = name(2).to_string();
        assert_eq!(key_of(&second, &mut routes).unwrap(), Key::probe(&name(2)));
        let (time, rest) = second.split_at(19);
        let bad = [
            format!("20261332T000000000Z{rest}"),
            format!("{time}{}", rest.to_lowercase()),
            format!("{time}_{}", &rest[1..].replacen('0', "O", 1)),
            format!("{time}{rest}x"),
            format!("{}{rest}", &time[..18]),
        ];
        for b in bad {
            assert!(key_of(&b, &mut routes).is_err(), "{b}");
            assert!(b.parse::<FileName>().is_err(), "{b}");
        }
    }

    #[test]
    fn a_failed_scan_keeps_the_old_listing() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let index = FolderIndex::new(file, OURS.into(), None);
        assert!(index.build().is_err());
        assert!(!index.ready());
        assert!(index.state().journal.is_none());
    }
}
