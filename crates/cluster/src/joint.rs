//! Rows of the exchange's tables written in a session step's transaction
//! ([`estafeta_session::storage::Step::joint`]): an upload's message (and
//! its idempotency key) becomes durable with the device's step, in the
//! same commit and the same round trip as the step's save, or not at all.
//!
//! [`PgMessages`](crate::PgMessages) and [`PgKeys`](crate::PgKeys) add the
//! rows to the step's [`Joint`]; the step sends them ahead of its save and
//! `COMMIT` (`Locked::finish`), each table's rows as one
//! statement.

use estafeta_exchange::keys::KeyedUpload;
use estafeta_exchange::store::Location;
use estafeta_exchange::wire::Message;
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::Error;

/// Writes message rows (each column an array): a joint's, and those
/// [`PgMessages`](crate::PgMessages) puts on its own.
pub(crate) const INSERT_MESSAGES: &str = "INSERT INTO messages
    (id, owner, place, sender, recipient, subsystem, created_at, size, body)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::bigint[], $8::bigint[], $9::bytea[])
    ON CONFLICT (id) DO NOTHING";
/// Writes (or replaces) idempotency key rows (each column an array): a
/// joint's, and those [`PgKeys`](crate::PgKeys) puts on its own.
pub(crate) const PUT_KEYS: &str =
    "INSERT INTO idempotency_keys (device_id, key, name, at, expires_at)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])
    ON CONFLICT (device_id, key) DO UPDATE
    SET name = EXCLUDED.name, at = EXCLUDED.at, expires_at = EXCLUDED.expires_at";

/// What a step offers the exchange's other stores: the registry's change
/// counter read with its lock, and the rows it carries until its next
/// commit (none for most steps).
#[derive(Default)]
pub(crate) struct Joint {
    /// The registry's change counter as of the step's lock
    /// (`Locked::registry`).
    pub(crate) registry: u64,
    messages: Messages,
    keys: Keys,
}

/// Message rows, as the columns of the messages' `INSERT`.
#[derive(Default)]
struct Messages {
    ids: Vec<String>,
    owners: Vec<String>,
    places: Vec<&'static str>,
    senders: Vec<String>,
    recipients: Vec<String>,
    subsystems: Vec<String>,
    created: Vec<i64>,
    sizes: Vec<i64>,
    bodies: Vec<Vec<u8>>,
}

/// Idempotency key rows, as the columns of the keys' upsert.
#[derive(Default)]
struct Keys {
    devices: Vec<String>,
    keys: Vec<String>,
    names: Vec<String>,
    at: Vec<i64>,
    expires: Vec<i64>,
}

/// The statements a [`Joint`] needs, prepared on the step's connection
/// before anything is sent (a statement still to prepare would fall behind
/// the `COMMIT` in the pipeline).
pub(crate) struct Prepared {
    messages: Option<Statement>,
    keys: Option<Statement>,
}

impl Prepared {
    /// Whether there is no row to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_none() && self.keys.is_none()
    }
}

impl Joint {
    /// No rows yet, the registry's change counter at `registry`.
    pub(crate) fn new(registry: u64) -> Joint {
        Joint {
            registry,
            ..Joint::default()
        }
    }

    /// Adds a new message into `at`, its stored bytes `bytes`.
    pub(crate) fn put_message(&mut self, at: &Location, message: &Message, bytes: Vec<u8>) {
        let m = &mut self.messages;
        m.ids.push(message.id.to_string());
        m.owners.push(at.mailbox.to_string());
        m.places.push(at.folder.as_str());
        m.senders.push(message.from.to_string());
        m.recipients.push(message.to.to_string());
        m.subsystems.push(message.subsystem.to_string());
        m.created.push(message.created_at.as_millis());
        m.sizes.push(i64::try_from(bytes.len()).unwrap_or(i64::MAX));
        m.bodies.push(bytes);
    }

    /// Records (or replaces) what `key` of `device` made. A key given twice
    /// keeps its last entry (one statement cannot change a row twice).
    pub(crate) fn put_key(&mut self, device: &str, key: &str, upload: &KeyedUpload) {
        let k = &mut self.keys;
        let values = (
            upload.name.clone(),
            upload.at.as_millis(),
            upload.expires_at.as_millis(),
        );
        match (0..k.keys.len()).find(|&i| k.devices[i] == device && k.keys[i] == key) {
            Some(i) => (k.names[i], k.at[i], k.expires[i]) = values,
            None => {
                k.devices.push(device.to_owned());
                k.keys.push(key.to_owned());
                k.names.push(values.0);
                k.at.push(values.1);
                k.expires.push(values.2);
            }
        }
    }

    /// Prepares the statements the rows need on `client` (cached per
    /// connection: no round trip after the connection's first).
    pub(crate) async fn prepare(
        &self,
        client: &deadpool_postgres::ClientWrapper,
    ) -> Result<Prepared, Error> {
        let messages = match self.messages.ids.is_empty() {
            true => None,
            false => Some(client.prepare_cached(INSERT_MESSAGES).await?),
        };
        let keys = match self.keys.keys.is_empty() {
            true => None,
            false => Some(client.prepare_cached(PUT_KEYS).await?),
        };
        Ok(Prepared { messages, keys })
    }

    /// Sends the rows on `client`: every statement is sent at the first
    /// poll, before this awaits any answer, so the statements that follow
    /// in the same pipeline go after them.
    pub(crate) async fn write(
        &self,
        client: &tokio_postgres::Client,
        prepared: &Prepared,
    ) -> Result<(), Error> {
        let m = &self.messages;
        let k = &self.keys;
        let messages: [&(dyn ToSql + Sync); 9] = [
            &m.ids,
            &m.owners,
            &m.places,
            &m.senders,
            &m.recipients,
            &m.subsystems,
            &m.created,
            &m.sizes,
            &m.bodies,
        ];
        let keys: [&(dyn ToSql + Sync); 5] = [&k.devices, &k.keys, &k.names, &k.at, &k.expires];
        let (inserted, put) = tokio::join!(
            async {
                match &prepared.messages {
                    Some(insert) => client.execute(insert, &messages).await.map(drop),
                    None => Ok(()),
                }
            },
            async {
                match &prepared.keys {
                    Some(put) => client.execute(put, &keys).await.map(drop),
                    None => Ok(()),
                }
            }
        );
        inserted?;
        put?;
        Ok(())
    }
}
