//! Shared harness of the integration tests: a temporary data folder with
//! mailboxes, and builders for ids and messages.

use std::path::Path;
use std::time::Duration;

use estafeta_exchange::mailbox::{
    FileEntry, Filter, Folder, Limits, Location, Mailboxes, SyncConfig,
};
use estafeta_exchange::wire::{Body, Message, Reply, SendMessage, StartRequest, Version};
use estafeta_exchange::{Id, MessageId, Timestamp};

/// A validated id from a literal.
pub(crate) fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// A temporary data folder with open mailboxes; removed when dropped.
pub(crate) struct Data {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) mailboxes: Mailboxes,
}

impl Data {
    /// The ids a process start would be handed from `queue` with these
    /// subsystem and sender filters and the default limits, oldest first.
    pub(crate) async fn selected(
        &self,
        queue: &Location,
        subsystems: Option<&[&str]>,
        senders: Option<&[&str]>,
    ) -> Vec<MessageId> {
        let ids = |v: &[&str]| v.iter().map(|x| id(x)).collect();
        let filter = Filter::new(subsystems.map(ids), senders.map(ids));
        self.mailboxes
            .select(queue, &filter, Limits::default())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name.id)
            .collect()
    }

    /// The entries a process start would be handed from `queue` with no
    /// filter and `limits`, oldest first.
    pub(crate) async fn unfiltered(&self, queue: &Location, limits: Limits) -> Vec<FileEntry> {
        let filter = Filter::default();
        let entries = self.mailboxes.select(queue, &filter, limits).await;
        entries.unwrap()
    }

    /// Writes `messages` into `loc`, one after the other.
    pub(crate) async fn write_each(
        &self,
        loc: &Location,
        messages: impl IntoIterator<Item = &Message>,
    ) {
        for m in messages {
            self.mailboxes.write(loc, m).await.unwrap();
        }
    }

    /// Mailboxes with the default group-commit settings.
    pub(crate) async fn new() -> Self {
        Self::with_config(SyncConfig::default()).await
    }

    /// Mailboxes with the given group-commit settings.
    pub(crate) async fn with_config(config: SyncConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mailboxes = Mailboxes::open(dir.path().join("data"), config)
            .await
            .unwrap();
        Self { dir, mailboxes }
    }

    /// Creates the mailbox of `name` and returns the location of its folder.
    pub(crate) async fn folder(&self, name: &str, folder: Folder) -> Location {
        let mailbox = id(name);
        self.mailboxes.create_mailbox(&mailbox).await.unwrap();
        Location::new(mailbox, folder)
    }

    /// Every entry name in a folder, hidden ones included but for spares
    /// not taken (empty files made ahead of writes).
    pub(crate) fn raw_entries(&self, loc: &Location) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.mailboxes.path(loc))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| {
                let len = e.metadata().map_or(1, |m| m.len());
                !estafeta_exchange::mailbox::is_idle_spare(&e.file_name().to_string_lossy(), len)
            })
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

/// A group-commit setting that waits for every concurrent writer, so that
/// tests of batching do not depend on scheduling.
pub(crate) fn patient() -> SyncConfig {
    SyncConfig {
        max_batch: 10_000,
        linger: Duration::from_secs(60),
        ..SyncConfig::default()
    }
}

/// A message with the given routing, created at `created_ms` and arrived at
/// `arrived_ms` (the time inside its id); `seq` keeps ids unique.
pub(crate) fn message(
    from: &str,
    to: &str,
    subsystem: &str,
    created_ms: i64,
    arrived_ms: u64,
    seq: u128,
    body: &str,
) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(arrived_ms, seq),
        from: id(from),
        to: id(to),
        subsystem: id(subsystem),
        created_at: Timestamp::from_millis(created_ms),
        body: Body::from_json(body).unwrap(),
    }
}

/// A message from phone-1 to db-a in subsystem sales, with a body of about `size` bytes.
pub(crate) fn sized(seq: u128, size: usize) -> Message {
    let body = format!("\"{}\"", "x".repeat(size));
    message(
        "phone-1",
        "db-a",
        "sales",
        1_000 + seq as i64,
        2_000,
        seq,
        &body,
    )
}

/// An upload to `to` with the JSON `body` and the idempotency key `key`,
/// neither dated nor scheduled.
pub(crate) fn send_request(to: &str, body: &str, key: Option<&str>) -> SendMessage {
    SendMessage {
        idempotency_key: key.map(str::to_owned),
        ..SendMessage::new(id(to), Body::from_json(body).unwrap())
    }
}

/// A start for the database `db` with no filters and the server's limits.
pub(crate) fn start_request(db: &str) -> StartRequest {
    StartRequest::new(id(db))
}

/// `n` replies to phone-1, each body numbering its reply.
pub(crate) fn replies(n: usize) -> Vec<Reply> {
    (0..n)
        .map(|i| Reply {
            to: id("phone-1"),
            body: Body::from_json(format!(r#"{{"reply":{i}}}"#)).unwrap(),
            created_at: None,
            deliver_at: None,
        })
        .collect()
}

/// How many message files the folder `dir` holds, hidden temporary files
/// left out; none if it is not there.
pub(crate) fn message_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0)
}
