//! [`Device`]: a mobile device that uploads messages and reads its replies
//! the way a real one on a bad network must.
//!
//! An upload gets an idempotency key when it is made and keeps it until the
//! server answers (201, or 200 for the same key), so a retry after a lost
//! answer never makes a second message. Messages the device could not
//! upload wait in its outbox, in order. The inbox is read, deduplicated by
//! message id (an acknowledgement can be lost too, and the message comes
//! again), and acknowledged.
//!
//! For an oracle that counts from the client's side, every attempt (each
//! request, retries included) carries a nonce of its own in its body and
//! is recorded as sent, byte for byte ([`Attempt`]); so is every upload the
//! server acknowledged ([`Acknowledged`]).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use estafeta_client::Client;
use estafeta_wire::{Body, Id, Message, MessageId, SendMessage, Upload};

use crate::SimError;

/// An upload not yet answered.
#[derive(Clone, Debug)]
struct Outgoing {
    to: Id,
    key: String,
    /// Its number among the device's messages (in the body).
    n: u64,
}

/// One upload request as it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The upload's idempotency key.
    pub key: String,
    /// The database it was for.
    pub to: Id,
    /// The nonce in its body, unique to this request.
    pub nonce: String,
    /// Its body's JSON, as sent.
    pub body: String,
}

/// An upload the server acknowledged (201, or 200 for its key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    /// The upload's idempotency key.
    pub key: String,
    /// The database it was for.
    pub to: Id,
    /// The message id the server answered.
    pub id: MessageId,
}

/// A simulated device.
#[derive(Debug)]
pub struct Device {
    client: Client,
    id: Id,
    /// Makes idempotency keys unique across runs that reuse a device id.
    session: String,
    /// Makes nonces unique across device objects of one device and session.
    instance: u64,
    made: u64,
    outbox: VecDeque<Outgoing>,
    attempts: Vec<Attempt>,
    acknowledged: Vec<Acknowledged>,
    repeated_uploads: u64,
    received: HashMap<MessageId, Message>,
    redelivered: u64,
    retries: u32,
    retry_wait: Duration,
}

impl Device {
    /// A device `id` whose `client` carries its token. `session` makes its
    /// idempotency keys unique (a run id, a seed).
    pub fn new(client: Client, id: Id, session: &str) -> Device {
        Device {
            client,
            id,
            session: session.to_owned(),
            instance: rand::random(),
            made: 0,
            outbox: VecDeque::new(),
            attempts: Vec::new(),
            acknowledged: Vec::new(),
            repeated_uploads: 0,
            received: HashMap::new(),
            redelivered: 0,
            retries: 3,
            retry_wait: Duration::from_millis(100),
        }
    }

    /// How often a failed upload is retried at once (transient errors
    /// only) before it waits in the outbox, and the wait between retries.
    pub fn set_retries(&mut self, retries: u32, wait: Duration) {
        self.retries = retries;
        self.retry_wait = wait;
    }

    /// The device's id.
    pub fn id(&self) -> &Id {
        &self.id
    }

    /// Makes a new message to `to` and puts it in the outbox; nothing is
    /// sent until [`Device::flush`].
    pub fn compose(&mut self, to: &Id) -> Result<(), SimError> {
        self.made += 1;
        let key = format!("{}-{}-{}", self.id, self.session, self.made);
        self.outbox.push_back(Outgoing {
            to: to.clone(),
            key,
            n: self.made,
        });
        Ok(())
    }

    /// The next request for `upload`: a body with a nonce of its own,
    /// recorded as sent.
    fn attempt(&mut self, upload: &Outgoing) -> Result<SendMessage, SimError> {
        let nonce = format!(
            "{}-{:016x}-{}",
            self.id,
            self.instance,
            self.attempts.len() + 1
        );
        let body = Body::from_value(&serde_json::json!({
            "device": self.id.to_string(),
            "to": upload.to.to_string(),
            "n": upload.n,
            "key": upload.key,
            "nonce": nonce,
        }))?;
        self.attempts.push(Attempt {
            key: upload.key.clone(),
            to: upload.to.clone(),
            nonce,
            body: body.get().to_owned(),
        });
        Ok(SendMessage::new(upload.to.clone(), body).with_key(upload.key.clone()))
    }

    /// Uploads the outbox in order, retrying transient failures with the
    /// same key; stops at the first upload that still fails (it stays
    /// first in the outbox). How many were uploaded.
    pub async fn flush(&mut self) -> Result<usize, SimError> {
        let mut uploaded = 0;
        while let Some(next) = self.outbox.front().cloned() {
            let mut attempt = 0;
            let sent = loop {
                let message = self.attempt(&next)?;
                match self.client.send(&message).await {
                    Ok(sent) => break sent,
                    Err(e) if e.is_transient() && attempt < self.retries => {
                        attempt += 1;
                        tokio::time::sleep(self.retry_wait).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            if sent.upload == Upload::Repeated {
                self.repeated_uploads += 1;
            }
            // A 200 for a key whose 201 was lost is this message's first
            // success seen here; a 200 after a seen 201 cannot happen,
            // because a key leaves the outbox with its first answer.
            self.acknowledged.push(Acknowledged {
                key: next.key,
                to: next.to,
                id: sent.accepted.id,
            });
            self.outbox.pop_front();
            uploaded += 1;
        }
        Ok(uploaded)
    }

    /// Reads the inbox (up to `limit` messages), keeps the new ones, and
    /// acknowledges everything it read. How many were new.
    pub async fn poll(&mut self, limit: usize) -> Result<usize, SimError> {
        let inbox = self.client.inbox(Some(limit)).await?;
        let mut fresh = 0;
        let ids: Vec<MessageId> = inbox.messages.iter().map(|m| m.id).collect();
        for m in inbox.messages {
            match self.received.entry(m.id) {
                Entry::Occupied(_) => self.redelivered += 1,
                Entry::Vacant(slot) => {
                    slot.insert(m);
                    fresh += 1;
                }
            }
        }
        if !ids.is_empty() {
            self.client.ack(&ids).await?;
        }
        Ok(fresh)
    }

    /// The ids of the messages the server accepted, in upload order.
    pub fn sent(&self) -> Vec<MessageId> {
        self.acknowledged.iter().map(|a| a.id).collect()
    }

    /// The uploads the server acknowledged, in upload order.
    pub fn acknowledged(&self) -> &[Acknowledged] {
        &self.acknowledged
    }

    /// Every upload request sent, in order, retries included.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    /// Messages made but not yet accepted.
    pub fn unsent(&self) -> usize {
        self.outbox.len()
    }

    /// Uploads answered 200 (the server already had the key).
    pub fn repeated_uploads(&self) -> u64 {
        self.repeated_uploads
    }

    /// The messages received, once each.
    pub fn received(&self) -> impl Iterator<Item = &Message> {
        self.received.values()
    }

    /// Messages read again after they were received (a lost acknowledgement).
    pub fn redelivered(&self) -> u64 {
        self.redelivered
    }
}
