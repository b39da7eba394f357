//! Simulators of the two kinds of clients, used by the tests, the
//! fault-injection harness (`estafeta-harness`) and `estafeta demo`.
//!
//! - [`processor`]: [`Processor`], a database processor that behaves like
//!   the seed's Gedemin: one SQLite transaction per process, a SAVEPOINT per
//!   message, the process id kept in its own database so that it settles a
//!   process in doubt after its own crash.
//! - [`device`]: [`Device`], a mobile device that uploads with idempotency
//!   keys (retrying with the same key), reads its inbox, deduplicates by id
//!   and acknowledges.
//! - [`error`]: [`SimError`], why a simulator step failed.

pub mod device;
pub mod error;
pub mod processor;

pub use device::Device;
pub use error::SimError;
pub use processor::{Cycle, Processor, ProcessorConfig, Step};
