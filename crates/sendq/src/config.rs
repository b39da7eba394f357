//! Queue configuration: the request types with their windows and flags, and
//! the size of the send worker pool.
//!
//! Validation happens once, in [`QueueConfig::validate`], so the queue itself
//! never meets a window of 0 or bounds that cannot hold.

use std::time::Duration;

use crate::error::ConfigError;

/// Index of a request type: its position in [`QueueConfig::types`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(pub usize);

/// Adaptive window bounds for one request type (AIMD).
///
/// A success answered within `latency_target` widens the window by one after
/// a full window of such successes; an error or a slow answer halves it. The
/// window always stays within `min..=max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adaptive {
    /// Smallest window the type may shrink to (at least 1).
    pub min: usize,
    /// Largest window the type may grow to.
    pub max: usize,
    /// Answers slower than this (from the start of the send) count as congestion.
    pub latency_target: Duration,
}

/// Health-probe behaviour for a prior one-shot type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePolicy {
    /// This many failed probes in a row mark the host down.
    pub failure_threshold: u32,
}

/// One request type: its window and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeConfig {
    /// Name, for errors and logs.
    pub name: String,
    /// Most entries of this type in flight per host (from joining the ready
    /// queue until answered or failed). The starting window when adaptive.
    pub window: usize,
    /// Entries are kept while the host is down and sent, in order, when it is up.
    pub queueable_if_down: bool,
    /// Entries jump to the front of the ready queue, and only one may be
    /// unanswered per host at a time (health probes).
    pub prior_one_shot: bool,
    /// An entry still queued (not yet handed to a send worker) this long after
    /// it was added fails with [`crate::SendError::Expired`].
    pub deadline: Option<Duration>,
    /// Adaptive window bounds; `None` keeps the window fixed.
    pub adaptive: Option<Adaptive>,
    /// Makes this type the host's health probe: its entries are sent even while
    /// the host is down, failures beyond the threshold mark the host down and a
    /// success marks it up.
    pub probe: Option<ProbePolicy>,
}

impl TypeConfig {
    /// A plain type with a fixed window and no flags.
    pub fn new(name: impl Into<String>, window: usize) -> Self {
        Self {
            name: name.into(),
            window,
            queueable_if_down: false,
            prior_one_shot: false,
            deadline: None,
            adaptive: None,
            probe: None,
        }
    }

    /// A health-probe type: prior one-shot, window 1, marking the host down
    /// after `failure_threshold` failures in a row.
    pub fn probe(name: impl Into<String>, failure_threshold: u32) -> Self {
        Self {
            prior_one_shot: true,
            probe: Some(ProbePolicy { failure_threshold }),
            ..Self::new(name, 1)
        }
    }

    /// Sets the queueable-if-down flag.
    pub fn queueable_if_down(mut self) -> Self {
        self.queueable_if_down = true;
        self
    }

    /// Sets the prior one-shot flag.
    pub fn prior_one_shot(mut self) -> Self {
        self.prior_one_shot = true;
        self
    }

    /// Sets the queued-entry deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Makes the window adaptive within the given bounds.
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.adaptive = Some(adaptive);
        self
    }
}

/// The whole queue's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// The request types; an entry names one by its index ([`Kind`]).
    pub types: Vec<TypeConfig>,
    /// Number of send workers shared by all hosts.
    pub workers: usize,
    /// Most sends being written to one host at once (1 by default).
    pub per_host_sends: usize,
}

impl QueueConfig {
    /// A configuration with the given types, 16 workers and one send at a time per host.
    pub fn new(types: Vec<TypeConfig>) -> Self {
        Self {
            types,
            workers: 16,
            per_host_sends: 1,
        }
    }

    /// Checks every rule the queue relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.types.is_empty() {
            return Err(ConfigError::NoTypes);
        }
        if self.workers == 0 {
            return Err(ConfigError::ZeroWorkers);
        }
        if self.per_host_sends == 0 {
            return Err(ConfigError::ZeroHostSends);
        }
        for (kind, t) in self.types.iter().enumerate() {
            let name = || t.name.clone();
            if t.window == 0 {
                return Err(ConfigError::ZeroWindow { kind, name: name() });
            }
            if let Some(a) = &t.adaptive
                && !(1 <= a.min && a.min <= t.window && t.window <= a.max)
            {
                return Err(ConfigError::AdaptiveBounds { kind, name: name() });
            }
            if let Some(p) = &t.probe
                && p.failure_threshold == 0
            {
                return Err(ConfigError::ZeroProbeThreshold { kind, name: name() });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_window_is_refused() {
        let config = QueueConfig::new(vec![TypeConfig::new("a", 1), TypeConfig::new("b", 0)]);
        assert_eq!(
            config.validate(),
            Err(ConfigError::ZeroWindow {
                kind: 1,
                name: "b".into()
            })
        );
    }

    #[test]
    fn adaptive_bounds_must_hold() {
        let bad = TypeConfig::new("a", 5).adaptive(Adaptive {
            min: 6,
            max: 10,
            latency_target: Duration::from_millis(10),
        });
        assert!(matches!(
            QueueConfig::new(vec![bad]).validate(),
            Err(ConfigError::AdaptiveBounds { .. })
        ));
        let good = TypeConfig::new("a", 5).adaptive(Adaptive {
            min: 1,
            max: 10,
            latency_target: Duration::from_millis(10),
        });
        assert_eq!(QueueConfig::new(vec![good]).validate(), Ok(()));
    }

    #[test]
    fn empty_and_zero_pools_are_refused() {
        assert_eq!(
            QueueConfig::new(vec![]).validate(),
            Err(ConfigError::NoTypes)
        );
        let mut c = QueueConfig::new(vec![TypeConfig::new("a", 1)]);
        c.workers = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroWorkers));
        c.workers = 1;
        c.per_host_sends = 0;
        assert_eq!(c.validate(), Err(ConfigError::ZeroHostSends));
        let probe = TypeConfig::probe("p", 0);
        assert!(matches!(
            QueueConfig::new(vec![probe]).validate(),
            Err(ConfigError::ZeroProbeThreshold { .. })
        ));
    }
}
