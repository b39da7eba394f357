//! Estafeta's send queue: outbound requests per remote host and per request
//! type, each type with a window of requests in flight, so that one slow or
//! dead host never holds back the others and no host gets more than it can take.
//!
//! How it works:
//!
//! - An entry joins its type queue at its host. While the type's window is
//!   open it moves to the host's ready queue, in the order windows opened,
//!   and counts as in flight until its transport answers or it fails. Only
//!   the answer (or an error) frees the slot; being written out does not.
//! - Send workers hand ready entries of hosts with a free send slot (one by
//!   default, [`QueueConfig::per_host_sends`]) to the transport, round-robin
//!   over hosts, from a bounded pool. Work moves in batches: adding only
//!   appends to an intake that a worker files into the queues; a worker takes
//!   a batch of jobs under one lock acquisition (a run of a host's entries is
//!   written one after another, so the host's send concurrency holds) and
//!   records the batch's sent events under the next; finished entries reach
//!   the finalizer as one batch. Idle workers and the finalizer are woken
//!   only when work appears for them. There is no manager task: handing
//!   ready entries of hosts that are not sending to a free worker,
//!   round-robin, is done under the lock by whichever worker is free, which
//!   spares two task wake-ups per entry. A worker whose transport makes
//!   it wait hands the rest of its batch back to the others. Adding never
//!   waits.
//! - Per type: *queueable if down* (kept while the host is down, sent in order
//!   when it is up) and *prior one-shot* (to the front of the ready queue; a
//!   second one while the first is unanswered is refused with
//!   [`SendError::Busy`]: the health probe, see [`TypeConfig::probe`]).
//!   Nothing but a probe is handed to the transport while its host is down,
//!   a queueable one-shot included: it waits for the host to come up.
//! - Host down ([`SendQueue::host_down`]): ready entries fail with
//!   [`SendError::ConnectionAborted`], queued entries of other types with
//!   [`SendError::HostDown`], queueable ones stay; written entries are settled
//!   by their transport. Host removed: every unsent entry fails with
//!   [`SendError::HostRemoved`].
//! - A deadline per queued entry ([`SendError::Expired`]) and
//!   an adaptive (AIMD) window per type ([`Adaptive`]). Only entries handed
//!   to the transport feed the window (and a probe's failure count); an
//!   entry refused after a worker picked it but before its write (its host
//!   went down or was removed, or the queue closed) counts as never sent.
//!   Time is Tokio's, so tests drive it with `tokio::time::pause()`.
//! - One finalizer task runs completions one at a time, outside every lock,
//!   and every entry is finalized exactly once: answered, failed, expired,
//!   aborted, removed, or failed with [`SendError::ShuttingDown`] by
//!   [`SendQueue::shutdown`] (or when the last handle is dropped).
//! - Adding allocates nothing per entry: the payload is stored by value and
//!   lent to the transport ([`Request`] borrows it from the send worker that
//!   holds the entry), and the completion is stored inline, its type chosen
//!   by the caller ([`Completion`]; the default [`OnDone`] boxes any callback
//!   and serves [`SendQueue::submit`]).
//!
//! The [`Transport`] contract keeps "sent" and "answered" apart: the future
//! of [`Transport::send`] resolving is the sent event, and the [`Reply`] it is
//! given carries the answer, from any task, at any time (an answer that comes
//! first is held until the sent event). Every answer reaches its entry,
//! whatever the entry's key: no key value stands for "no send running",
//! so an entry is never left sent but unanswered with its window slot taken. Transports here: [`WebhookTransport`]
//! (JSON POST; sent when the body is written), [`SmtpTransport`] (e-mail,
//! STARTTLS and AUTH), [`SmsTransport`] (an HTTP SMS gateway from URL, method
//! and body templates) and [`HttpProbe`] (health probes).
//!
//! ```
//! use estafeta_sendq::{Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport, TypeConfig};
//!
//! /// Answers every request with its payload doubled.
//! struct Doubler;
//!
//! impl Transport<&'static str, u32> for Doubler {
//!     type Answer = u32;
//!     async fn send(&self, request: Request<'_, &'static str, u32>, reply: Reply<u32>) -> Result<(), SendError> {
//!         reply.answer(Ok(*request.payload * 2));
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let alerts = Kind(0);
//! let queue = SendQueue::new(QueueConfig::new(vec![TypeConfig::new("alerts", 4)]), Doubler)?;
//! let answer = queue.submit("ops.example", alerts, 21)?.await?;
//! assert_eq!(answer, 42);
//! queue.shutdown().await;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod admission;
mod body;
mod completion;
mod config;
mod error;
mod http;
mod probe;
mod queue;
mod shared;
mod slab;
mod sms;
mod smtp;
mod state;
mod transport;
mod webhook;
mod window;
mod worker;

pub use completion::{Completion, OnDone};
pub use config::{Adaptive, Kind, ProbePolicy, QueueConfig, TypeConfig};
pub use error::{ConfigError, SendError, TransportError};
pub use http::HttpAnswer;
pub use probe::{HttpProbe, ProbeRequest};
pub use queue::{Pending, SendQueue};
pub use sms::{SmsConfig, SmsMessage, SmsTransport};
pub use smtp::{EmailMessage, SmtpAnswer, SmtpConfig, SmtpTransport};
pub use state::{Done, TypeStats};
pub use transport::{Reply, Request, Transport};
pub use webhook::{WebhookAnswer, WebhookConfig, WebhookRequest, WebhookTransport};
