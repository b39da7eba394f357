//! Directory fsyncs shared by the threads that need them.
//!
//! A thread that renamed a file into a folder needs an fsync of the folder
//! begun after its rename. If none is under way, it makes one itself; if
//! one is, it waits for it to end and then for the next, which whoever
//! arrives first makes for everyone who arrived meanwhile. So a lone
//! upload's folder fsync runs on the thread that wrote its file (no
//! hand-over to another thread), and concurrent uploads share one fsync
//! per round instead of one each: the rounds follow each other as fast as
//! the disk answers, with no waiting time to tune.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// The rounds of directory fsyncs of every folder in use.
#[derive(Default)]
pub(crate) struct Rounds {
    folders: Mutex<HashMap<PathBuf, FolderRounds>>,
}

/// One folder's rounds.
#[derive(Default)]
struct FolderRounds {
    /// The round that whoever arrives now joins: it begins after them.
    next: u64,
    /// A round is under way (the one before `next`).
    running: bool,
    /// Rounds that have callers to tell, by number.
    rounds: BTreeMap<u64, Round>,
}

/// One round of a folder: how many wait for it, and once it ended, what
/// its fsync answered.
#[derive(Default)]
struct Round {
    waiting: usize,
    outcome: Option<Result<(), (io::ErrorKind, String)>>,
    /// Its callers wait on this: all are woken when it ends, and one when
    /// the round before it ends, to begin it. No one else is woken.
    wake: Arc<Condvar>,
}

/// What [`Rounds::sync`] did for its caller.
#[derive(Debug)]
pub(crate) struct Synced {
    /// The caller made the round's fsync itself (the others waited).
    pub(crate) led: bool,
    /// What the round's fsync answered.
    pub(crate) result: io::Result<()>,
}

impl Rounds {
    /// Waits (blocking) until an fsync of `dir` begun after this call has
    /// ended, making it with `fsync` if nobody else is; answers what it
    /// answered.
    pub(crate) fn sync(&self, dir: &Path, fsync: impl FnOnce(&Path) -> io::Result<()>) -> Synced {
        let mut folders = self.lock();
        let mine = {
            let folder = folders.entry(dir.to_owned()).or_default();
            folder.rounds.entry(folder.next).or_default().waiting += 1;
            folder.next
        };
        let mut fsync = Some(fsync);
        let mut led = false;
        loop {
            let folder = folders
                .get_mut(dir)
                .expect("a folder with a caller waiting is kept");
            let round = folder
                .rounds
                .get_mut(&mine)
                .expect("a round with a caller waiting is kept");
            if let Some(outcome) = &round.outcome {
                let result = outcome
                    .clone()
                    .map_err(|(kind, text)| io::Error::new(kind, text));
                round.waiting -= 1;
                if round.waiting == 0 {
                    folder.rounds.remove(&mine);
                    if folder.rounds.is_empty() && !folder.running {
                        folders.remove(dir);
                    }
                }
                return Synced { led, result };
            }
            if folder.running {
                let wake = Arc::clone(&round.wake);
                folders = wake.wait(folders).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // No round under way and ours not ended: ours is the next, and
            // it begins now, here.
            folder.running = true;
            folder.next += 1;
            drop(folders);
            let result = fsync.take().map_or(Ok(()), |f| f(dir));
            led = true;
            folders = self.lock();
            let folder = folders
                .get_mut(dir)
                .expect("a folder with a round under way is kept");
            folder.running = false;
            if let Some(round) = folder.rounds.get_mut(&mine) {
                round.outcome = Some(result.map_err(|e| (e.kind(), e.to_string())));
                round.wake.notify_all();
            }
            if let Some(next) = folder.rounds.get(&folder.next) {
                next.wake.notify_one();
            }
        }
    }

    /// How many callers wait for a round of `dir` not yet begun.
    #[cfg(test)]
    pub(crate) fn waiting(&self, dir: &Path) -> usize {
        let folders = self.lock();
        let Some(folder) = folders.get(dir) else {
            return 0;
        };
        folder.rounds.get(&folder.next).map_or(0, |r| r.waiting)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, FolderRounds>> {
        self.folders.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_lone_caller_makes_its_own_fsync_and_gets_its_answer() {
        let rounds = Rounds::default();
        let dir = Path::new("/data/db-a/Messages");
        let synced = rounds.sync(dir, |d| {
            assert_eq!(d, dir);
            Ok(())
        });
        assert!(synced.led);
        assert!(synced.result.is_ok());
        let failed = rounds.sync(dir, |_| Err(io::Error::other("disk gone")));
        assert_eq!(failed.result.unwrap_err().to_string(), "disk gone");
        assert!(
            rounds.lock().is_empty(),
            "nothing kept once everyone is told"
        );
    }

    /// Callers that arrive while a round is under way all wait for the
    /// next, which one of them makes for all; its failure reaches each.
    #[test]
    fn callers_arriving_during_a_round_share_the_next() {
        let rounds = Arc::new(Rounds::default());
        let dir = Path::new("/data/db-a/Messages");
        let (entered, leave) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let fsyncs = Arc::new(AtomicUsize::new(0));
        let first = {
            let (rounds, entered, leave) = (rounds.clone(), entered.clone(), leave.clone());
            std::thread::spawn(move || {
                rounds.sync(dir, |_| {
                    entered.wait();
                    leave.wait();
                    Ok(())
                })
            })
        };
        entered.wait();
        // The first round is under way: these join the next.
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let (rounds, fsyncs) = (rounds.clone(), fsyncs.clone());
                std::thread::spawn(move || {
                    rounds.sync(dir, |_| {
                        fsyncs.fetch_add(1, Ordering::SeqCst);
                        Err(io::Error::other("no space"))
                    })
                })
            })
            .collect();
        while rounds.waiting(dir) < 8 {
            std::thread::yield_now();
        }
        leave.wait();
        assert!(first.join().unwrap().result.is_ok());
        let answers: Vec<Synced> = waiting.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(fsyncs.load(Ordering::SeqCst), 1, "one fsync for the eight");
        assert_eq!(answers.iter().filter(|s| s.led).count(), 1);
        assert!(answers.iter().all(|s| s.result.is_err()));
        assert!(rounds.lock().is_empty());
    }

    #[test]
    fn folders_have_rounds_of_their_own() {
        let rounds = Arc::new(Rounds::default());
        let (entered, leave) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let a = {
            let (rounds, entered, leave) = (rounds.clone(), entered.clone(), leave.clone());
            std::thread::spawn(move || {
                rounds.sync(Path::new("/a"), |_| {
                    entered.wait();
                    leave.wait();
                    Ok(())
                })
            })
        };
        entered.wait();
        // /a's round is under way; /b's caller does not wait for it.
        assert!(rounds.sync(Path::new("/b"), |_| Ok(())).led);
        leave.wait();
        assert!(a.join().unwrap().led);
    }
}
