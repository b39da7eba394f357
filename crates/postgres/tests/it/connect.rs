//! Connecting to a real PostgreSQL: URLs, several hosts, a crash.

use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Error, Options, Store};
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

/// A certificate authority and a server certificate it signed for
/// `localhost` only, as PEM: (root, server chain, server key).
fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), server.pem(), key.serialize_pem())
}

/// Whether the store's connection to the server is encrypted, as the
/// server sees it.
async fn encrypted(store: &Store) -> Result<bool, Error> {
    let client = store.client().await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// libpq's `sslmode`s against a server that takes TCP only over TLS, with
/// a certificate for `localhost` from a private root: the modes that check
/// nothing connect encrypted, `verify-full` checks both root and name,
/// `verify-ca` only the root, and `disable` is turned away.
#[tokio::test]
async fn tls_follows_libpq_sslmode_and_checks_what_it_says() {
    let (root, chain, key) = certificates();
    let pg = Postgres::start_with_tls(&chain, &key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let right_root = dir.path().join("root.pem");
    std::fs::write(&right_root, &root).unwrap();
    let (other_root, _, _) = certificates();
    let wrong_root = dir.path().join("other.pem");
    std::fs::write(&wrong_root, &other_root).unwrap();
    let port = pg.port();
    let url = |host: &str, tls: &str| {
        format!("host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres {tls}")
    };
    let connect = |url: String| async move {
        let options = Options {
            connect_timeout: std::time::Duration::from_secs(5),
            wait_timeout: std::time::Duration::from_secs(10),
            ..Options::default()
        };
        encrypted(&Store::connect_with(&url, &options)?).await
    };

    for tls in ["", "sslmode=prefer", "sslmode=require"] {
        assert!(connect(url("127.0.0.1", tls)).await.unwrap(), "{tls:?}");
    }
    let full =
        |root: &std::path::Path| format!("sslmode=verify-full sslrootcert={}", root.display());
    let ca = |root: &std::path::Path| format!("sslmode=verify-ca sslrootcert={}", root.display());
    assert!(connect(url("localhost", &full(&right_root))).await.unwrap());
    // The URL form, its settings percent-encoded as a URL's are.
    let query = format!(
        "postgres://postgres@localhost:{port}/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}",
        right_root.display().to_string().replace('/', "%2F")
    );
    assert!(connect(query).await.unwrap());

    let refused = |result: Result<bool, Error>, what: &str, why: &str| {
        let error = result.expect_err(what).to_string();
        assert!(error.contains(why), "{what}: {error}");
    };
    // Another root: refused by verify-full, by verify-ca, and by require
    // given that root (libpq's require checks the chain when a root is named).
    refused(
        connect(url("localhost", &full(&wrong_root))).await,
        "verify-full, wrong root",
        "invalid peer certificate",
    );
    refused(
        connect(url("localhost", &ca(&wrong_root))).await,
        "verify-ca, wrong root",
        "invalid peer certificate",
    );
    refused(
        connect(url(
            "localhost",
            &format!("sslmode=require sslrootcert={}", wrong_root.display()),
        ))
        .await,
        "require with a root, wrong root",
        "invalid peer certificate",
    );
    // The right root, another name: verify-full refuses, verify-ca accepts.
    refused(
        connect(url("127.0.0.1", &full(&right_root))).await,
        "verify-full, wrong name",
        "not valid for name",
    );
    assert!(connect(url("127.0.0.1", &ca(&right_root))).await.unwrap());
    // Without TLS the server turns the node away: the checks above ran over TLS.
    refused(
        connect(url("127.0.0.1", "sslmode=disable")).await,
        "sslmode=disable",
        "no encryption",
    );
    // A check with no root to check against stops the node at start.
    assert!(matches!(
        Store::connect(&url(
            "localhost",
            "sslmode=verify-full sslrootcert=/nonexistent.pem"
        )),
        Err(Error::Tls(_))
    ));
}
