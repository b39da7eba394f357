//! Per-database statistics are kept in the database's session: they count
//! committed work and errors and survive a restart.

use crate::common;
use crate::common::restartable::{self, Server};
use crate::common::{Store, id, message, processed, reply, start_request};
use estafeta_exchange::MessageId;
use estafeta_exchange::wire::{
    CallStatus, DatabaseStats, MessageResult, PrepareRequest, ResultStatus, Version,
};

async fn db_a(server: &Server) -> DatabaseStats {
    let stats = server.admin.stats().await.unwrap();
    stats
        .databases
        .into_iter()
        .find(|d| d.id == id("db-a"))
        .unwrap()
}

async fn database_counters_survive_a_restart(store: Store) {
    let (data, store, clock, server, t) = restartable::started(store).await;
    for n in 0..2 {
        t.phone1
            .send(&message("db-a", &format!(r#"{{"n":{n}}}"#), None))
            .await
            .unwrap();
    }
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let ids: Vec<MessageId> = started.messages.unwrap().iter().map(|m| m.id).collect();
    let prepare = PrepareRequest {
        version: Version,
        results: vec![
            processed(ids[0]),
            MessageResult {
                message_id: ids[1],
                status: ResultStatus::ProcessedIncorrect,
                error_code: Some(7),
                error_text: Some("bad total".into()),
            },
        ],
        replies: vec![reply(id("phone-1"), "{}")],
    };
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);
    let before = db_a(&server).await;
    assert_eq!(before.processes, 1);
    assert_eq!(before.processed, 1);
    assert_eq!(before.incorrect, 1);
    assert_eq!(before.replies, 1);
    assert_eq!(before.last_error.as_deref(), Some("7: bad total"));
    assert!(before.last_seen.is_some());

    server.stop().await;
    let server = Server::start_on(data.path(), store.as_deref(), &clock).await;
    assert_eq!(db_a(&server).await, before);
    server.stop().await;
}

common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    database_counters_survive_a_restart
);
