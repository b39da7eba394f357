//! Scheduled delivery (`deliver_at`): a message due later is scheduled in
//! the repeat scheduler (`<data>/.estafeta/scheduled.redb`, durable before
//! the upload is answered) with its file bytes as the entry's payload, and
//! enters its recipient's `Messages` when the exchange's clock reaches the
//! time. The entry is removed only after the file is durable there; a crash
//! in between writes it again, and a message already in any folder of its
//! recipient is not written twice. The delivery is the rest of an
//! upload, on the upload's parts ([`DeviceCalls`]).

use super::arrivals::announce;
use super::device::DeviceCalls;
use crate::error::MailboxError;
use crate::store::{FileName, Folder, Location};
use crate::wire::Message;
use estafeta_repeat::{Entry, Outcome};

impl DeviceCalls<'_> {
    /// A kept-aside message came due: into `Messages`, durably, unless a
    /// delivery before a crash got there but not to removing its entry.
    pub(crate) async fn deliver_due(&self, entry: Entry) -> Outcome {
        let message: Message = match serde_json::from_slice(&entry.payload) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(id = entry.id, error = %e, "unreadable scheduled message dropped");
                return Outcome::Done;
            }
        };
        if self
            .store
            .delivered(&FileName::of(&message))
            .await
            .unwrap_or(false)
        {
            return Outcome::Done;
        }
        let queue = Location::new(message.to.clone(), Folder::Messages);
        match self.store.put(&queue, &message).await {
            Ok(_) => {
                announce(self.registry, self.push, [&message.to], None).await;
                tracing::info!(target: "estafeta::event", message = %message.id, to = %message.to, "scheduled message delivered");
                Outcome::Done
            }
            Err(MailboxError::NoMailbox(to)) => {
                tracing::warn!(target: "estafeta::event", message = %message.id, to = %to, "a scheduled message for a deleted mailbox discarded");
                Outcome::Done
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}
