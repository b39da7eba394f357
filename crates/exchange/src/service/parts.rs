//! The exchange's parts, given at open and kept for its life. [`Parts`]
//! has no behaviour of its own: each kind of call borrows what it uses
//! from it ([`DeviceCalls`](super::device::DeviceCalls),
//! [`ProcessCalls`](super::protocol::ProcessCalls), the lifecycle's
//! [`Interpreter`](super::drive::Interpreter)); administration and
//! start-up processing, which reach nearly every part, are methods of the
//! [`Exchange`](super::Exchange) itself.

use super::ExchangeConfig;
use super::sessions::Sessions;
use crate::UlidGenerator;
use crate::tenancy::Registry;
use estafeta_session::Clock;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

/// Counters of start-up processing, filled by the first-load hook and
/// read into its report.
#[derive(Default)]
pub(crate) struct RecoveryCounters {
    pub(crate) timed_out: AtomicUsize,
    pub(crate) cleanups: AtomicUsize,
    pub(crate) in_doubt: AtomicUsize,
}

/// Everything the exchange runs on.
pub(crate) struct Parts {
    /// The settings it was opened with.
    pub(crate) config: ExchangeConfig,
    /// The time of every call, deadline and alert.
    pub(crate) clock: Arc<dyn Clock>,
    /// Enterprises, databases and devices, and their tokens.
    pub(crate) registry: Registry,
    /// Where messages live, its writes told to the commit observer.
    pub(crate) store: super::observer::Messages,
    /// New message and process ids.
    pub(crate) ids: UlidGenerator,
    /// The engines; their hooks reach the parts through a `Weak` to them.
    pub(crate) sessions: Sessions,
    /// The server's phase: the exchange moves it, everyone reads it.
    pub(crate) phase: tokio::sync::watch::Sender<super::Phase>,
    /// What start-up processing found.
    pub(crate) recovery: RecoveryCounters,
    /// Where alerts go, and the storage-write condition.
    pub(crate) alerting: super::alerting::Alerting,
    /// The devices' idempotency keys.
    pub(crate) keys: std::sync::Arc<dyn crate::keys::UploadKeys>,
    /// Messages scheduled for their `deliver_at`.
    pub(crate) scheduled: std::sync::Arc<crate::store::scheduled::DeliveryScheduler>,
    /// The store under `scheduled`, read to list what is scheduled.
    pub(crate) scheduled_store: Arc<dyn estafeta_repeat::store::Store>,
    /// Where arrivals are pushed.
    pub(crate) push: Arc<dyn super::push::PushSink>,
    /// Set once every registered mailbox has been told to the store's
    /// running totals (those registered later are told as they are).
    pub(crate) counting: tokio::sync::OnceCell<()>,
    /// The processes of every database, kept as their records are saved:
    /// only where this server sees every save (a store of its own; with a
    /// shared store the list is read from the records when asked).
    pub(crate) process_tally: Option<super::admin::process_tally::ProcessTally>,
}
