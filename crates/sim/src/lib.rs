//! Simulators of Estafeta's two kinds of clients. The server's tests,
//! `estafeta demo` (the server's `demo` feature) and the fault runs of the
//! `estafeta-faults` crate (the harness and the power-loss checker) drive
//! them.
//!
//! - [`processor`]: [`Processor`], a database processor that behaves like a
//!   real one (Gedemin): one SQLite transaction per process, a SAVEPOINT per
//!   message, the process id kept in its own database so that it settles a
//!   process in doubt after its own crash.
//! - [`device`]: [`Device`], a mobile device that uploads with idempotency
//!   keys (retrying with the same key), reads its inbox, deduplicates by id
//!   and acknowledges.
//! - [`error`]: [`SimError`], why a simulator step failed.
//!
//! This crate is where SQLite (bundled) comes in: the typed client
//! (`estafeta-client`) and the server binary without its `demo` feature do
//! not link it.
//!
//! # Example
//!
//! Against a running server: a device uploads a message, the database's
//! processor applies it in one process, and the device reads the reply:
//!
//! ```no_run
//! use std::path::Path;
//!
//! use estafeta_client::Client;
//! use estafeta_sim::{Cycle, Device, Processor, ProcessorConfig};
//! use estafeta_wire::Id;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let admin = Client::new("http://127.0.0.1:8080", "the-admin-token")?;
//! let acme: Id = "acme".parse()?;
//! admin.create_enterprise(&acme).await?;
//! admin.create_subsystem(&acme, &"sales".parse()?).await?;
//! let db = admin.create_database(&acme, &"db-a".parse()?).await?;
//! let phone = admin.create_device(&acme, &"phone-1".parse()?, &"sales".parse()?).await?;
//!
//! let mut device = Device::new(admin.with_token(&phone.token), phone.id, "run-1");
//! device.compose(&db.id)?;
//! assert_eq!(device.flush().await?, 1);
//!
//! let config = ProcessorConfig::new(db.id.clone());
//! let mut processor = Processor::open(Path::new("db-a.sqlite"), admin.with_token(&db.token), config)?;
//! let cycles = processor.run_until_idle().await?;
//! assert!(matches!(cycles[0], Cycle::Done { processed: 1, committed: true, .. }));
//! assert_eq!(processor.applied()?.len(), 1);
//!
//! device.poll(10).await?;
//! assert_eq!(device.received().count(), 1);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod device;
pub mod error;
pub mod processor;

pub use device::{Acknowledged, Attempt, Device};
pub use error::SimError;
pub use processor::{Cycle, Kept, Processor, ProcessorConfig, Step};
