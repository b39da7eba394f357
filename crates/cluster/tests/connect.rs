//! Connecting to a real PostgreSQL: URLs, several hosts, a crash.

use estafeta_cluster::testing::Postgres;
use estafeta_cluster::{Error, Options, Store};
use std::net::TcpListener;

/// A loopback port that nothing listens on: a host that is down.
fn down_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn one(store: &Store) -> Result<i32, Error> {
    let client = store.client().await?;
    Ok(client.query_one("SELECT 1", &[]).await?.get(0))
}

#[tokio::test]
async fn connects_by_url_and_by_unix_socket() {
    let pg = Postgres::start().unwrap();
    assert_eq!(one(&Store::connect(&pg.url()).unwrap()).await.unwrap(), 1);

    let socket = format!(
        "host={} port={} user=postgres dbname=postgres",
        pg.socket_dir().display(),
        pg.port()
    );
    assert_eq!(one(&Store::connect(&socket).unwrap()).await.unwrap(), 1);
}

#[tokio::test]
async fn a_two_host_url_skips_a_host_that_is_down() {
    let pg = Postgres::start().unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{},{}/postgres?target_session_attrs=read-write",
        down_port(),
        pg.host_port()
    );
    let store = Store::connect(&url).unwrap();
    assert_eq!(one(&store).await.unwrap(), 1);
}

#[tokio::test]
async fn no_reachable_host_is_unavailable() {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", down_port());
    let store = Store::connect(&url).unwrap();
    let err = one(&store).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[test]
fn a_malformed_url_is_a_typed_error() {
    assert!(matches!(
        Store::connect("postgres://postgres@127.0.0.1:notaport/x"),
        Err(Error::Url(_))
    ));
    assert!(matches!(
        Store::connect("dbname=estafeta"),
        Err(Error::NoHost)
    ));
}

#[tokio::test]
async fn a_killed_server_loses_no_commit_and_the_pool_reconnects() {
    let pg = Postgres::start().unwrap();
    let options = Options {
        pool_size: 2,
        ..Options::default()
    };
    let store = Store::connect_with(&pg.url(), &options).unwrap();
    store.migrate().await.unwrap();
    let mut step = store.lock(b"k").await.unwrap();
    step.save(b"acknowledged", None).await.unwrap();
    step.commit().await.unwrap();

    pg.kill().unwrap();
    let err = one(&store).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    pg.restart().unwrap();
    // Each pooled connection broken by the crash fails its next call once
    // (a node answers 503 then); the pool replaces it.
    let mut reached = None;
    for _ in 0..=options.pool_size {
        match store.lock(b"k").await {
            Ok(step) => {
                reached = Some(step);
                break;
            }
            Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        }
    }
    let step = reached.expect("the pool reconnects after the restart");
    assert_eq!(step.record(), Some(&b"acknowledged"[..]));
}

/// The backend serving `client`.
async fn backend(client: &deadpool_postgres::Object) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn the_pool_hands_out_the_connection_returned_last() {
    let pg = Postgres::start().unwrap();
    let store = Store::connect(&pg.url()).unwrap();
    let (first, second) = (store.client().await.unwrap(), store.client().await.unwrap());
    let (a, b) = (backend(&first).await, backend(&second).await);
    assert_ne!(a, b);
    // `first` goes back to the pool before `second`: the next caller gets
    // `second`, the warm one, however many the pool holds.
    drop(first);
    drop(second);
    for _ in 0..3 {
        let next = store.client().await.unwrap();
        assert_eq!(backend(&next).await, b);
    }
}
