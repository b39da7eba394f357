//! The disk's own limits for durable files, measured the way the server
//! makes a message durable (a file created, written and fsynced, then its
//! folder fsynced): the baselines the benchmarks state their figures
//! against, measured in the same run on the same disk.
//!
//! - The floor, [`Probe::one_file`]: one durable file at a time.
//! - The batch ceiling, [`Probe::files_at_once`]: `n` durable files at
//!   once (each written and fsynced on a thread of its own, the threads
//!   kept between batches), then one fsync of their folder. No server that
//!   gives each message a file of its own can make more than this many
//!   messages per second durable with `n` of them under way at a time.
//! - The syncs of one upload, [`Probe::file_beside_record`]: one durable
//!   file and, at the same time, a record appended to a log and
//!   fdatasynced; what one device's upload waits for, without the server.
//!
//! ```
//! # fn main() -> std::io::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let probe = estafeta_durable::limits::Probe::new(dir.path().join("probe"), 1024)?;
//! probe.one_file()?;
//! let mut batch = probe.files_at_once(4)?;
//! batch.run()?;
//! let rate = probe.measure(|| batch.run(), 4, std::time::Duration::from_millis(20))?;
//! assert!(rate.files_per_second() > 0.0);
//! # Ok(())
//! # }
//! ```

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Writes durable files of one size into one folder of the disk to
/// measure.
pub struct Probe {
    dir: PathBuf,
    /// Every file's content.
    bytes: Arc<Vec<u8>>,
    /// The next file's number (names are never reused: a creation never
    /// replaces a file).
    seq: Arc<AtomicU64>,
}

impl Probe {
    /// A probe writing files of `size` bytes into `dir` (made, durably, if
    /// missing).
    pub fn new(dir: impl Into<PathBuf>, size: usize) -> io::Result<Probe> {
        let dir = dir.into();
        crate::create_dir_all(&dir, 0o700)?;
        Ok(Probe {
            dir,
            bytes: Arc::new(vec![b'x'; size]),
            seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The folder the files go into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The floor: one file created, written and fsynced, then its folder
    /// fsynced.
    pub fn one_file(&self) -> io::Result<()> {
        write_synced(&self.dir, &self.seq, &self.bytes)?;
        crate::sync_dir(&self.dir)
    }

    /// `n` threads ready to write a batch of the ceiling (see
    /// [`Batch::run`]).
    pub fn files_at_once(&self, n: usize) -> io::Result<Batch> {
        let jobs = (0..n.max(1)).map(|_| self.file_job()).collect();
        Ok(Batch::spawn(jobs, Some(self.dir.clone())))
    }

    /// A job that makes one file durable (its folder not).
    fn file_job(&self) -> Job {
        let (dir, seq, bytes) = (
            self.dir.clone(),
            Arc::clone(&self.seq),
            Arc::clone(&self.bytes),
        );
        Box::new(move || write_synced(&dir, &seq, &bytes))
    }

    /// Two threads ready to make, at once, one file durable (created,
    /// written and fsynced, its folder not) and a `record` of that many
    /// bytes appended to a log of this folder and fdatasynced: the two
    /// syncs a device's upload waits for side by side (its message's file
    /// and its session's save log), on their own. [`Batch::run`] runs one.
    pub fn file_beside_record(&self, record: usize) -> io::Result<Batch> {
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("probe.log"))?;
        let record = vec![b'r'; record];
        let jobs: Vec<Job> = vec![
            self.file_job(),
            Box::new(move || {
                log.write_all(&record)?;
                log.sync_data()
            }),
        ];
        Ok(Batch::spawn(jobs, None))
    }

    /// Runs `round` (which makes `files` files durable) again and again
    /// for `time` at least: how many files it made durable in how long,
    /// and each round's time.
    pub fn measure(
        &self,
        mut round: impl FnMut() -> io::Result<()>,
        files: usize,
        time: Duration,
    ) -> io::Result<Measured> {
        let began = Instant::now();
        let mut rounds = Vec::new();
        while began.elapsed() < time {
            let t = Instant::now();
            round()?;
            rounds.push(t.elapsed());
        }
        Ok(Measured {
            files: (rounds.len() * files) as u64,
            elapsed: began.elapsed(),
            rounds,
        })
    }
}

/// One piece of a batch's work, on a thread of its own.
type Job = Box<dyn FnMut() -> io::Result<()> + Send>;

/// Threads that each run their job once a round, all at once; they end
/// when it is dropped.
pub struct Batch {
    /// The folder fsynced once every job of a round is done, if any.
    sync_dir: Option<PathBuf>,
    start: Arc<Barrier>,
    done: Arc<Barrier>,
    failed: Arc<Mutex<Option<io::Error>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Batch {
    /// A thread for each of `jobs`, waiting for the first round.
    fn spawn(jobs: Vec<Job>, sync_dir: Option<PathBuf>) -> Batch {
        let start = Arc::new(Barrier::new(jobs.len() + 1));
        let done = Arc::new(Barrier::new(jobs.len() + 1));
        let failed: Arc<Mutex<Option<io::Error>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = jobs
            .into_iter()
            .map(|mut job| {
                let (start, done, failed, stop) = (
                    Arc::clone(&start),
                    Arc::clone(&done),
                    Arc::clone(&failed),
                    Arc::clone(&stop),
                );
                std::thread::spawn(move || {
                    loop {
                        start.wait();
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        if let Err(e) = job() {
                            failed
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .get_or_insert(e);
                        }
                        done.wait();
                    }
                })
            })
            .collect();
        Batch {
            sync_dir,
            start,
            done,
            failed,
            stop,
            threads,
        }
    }

    /// One round: every thread runs its job at once (for the ceiling,
    /// each creates, writes and fsyncs a file of its own); once all are
    /// done, the batch's folder, if it has one, is fsynced.
    pub fn run(&mut self) -> io::Result<()> {
        self.start.wait();
        self.done.wait();
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(e) = failed {
            return Err(e);
        }
        match &self.sync_dir {
            Some(dir) => crate::sync_dir(dir),
            None => Ok(()),
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.start.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What [`Probe::measure`] measured.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Files made durable.
    pub files: u64,
    /// In how long.
    pub elapsed: Duration,
    /// Each round's time, in order.
    pub rounds: Vec<Duration>,
}

impl Measured {
    /// Files made durable per second.
    pub fn files_per_second(&self) -> f64 {
        self.files as f64 / self.elapsed.as_secs_f64()
    }

    /// The median round's time (zero when none ran).
    pub fn median_round(&self) -> Duration {
        let mut sorted = self.rounds.clone();
        sorted.sort();
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    }
}

/// Creates a new file in `dir`, writes `bytes` and fsyncs it.
fn write_synced(dir: &Path, seq: &AtomicU64, bytes: &[u8]) -> io::Result<()> {
    let n = seq.fetch_add(1, Ordering::Relaxed);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(format!("probe-{n}.msg")))?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_beside_a_record_makes_both_each_round() {
        let dir = tempfile::tempdir().unwrap();
        let probe = Probe::new(dir.path().join("probe"), 100).unwrap();
        let mut pair = probe.file_beside_record(30).unwrap();
        pair.run().unwrap();
        pair.run().unwrap();
        let files = std::fs::read_dir(probe.dir())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("msg".as_ref()))
            .count();
        assert_eq!(files, 2);
        let log = std::fs::metadata(probe.dir().join("probe.log")).unwrap();
        assert_eq!(log.len(), 60);
    }

    #[test]
    fn a_failed_job_fails_its_round() {
        let dir = tempfile::tempdir().unwrap();
        let probe = Probe::new(dir.path().join("probe"), 100).unwrap();
        let mut batch = probe.files_at_once(2).unwrap();
        batch.run().unwrap();
        std::fs::remove_dir_all(probe.dir()).unwrap();
        assert!(batch.run().is_err());
    }
}
