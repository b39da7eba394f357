//! [`Phase`]: where the server is in its life, one `watch` that the
//! exchange moves and everything else reads (readiness, the `not_ready`
//! answer, the session hooks, the start of push delivery).
//!
//! ```text
//! Starting ──recover()──▶ Recovering ──done──▶ Ready
//!     │                       │                  │
//!     └───────────────────────┴──────────────────┴──stop──▶ Stopping
//! ```
//!
//! The phase only moves forward: a recovery that fails is tried again
//! while `Recovering`, and one that ends after stopping began leaves the
//! phase at `Stopping`.

/// The server's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Opened; start-up processing has not begun. The session hooks wait
    /// (nothing is changed, no alert raised, before it begins).
    Starting,
    /// Start-up processing runs; protocol calls answer `not_ready`.
    Recovering,
    /// Serving: `/readyz` answers 200.
    Ready,
    /// Told to stop: `/readyz` and new protocol calls answer 503 while the
    /// calls in flight finish.
    Stopping,
}

impl Phase {
    /// The phase after start-up processing began.
    pub(crate) fn recovering(self) -> Phase {
        self.max(Phase::Recovering)
    }

    /// The phase after start-up processing succeeded.
    pub(crate) fn recovered(self) -> Phase {
        self.max(Phase::Ready)
    }

    /// Whether the session hooks may act: start-up processing has begun.
    pub(crate) fn hooks_run(self) -> bool {
        self != Phase::Starting
    }
}

#[cfg(test)]
mod tests {
    use super::Phase;

    #[test]
    fn the_phase_only_moves_forward() {
        assert_eq!(Phase::Starting.recovering(), Phase::Recovering);
        assert_eq!(Phase::Recovering.recovered(), Phase::Ready);
        assert_eq!(Phase::Stopping.recovering(), Phase::Stopping);
        assert_eq!(Phase::Stopping.recovered(), Phase::Stopping);
        assert_eq!(Phase::Ready.recovering(), Phase::Ready);
        assert!(!Phase::Starting.hooks_run());
        assert!(Phase::Stopping.hooks_run());
    }
}
