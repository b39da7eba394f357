//! Two `estafeta serve` nodes over one throwaway PostgreSQL (`store` set to
//! its URL): what is provisioned through one works through the other, a
//! whole process cycle runs with calls alternating between the nodes,
//! BUSY is cluster-wide, and the statistics read the same through both.

use crate::common::cluster::Node;
use crate::common::{
    Binary, id, listed, message, on_loopback, prepare_all, provision_one, start_ok, start_request,
};
use estafeta_client::Client;
use estafeta_exchange::wire::{CallStatus, StartStatus};
use estafeta_postgres::testing::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_serve_one_cluster() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let env = [("ESTAFETA_STORE", url.as_str())];
    let a = Binary::serve(dir.path(), &dir.path().join("a"), &[], &env).await;
    let b = Binary::serve(dir.path(), &dir.path().join("b"), &[], &env).await;
    // The first node made the admin token; the second found it.
    let admin = a
        .printed_token
        .clone()
        .expect("the first node prints the token");
    assert_eq!(b.printed_token, None);

    let admin_a = Client::new(&a.base, &admin).unwrap();
    let (db_token, phone_token) = provision_one(&admin_a).await;
    let on = |node: &Binary, token: &str| Client::new(&node.base, token).unwrap();

    // A device created through A uploads through B.
    let sent = on(&b, &phone_token)
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = start_ok(&on(&a, &db_token), "db-a").await;
    let pid = started.process_id.unwrap();
    // A second start through the other node: BUSY.
    let second = on(&b, &db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    assert_eq!(second.status, StartStatus::Busy);

    let prepare = prepare_all([sent.accepted.id], r#"{"ok":true}"#);
    let prepared = on(&b, &db_token).prepare(&pid, &prepare).await.unwrap();
    assert_eq!(prepared.status, CallStatus::Ok);
    let committed = on(&a, &db_token).commit(&pid).await.unwrap();
    assert_eq!(committed.status, CallStatus::Ok);

    // The reply is in the device's inbox through either node.
    for node in [&a, &b] {
        let inbox = on(node, &phone_token).inbox(None).await.unwrap();
        assert_eq!(inbox.messages.len(), 1);
        assert_eq!(inbox.messages[0].from, id("db-a"));
    }
    // The statistics are the cluster's: kept with the database's session
    // record in the store, and read the same through either node.
    for node in [&a, &b] {
        let stats = on(node, &admin).stats().await.unwrap();
        let db = stats.databases.iter().find(|d| d.id == id("db-a")).unwrap();
        assert_eq!((db.received, db.processes, db.processed), (1, 1, 1));
        let phone = stats
            .devices
            .iter()
            .find(|d| d.id == id("phone-1"))
            .unwrap();
        assert_eq!(phone.processed, 1);
    }
    let idle = on(&b, &db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    assert_eq!(idle.status, StartStatus::Idle);
    a.terminate().await;
    b.terminate().await;
}

/// A node assembled in a process of its own choosing (an embedder, or a
/// benchmark) with a data folder that does not exist yet: in cluster mode
/// nothing else makes it, and `/readyz` checks the node's disk there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_a_new_data_folder_becomes_ready() {
    use estafeta_exchange::ExchangeConfig;
    use estafeta_server::config::ClusterStore;
    use estafeta_server::notify::NotifySettings;
    use estafeta_server::{HttpSettings, Server};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node");
    let mut config = ExchangeConfig::new(&data);
    config.admin_token = Some("cluster-admin-token-0123456789".to_owned());
    let (server, _) = Server::open_with(
        config,
        Arc::new(estafeta_session::SystemClock),
        HttpSettings::default(),
        NotifySettings::log_only(&data),
        Some(&ClusterStore::new(pg.url())),
        None,
    )
    .await
    .unwrap();
    let (_, base, stop, serving) = on_loopback(server).await;
    let client = Client::new(&base, "cluster-admin-token-0123456789").unwrap();
    let began = Instant::now();
    while !client.readyz().await.unwrap() {
        assert!(began.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    serving.await.unwrap().unwrap();
}

/// `store_pool` bounds the connections a node opens: eight devices
/// uploading at once through a node started with `ESTAFETA_STORE_POOL=2`
/// just after they were made (so each first call reloads the node's copy of
/// the registry while its step holds a connection) are all answered, and
/// PostgreSQL never sees more sessions of one of the node's pools than it
/// holds (each pool's sessions tell themselves by their `application_name`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_pool_bounds_a_nodes_connections() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (node, admin) = node_with_pools_of_two(&pg, dir.path()).await;
    provision_one(&admin).await;
    let mut devices = Vec::new();
    for n in 0..8 {
        let phone = admin
            .create_device(&id("acme"), &id(&format!("uploader-{n}")), &id("sales"))
            .await
            .unwrap();
        devices.push(Client::new(&node.base, &phone.token).unwrap());
    }

    // The most sessions of each pool PostgreSQL holds at once, sampled
    // while the uploads run.
    let watcher = estafeta_postgres::Store::connect(&pg.url()).unwrap();
    let most: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let sampling = tokio::spawn({
        let (most, done) = (most.clone(), done.clone());
        async move {
            let client = watcher.client().await.unwrap();
            while !done.load(Ordering::Relaxed) {
                let rows = client
                    .query(
                        "SELECT application_name, count(*) FROM pg_stat_activity
                         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                         GROUP BY application_name",
                        &[],
                    )
                    .await
                    .unwrap();
                let mut most = most.lock().unwrap();
                for row in rows {
                    let seen = most.entry(row.get(0)).or_default();
                    *seen = (*seen).max(row.get(1));
                }
            }
        }
    });
    let mut uploads = tokio::task::JoinSet::new();
    for device in devices {
        uploads.spawn(async move {
            for i in 0..5 {
                device
                    .send(&message("db-a", &format!(r#"{{"n":{i}}}"#), None))
                    .await
                    .unwrap();
            }
        });
    }
    uploads.join_all().await;
    done.store(true, Ordering::Relaxed);
    sampling.await.unwrap();
    let most = most.lock().unwrap().clone();
    assert!(most.contains_key("estafeta steps"), "{most:?}");
    for (name, bound) in [
        ("estafeta steps", 2),
        ("estafeta process steps", 2),
        ("estafeta statements", 2),
        ("estafeta registry", 1),
        ("estafeta events", 1),
    ] {
        let seen = most.get(name).copied().unwrap_or(0);
        assert!(seen <= bound, "{seen} sessions of {name:?}: {most:?}");
    }

    let waiting = listed(&admin, "db-a", estafeta_exchange::wire::Folder::Messages).await;
    assert_eq!(waiting.len(), 40);
    node.terminate().await;
}

/// A processor's calls run statements beside the step that holds their
/// database: with `ESTAFETA_STORE_POOL=2`, four databases' processors
/// starting, preparing and committing at once, round after round, are all
/// answered (none waits out the pool for a second connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processors_of_more_databases_than_the_pool_holds_all_go_on() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (node, admin) = node_with_pools_of_two(&pg, dir.path()).await;
    let (_, phone) = provision_one(&admin).await;
    let phone = Client::new(&node.base, &phone).unwrap();
    let mut processors = Vec::new();
    for n in 0..4 {
        let db = format!("db-{n}");
        let made = admin.create_database(&id("acme"), &id(&db)).await.unwrap();
        processors.push((db, Client::new(&node.base, &made.token).unwrap()));
    }
    for round in 0..3 {
        for (db, _) in &processors {
            phone
                .send(&message(db, &format!(r#"{{"round":{round}}}"#), None))
                .await
                .unwrap();
        }
        let mut calls = tokio::task::JoinSet::new();
        for (db, processor) in processors.clone() {
            calls.spawn(async move {
                let started = start_ok(&processor, &db).await;
                let pid = started.process_id.unwrap();
                let ids = started
                    .messages
                    .unwrap()
                    .iter()
                    .map(|m| m.id)
                    .collect::<Vec<_>>();
                let prepare = prepare_all(ids, r#"{"ok":true}"#);
                let prepared = processor.prepare(&pid, &prepare).await.unwrap();
                assert_eq!(prepared.status, CallStatus::Ok);
                let committed = processor.commit(&pid).await.unwrap();
                assert_eq!(committed.status, CallStatus::Ok);
            });
        }
        calls.join_all().await;
    }
    node.terminate().await;
}

/// A node on `pg` started with `ESTAFETA_STORE_POOL=2` (its folders under
/// `dir`), and its admin client.
async fn node_with_pools_of_two(pg: &Postgres, dir: &std::path::Path) -> (Binary, Client) {
    let url = pg.url();
    let env = [
        ("ESTAFETA_STORE", url.as_str()),
        ("ESTAFETA_STORE_POOL", "2"),
    ];
    let node = Binary::serve(dir, &dir.join("a"), &[], &env).await;
    let admin = Client::new(&node.base, node.printed_token.as_deref().unwrap()).unwrap();
    (node, admin)
}

/// libfaketime, which makes a process read a wall clock of its own
/// (Debian's `faketime` package; the test fails without it).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A node whose wall clock runs 20 minutes ahead (libfaketime; its
/// monotonic clock untouched) runs on the database server's time: a
/// process another node started 10 minutes' STARTED timeout ago is not
/// timed out through it (a start through it answers BUSY), and its metrics
/// and log say how far its own clock is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_runs_ahead_times_out_nothing_early() {
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install Debian's faketime package"
    );
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let timeout = ("ESTAFETA_STARTED_TIMEOUT", "10m");
    let a = Node::start(dir.path(), "a", &url, &[timeout]).await;
    let ahead = [
        timeout,
        ("LD_PRELOAD", FAKETIME),
        ("FAKETIME", "+20m"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let b = Node::start(dir.path(), "b", &url, &ahead).await;
    let admin = a.printed_token.clone().unwrap();
    let (db_token, phone_token) = provision_one(&a.client(&admin)).await;
    let on = |node: &Node, token: &str| node.client(token);
    on(&a, &phone_token)
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap();
    let started = on(&a, &db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    let pid = started.process_id.unwrap();

    let through_b = on(&b, &db_token);
    let again = through_b.start(&start_request("db-a")).await.unwrap();
    assert_eq!(again.status, StartStatus::Busy, "the process lives on");
    assert_eq!(
        through_b.process(&pid).await.unwrap().state,
        estafeta_exchange::wire::ProcessState::Started
    );

    let metrics = on(&b, &admin).metrics().await.unwrap();
    let offset: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("estafeta_clock_offset_seconds "))
        .expect("the clock offset in the metrics")
        .parse()
        .unwrap();
    assert!((1150.0..1250.0).contains(&offset), "offset {offset}");
    assert!(
        b.log()
            .contains("this node's clock is off from the database server's"),
        "the node says its clock is off"
    );
}

/// `/readyz` of a node whose database takes no writes (every transaction
/// read-only, as on a standby) is 503, and 200 again once it takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_not_ready_while_its_database_takes_no_writes() {
    use crate::common::cluster::{eventually, node_env};
    use crate::common::{ADMIN_TOKEN, wait_ready};

    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let node = Binary::serve(
        dir.path(),
        &dir.path().join("node"),
        &[],
        &node_env(&url, &[]),
    )
    .await;
    let client = Client::new(&node.base, ADMIN_TOKEN).unwrap();
    wait_ready(&client).await;

    // This session stays writable whatever the server's configuration says.
    let db = estafeta_postgres::Store::connect(&url).unwrap();
    let admin = db.client().await.unwrap();
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let read_only = |on: bool| {
        let sql = match on {
            true => "ALTER SYSTEM SET default_transaction_read_only = on",
            false => "ALTER SYSTEM RESET default_transaction_read_only",
        };
        let admin = &admin;
        async move {
            admin.batch_execute(sql).await.unwrap();
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
        }
    };
    read_only(true).await;
    eventually("/readyz to be 503", || async {
        (!client.readyz().await.unwrap()).then_some(())
    })
    .await;
    read_only(false).await;
    eventually("/readyz to be 200", || async {
        client.readyz().await.unwrap().then_some(())
    })
    .await;
    node.terminate().await;
}
