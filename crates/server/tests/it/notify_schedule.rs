//! Scheduled delivery (`deliver_at`) under a clock the test moves: a message
//! is not in its queue before its time, is there after, and the schedule
//! survives a restart of the server.

use std::time::Duration;

use crate::common;
use crate::common::clock::ManualClock;
use crate::common::restartable::{self, Server};
use crate::common::{Store, Tenancy, id, message, processed, reply, start_request};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::StartStatus;
use estafeta_exchange::{MessageId, Timestamp};

/// A device upload to db-a due `after` from the clock's now.
async fn upload_due(t: &Tenancy, clock: &ManualClock, after: Duration) -> MessageId {
    use estafeta_session::Clock;
    let at = clock.now().after(after);
    let mut m = message("db-a", r#"{"later":true}"#, None);
    m.deliver_at = Some(Timestamp::from_millis(i64::try_from(at.0).unwrap()));
    t.phone1.send(&m).await.unwrap().accepted.id
}

async fn a_scheduled_message_enters_the_queue_at_its_time_and_not_before(store: Store) {
    let (data, store, clock, server, t) = restartable::started(store).await;

    let in_an_hour = upload_due(&t, &clock, Duration::from_secs(3600)).await;
    let in_half_an_hour = upload_due(&t, &clock, Duration::from_secs(1800)).await;
    assert!(server.queued().await.is_empty());
    let start = t.db_a.start(&start_request("db-a")).await.unwrap();
    assert_eq!(start.status, StartStatus::Idle);

    // Half an hour on (and the second the due time rounds up to), the
    // earlier one is delivered and the later one, scheduled in the same
    // store, is still not.
    clock.advance(Duration::from_secs(1801));
    server.wait_queued(in_half_an_hour).await;
    assert_eq!(server.queued().await, vec![in_half_an_hour]);

    // The server restarts before the later one is due; it is kept.
    server.stop().await;
    let server = Server::start_on(data.path(), store.as_deref(), &clock).await;
    assert_eq!(server.queued().await, vec![in_half_an_hour]);
    clock.advance(Duration::from_secs(1800));
    server.wait_queued(in_an_hour).await;
    // Listed by creation time: both were made at the same (frozen) instant.
    assert_eq!(server.queued().await, vec![in_an_hour, in_half_an_hour]);
    server.stop().await;
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_scheduled_message_enters_the_queue_at_its_time_and_not_before
);

async fn a_deliver_at_in_the_past_delivers_at_once(store: Store) {
    let (_data, _, _, server, t) = restartable::started(store).await;
    let mut m = message("db-a", "{}", None);
    m.deliver_at = Some(Timestamp::from_millis(0));
    let sent = t.phone1.send(&m).await.unwrap().accepted.id;
    assert_eq!(server.queued().await, vec![sent]);
    server.stop().await;
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_deliver_at_in_the_past_delivers_at_once
);

async fn a_scheduled_reply_reaches_the_inbox_at_its_time_across_a_restart(store: Store) {
    use estafeta_exchange::wire::{CallStatus, PrepareRequest, Reply, Version};
    use estafeta_session::Clock;
    let (data, store, clock, server, t) = restartable::started(store).await;
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let at = clock.now().after(Duration::from_secs(3600));
    let prepare = PrepareRequest {
        version: Version,
        results: vec![processed(started.messages.unwrap()[0].id)],
        replies: vec![
            Reply {
                deliver_at: Some(Timestamp::from_millis(i64::try_from(at.0).unwrap())),
                ..reply(id("phone-1"), r#"{"later":true}"#)
            },
            reply(id("phone-1"), r#"{"now":true}"#),
        ],
    };
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);
    // Only the reply without a delivery time is in the inbox; nothing is
    // left in Prepared.
    let inbox = t.phone1.inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    let now_id = inbox.messages[0].id;
    let prepared = server
        .admin
        .folder(&id("db-a"), Folder::Prepared)
        .await
        .unwrap();
    assert!(prepared.files.is_empty());

    server.stop().await;
    let server = Server::start_on(data.path(), store.as_deref(), &clock).await;
    assert_eq!(server.queued_at("phone-1").await, vec![now_id]);
    clock.advance(Duration::from_secs(3601));
    for _ in 0..3000 {
        if server.queued_at("phone-1").await.len() == 2 {
            server.stop().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the scheduled reply did not reach the inbox");
}
common::both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_scheduled_reply_reaches_the_inbox_at_its_time_across_a_restart
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_at_is_in_the_openapi_document() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &ManualClock::now()).await;
    let doc = server.admin.openapi().await.unwrap();
    for schema in ["SendMessage", "Reply"] {
        let field = &doc["components"]["schemas"][schema]["properties"]["deliver_at"];
        assert!(field.is_object(), "{schema}: {field}");
        let text = field.to_string();
        assert!(
            text.contains("RFC 3339") || text.contains("Timestamp"),
            "{text}"
        );
    }
    server.stop().await;
}
