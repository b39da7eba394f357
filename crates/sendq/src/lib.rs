//! Estafeta's send queue: outbound requests per remote host and per request
//! type, each type with a window of requests in flight, so that one slow or
//! dead host never holds back the others and no host gets more than it can take.
//!
//! Built from Gfarm's `netsendq` (seed 002). An entry joins its type queue at
//! its host; while the type's window is open it moves to the host's ready
//! queue and counts as in flight until its transport answers or it fails. A
//! manager task hands ready entries of hosts that are not busy writing to a
//! bounded pool of send workers, round-robin over hosts; adding never waits.
//! One finalizer task runs completions one at a time, outside every lock, and
//! every entry is finalized exactly once.
//!
//! Transports: [`WebhookTransport`] (JSON POST), [`SmtpTransport`] (e-mail),
//! [`SmsTransport`] (an HTTP SMS gateway) and [`HttpProbe`] (health probes),
//! or any [`Transport`] of your own.
//!
//! ```
//! use estafeta_sendq::{Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport, TypeConfig};
//!
//! /// Answers every request with its payload doubled.
//! struct Doubler;
//!
//! impl Transport<&'static str, u32> for Doubler {
//!     type Answer = u32;
//!     async fn send(&self, request: Request<&'static str, u32>, reply: Reply<u32>) -> Result<(), SendError> {
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

mod config;
mod error;
mod http;
mod probe;
mod queue;
mod slab;
mod sms;
mod smtp;
mod state;
mod transport;
mod webhook;
mod window;

pub use config::{Adaptive, Kind, ProbePolicy, QueueConfig, TypeConfig};
pub use error::{ConfigError, SendError, TransportError};
pub use http::HttpAnswer;
pub use probe::{HttpProbe, ProbeRequest};
pub use queue::{Pending, SendQueue};
pub use sms::{SmsConfig, SmsMessage, SmsTransport};
pub use smtp::{
    EmailMessage, SmtpAnswer, SmtpConfig, SmtpCredentials, SmtpSecurity, SmtpTransport,
};
pub use state::{Done, TypeStats};
pub use transport::{Reply, Request, Transport};
pub use webhook::{WebhookAnswer, WebhookConfig, WebhookRequest, WebhookTransport};
