//! Alerts for administrators as typed values: what the exchange raises when
//! something needs a person (a process in doubt or FAILED, orphaned files
//! at start-up, a failed storage write), handed to an [`AlertSink`].
//!
//! The exchange only says *that* a condition began or ended; the sink
//! decides how administrators hear of it. The default sink does nothing
//! beyond the `estafeta::alert` tracing event every alert also produces, so
//! an exchange without a configured sink still logs its alerts. Each alert
//! has a condition key (`in_doubt:<pid>`): a sink sends one notice per key
//! while the condition lasts, and [`AlertSink::clear`] says when it ended.

pub use super::alert_kind::AlertKind;
use crate::Timestamp;
use estafeta_session::{BoxFuture, Step};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// One alert: a condition that began.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// The condition, e.g. `in_doubt:<pid>`: the same key is not sent twice
    /// while the condition lasts.
    pub key: String,
    /// What kind of condition.
    pub kind: AlertKind,
    /// A sentence for the administrator.
    pub text: String,
    /// When it was raised.
    pub raised_at: Timestamp,
}

impl Alert {
    /// An alert of `kind` for `subject` (a process id, a database id, a
    /// folder): the key is `<kind>:<subject>`.
    pub fn new(
        kind: AlertKind,
        subject: impl fmt::Display,
        text: impl Into<String>,
        raised_at: Timestamp,
    ) -> Self {
        Alert {
            key: key(kind, subject),
            kind,
            text: text.into(),
            raised_at,
        }
    }
}

/// The condition key of `kind` for `subject`.
pub fn key(kind: AlertKind, subject: impl fmt::Display) -> String {
    format!("{kind}:{subject}")
}

/// Where the exchange hands its alerts. Both calls are awaited by the
/// operation that raised them, so a sink that records alerts durably has
/// done so before the operation goes on; a sink reports its own failures
/// (it cannot fail the operation).
pub trait AlertSink: Send + Sync + 'static {
    /// A condition began.
    fn raise(&self, alert: Alert) -> BoxFuture<'_, ()>;
    /// The condition with this key ended (a process in doubt was settled, a
    /// FAILED one finished its moves): a later alert with it is news again.
    fn clear(&self, key: String) -> BoxFuture<'_, ()>;
    /// [`raise`](Self::raise) as part of `step`, the step a command holds
    /// in a shared session store whose transactions the sink writes in:
    /// the alert is then recorded with the step's next save or end, or not
    /// at all (a server that lost the step's key raises nothing). `false`
    /// (the default): the sink cannot; nothing was done.
    fn raise_in_step(&self, _step: &mut dyn Step, _alert: &Alert) -> bool {
        false
    }
    /// [`clear`](Self::clear) as part of `step`, as
    /// [`raise_in_step`](Self::raise_in_step).
    fn clear_in_step(&self, _step: &mut dyn Step, _key: &str) -> bool {
        false
    }
}

/// The default sink: the tracing event is the whole alert.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogOnly;

impl AlertSink for LogOnly {
    fn raise(&self, _alert: Alert) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn clear(&self, _key: String) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Whether a condition's alert is open, as this run last told the sink:
/// unknown until this run first tells it, so an alert an earlier run left
/// open (killed before the condition ended) is closed by this run's first
/// good outcome.
#[derive(Default)]
pub(crate) struct Condition(AtomicU8);

impl Condition {
    const OPEN: u8 = 1;
    const ENDED: u8 = 2;

    /// The condition holds: whether that is news to tell the sink.
    pub(crate) fn holds(&self) -> bool {
        self.0.swap(Self::OPEN, Ordering::SeqCst) != Self::OPEN
    }

    /// The condition ended: whether that is news to tell the sink.
    pub(crate) fn ended(&self) -> bool {
        self.0.swap(Self::ENDED, Ordering::SeqCst) != Self::ENDED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_news_once_each_way_and_at_first_either_way() {
        let fresh = Condition::default();
        assert!(fresh.ended(), "an earlier run's alert is closed");
        assert!(!fresh.ended());
        assert!(fresh.holds());
        assert!(!fresh.holds());
        assert!(fresh.ended());
        assert!(Condition::default().holds());
    }

    #[test]
    fn keys_name_kind_and_subject() {
        let a = Alert::new(
            AlertKind::InDoubt,
            "01JD",
            "text",
            Timestamp::from_millis(0),
        );
        assert_eq!(a.key, "in_doubt:01JD");
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains(r#""kind":"in_doubt""#), "{json}");
        assert_eq!(serde_json::from_str::<Alert>(&json).unwrap(), a);
    }
}
