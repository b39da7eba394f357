//! Choosing the messages of a process start (API_1): filters by subsystem
//! and sender, then the file-count and size limits.

use std::collections::HashSet;

use super::FileName;
use crate::error::LimitError;
use crate::id::Id;

/// A megabyte, as the size limits count it (2^20 bytes).
pub const MB: u64 = 1_048_576;

/// How much one start may hand out. The effective limits are the smaller of
/// the server's and the caller's ([`Limits::narrow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most messages.
    pub max_files: usize,
    /// The most bytes in total; a single larger message is still sent alone.
    pub max_bytes: u64,
}

impl Limits {
    /// The server's limits from its settings (`ESTAFETA_MAX_FILES`, `ESTAFETA_MAX_MB`).
    pub fn new(max_files: usize, max_mb: f64) -> Result<Self, LimitError> {
        if max_files == 0 {
            return Err(LimitError::NoFiles);
        }
        Ok(Self {
            max_files,
            max_bytes: mb_to_bytes(max_mb)?,
        })
    }

    /// The limits for a call that asked for `max_files` and `max_mb`: each is
    /// the smaller of the server's and the caller's.
    pub fn narrow(self, max_files: Option<u64>, max_mb: Option<f64>) -> Result<Self, LimitError> {
        let mut out = self;
        if let Some(n) = max_files {
            if n == 0 {
                return Err(LimitError::NoFiles);
            }
            out.max_files = out.max_files.min(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(mb) = max_mb {
            out.max_bytes = out.max_bytes.min(mb_to_bytes(mb)?);
        }
        Ok(out)
    }
}

impl Default for Limits {
    /// 10 files, 20 MB per answer.
    fn default() -> Self {
        Self {
            max_files: 10,
            max_bytes: 20 * MB,
        }
    }
}

fn mb_to_bytes(mb: f64) -> Result<u64, LimitError> {
    if !(mb.is_finite() && mb > 0.0) {
        return Err(LimitError::BadMegabytes(mb));
    }
    // `as` saturates for huge values, which is the intent: "no limit".
    Ok(((mb * MB as f64) as u64).max(1))
}

/// Which messages a start may take, by subsystem and by sender. `None` means
/// "any"; an empty set matches nothing (the caller asked for no subsystem).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only these subsystems.
    pub subsystems: Option<HashSet<Id>>,
    /// Only from these senders.
    pub senders: Option<HashSet<Id>>,
}

impl Filter {
    /// A filter from the optional lists of a start request.
    pub fn new(subsystems: Option<Vec<Id>>, senders: Option<Vec<Id>>) -> Self {
        Self {
            subsystems: subsystems.map(|v| v.into_iter().collect()),
            senders: senders.map(|v| v.into_iter().collect()),
        }
    }

    /// Whether the message named `name` passes.
    pub fn matches(&self, name: &FileName) -> bool {
        self.admits(&name.subsystem, &name.from)
    }

    /// Whether a message of `subsystem` from `sender` passes.
    pub(crate) fn admits(&self, subsystem: &Id, sender: &Id) -> bool {
        let ok = |set: &Option<HashSet<Id>>, id: &Id| set.as_ref().is_none_or(|s| s.contains(id));
        ok(&self.subsystems, subsystem) && ok(&self.senders, sender)
    }
}

/// Takes the longest prefix of `sized` (oldest first) within `limits`; when
/// even the first message is larger than the byte limit, it alone, so that
/// no message can block the queue. Sizes are asked for lazily (`None` means
/// the file vanished and is skipped), so only the files taken are looked at.
pub fn take_within<T>(
    candidates: impl IntoIterator<Item = T>,
    mut size_of: impl FnMut(&T) -> Option<u64>,
    limits: Limits,
) -> Vec<(T, u64)> {
    let mut taken = Vec::new();
    let mut total = 0u64;
    for c in candidates {
        if taken.len() >= limits.max_files {
            break;
        }
        let Some(size) = size_of(&c) else { continue };
        let sum = total.saturating_add(size);
        if sum > limits.max_bytes && !taken.is_empty() {
            break;
        }
        taken.push((c, size));
        total = sum;
        if total >= limits.max_bytes {
            break;
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(sizes: &[u64], max_files: usize, max_bytes: u64) -> Vec<u64> {
        let limits = Limits {
            max_files,
            max_bytes,
        };
        take_within(sizes.iter().copied(), |s| Some(*s), limits)
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    #[test]
    fn count_and_size_limits() {
        assert_eq!(take(&[1, 2, 3, 4], 3, 100), vec![1, 2, 3]);
        assert_eq!(take(&[4, 4, 4, 4], 10, 10), vec![4, 4]);
        assert_eq!(take(&[4, 4, 2, 4], 10, 10), vec![4, 4, 2]);
        assert_eq!(take(&[50, 1, 1], 10, 10), vec![50]);
        assert_eq!(take(&[1, 50, 1], 10, 10), vec![1]);
        assert_eq!(take(&[], 10, 10), Vec::<u64>::new());
    }

    #[test]
    fn vanished_files_are_skipped() {
        let limits = Limits::default();
        let got = take_within([1u64, 0, 3], |s| (*s != 0).then_some(*s), limits);
        assert_eq!(got, vec![(1, 1), (3, 3)]);
    }

    #[test]
    fn narrowing_takes_the_smaller() {
        let server = Limits::new(10, 20.0).unwrap();
        assert_eq!(server, Limits::default());
        let l = server.narrow(Some(5), Some(0.5)).unwrap();
        assert_eq!(l.max_files, 5);
        assert_eq!(l.max_bytes, MB / 2);
        let l = server.narrow(Some(500), Some(500.0)).unwrap();
        assert_eq!(l, server);
        assert_eq!(server.narrow(Some(0), None), Err(LimitError::NoFiles));
        assert!(server.narrow(None, Some(-1.0)).is_err());
        assert!(server.narrow(None, Some(f64::NAN)).is_err());
        assert!(Limits::new(0, 1.0).is_err());
    }
}
