//! The hold limit (`Options::hold_limit`) as the server settings every
//! pooled connection gets, and a URL's own options taking precedence.

use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Options, Store};
use std::time::Duration;

/// `idle_in_transaction_session_timeout` and `tcp_user_timeout` as a
/// pooled connection of `store` sees them (`SHOW` gives the second in
/// milliseconds without a unit).
async fn settings(store: &Store) -> (String, String) {
    let client = store.client().await.unwrap();
    let show = |name: &'static str| {
        let client = &client;
        async move {
            let row = client.query_one(&format!("SHOW {name}"), &[]).await;
            row.unwrap().get::<_, String>(0)
        }
    };
    (
        show("idle_in_transaction_session_timeout").await,
        show("tcp_user_timeout").await,
    )
}

#[tokio::test]
async fn every_connection_gets_the_hold_limit_unless_the_url_sets_it() {
    let pg = Postgres::start().unwrap();
    let options = Options {
        hold_limit: Duration::from_millis(2500),
        ..Options::default()
    };
    let store = Store::connect_with(&pg.url(), &options).unwrap();
    assert_eq!(
        settings(&store).await,
        ("2500ms".to_owned(), "2500".to_owned())
    );

    let url = format!(
        "{}?options=-c%20idle_in_transaction_session_timeout%3D1500%20-c%20tcp_user_timeout%3D700",
        pg.url()
    );
    let store = Store::connect_with(&url, &options).unwrap();
    assert_eq!(
        settings(&store).await,
        ("1500ms".to_owned(), "700".to_owned())
    );
}
