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
use estafeta_repeat::Entry;
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

/// Writes (or replaces) session records of other keys (each column an
/// array): a process's owner record, written by its database's step.
const PUT_SESSIONS: &str = "INSERT INTO sessions (key, record, expires_at)
    SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bigint[])
    ON CONFLICT (key) DO UPDATE SET record = EXCLUDED.record, expires_at = EXCLUDED.expires_at";
/// As [`PUT_SESSIONS`], keeping a record already stored.
const ADD_SESSIONS: &str = "INSERT INTO sessions (key, record, expires_at)
    SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bigint[])
    ON CONFLICT (key) DO UPDATE SET record = EXCLUDED.record, expires_at = EXCLUDED.expires_at
    WHERE sessions.record IS NULL";
/// Records an alert unless its condition is ongoing, with its deliveries
/// (repeat entries, each column an array) only when it was recorded: see
/// [`PgAlerts`](crate::PgAlerts).
const RAISE: &str = "WITH raised AS (
        INSERT INTO alerts (key, alert) SELECT $1::text, $2::bytea
        WHERE NOT EXISTS (SELECT 1 FROM alerts WHERE key = $1 AND ended_at IS NULL)
        ON CONFLICT (key) WHERE ended_at IS NULL DO NOTHING RETURNING id),
    sources AS (
        INSERT INTO repeat_sources (name) SELECT DISTINCT name FROM unnest($4::text[]) AS s(name)
        WHERE EXISTS (SELECT 1 FROM raised) ON CONFLICT DO NOTHING)
    INSERT INTO repeat_entries (id, source, due, attempt, payload)
    SELECT * FROM unnest($3::text[], $4::text[], $5::bigint[], $6::integer[], $7::bytea[])
    WHERE EXISTS (SELECT 1 FROM raised)
    ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, due = EXCLUDED.due,
        attempt = EXCLUDED.attempt, payload = EXCLUDED.payload";
/// Ends an ongoing alert's condition.
pub(crate) const CLOSE: &str =
    "UPDATE alerts SET ended_at = $2 WHERE key = $1 AND ended_at IS NULL";

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
    /// Other keys' records to replace, and to add where none is stored.
    sessions: [Sessions; 2],
    /// Alerts raised, with their deliveries.
    raised: Vec<Raised>,
    /// Conditions ended: the key and when.
    closed: Vec<(String, i64)>,
}

/// Session records of other keys, as the columns of [`PUT_SESSIONS`].
#[derive(Default)]
struct Sessions {
    keys: Vec<Vec<u8>>,
    records: Vec<Vec<u8>>,
    expires: Vec<Option<i64>>,
}

/// An alert to record, and its deliveries as the columns of [`RAISE`].
struct Raised {
    key: String,
    alert: Vec<u8>,
    ids: Vec<String>,
    sources: Vec<String>,
    due: Vec<i64>,
    attempts: Vec<i32>,
    payloads: Vec<Vec<u8>>,
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
    sessions: [Option<Statement>; 2],
    raise: Option<Statement>,
    close: Option<Statement>,
}

impl Prepared {
    /// Whether there is no row to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_none()
            && self.keys.is_none()
            && self.sessions.iter().all(Option::is_none)
            && self.raise.is_none()
            && self.close.is_none()
    }
}

/// `sql` prepared on `client` when `needed`.
async fn prepared_if(
    client: &deadpool_postgres::ClientWrapper,
    needed: bool,
    sql: &str,
) -> Result<Option<Statement>, Error> {
    Ok(match needed {
        true => Some(client.prepare_cached(sql).await?),
        false => None,
    })
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

    /// Writes `write`, another key's session record, with the step (see
    /// `Step::put_beside`); with `if_absent` a stored record is kept.
    pub(crate) fn put_session(&mut self, write: estafeta_session::storage::Write, if_absent: bool) {
        use estafeta_session::storage::Write;
        let Write::Put {
            key,
            record,
            expires_at,
        } = write
        else {
            // Only owner records are written beside a step; a removal of
            // another key's record is its own engine's.
            return;
        };
        let to = &mut self.sessions[usize::from(if_absent)];
        to.keys.push(key);
        to.records.push(record);
        to.expires
            .push(expires_at.map(|t| i64::try_from(t.0).unwrap_or(i64::MAX)));
    }

    /// Records `alert` (its JSON) unless its condition `key` is ongoing,
    /// with its `deliveries`, with the step.
    pub(crate) fn raise(&mut self, key: &str, alert: Vec<u8>, deliveries: &[Entry]) {
        self.raised.push(Raised {
            key: key.to_owned(),
            alert,
            ids: deliveries.iter().map(|e| e.id.clone()).collect(),
            sources: deliveries.iter().map(|e| e.source.clone()).collect(),
            due: deliveries
                .iter()
                .map(|e| crate::schedule::to_sql(e.due))
                .collect(),
            attempts: deliveries
                .iter()
                .map(|e| crate::schedule::attempt_to_sql(e.attempt))
                .collect(),
            payloads: deliveries.iter().map(|e| e.payload.clone()).collect(),
        });
    }

    /// Ends the condition `key` at `at` (milliseconds), with the step.
    pub(crate) fn close(&mut self, key: &str, at: i64) {
        self.closed.push((key.to_owned(), at));
    }

    /// Prepares the statements the rows need on `client` (cached per
    /// connection: no round trip after the connection's first).
    pub(crate) async fn prepare(
        &self,
        client: &deadpool_postgres::ClientWrapper,
    ) -> Result<Prepared, Error> {
        let [put, add] = &self.sessions;
        Ok(Prepared {
            messages: prepared_if(client, !self.messages.ids.is_empty(), INSERT_MESSAGES).await?,
            keys: prepared_if(client, !self.keys.keys.is_empty(), PUT_KEYS).await?,
            sessions: [
                prepared_if(client, !put.keys.is_empty(), PUT_SESSIONS).await?,
                prepared_if(client, !add.keys.is_empty(), ADD_SESSIONS).await?,
            ],
            raise: prepared_if(client, !self.raised.is_empty(), RAISE).await?,
            close: prepared_if(client, !self.closed.is_empty(), CLOSE).await?,
        })
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
        let sessions: Vec<[&(dyn ToSql + Sync); 3]> = self
            .sessions
            .iter()
            .map(|s| [&s.keys as &(dyn ToSql + Sync), &s.records, &s.expires])
            .collect();
        let raised: Vec<[&(dyn ToSql + Sync); 7]> = self
            .raised
            .iter()
            .map(|r| {
                [
                    &r.key as &(dyn ToSql + Sync),
                    &r.alert,
                    &r.ids,
                    &r.sources,
                    &r.due,
                    &r.attempts,
                    &r.payloads,
                ]
            })
            .collect();
        let closed: Vec<[&(dyn ToSql + Sync); 2]> = self
            .closed
            .iter()
            .map(|(key, at)| [key as &(dyn ToSql + Sync), at])
            .collect();
        let mut writes = Vec::new();
        if let Some(insert) = &prepared.messages {
            writes.push(client.execute(insert, &messages));
        }
        if let Some(put) = &prepared.keys {
            writes.push(client.execute(put, &keys));
        }
        for (statement, params) in prepared.sessions.iter().zip(&sessions) {
            if let Some(statement) = statement {
                writes.push(client.execute(statement, params));
            }
        }
        if let Some(raise) = &prepared.raise {
            for params in &raised {
                writes.push(client.execute(raise, params));
            }
        }
        if let Some(close) = &prepared.close {
            for params in &closed {
                writes.push(client.execute(close, params));
            }
        }
        // Every statement is sent at the first poll, in order.
        for written in futures_util::future::join_all(writes).await {
            written?;
        }
        Ok(())
    }
}
