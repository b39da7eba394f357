//! The primary killed, its synchronous standby promoted: every committed
//! step survives, and the same store (one multi-host URL) carries on.

use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Options, Store};

/// The connections the failover tests' store keeps open.
const POOL_SIZE: usize = 2;

/// A store of [`POOL_SIZE`] connections over one multi-host URL that names
/// `first` and `second`, migrated: it connects to whichever is the primary.
async fn over_both(first: &Postgres, second: &Postgres) -> Store {
    let url = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        first.host_port(),
        second.host_port()
    );
    let options = Options {
        pool_size: POOL_SIZE,
        ..Options::default()
    };
    let store = Store::connect_with(&url, &options).unwrap();
    store.migrate().await.unwrap();
    store
}

#[tokio::test]
async fn committed_steps_survive_a_failover_to_the_synchronous_standby() {
    let primary = Postgres::start().unwrap();
    let standby = primary.standby().unwrap();
    let store = over_both(&primary, &standby).await;
    let durability = store.durability().await.unwrap();
    assert!(durability.flushes(), "{durability:?}");
    assert!(durability.survives_the_primary(), "{durability:?}");
    assert_eq!(durability.synchronous_standbys, 1);
    for i in 0..20u8 {
        let mut step = store.lock(&[i]).await.unwrap();
        step.save(&[i; 3], None).await.unwrap();
        step.commit().await.unwrap();
    }

    primary.kill().unwrap();
    // Before the promotion the only server left is read-only: the URL asks
    // for a writable one, so calls are refused as unavailable, never
    // answered by the standby.
    let err = store.lock(&[0]).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    standby.promote().unwrap();
    let mut survivors = 0;
    let mut unavailable = 0;
    for i in 0..20u8 {
        let step = loop {
            match store.lock(&[i]).await {
                Ok(step) => break step,
                Err(e) => {
                    assert!(e.is_unavailable(), "{e:?}");
                    unavailable += 1;
                    assert!(unavailable <= POOL_SIZE, "the pool does not reconnect");
                }
            }
        };
        assert_eq!(step.record(), Some(&[i; 3][..]));
        step.commit().await.unwrap();
        survivors += 1;
    }
    assert_eq!(survivors, 20);

    let mut step = store.lock(b"after").await.unwrap();
    step.save(b"written on the new primary", None)
        .await
        .unwrap();
    step.commit().await.unwrap();
}

/// Locks `key` through the switch: refusals as unavailable (the pool's
/// connections to the dead primary, dropped one by one) until a writable
/// server answers.
async fn lock_through_switch(store: &Store, key: &[u8]) -> estafeta_postgres::Locked {
    let mut unavailable = 0;
    loop {
        match store.lock(key).await {
            Ok(step) => return step,
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                unavailable += 1;
                assert!(unavailable <= POOL_SIZE, "the pool does not reconnect");
            }
        }
    }
}

#[tokio::test]
async fn the_old_primary_rebuilt_as_standby_carries_the_next_failover() {
    let first = Postgres::start().unwrap();
    let second = first.standby().unwrap();
    let store = over_both(&first, &second).await;
    let save = |key: &'static [u8]| {
        let store = store.clone();
        async move {
            let mut step = lock_through_switch(&store, key).await;
            step.save(key, None).await.unwrap();
            step.commit().await.unwrap();
        }
    };
    save(b"on the first").await;

    // Failover to the second; the first, rebuilt as its standby, at its
    // old address.
    first.kill().unwrap();
    second.promote().unwrap();
    save(b"on the second").await;
    second.rebuild_standby(&first).unwrap();
    save(b"on the second, mirrored").await;

    // And back: the same URL finds the first again.
    second.kill().unwrap();
    first.promote().unwrap();
    for key in [
        &b"on the first"[..],
        b"on the second",
        b"on the second, mirrored",
    ] {
        let step = lock_through_switch(&store, key).await;
        assert_eq!(step.record(), Some(key));
        step.commit().await.unwrap();
    }
    save(b"on the first again").await;
}
