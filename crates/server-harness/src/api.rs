//! A running Estafeta server driven over HTTP with the typed client, as
//! the server's tests and benches drive it: a provisioned tenancy, a
//! process left ready to commit, and the requests they send.

use std::time::Duration;

use estafeta_client::Client;
use estafeta_wire::{
    Body, CallStatus, Id, Message, MessageId, MessageResult, PrepareRequest, ProcessId, Reply,
    ResultStatus, SendMessage, StartRequest, StartResponse, StartStatus, Version,
};

/// The id `s`; panics when `s` is not a valid id.
pub fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// An upload of `body` (JSON) to `to`, with the idempotency key `key`.
pub fn message(to: &str, body: &str, key: Option<&str>) -> SendMessage {
    SendMessage {
        idempotency_key: key.map(str::to_owned),
        ..SendMessage::new(id(to), Body::from_json(body).unwrap())
    }
}

/// A start call for `db` with no filters.
pub fn start_request(db: &str) -> StartRequest {
    StartRequest::new(id(db))
}

/// The result of `message_id`: PROCESSED, no error.
pub fn processed(message_id: MessageId) -> MessageResult {
    MessageResult {
        message_id,
        status: ResultStatus::Processed,
        error_code: None,
        error_text: None,
    }
}

/// A reply of `body` (JSON) to `to`, delivered at once.
pub fn reply(to: Id, body: &str) -> Reply {
    Reply {
        to,
        body: Body::from_json(body).unwrap(),
        created_at: None,
        deliver_at: None,
    }
}

/// A prepare that marks each of `messages` PROCESSED and answers each one's
/// sender with `body` (JSON).
pub fn answer_each(messages: &[Message], body: &str) -> PrepareRequest {
    PrepareRequest {
        version: Version,
        results: messages.iter().map(|m| processed(m.id)).collect(),
        replies: messages
            .iter()
            .map(|m| reply(m.from.clone(), body))
            .collect(),
    }
}

/// Creates, through `admin`, enterprise `acme` with subsystem `sales`,
/// database `db-a` and the devices `devices` of `sales`, in that order;
/// the database's token and each device's.
pub async fn provision_db_a(admin: &Client, devices: &[Id]) -> (String, Vec<String>) {
    admin.create_enterprise(&id("acme")).await.unwrap();
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    let db = admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for dev in devices {
        let created = admin
            .create_device(&id("acme"), dev, &id("sales"))
            .await
            .unwrap();
        tokens.push(created.token);
    }
    (db.token, tokens)
}

/// Starts a process of `db` through `processor`, with no filters:
/// answered OK. The answer.
pub async fn start_ok(processor: &Client, db: &str) -> StartResponse {
    let started = processor.start(&start_request(db)).await.unwrap();
    assert_eq!(started.status, StartStatus::Ok);
    started
}

/// Waits until `/readyz` answers 200 (start-up recovery runs in the
/// background); fails after many tries.
pub async fn wait_ready(client: &Client) {
    for _ in 0..1000 {
        if client.readyz().await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the server did not become ready");
}

/// A provisioned tenancy: enterprise `acme` (subsystem `sales`, databases
/// `db-a` and `db-b`, devices `phone-1` and `phone-2`) and enterprise
/// `other` (database `db-x`, device `phone-x`), each with its client.
pub struct Tenancy {
    /// Database `db-a` of `acme`.
    pub db_a: Client,
    /// Database `db-b` of `acme`.
    pub db_b: Client,
    /// Database `db-x` of `other`.
    pub db_x: Client,
    /// Device `phone-1` of `acme`.
    pub phone1: Client,
    /// Device `phone-2` of `acme`.
    pub phone2: Client,
    /// Device `phone-x` of `other`.
    pub phone_x: Client,
}

impl Tenancy {
    /// Creates the tenancy through `admin`, a client with the admin token.
    pub async fn provision(admin: &Client) -> Tenancy {
        for ent in ["acme", "other"] {
            admin.create_enterprise(&id(ent)).await.unwrap();
            admin
                .create_subsystem(&id(ent), &id("sales"))
                .await
                .unwrap();
        }
        let db = |ent: &'static str, db: &'static str| async move {
            let c = admin.create_database(&id(ent), &id(db)).await.unwrap();
            admin.with_token(&c.token)
        };
        let dev = |ent: &'static str, dev: &'static str| async move {
            let c = admin
                .create_device(&id(ent), &id(dev), &id("sales"))
                .await
                .unwrap();
            admin.with_token(&c.token)
        };
        Tenancy {
            db_a: db("acme", "db-a").await,
            db_b: db("acme", "db-b").await,
            db_x: db("other", "db-x").await,
            phone1: dev("acme", "phone-1").await,
            phone2: dev("acme", "phone-2").await,
            phone_x: dev("other", "phone-x").await,
        }
    }
}

/// Device `phone-1` uploads one message to `db-a`; `db-a` starts a process
/// and prepares it with `status` for that message and one reply to
/// `phone-1`: the process is READY_TO_COMMIT. Returns the process and the
/// message.
pub async fn ready_process(t: &Tenancy, status: ResultStatus) -> (ProcessId, MessageId) {
    let sent = t
        .phone1
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let prepare = PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            status,
            error_text: (status != ResultStatus::Processed).then(|| "rejected".to_owned()),
            ..processed(sent.accepted.id)
        }],
        replies: vec![reply(id("phone-1"), r#"{"ok":true}"#)],
    };
    t.db_a.prepare(&pid, &prepare).await.unwrap();
    (pid, sent.accepted.id)
}

/// [`ready_process`], then `db-a` commits the process: answered OK.
/// Returns the process and the message.
pub async fn committed_process(t: &Tenancy, status: ResultStatus) -> (ProcessId, MessageId) {
    let (pid, message) = ready_process(t, status).await;
    let committed = t.db_a.commit(&pid).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);
    (pid, message)
}
