//! The save log: a write-ahead log in front of the session database.
//!
//! A redb commit rewrites every B-tree page its writes touch (copy on
//! write, 4 KiB each, with their branches and the allocator's state): a
//! group commit of 33 small records costs about 160 KiB of writes before
//! its sync. The log makes a batch durable with one append of its encoded
//! writes and one `fdatasync`; [`RedbStorage`](super::RedbStorage) folds
//! what it holds into the database now and then, many batches in one
//! commit.
//!
//! The file begins with a header written once, when it is made (under a
//! temporary name, synced, renamed, its folder synced): a magic number and
//! a salt of its own. Frames follow, each `[length u32][epoch u64][hash
//! u64][payload]`, the hash (xxh3, seeded with the salt) over the length,
//! the epoch and the payload. Space is zeroed ahead of the frames, a chunk
//! at a time, so that most appends overwrite blocks the file already owns
//! and their `fdatasync` carries no metadata.
//!
//! The database stores the last epoch folded into it, in the fold's own
//! commit. The frames written after a fold start again just after the
//! header, with the next epoch. Opening reads the frames of the epoch after
//! the database's from the start, until one does not check: the torn tail
//! of a crash, an older epoch's frame, zeros. An older frame can never pass
//! for a newer one (its epoch differs), nor can another log's (its salt
//! differs), so a fold needs no write to the log at all: the database's
//! commit is the one atomic switch.

use super::Write;
use crate::clock::Timestamp;
use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"estsavlg";
/// The header: the magic number and the salt.
const HEADER: u64 = 16;
/// A frame's length, epoch and hash.
const FRAME_HEAD: usize = 20;
/// Space is zeroed ahead of the frames this much at a time.
const CHUNK: u64 = 256 * 1024;

/// Why a batch was not appended.
#[derive(Debug)]
pub(super) enum AppendError {
    /// It does not fit in what is left of the log (fold, then try again;
    /// a batch that does not fit an empty log goes to the database).
    Full,
    /// The file system failed: the frame may be partly written, and no
    /// frame may follow it before a fold.
    Io(io::Error),
}

/// The log file, open for appends.
#[derive(Debug)]
pub(super) struct SaveLog {
    file: File,
    /// Mixed into every frame's hash.
    salt: u64,
    /// The epoch of the frames written now: one after the database's.
    epoch: u64,
    /// Where the next frame goes.
    end: u64,
    /// How far the file is zeroed ahead of `end`.
    zeroed: u64,
    /// The most the log grows to.
    limit: u64,
}

impl SaveLog {
    /// Opens the log at `path` (made if missing), up to `limit` bytes,
    /// with the frames of `epoch`, the one after the database's last fold:
    /// the batches saved since, in order. New frames go after them, in the
    /// same epoch.
    pub(super) fn open(
        path: &Path,
        epoch: u64,
        limit: u64,
    ) -> io::Result<(SaveLog, Vec<Vec<Write>>)> {
        if !path.try_exists()? {
            create(path)?;
        }
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (salt, batches, at) = parse(path, &bytes, epoch)?;
        let log = SaveLog {
            file,
            salt,
            epoch,
            end: at as u64,
            zeroed: bytes.len() as u64,
            limit: limit.max(bytes.len() as u64),
        };
        Ok((log, batches))
    }

    /// A log made anew at `path` (whatever was there removed), empty, its
    /// frames of `epoch` next.
    pub(super) fn create_new(path: &Path, epoch: u64, limit: u64) -> io::Result<SaveLog> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let (log, _) = SaveLog::open(path, epoch, limit)?;
        Ok(log)
    }

    /// What sets this log's frames apart from any other log's.
    pub(super) fn salt(&self) -> u64 {
        self.salt
    }

    /// The epoch of the frames written now.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether no frame was written since the last fold.
    pub(super) fn is_empty(&self) -> bool {
        self.end == HEADER
    }

    /// Makes `batch` durable as the next frame.
    pub(super) fn append(&mut self, batch: &[Write]) -> Result<(), AppendError> {
        let frame = encode(batch, self.epoch, self.salt);
        let end = self.end + frame.len() as u64;
        if end > self.limit {
            return Err(AppendError::Full);
        }
        if end > self.zeroed {
            let zeroed = end.next_multiple_of(CHUNK).min(self.limit);
            let zeros = vec![0; (zeroed - self.zeroed) as usize];
            self.file
                .write_all_at(&zeros, self.zeroed)
                .map_err(AppendError::Io)?;
            self.zeroed = zeroed;
        }
        self.file
            .write_all_at(&frame, self.end)
            .and_then(|()| self.file.sync_data())
            .map_err(AppendError::Io)?;
        self.end = end;
        Ok(())
    }

    /// After the database's commit of this epoch as folded: the next
    /// frames go from the start, in the next epoch.
    pub(super) fn folded(&mut self) {
        self.epoch += 1;
        self.end = HEADER;
    }
}

/// What the log at `path` holds, read without changing it: its salt and
/// how many batches of `epoch` it has; `None` when there is no file.
pub(super) fn inspect(path: &Path, epoch: u64) -> io::Result<Option<(u64, usize)>> {
    let bytes = match std::fs::read(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        read => read?,
    };
    let (salt, batches, _) = parse(path, &bytes, epoch)?;
    Ok(Some((salt, batches.len())))
}

/// The salt of the log `bytes` (the file at `path`), its batches of
/// `epoch` in order, and where the next frame goes; an error if it is not
/// a save log.
fn parse(path: &Path, bytes: &[u8], epoch: u64) -> io::Result<(u64, Vec<Vec<Write>>, usize)> {
    let salt = match bytes.get(..HEADER as usize) {
        Some(header) if header[..8] == MAGIC[..] => u64_at(header, 8),
        _ => {
            return Err(io::Error::other(format!(
                "{} is not a save log",
                path.display()
            )));
        }
    };
    let mut batches = Vec::new();
    let mut at = HEADER as usize;
    while let Some((batch, next)) = frame_at(bytes, at, salt, epoch) {
        batches.push(batch);
        at = next;
    }
    Ok((salt, batches, at))
}

/// The log's path beside the database at `db`.
pub(super) fn path_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

/// Makes a log at `path` whole before it appears: its header and a first
/// zeroed chunk under a temporary name, synced, renamed, its folder
/// synced. Private to the server's user, as the database is.
fn create(path: &Path) -> io::Result<()> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".new");
    let temp = PathBuf::from(temp);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    let salt =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    let mut start = vec![0; CHUNK as usize];
    start[..8].copy_from_slice(MAGIC);
    start[8..16].copy_from_slice(&salt.to_le_bytes());
    file.write_all_at(&start, 0)?;
    file.sync_all()?;
    std::fs::rename(&temp, path)?;
    estafeta_durable::sync_parent(path)
}

/// The batch of the frame of `epoch` at `at` in `bytes`, and where the next
/// frame begins; `None` where no such frame is whole.
fn frame_at(bytes: &[u8], at: usize, salt: u64, epoch: u64) -> Option<(Vec<Write>, usize)> {
    let head = bytes.get(at..at.checked_add(FRAME_HEAD)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    if u64_at(head, 4) != epoch {
        return None;
    }
    let end = at.checked_add(FRAME_HEAD)?.checked_add(len)?;
    let payload = bytes.get(at + FRAME_HEAD..end)?;
    if u64_at(head, 12) != hash(&head[..12], payload, salt) {
        return None;
    }
    Some((decode(payload)?, end))
}

fn hash(head: &[u8], payload: &[u8], salt: u64) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(salt);
    hasher.update(head);
    hasher.update(payload);
    hasher.digest()
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A put's tag in a payload.
const PUT: u8 = 1;
/// A delete's tag.
const DELETE: u8 = 2;
/// A put's expiry, when it has none.
const NO_EXPIRY: u64 = u64::MAX;

/// The frame of `batch` in `epoch`.
fn encode(batch: &[Write], epoch: u64, salt: u64) -> Vec<u8> {
    let mut frame = vec![0; FRAME_HEAD];
    for w in batch {
        match w {
            Write::Put {
                key,
                record,
                expires_at,
            } => {
                frame.push(PUT);
                put_bytes(&mut frame, key);
                put_bytes(&mut frame, record);
                let at = expires_at.map_or(NO_EXPIRY, |t| t.0);
                frame.extend_from_slice(&at.to_le_bytes());
            }
            Write::Delete { key } => {
                frame.push(DELETE);
                put_bytes(&mut frame, key);
            }
        }
    }
    let len = u32::try_from(frame.len() - FRAME_HEAD).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..12].copy_from_slice(&epoch.to_le_bytes());
    let digest = hash(&frame[..12], &frame[FRAME_HEAD..], salt);
    frame[12..20].copy_from_slice(&digest.to_le_bytes());
    frame
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The writes of a payload whose hash checked; `None` if it does not
/// parse (which a checked payload of this format always does).
fn decode(mut payload: &[u8]) -> Option<Vec<Write>> {
    let mut batch = Vec::new();
    while let Some((&tag, rest)) = payload.split_first() {
        payload = rest;
        let key = take_bytes(&mut payload)?;
        batch.push(match tag {
            PUT => {
                let record = take_bytes(&mut payload)?;
                let (at, rest) = payload.split_at_checked(8)?;
                payload = rest;
                let at = u64_at(at, 0);
                Write::Put {
                    key,
                    record,
                    expires_at: (at != NO_EXPIRY).then_some(Timestamp(at)),
                }
            }
            DELETE => Write::Delete { key },
            _ => return None,
        });
    }
    Some(batch)
}

fn take_bytes(payload: &mut &[u8]) -> Option<Vec<u8>> {
    let (len, rest) = payload.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let (bytes, rest) = rest.split_at_checked(len)?;
    *payload = rest;
    Some(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, record: &str, at: Option<u64>) -> Write {
        Write::Put {
            key: key.into(),
            record: record.into(),
            expires_at: at.map(Timestamp),
        }
    }

    fn same(a: &[Write], b: &[Write]) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    #[test]
    fn batches_appended_are_read_back_in_order_in_their_epoch_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(&dir.path().join("s.redb"));
        let one = vec![put("a", "1", Some(5)), Write::Delete { key: b"b".to_vec() }];
        let two = vec![put("b", "", None)];
        {
            let (mut log, read) = SaveLog::open(&path, 1, 1 << 20).unwrap();
            assert!(read.is_empty() && log.is_empty());
            log.append(&one).unwrap();
            log.append(&two).unwrap();
        }
        let (mut log, read) = SaveLog::open(&path, 1, 1 << 20).unwrap();
        assert!(same(&read.concat(), &[one.clone(), two].concat()));
        assert!(SaveLog::open(&path, 2, 1 << 20).unwrap().1.is_empty());
        // After a fold, the next epoch's frames start over; the older ones
        // behind them never pass for its own.
        log.folded();
        log.append(&one).unwrap();
        let (_, read) = SaveLog::open(&path, 2, 1 << 20).unwrap();
        assert!(same(&read.concat(), &one));
    }

    #[test]
    fn a_torn_frame_ends_what_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(&dir.path().join("s.redb"));
        let (mut log, _) = SaveLog::open(&path, 1, 1 << 20).unwrap();
        log.append(&[put("a", "1", None)]).unwrap();
        let first_end = log.end;
        log.append(&[put("b", "2", None)]).unwrap();
        let end = log.end;
        log.append(&[put("c", "3", None)]).unwrap();
        // Every byte of the middle frame, changed in turn: the first frame
        // alone comes back, never the third after it.
        for at in first_end..end {
            let mut byte = [0];
            log.file.read_exact_at(&mut byte, at).unwrap();
            log.file.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
            let (_, read) = SaveLog::open(&path, 1, 1 << 20).unwrap();
            assert!(same(&read.concat(), &[put("a", "1", None)]), "byte {at}");
            log.file.write_all_at(&byte, at).unwrap();
        }
    }

    #[test]
    fn a_batch_beyond_the_limit_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(&dir.path().join("s.redb"));
        let (mut log, _) = SaveLog::open(&path, 1, CHUNK).unwrap();
        let big = put("a", &"x".repeat(CHUNK as usize), None);
        assert!(matches!(log.append(&[big]), Err(AppendError::Full)));
        assert!(log.is_empty());
    }

    #[test]
    fn the_log_grows_a_chunk_at_a_time_up_to_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(&dir.path().join("s.redb"));
        let (mut log, _) = SaveLog::open(&path, 1, 4 * CHUNK).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), CHUNK);
        let record = "x".repeat(100_000);
        let mut written = 0;
        while log.append(&[put("a", &record, None)]).is_ok() {
            written += 1;
        }
        assert_eq!(written, 10);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * CHUNK);
        let (_, read) = SaveLog::open(&path, 1, 4 * CHUNK).unwrap();
        assert_eq!(read.len(), 10);
    }

    #[test]
    fn another_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_of(&dir.path().join("s.redb"));
        std::fs::write(&path, b"not a log at all").unwrap();
        assert!(SaveLog::open(&path, 1, CHUNK).is_err());
    }
}
