//! The names of the failpoints (the `fail` crate's, compiled in with the
//! `failpoints` feature) that the fault-injection harness arms: one list,
//! read by the server that arms them from its environment and by the
//! harness that picks them.
//!
//! The points sit around every write, rename and fsync of the protocol:
//! the mailbox's temporary-file write and fsync, its renames and unlinks,
//! its folder fsyncs and the moment after them ([`MAILBOX_POINTS`], the
//! embedded store's only); the session storage's commit and the moment
//! after it (the redb file's, or the cluster store's transaction), a
//! step's batch handed to the message store and the moment after it, and
//! a prepare's two halves: its reply names recorded, its replies stored,
//! and start-up's look for orphans in `Prepared` with the database's record
//! read and its key held ([`STORE_POINTS`], passed on both stores).

/// Every named point: [`MAILBOX_POINTS`], then [`STORE_POINTS`].
pub const POINTS: &[&str] = &[
    "mailbox::temp_write",
    "mailbox::temp_fsync",
    "mailbox::rename",
    "mailbox::unlink",
    "mailbox::dir_fsync",
    "mailbox::synced",
    "session::commit",
    "session::committed",
    "messages::apply",
    "messages::applied",
    "prepare::recorded",
    "prepare::written",
    "recovery::orphans",
];

/// How many of [`POINTS`] are the mailbox's.
const MAILBOX_COUNT: usize = 6;

/// The mailbox's points, passed by the embedded store only.
pub const MAILBOX_POINTS: &[&str] = POINTS.split_at(MAILBOX_COUNT).0;

/// The points passed on both stores, the only ones a cluster node passes.
pub const STORE_POINTS: &[&str] = POINTS.split_at(MAILBOX_COUNT).1;

/// The line an armed server writes to its stderr right before it kills
/// itself at `point`: what tells that death from a SIGKILL of another
/// sender.
pub fn crash_line(point: &str) -> String {
    format!("failpoint {point}: kill -9 of this server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mailbox_points_are_those_named_mailbox() {
        assert!(MAILBOX_POINTS.iter().all(|p| p.starts_with("mailbox::")));
        assert!(!STORE_POINTS.iter().any(|p| p.starts_with("mailbox::")));
        assert_eq!(MAILBOX_POINTS.len() + STORE_POINTS.len(), POINTS.len());
    }
}
