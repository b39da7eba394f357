//! Two `estafeta serve` nodes over one throwaway PostgreSQL (`store` set to
//! its URL): what is provisioned through one works through the other, a
//! whole process cycle runs with calls alternating between the nodes,
//! BUSY is cluster-wide, and the statistics read the same through both.

mod common;

use common::{Binary, id, message, provision_one, start_request};
use estafeta_client::Client;
use estafeta_cluster::testing::Postgres;
use estafeta_exchange::wire::{
    CallStatus, MessageResult, PrepareRequest, Reply, ResultStatus, StartStatus, Version,
};

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
    let started = on(&a, &db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    assert_eq!(started.status, StartStatus::Ok);
    let pid = started.process_id.unwrap();
    // A second start through the other node: BUSY.
    let second = on(&b, &db_token)
        .start(&start_request("db-a"))
        .await
        .unwrap();
    assert_eq!(second.status, StartStatus::Busy);

    let prepare = PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            message_id: sent.accepted.id,
            status: ResultStatus::Processed,
            error_code: None,
            error_text: None,
        }],
        replies: vec![Reply {
            to: id("phone-1"),
            body: estafeta_exchange::wire::Body::from_json(r#"{"ok":true}"#).unwrap(),
            created_at: None,
            deliver_at: None,
        }],
    };
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
        Some(&pg.url()),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(server.run(listener, stop.clone()));
    let client = Client::new(&base, "cluster-admin-token-0123456789").unwrap();
    let began = Instant::now();
    while !client.readyz().await.unwrap() {
        assert!(began.elapsed() < Duration::from_secs(30), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    serving.await.unwrap().unwrap();
}
