//! The exchange's registry over the cluster store: two registries (two
//! nodes) over one PostgreSQL see each other's changes (webhooks too) at
//! their next authentication, and the admin token of a first start is made
//! once.

use crate::common::{id, store};
use estafeta_exchange::TenancyError;
use estafeta_exchange::tenancy::{AdminToken, Kind, Principal, Registry};
use estafeta_exchange::token::Token;
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgRegistry, Store};
use std::sync::Arc;

/// A node's registry over `store`.
async fn node(store: &Store) -> (Registry, AdminToken) {
    Registry::with_store(Arc::new(PgRegistry::new(store.clone())), None)
        .await
        .unwrap()
}

/// What node `reg` answers for `token`, as a call would see it.
async fn who(reg: &Registry, token: &str) -> Option<Principal> {
    reg.refresh().await.unwrap();
    reg.authenticate(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_node_holds_on_the_other_at_once() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let (a, made) = node(&store).await;
    let (b, again) = node(&store).await;
    let AdminToken::Generated(admin) = made else {
        panic!("the first node makes the admin token: {made:?}");
    };
    assert_eq!(again, AdminToken::Existing);
    assert_eq!(who(&b, admin.expose()).await, Some(Principal::Admin));

    a.create_enterprise(id("acme")).await.unwrap();
    a.create_subsystem(id("acme"), id("sales")).await.unwrap();
    let phone = a
        .create_device(id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();
    let device = Some(Principal::Device {
        id: id("phone-1"),
        enterprise: id("acme"),
        subsystem: id("sales"),
    });
    assert_eq!(who(&b, phone.expose()).await, device);
    assert_eq!(who(&a, phone.expose()).await, device);

    // B checks a change against what A did: the id is taken.
    let taken = b.create_database(id("acme"), id("phone-1")).await;
    assert!(
        matches!(taken, Err(TenancyError::AlreadyExists { .. })),
        "{taken:?}"
    );
    let db = b.create_database(id("acme"), id("db-a")).await.unwrap();
    assert!(who(&a, db.expose()).await.is_some());

    // A token changed through B is refused through A at its next call.
    let rotated = b.rotate_token(Kind::Device, id("phone-1")).await.unwrap();
    assert_eq!(who(&a, phone.expose()).await, None);
    assert_eq!(who(&a, rotated.expose()).await, device);
    b.delete_endpoint(Kind::Device, id("phone-1"))
        .await
        .unwrap();
    assert_eq!(who(&a, rotated.expose()).await, None);

    // The admin token rotated through A: B takes the new one, not the old.
    let new_admin = a.rotate_admin_token().await.unwrap();
    assert_eq!(who(&b, admin.expose()).await, None);
    assert_eq!(who(&b, new_admin.expose()).await, Some(Principal::Admin));

    // A third node started later loads everything, and the admin token is
    // kept only as a hash.
    let (c, origin) = node(&store).await;
    assert_eq!(origin, AdminToken::Existing);
    assert!(who(&c, db.expose()).await.is_some());
    let settings = pg
        .psql("SELECT encode(value, 'hex') FROM cluster_settings")
        .unwrap();
    assert_eq!(settings.trim(), new_admin.hash().to_hex());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_at_once_agree_on_one_admin_token() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { node(&store).await })
        })
        .collect();
    let mut made = Vec::new();
    let mut nodes = Vec::new();
    for start in starts {
        let (reg, origin) = start.await.unwrap();
        if let AdminToken::Generated(token) = origin {
            made.push(token);
        }
        nodes.push(reg);
    }
    assert_eq!(made.len(), 1, "exactly one node makes and prints the token");
    for reg in &nodes {
        assert_eq!(who(reg, made[0].expose()).await, Some(Principal::Admin));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_admin_token_wins_and_a_store_down_is_an_error() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let configured = Token::from_text("from-env").unwrap();
    let (a, origin) =
        Registry::with_store(Arc::new(PgRegistry::new(store.clone())), Some(configured))
            .await
            .unwrap();
    assert_eq!(origin, AdminToken::Configured);
    assert_eq!(who(&a, "from-env").await, Some(Principal::Admin));

    pg.stop().unwrap();
    let refused = a.refresh().await;
    assert!(
        matches!(refused, Err(TenancyError::Unavailable(_))),
        "{refused:?}"
    );
    let answered = estafeta_exchange::ExchangeError::from(refused.unwrap_err());
    assert!(answered.is_store_unavailable(), "{answered}");
    assert_eq!(
        answered.code(),
        estafeta_exchange::wire::ErrorCode::StorageError
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_set_through_one_node_is_the_others_at_their_next_call() {
    let pg = Postgres::start().unwrap();
    let store = store(&pg).await;
    let (a, made) = node(&store).await;
    let (b, _) = node(&store).await;
    let AdminToken::Generated(admin) = made else {
        panic!("the first node makes the admin token: {made:?}");
    };
    a.create_enterprise(id("acme")).await.unwrap();
    a.create_subsystem(id("acme"), id("sales")).await.unwrap();
    a.create_database(id("acme"), id("db-a")).await.unwrap();
    a.create_device(id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();

    a.set_webhook(Kind::Database, id("db-a"), Some("http://h/db".into()))
        .await
        .unwrap();
    assert_eq!(
        a.webhook(&id("db-a")),
        Some((Kind::Database, "http://h/db".into()))
    );
    who(&b, admin.expose()).await;
    assert_eq!(
        b.webhook(&id("db-a")),
        Some((Kind::Database, "http://h/db".into()))
    );

    // Changed through B, cleared through B, set on a device: A follows.
    b.set_webhook(Kind::Database, id("db-a"), Some("http://h/new".into()))
        .await
        .unwrap();
    b.set_webhook(Kind::Device, id("phone-1"), Some("http://h/dev".into()))
        .await
        .unwrap();
    who(&a, admin.expose()).await;
    assert_eq!(
        a.webhook(&id("db-a")),
        Some((Kind::Database, "http://h/new".into()))
    );
    assert_eq!(
        a.webhook(&id("phone-1")),
        Some((Kind::Device, "http://h/dev".into()))
    );
    b.set_webhook(Kind::Database, id("db-a"), None)
        .await
        .unwrap();
    who(&a, admin.expose()).await;
    assert_eq!(a.webhook(&id("db-a")), None);
    assert_eq!(a.hooked(), vec![id("phone-1")]);

    // The wrong kind and an unknown id are refused and change nothing; a
    // deleted device's webhook goes with it.
    for (kind, who_) in [(Kind::Device, "db-a"), (Kind::Database, "db-zz")] {
        let refused = a
            .set_webhook(kind, id(who_), Some("http://h/x".into()))
            .await;
        assert!(
            matches!(refused, Err(TenancyError::Unknown { .. })),
            "{refused:?}"
        );
    }
    a.delete_endpoint(Kind::Device, id("phone-1"))
        .await
        .unwrap();
    who(&b, admin.expose()).await;
    assert_eq!(b.webhook(&id("phone-1")), None);
    assert!(b.hooked().is_empty());
    let (c, _) = node(&store).await;
    assert!(c.hooked().is_empty());
}
