//! A node whose database server is down answers 503 `storage_error` with
//! `Retry-After`, as it would for failing storage, and counts these answers
//! apart (`estafeta_store_unavailable_total`); with the server back it
//! serves again, no restart needed. A node started while its database is
//! out of reach waits for it rather than exit.

use std::sync::Arc;

use crate::common;
use crate::common::cluster::node_env;
use crate::common::{Binary, provision_one};
use estafeta_client::Client;
use estafeta_exchange::ExchangeConfig;
use estafeta_postgres::testing::Postgres;
use estafeta_server::HttpSettings;
use estafeta_server::config::ClusterStore;
use estafeta_server::notify::NotifySettings;
use estafeta_server::open::open_server;
use reqwest::StatusCode;
use tokio::net::{TcpListener, TcpStream};

/// The value of the unlabelled metric `name` in `text`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// Uploads one message as `token` through `node`.
async fn upload(node: &Binary, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/messages", node.base))
        .bearer_auth(token)
        .json(&serde_json::json!({"version": 1, "to": "db-a", "body": {}}))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_down_is_a_storage_error_counted_as_a_store_unavailable() {
    let pg = Postgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let env = node_env(&url, &[]);
    let node = Binary::serve(dir.path(), &dir.path().join("a"), &[], &env).await;
    let admin = Client::new(&node.base, common::ADMIN_TOKEN).unwrap();
    common::wait_ready(&admin).await;
    let (_, phone) = provision_one(&admin).await;
    assert_eq!(upload(&node, &phone).await.status(), StatusCode::CREATED);
    let before = metric(
        &admin.metrics().await.unwrap(),
        "estafeta_store_unavailable_total",
    );
    assert_eq!(before, 0.0);

    pg.stop().unwrap();
    let refused = upload(&node, &phone).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "2");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "storage_error", "{body}");

    pg.restart().unwrap();
    let mut served = false;
    for _ in 0..600 {
        if upload(&node, &phone).await.status() == StatusCode::CREATED {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(served, "the node did not serve again");
    let after = metric(
        &admin.metrics().await.unwrap(),
        "estafeta_store_unavailable_total",
    );
    assert!(after >= 1.0, "{after}");
    node.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_database_connection_is_lost_while_it_opens_tries_again() {
    let pg = Postgres::start().unwrap();
    // In front of the database: the first connection is closed at once
    // (lost mid-way, as in a network fault or a failover), the others are
    // forwarded.
    let door = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = door.local_addr().unwrap();
    let port = pg.port();
    tokio::spawn(async move {
        let (first, _) = door.accept().await.unwrap();
        drop(first);
        while let Ok((mut node, _)) = door.accept().await {
            tokio::spawn(async move {
                let mut db = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut node, &mut db).await;
            });
        }
    });
    let url = format!("postgres://postgres@{addr}/postgres");
    let dir = tempfile::tempdir().unwrap();
    let mut config = ExchangeConfig::new(dir.path());
    config.admin_token = Some(common::ADMIN_TOKEN.to_owned());
    let opened = open_server(
        config,
        Arc::new(estafeta_session::SystemClock),
        HttpSettings::default(),
        NotifySettings::log_only(dir.path()),
        0,
        Some(&ClusterStore::new(url)),
        None,
    )
    .await;
    if let Err(e) = opened {
        panic!("the node did not wait for its database: {e}");
    }
}
