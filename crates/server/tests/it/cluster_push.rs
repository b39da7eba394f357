//! Two `estafeta serve` nodes over one throwaway PostgreSQL share the
//! webhooks: one set through a node is used by the other at its next call,
//! a webhook changed through one node is the one the other pushes to, and
//! one removed through a node is pushed to by neither; each arrival is one
//! POST though both nodes run their pushers. A node that no call reached
//! since a webhook was set elsewhere still pushes the arrivals it makes on
//! its own (a scheduled message coming due).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::cluster::{pushed_once, set_webhook, two_nodes};
use crate::common::recorder;
use crate::common::{id, message, next, provision_one};
use estafeta_client::Client;
use estafeta_postgres::testing::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_pushes_to_the_webhook_set_last_through_any_node() {
    let pg = Postgres::start().unwrap();
    let (hook, mut hits) = recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let [(a, admin_a), (b, _)] = two_nodes(&pg, dir.path(), &[]).await;
    // Both nodes loaded the registry before any webhook existed.
    admin_a.create_enterprise(&id("acme")).await.unwrap();
    admin_a
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    for db in ["db-a", "db-b"] {
        admin_a.create_database(&id("acme"), &id(db)).await.unwrap();
    }
    let phone = admin_a
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await
        .unwrap();
    let phone_a = Client::new(&a.base, &phone.token).unwrap();
    let phone_b = Client::new(&b.base, &phone.token).unwrap();
    let store = estafeta_postgres::Store::connect(&pg.url()).unwrap();

    // Set through A, the arrival through B: B pushes to it.
    set_webhook(&a, "db-a", Some(format!("http://{hook}/first"))).await;
    let hit = pushed_once(&phone_b, "db-a", &mut hits, &store).await;
    assert_eq!(hit.uri, "/first");

    // Changed through B, the arrival through A: the new one.
    set_webhook(&b, "db-a", Some(format!("http://{hook}/second"))).await;
    let hit = pushed_once(&phone_a, "db-a", &mut hits, &store).await;
    assert_eq!(hit.uri, "/second");
    let hit = pushed_once(&phone_b, "db-a", &mut hits, &store).await;
    assert_eq!(hit.uri, "/second");

    // Removed through A: an arrival through B is not pushed. db-b's
    // webhook, set before and pushed after, shows that B has handled the
    // arrival for db-a by then, and that the only POST is db-b's.
    set_webhook(&b, "db-b", Some(format!("http://{hook}/other"))).await;
    set_webhook(&a, "db-a", None).await;
    phone_b.send(&message("db-a", "{}", None)).await.unwrap();
    let hit = pushed_once(&phone_b, "db-b", &mut hits, &store).await;
    assert_eq!(hit.uri, "/other");

    a.terminate().await;
    b.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_message_delivered_by_a_node_no_call_reached_is_pushed() {
    let pg = Postgres::start().unwrap();
    let (hook, mut hits) = recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let [(a, admin_a), (b, _)] = two_nodes(&pg, dir.path(), &[]).await;
    // From here on every call goes to A: B's registry is the one it read
    // before any of this.
    let (_, phone) = provision_one(&admin_a).await;
    set_webhook(&a, "db-a", Some(format!("http://{hook}/hook"))).await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let soon = i64::try_from(now.as_millis()).unwrap() + 2_000;
    let mut later = message("db-a", "{}", None);
    later.deliver_at = Some(estafeta_exchange::Timestamp::from_millis(soon));
    Client::new(&a.base, &phone)
        .unwrap()
        .send(&later)
        .await
        .unwrap();
    // A stops before the message is due: B delivers it, and pushes it.
    a.terminate().await;
    let hit = next(&mut hits).await;
    assert_eq!(hit.uri, "/hook");
    assert!(hit.body.contains("db-a"), "{}", hit.body);
    b.terminate().await;
}
