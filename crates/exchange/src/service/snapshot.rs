//! Pausing every durable write of the data folder, so that a copy taken
//! during the pause is a state a crash could have left (an online backup).
//!
//! Every embedded store is opened with one of the [`Quiesce`]'s two
//! gates ([`estafeta_durable::WriteGate`]) and passes it for the length of
//! each durable write (a redb transaction, a message file written, moved or
//! deleted, a protocol step's batch of moves). [`Quiesce::pause`] closes
//! both: it waits for the writes under way and holds back new ones until
//! the [`Paused`] guard is dropped, so during the pause the files on disk
//! are exactly what a crash at that moment would leave, which start-up
//! recovery already handles. Reads go on.
//!
//! Two gates, always closed in the same order: the message files'
//! ([`Quiesce::files`]) and the redb stores' ([`Quiesce::stores`]). A batch
//! of moves can schedule a message in the scheduled store while it holds
//! the files' gate, so it passes the stores' gate inside it; nothing passes
//! the files' gate inside the stores', and the pause closes the files'
//! first. A store of a cluster's database is opened without a gate: its
//! backup is the database's own.

use std::sync::Arc;

use estafeta_durable::{Closed, WriteGate};

use super::observer::CommitObserver;

/// The pause that backups take, shared by every store of one data folder
/// (the exchange's and the server's own), and the observer of the
/// exchange's commits. Cheap to clone.
#[derive(Clone, Default)]
pub struct Quiesce {
    inner: Arc<Gates>,
}

#[derive(Default)]
struct Gates {
    files: WriteGate,
    stores: WriteGate,
    observer: Option<Arc<dyn CommitObserver>>,
}

impl std::fmt::Debug for Quiesce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quiesce").finish_non_exhaustive()
    }
}

/// Writes are held back while this lives.
pub struct Paused {
    _stores: Closed,
    _files: Closed,
}

impl Quiesce {
    /// A pause whose exchange tells `observer` of its commits.
    pub fn observed(observer: Arc<dyn CommitObserver>) -> Self {
        Quiesce {
            inner: Arc::new(Gates {
                observer: Some(observer),
                ..Gates::default()
            }),
        }
    }

    /// The observer of the exchange's commits, if there is one.
    pub(crate) fn observer(&self) -> Option<&Arc<dyn CommitObserver>> {
        self.inner.observer.as_ref()
    }

    /// The gate the message files' writes pass.
    pub fn files(&self) -> &WriteGate {
        &self.inner.files
    }

    /// The gate the redb stores' writes pass.
    pub fn stores(&self) -> &WriteGate {
        &self.inner.stores
    }

    /// Waits for the writes under way to end and holds back new ones until
    /// the guard is dropped.
    pub async fn pause(&self) -> Paused {
        let files = self.inner.files.close().await;
        let stores = self.inner.stores.close().await;
        Paused {
            _stores: stores,
            _files: files,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_closes_both_gates_until_it_ends() {
        let quiesce = Quiesce::default();
        let paused = quiesce.pause().await;
        assert!(!quiesce.files().is_open());
        assert!(!quiesce.stores().is_open());
        drop(paused);
        assert!(quiesce.files().is_open());
        assert!(quiesce.stores().is_open());
    }

    /// Every store [`super::super::Stores::embedded`] opens holds its
    /// writes back during a pause, and makes them once it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_holds_back_every_embedded_stores_writes() {
        use crate::keys::KeyedUpload;
        use crate::store::{Change, Folder, Location};
        use crate::wire::{Body, Message, Version};
        use crate::{Id, Timestamp};
        use estafeta_session::storage::Write;

        let dir = tempfile::tempdir().unwrap();
        let quiesce = Quiesce::default();
        let clock = Arc::new(estafeta_session::SystemClock);
        let stores = super::super::Stores::embedded(dir.path(), clock, &quiesce)
            .await
            .unwrap();
        let phone = Id::new("phone-1").unwrap();
        stores.messages.create_mailbox(&phone).await.unwrap();
        let message = Message {
            version: Version,
            id: crate::MessageId::from_parts(1_764_064_800_000, 1),
            from: Id::new("db-a").unwrap(),
            to: phone.clone(),
            subsystem: Id::new("sales").unwrap(),
            created_at: Timestamp::from_millis(1_764_064_800_000),
            body: Body::from_json(r#"{"n":1}"#).unwrap(),
        };
        let paused = quiesce.pause().await;
        let mut writes = tokio::task::JoinSet::new();
        let messages = stores.messages.clone();
        writes.spawn(async move {
            let at = Location::new(phone, Folder::Messages);
            let put = messages.put(&at, &message).await;
            put.map(|_| "message").map_err(|e| e.to_string())
        });
        let registry = stores.registry.clone();
        writes.spawn(async move {
            let change = Change::CreateEnterprise(Id::new("acme").unwrap());
            let applied = registry.apply(&change).await;
            applied.map(|()| "registry").map_err(|e| e.to_string())
        });
        let sessions = stores.sessions.clone();
        writes.spawn_blocking(move || {
            let put = Write::Put {
                key: b"k".to_vec(),
                record: vec![1],
                expires_at: None,
            };
            sessions
                .write(&[put])
                .map(|()| "sessions")
                .map_err(|e| e.to_string())
        });
        let keys = stores.keys.clone();
        writes.spawn_blocking(move || {
            let upload = KeyedUpload {
                name: "n.msg".to_owned(),
                at: Timestamp::from_millis(0),
                expires_at: Timestamp::from_millis(i64::MAX),
            };
            let device = Id::new("phone-1").unwrap();
            keys.put(&device, "key", &upload)
                .map(|()| "keys")
                .map_err(|e| e.to_string())
        });
        let scheduled = stores.scheduled.store.clone();
        writes.spawn_blocking(move || {
            let entry = estafeta_repeat::Entry {
                source: crate::store::SCHEDULED_SOURCE.to_owned(),
                due: u64::MAX / 2,
                id: "m1".to_owned(),
                payload: Vec::new(),
                attempt: 0,
            };
            let put = estafeta_repeat::store::Op::Put(entry);
            scheduled
                .apply(&[put])
                .map(|_| "scheduled")
                .map_err(|e| e.to_string())
        });
        // Each write either reaches its store's gate and waits there, or
        // (its store not gated) ends while the pause holds.
        while quiesce.files().waiting() < 1 || quiesce.stores().waiting() < 4 {
            if let Some(done) = writes.try_join_next() {
                panic!("a write passed the pause: {done:?}");
            }
            tokio::task::yield_now().await;
        }
        drop(paused);
        let mut done: Vec<&str> = writes
            .join_all()
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        done.sort_unstable();
        assert_eq!(
            done,
            ["keys", "message", "registry", "scheduled", "sessions"]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_waits_for_the_file_write_under_way() {
        let quiesce = Quiesce::default();
        let writing = quiesce.files().enter().await;
        let pause = tokio::spawn({
            let quiesce = quiesce.clone();
            async move { drop(quiesce.pause().await) }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!pause.is_finished());
        drop(writing);
        pause.await.unwrap();
    }
}
