//! A node whose database server is down answers 503 `storage_error` with
//! `Retry-After`, as it would for failing storage, and counts these answers
//! apart (`estafeta_store_unavailable_total`); with the server back it
//! serves again, no restart needed.

mod common;

use common::cluster::node_env;
use common::{Binary, provision_one};
use estafeta_client::Client;
use estafeta_cluster::testing::Postgres;
use reqwest::StatusCode;

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
