//! [`Faults`]: what a run's rounds did to the server, its processors and
//! their links, counted as they fire; the judge reads it beside what the
//! clients saw.

use std::collections::BTreeMap;
use std::time::Duration;

use estafeta_wire::ProcessId;

/// What the rounds did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    pub(crate) rounds: u64,
    pub(crate) server_crashes: u64,
    pub(crate) processor_crashes: u64,
    pub(crate) pauses: u64,
    pub(crate) disk_full: u64,
    /// Episodes of faults between the nodes and PostgreSQL.
    pub(crate) db_episodes: u64,
    /// PostgreSQL primaries killed and their standby promoted.
    pub(crate) failovers: u64,
    /// Times the server exited by itself (not killed by the harness, and
    /// not at a point it was armed to die at), seen before a restart or
    /// before the harness's own kill: each fails the run.
    pub(crate) unexpected_exits: u64,
    /// Times a processor child ended by itself (before the harness's kill,
    /// or with a failure at the drain's gentle stop): each fails the run.
    pub(crate) processor_exits: u64,
    /// Each start's own time to `/readyz`.
    pub(crate) ready_times: Vec<Duration>,
    /// Processes the harness put in doubt: stopped after their prepare
    /// was answered, then the server killed before their commit could
    /// come. Each must have its alert.
    pub(crate) withheld: Vec<ProcessId>,
    /// Server crashes at each named failpoint (part of `server_crashes`).
    pub(crate) failpoint_crashes: BTreeMap<&'static str, u64>,
    /// Starts armed with a crash point (the round-robin position in POINTS).
    pub(crate) armed_crashes: u64,
    /// Starts armed with a stall (the round-robin position in the points).
    pub(crate) armed_pauses: u64,
    /// Stalls of a node inside a step past the hold limit, by failpoint, as
    /// the nodes reported them.
    pub(crate) failpoint_pauses: BTreeMap<String, u64>,
    /// Answers to `COMMIT`s the links lost, by kind of transaction.
    pub(crate) commits_lost: BTreeMap<String, u64>,
    /// With a skewed node: times its log said its clock is off from the
    /// database server's (none: the skew did not take, which fails the
    /// run).
    pub(crate) skew_warnings: Option<usize>,
}

impl Faults {
    pub(crate) fn crashed_at(&mut self, point: &'static str) {
        tracing::info!(point, "the server killed itself at its failpoint");
        self.server_crashes += 1;
        *self.failpoint_crashes.entry(point).or_default() += 1;
    }
}
