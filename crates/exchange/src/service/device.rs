//! Device calls: upload (idempotent per device and key), inbox,
//! acknowledge. Each runs as a command on the device's session, on
//! [`DeviceCalls`]: the few parts of the exchange they use (the clock, ids,
//! the registry, the message and key stores, the devices' sessions, the
//! push sink), so that what an upload can touch is read in one place.

use super::Presented;
use super::Upload as UploadOutcome;
use super::arrivals::arrived;
use super::error::ExchangeError;
use super::hold::{confirm, hold_for};
use super::observer::Messages;
use super::parts::Parts;
use super::push::PushSink;
use super::records::{DeviceRecord, Upload};
use crate::keys::{KeyedUpload, KeysError, UploadKeys};
use crate::store::{FileName, Folder, Location, Op};
use crate::tenancy::{Principal, Registry};
use crate::wire::ErrorCode;
use crate::wire::{AckRequest, AckResponse, Inbox, Message, MessageAccepted, SendMessage, Version};
use crate::{Id, Timestamp, UlidGenerator};
use estafeta_session::{Clock, Engine};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// The longest idempotency key accepted.
const MAX_KEY_LEN: usize = 200;
/// Inbox answers hold at most this many messages.
const MAX_INBOX: usize = 1000;
/// The most idempotency keys a device's record keeps (see
/// [`DeviceCalls::keep_in_record`]): each upload's save rewrites them, and
/// every this many uploads share one commit of the key store.
const KEYS_IN_RECORD: usize = 32;

struct Device<'a> {
    id: &'a Id,
    enterprise: &'a Id,
}

fn device(who: &Principal) -> Result<Device<'_>, ExchangeError> {
    match who {
        Principal::Device { id, enterprise, .. } => Ok(Device { id, enterprise }),
        _ => Err(ExchangeError::forbidden("this call needs a device token")),
    }
}

/// Counts a new upload of `body_bytes` of body at `now` in the device's
/// counters.
fn count(
    g: &mut estafeta_session::SessionGuard<Id, DeviceRecord>,
    body_bytes: u64,
    now: Timestamp,
) {
    let counters = &mut g.persistent_mut().device;
    counters.sent += 1;
    counters.bytes += body_bytes;
    counters.last_seen = Some(now);
}

/// The answer to a new upload of `message`, now durable; the event logged.
fn accepted(message: &Message) -> (MessageAccepted, UploadOutcome) {
    tracing::info!(target: "estafeta::event", device = %message.from, db = %message.to, message = %message.id, "message received");
    (
        MessageAccepted {
            version: Version,
            id: message.id,
        },
        UploadOutcome::Created,
    )
}

/// What the device calls (upload, inbox, acknowledge) use of the
/// exchange, and nothing more.
pub(crate) struct DeviceCalls<'a> {
    /// The time of an upload, and of its key's expiry.
    clock: &'a dyn Clock,
    /// The new messages' ids.
    ids: &'a UlidGenerator,
    /// Who may send to which database; confirms a presented token.
    pub(super) registry: &'a Registry,
    /// Where messages go (and those scheduled for later).
    pub(super) store: &'a Messages,
    /// The devices' sessions: their counters, and the keys of old.
    devices: &'a Engine<Id, DeviceRecord>,
    /// The devices' idempotency keys.
    keys: &'a Arc<dyn UploadKeys>,
    /// How long an idempotency key is remembered.
    key_ttl: Duration,
    /// Told of each arrival.
    pub(super) push: &'a dyn PushSink,
}

impl<'a> DeviceCalls<'a> {
    /// The parts the device calls use.
    pub(crate) fn of(parts: &'a Parts) -> DeviceCalls<'a> {
        DeviceCalls {
            clock: parts.clock.as_ref(),
            ids: &parts.ids,
            registry: &parts.registry,
            store: &parts.store,
            devices: &parts.sessions.device,
            keys: &parts.keys,
            key_ttl: parts.config.idempotency_ttl,
            push: parts.push.as_ref(),
        }
    }

    fn now(&self) -> Timestamp {
        super::basics::now(self.clock)
    }

    /// POST /v1/messages: on the device's session, the caller confirmed in
    /// its step ([`hold_for`]), the upload checked against
    /// the registry as that left it (a database created through another
    /// node is known to it).
    pub(crate) async fn send(
        &self,
        who: &Presented,
        req: SendMessage,
    ) -> Result<(MessageAccepted, UploadOutcome), ExchangeError> {
        let g = self.device_session(who).await?;
        let who = &who.who;
        if let Err(e) = self.check_upload(who, &req) {
            g.release().await?;
            return Err(e);
        }
        self.upload(g, who, req).await
    }

    /// Write `message` into its recipient's `Messages` now, or schedule it
    /// for its `deliver_at` when that is later than now.
    async fn place(
        &self,
        message: &Message,
        deliver_at: Option<Timestamp>,
    ) -> Result<(), ExchangeError> {
        match deliver_at.filter(|at| *at > self.now()) {
            None => {
                let queue = Location::new(message.to.clone(), Folder::Messages);
                self.store.put(&queue, message).await?;
                arrived(self.registry, self.push, &message.to);
            }
            Some(at) => self.store.schedule(message, at).await?,
        }
        Ok(())
    }

    /// The checks of an upload that need no session: a device of the
    /// enterprise of the target database, a well-formed idempotency key.
    fn check_upload<'w>(
        &self,
        who: &'w Principal,
        req: &SendMessage,
    ) -> Result<Device<'w>, ExchangeError> {
        let dev = device(who)?;
        if !self.registry.is_database_of(&req.to, dev.enterprise) {
            return Err(ExchangeError::forbidden(format!(
                "{} is not a database of this device's enterprise",
                req.to
            )));
        }
        if let Some(key) = &req.idempotency_key
            && (key.is_empty() || key.len() > MAX_KEY_LEN)
        {
            return Err(ExchangeError::bad_request(
                ErrorCode::BadIdempotencyKey,
                format!("idempotency_key must be 1–{MAX_KEY_LEN} bytes"),
            ));
        }
        Ok(dev)
    }

    /// An upload checked by [`check_upload`](Self::check_upload), on the
    /// device's session `g`.
    async fn upload(
        &self,
        mut g: estafeta_session::SessionGuard<Id, DeviceRecord>,
        who: &Principal,
        req: SendMessage,
    ) -> Result<(MessageAccepted, UploadOutcome), ExchangeError> {
        let dev = device(who)?;
        let Principal::Device { subsystem, .. } = who else {
            return Err(ExchangeError::forbidden("device token needed"));
        };
        let now = self.now();
        let deliver_at = req.deliver_at;
        let mut message = Message {
            version: Version,
            id: self.ids.message_id(self.clock.now().to_system_time()),
            from: dev.id.clone(),
            to: req.to.clone(),
            subsystem: subsystem.clone(),
            created_at: req.created_at.unwrap_or(now),
            body: req.body,
        };
        let body_bytes = message.body.get().len() as u64;
        let Some(key) = req.idempotency_key else {
            if self
                .place_in_step(&mut g, &message, deliver_at, None)
                .await?
            {
                return self.received(g, &message, body_bytes, now).await;
            }
            return self
                .place_counted(g, &message, deliver_at, None, body_bytes, now)
                .await;
        };

        // The device's session serializes its uploads, so two uploads with
        // one key never race between the lookup and the record.
        if let Some(earlier) = self.earlier_upload(&mut g, dev.id, &key, now).await? {
            tracing::info!(target: "estafeta::event", device = %dev.id, db = %earlier.to, message = %earlier.id, "repeated upload (same idempotency key)");
            // The device's session stays held until the message is known
            // to be written: another retry with the key waits, and never
            // finds the file of a write that is still under way (and may
            // yet fail and take it back). A look that fails answers an
            // error, to be retried: nothing unverified is acknowledged.
            if !self.store.delivered(&earlier).await? {
                // Recorded but not written (a crash, a full disk in
                // between): write the very same message now.
                message.id = earlier.id;
                message.created_at = earlier.created_at;
                message.to = earlier.to.clone();
                self.place(&message, deliver_at).await?;
            }
            let counters = &mut g.persistent_mut().device;
            counters.duplicates += 1;
            counters.last_seen = Some(now);
            g.release().await?;
            return Ok((
                MessageAccepted {
                    version: Version,
                    id: earlier.id,
                },
                UploadOutcome::Repeated,
            ));
        }
        // The key and the file name are durable before the file is
        // written.
        let ttl = i64::try_from(self.key_ttl.as_millis()).unwrap_or(i64::MAX);
        let upload = KeyedUpload {
            name: FileName::of(&message).to_string(),
            at: now,
            expires_at: Timestamp::from_millis(now.as_millis().saturating_add(ttl)),
        };
        if self
            .place_in_step(&mut g, &message, deliver_at, Some((&key, &upload)))
            .await?
        {
            return self.received(g, &message, body_bytes, now).await;
        }
        // Should the write fail, or its outcome be unknown, the key stays:
        // the retry with it finds the key and writes this very message
        // (same id) if it is not there, so no outcome makes a second one.
        self.place_counted(
            g,
            &message,
            deliver_at,
            Some((key, upload)),
            body_bytes,
            now,
        )
        .await
    }

    /// A new upload of `message` (`body_bytes` of body) joined to the
    /// device's step ([`place_in_step`](Self::place_in_step)) becomes
    /// durable with the release of the device's session `g`: the device's
    /// counters saved with it, then the recipient told
    /// ([`placed_in_step`](Self::placed_in_step)).
    async fn received(
        &self,
        mut g: estafeta_session::SessionGuard<Id, DeviceRecord>,
        message: &Message,
        body_bytes: u64,
        now: Timestamp,
    ) -> Result<(MessageAccepted, UploadOutcome), ExchangeError> {
        count(&mut g, body_bytes, now);
        g.release().await?;
        self.placed_in_step(&message.to);
        Ok(accepted(message))
    }

    /// A new upload of `message` (`body_bytes` of body) not joined to a
    /// step: the message placed ([`place`](Self::place)), its idempotency
    /// `key` (if any) durable before the message can appear, and the
    /// device's counters saved in its session `g`; answered once all of it
    /// is durable. With a session store of this server alone they run at
    /// once: a key due now is kept in the device's record
    /// ([`keep_in_record`](Self::keep_in_record)), saved with the counters
    /// in one commit that overlaps the message file's write and fsync (the
    /// file appears once the commit is done); a key of a message scheduled
    /// for later goes to the key store before the message is scheduled.
    /// Should the message fail, the counters go back to what they were
    /// (saved with the session's next save) and the key stays, so that the
    /// retry with it writes this very message. With a shared store, one
    /// after the other: the key, the message, the counters with the step's
    /// end.
    async fn place_counted(
        &self,
        mut g: estafeta_session::SessionGuard<Id, DeviceRecord>,
        message: &Message,
        deliver_at: Option<Timestamp>,
        key: Option<(String, KeyedUpload)>,
        body_bytes: u64,
        now: Timestamp,
    ) -> Result<(MessageAccepted, UploadOutcome), ExchangeError> {
        let record = |(key, upload): (String, KeyedUpload)| {
            let device = message.from.clone();
            with_keys(self.keys, move |keys| keys.put(&device, &key, &upload))
        };
        let embedded = g.holds() && g.step().is_none();
        if !embedded {
            if let Some(key) = key {
                record(key).await?;
            }
            self.place(message, deliver_at).await?;
            count(&mut g, body_bytes, now);
            g.release().await?;
            return Ok(accepted(message));
        }
        let before = g.state().device.clone();
        let due_later = deliver_at.is_some_and(|at| at > self.now());
        let (placed, saved) = match key {
            Some((key, upload)) if !due_later => {
                self.keep_in_record(&mut g, key, FileName::of(message), upload.at, now)
                    .await?;
                count(&mut g, body_bytes, now);
                let (go, when) = tokio::sync::oneshot::channel();
                let queue = Location::new(message.to.clone(), Folder::Messages);
                let saving = async {
                    let saved = g.save().await;
                    let _ = go.send(saved.is_ok());
                    saved
                };
                let (saved, put) = tokio::join!(saving, self.store.put_when(&queue, message, when));
                let placed = match (saved, put) {
                    (Err(e), _) => Err(ExchangeError::from(e)),
                    (Ok(()), Err(e)) => Err(e.into()),
                    (Ok(()), Ok(None)) => Err(ExchangeError::unavailable(
                        ErrorCode::Internal,
                        "the message was not written after its key was recorded",
                    )),
                    (Ok(()), Ok(Some(_))) => {
                        arrived(self.registry, self.push, &message.to);
                        Ok(())
                    }
                };
                (placed, Ok(()))
            }
            key => {
                count(&mut g, body_bytes, now);
                let placing = async {
                    if let Some(key) = key {
                        record(key).await?;
                    }
                    self.place(message, deliver_at).await
                };
                tokio::join!(placing, g.save())
            }
        };
        if let Err(e) = placed {
            // Nothing was accepted: the counters as they were (saved, if
            // the save above was, with the session in the background).
            g.persistent_mut().device = before;
            return Err(e);
        }
        saved?;
        g.release().await?;
        Ok(accepted(message))
    }

    /// Keeps `key`, the upload of the file `name` accepted `at`, in the
    /// device's record `g`, to be saved with its counters in one commit. A record already
    /// holding [`KEYS_IN_RECORD`] keys first hands them to the key store in
    /// one durable commit (the ones expired dropped) and forgets them: a
    /// record's save stays small, and the key store's commit is shared by
    /// that many uploads.
    async fn keep_in_record(
        &self,
        g: &mut estafeta_session::SessionGuard<Id, DeviceRecord>,
        key: String,
        name: FileName,
        at: Timestamp,
        now: Timestamp,
    ) -> Result<(), ExchangeError> {
        if g.state().keys.len() >= KEYS_IN_RECORD {
            let ttl = i64::try_from(self.key_ttl.as_millis()).unwrap_or(i64::MAX);
            let device = g.key().clone();
            let entries: Vec<_> = g
                .state()
                .keys
                .iter()
                .map(|(key, kept)| {
                    let expires_at =
                        Timestamp::from_millis(kept.at.as_millis().saturating_add(ttl));
                    let upload = KeyedUpload {
                        name: kept.name.to_string(),
                        at: kept.at,
                        expires_at,
                    };
                    (device.clone(), key.clone(), upload)
                })
                .filter(|(_, _, upload)| upload.expires_at > now)
                .collect();
            self.settle(g.state().keys.values().map(|u| &u.name))
                .await?;
            with_keys(self.keys, move |keys| keys.put_all(&entries)).await?;
            g.persistent_mut().keys.clear();
        }
        g.persistent_mut().keys.insert(key, Upload { name, at });
        Ok(())
    }

    /// With a shared session store whose transactions the message store
    /// writes in: `message` (due now) and its idempotency `key`, if any, as
    /// part of the device's step, so that the release's commit makes the
    /// upload durable with the device's counters, all or nothing (`true`;
    /// the caller tells [`placed_in_step`](Self::placed_in_step) once the
    /// release succeeded). `false`: nothing was done, and the message goes
    /// through [`place`](Self::place) (the key, for the caller to write
    /// before it).
    async fn place_in_step(
        &self,
        g: &mut estafeta_session::SessionGuard<Id, DeviceRecord>,
        message: &Message,
        deliver_at: Option<Timestamp>,
        key: Option<(&String, &KeyedUpload)>,
    ) -> Result<bool, ExchangeError> {
        if deliver_at.is_some_and(|at| at > self.now()) {
            return Ok(false);
        }
        let Some(step) = g.step() else {
            return Ok(false);
        };
        let queue = Location::new(message.to.clone(), Folder::Messages);
        if self.store.put_in_step(step, &queue, message)?.is_none() {
            return Ok(false);
        }
        if let Some((key, upload)) = key
            && !self.keys.put_in_step(step, &message.from, key, upload)
        {
            // A key store that cannot join the step: the key is durable
            // before the step commits the message, as on the other path (a
            // retry after a failed release writes the very same message).
            with_keys(self.keys, {
                let (device, key, upload) = (message.from.clone(), key.clone(), upload.clone());
                move |keys| keys.put(&device, &key, &upload)
            })
            .await?;
        }
        Ok(true)
    }

    /// A message placed by [`place_in_step`](Self::place_in_step) is
    /// durable (the release succeeded): its recipient and the commit
    /// observer are told.
    fn placed_in_step(&self, to: &Id) {
        arrived(self.registry, self.push, to);
        self.store.delivered_in_step(1);
    }

    /// The message an earlier upload of `device` with `key` made, if the key
    /// is remembered: in the key store, or among the keys the device's
    /// record keeps ([`keep_in_record`](Self::keep_in_record); those
    /// expired are dropped from it here).
    async fn earlier_upload(
        &self,
        g: &mut estafeta_session::SessionGuard<Id, DeviceRecord>,
        device: &Id,
        key: &str,
        now: Timestamp,
    ) -> Result<Option<FileName>, ExchangeError> {
        let found = match self.keys.reads_in_place() {
            true => self.keys.get(device, key, now)?,
            false => {
                with_keys(self.keys, {
                    let (device, key) = (device.clone(), key.to_owned());
                    move |keys| keys.get(&device, &key, now)
                })
                .await?
            }
        };
        if let Some(found) = found {
            return found.name.parse().map(Some).map_err(|_| {
                ExchangeError::unavailable(
                    ErrorCode::StorageError,
                    format!("the idempotency key {key:?} of {device} names no message file"),
                )
            });
        }
        if g.state().keys.is_empty() {
            return Ok(None);
        }
        let ttl = i64::try_from(self.key_ttl.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now.as_millis().saturating_sub(ttl);
        let earlier = g
            .state()
            .keys
            .get(key)
            .filter(|u| u.at.as_millis() >= cutoff)
            .map(|u| u.name.clone());
        // Dropped with the upload's own save (no commit of their own: a
        // device whose keys expire one by one would pay one per upload).
        if g.state().keys.values().any(|u| u.at.as_millis() < cutoff) {
            let expired = g.state().keys.values();
            self.settle(
                expired
                    .filter(|u| u.at.as_millis() < cutoff)
                    .map(|u| &u.name),
            )
            .await?;
            g.persistent_mut()
                .keys
                .retain(|_, u| u.at.as_millis() >= cutoff);
        }
        Ok(earlier)
    }

    /// Makes the uploads of the files `names` durable under their names
    /// ([`settle`](crate::store::MessageSteps::settle) of their queues),
    /// before their keys leave a device's record: a keyed upload's file
    /// may appear once its record's save kept its key, its rename is not
    /// waited for on disk, and at a start after a crash the record's key
    /// is what says the upload was accepted ([`saved_uploads`](Self::saved_uploads)).
    pub(super) async fn settle(
        &self,
        names: impl Iterator<Item = &FileName>,
    ) -> Result<(), ExchangeError> {
        let queues: std::collections::BTreeSet<&Id> = names.map(|name| &name.to).collect();
        for to in queues {
            let queue = Location::new(to.clone(), Folder::Messages);
            self.store.settle(&queue).await?;
        }
        Ok(())
    }

    /// Of the messages `written` that keyed uploads wrote before a crash
    /// but did not publish ([`unconfirmed_written`](crate::store::MessageUpkeep::unconfirmed_written)),
    /// the ids of those accepted: their sender's record keeps their key
    /// (its save was their go-ahead, see [`place_counted`](Self::place_counted);
    /// a key leaves the record only once its file is [`settle`](Self::settle)d).
    /// The others were never answered, and their retry makes them anew.
    pub(super) async fn saved_uploads(
        &self,
        written: &[Message],
    ) -> Result<HashSet<crate::MessageId>, ExchangeError> {
        let mut saved = HashSet::new();
        for message in written {
            let Some(g) = self.devices.get(message.from.clone(), false).await? else {
                continue;
            };
            let name = FileName::of(message);
            if g.state().keys.values().any(|kept| kept.name == name) {
                saved.insert(message.id);
            }
            g.release().await?;
        }
        Ok(saved)
    }

    /// The session of the device `who` (its keys and counters), held, the
    /// caller confirmed in its step ([`hold_for`]).
    async fn device_session(
        &self,
        who: &Presented,
    ) -> Result<estafeta_session::SessionGuard<Id, DeviceRecord>, ExchangeError> {
        let dev = device(&who.who)?;
        hold_for(self.registry, self.devices, dev.id, "device", who).await
    }

    /// GET /v1/inbox: the messages read, then the caller confirmed with
    /// the registry's change counter read beside them (the same round trip
    /// with a shared store); a token refused there gets nothing (401).
    pub(crate) async fn inbox(
        &self,
        who: &Presented,
        limit: Option<usize>,
    ) -> Result<Vec<u8>, ExchangeError> {
        let dev = device(&who.who)?;
        let inbox = Location::new(dev.id.clone(), Folder::Messages);
        let n = limit.unwrap_or(MAX_INBOX).min(MAX_INBOX);
        let (raw, version) = match who.hash {
            Some(_) => self.store.oldest_array_and_registry(&inbox, n).await?,
            None => (self.store.oldest_array(&inbox, n).await?, None),
        };
        confirm(self.registry, who, version).await?;
        Ok(Inbox::json_from_raw(&raw.json))
    }

    /// POST /v1/inbox/ack.
    pub(crate) async fn ack(
        &self,
        who: &Presented,
        req: AckRequest,
    ) -> Result<AckResponse, ExchangeError> {
        let dev = device(&who.who)?;
        // On the device's session, so acknowledgements of one device are
        // serialized with each other.
        let mut g = self.device_session(who).await?;
        let inbox = Location::new(dev.id.clone(), Folder::Messages);
        let wanted: HashSet<_> = req.ids.iter().copied().collect();
        let log = Location::new(dev.id.clone(), Folder::Log);
        // With a shared session store whose transactions the message store
        // writes in: the moves are part of the device's step, durable with
        // its counters at the release, or not at all.
        let moved = match g.step() {
            Some(step) => self.store.move_in_step(step, &inbox, &log, &wanted).await?,
            None => None,
        };
        let (acked, failed) = match moved {
            Some(moved) => (moved.len() as u64, None),
            None => {
                let names: Vec<FileName> = self.store.find_all(&inbox, &wanted).await?;
                let moves: Vec<_> = names
                    .iter()
                    .map(|n| Op::Move {
                        name: n.clone(),
                        from: inbox.clone(),
                        to: log.clone(),
                    })
                    .collect();
                let mut acked = 0;
                let mut failed = None;
                for r in self.store.apply(None, &moves).await.results {
                    match r {
                        Ok(_) => acked += 1,
                        Err(crate::error::MailboxError::NotFound { .. }) => {}
                        Err(e) => failed = Some(e),
                    }
                }
                (acked, failed)
            }
        };
        if acked > 0 {
            let counters = &mut g.persistent_mut().device;
            counters.acked += acked;
            counters.last_seen = Some(self.now());
        }
        g.release().await?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        tracing::info!(target: "estafeta::event", device = %dev.id, acked, "messages acknowledged");
        Ok(AckResponse {
            version: Version,
            acked,
        })
    }
}

/// Run `f` on the key store `keys` off the async threads.
pub(crate) async fn with_keys<T: Send + 'static>(
    keys: &Arc<dyn UploadKeys>,
    f: impl FnOnce(&dyn UploadKeys) -> Result<T, KeysError> + Send + 'static,
) -> Result<T, ExchangeError> {
    let keys = keys.clone();
    tokio::task::spawn_blocking(move || f(keys.as_ref()))
        .await
        .map_err(|e| ExchangeError::unavailable(ErrorCode::Internal, e.to_string()))?
        .map_err(ExchangeError::from)
}
