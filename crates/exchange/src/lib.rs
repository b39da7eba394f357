//! The message-exchange domain of Estafeta, with no HTTP in it.
//!
//! Devices (mobile applications) send messages to databases; processors
//! working on a database fetch them in processes (the six-call protocol)
//! and send replies back to devices. This crate holds the parts the
//! server builds on:
//!
//! - [`wire`], [`id`], [`timestamp`] and [`ulid_ids`]: the API's vocabulary
//!   (the serde type of every body, [`Id`], [`Timestamp`], [`MessageId`],
//!   [`ProcessId`]), re-exported from the `estafeta-wire` crate, which the
//!   client uses without any of the storage below.
//! - [`service`]: the [`Exchange`], the one entry point the server calls.
//!   A call goes through the protocol (`service/protocol.rs`,
//!   `device.rs`, …) to the process lifecycle (`service/lifecycle.rs`, a
//!   pure state machine: state + event → new state + steps), whose steps
//!   the interpreter (`service/drive.rs`) carries out against the stores.
//! - [`store`]: the storage seams. [`store::MessageStore`] keeps the
//!   messages in their places (`Messages`, `Prepared`, `Log`, `Unknown`,
//!   `Error` of each database and device), seen through three ports by
//!   use: a call's writes and each protocol step's batch of moves
//!   ([`store::MessageSteps`]), reads ([`store::MessageReads`]), and
//!   mailboxes, recovery, retention and totals ([`store::MessageUpkeep`]);
//!   [`store::RegistryStore`] keeps the registry's records. The session
//!   engine and the scheduler have storage traits in their own crates. The
//!   embedded implementations are files and redb, each opened with the
//!   write gate an online backup closes ([`Quiesce`]).
//! - [`mailbox`]: the files behind the embedded message store,
//!   `<data>/<id>/{Messages,Prepared,Log,Unknown,Error}`, one file per
//!   message, with durable, group-committed writes, idempotent moves and
//!   deletes, an in-memory index per folder, and answers assembled from raw
//!   file bytes.
//! - [`layout`]: [`DataLayout`], every path under the data folder.
//! - [`tenancy`] and [`token`]: the registry of enterprises, subsystems,
//!   databases and devices (kept in memory over its [`store::RegistryStore`]),
//!   and bearer tokens stored as hashes.
//! - [`error`]: the typed errors of all of the above.
//!
//! # Example
//!
//! The mailbox files on their own: a device's message is written into a
//! database's queue, chosen for a process start, and handed out as bytes
//! that parse as the same message:
//!
//! ```
//! use estafeta_exchange::mailbox::{Filter, Folder, Limits, Location, Mailboxes, SyncConfig};
//! use estafeta_exchange::wire::{Body, Message, StartResponse, Version};
//! use estafeta_exchange::{Id, Timestamp, UlidGenerator};
//! use std::time::SystemTime;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let data = tempfile::tempdir()?;
//! let mailboxes = Mailboxes::open(data.path(), SyncConfig::default()).await?;
//! let db: Id = "db-a".parse()?;
//! mailboxes.create_mailbox(&db).await?;
//!
//! let ids = UlidGenerator::new();
//! let now = SystemTime::now();
//! let message = Message {
//!     version: Version,
//!     id: ids.message_id(now),
//!     from: "phone-1".parse()?,
//!     to: db.clone(),
//!     subsystem: "sales".parse()?,
//!     created_at: Timestamp::from_system_time(now),
//!     body: Body::from_json(r#"{"order": 17}"#)?,
//! };
//! let queue = Location::new(db, Folder::Messages);
//! mailboxes.write(&queue, &message).await?;
//!
//! let chosen = mailboxes.select(&queue, &Filter::default(), Limits::default()).await?;
//! let names: Vec<_> = chosen.into_iter().map(|e| e.name).collect();
//! let raw = mailboxes.read_array(&queue, &names).await?;
//! let answer = StartResponse::ok_json_from_raw(ids.process_id(now), &raw.json);
//! let parsed: StartResponse = serde_json::from_slice(&answer)?;
//! assert_eq!(parsed.messages, Some(vec![message]));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod error;
pub mod failpoints;
pub mod keys;
pub mod layout;
pub mod mailbox;
pub mod service;
pub mod store;
pub mod tenancy;
pub mod token;

pub use estafeta_wire as wire;
pub use estafeta_wire::{id, timestamp, ulid_ids};

pub use error::{IdError, LimitError, MailboxError, TenancyError};
pub use id::Id;
pub use layout::DataLayout;
pub use service::{
    Alert, AlertKind, AlertSink, CommitObserver, Durable, ErrorKind, Exchange, ExchangeConfig,
    ExchangeError, LogOnly, NoPush, Paused, Phase, Presented, ProcessTotals, PushSink, Quiesce,
    RecipientKind, RecoveryReport, Sinks, Stores, Tidied, Totals, Upload, Verdicts, alert_key,
};
pub use timestamp::Timestamp;
pub use ulid_ids::{MessageId, ProcessId, UlidGenerator};
