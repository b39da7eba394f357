//! Wrong tokens by client address shared by two nodes over one PostgreSQL:
//! what each reports adds up, an admin token resets the count for both, a
//! node learns only what changed since its last look, and counts whose
//! last failure is older than the forgetting time start afresh and go.

use std::net::IpAddr;
use std::time::Duration;

use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{Known, PgAuthFailures, Reported, Store};

const FORGET: Duration = Duration::from_secs(3600);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn failures(client: IpAddr, n: u32, age: Duration) -> Reported {
    Reported {
        client,
        reset: false,
        failures: n,
        age,
    }
}

/// The counts in `known` by address, without their ages.
fn counts(known: &[Known]) -> Vec<(IpAddr, u32)> {
    let mut c: Vec<_> = known.iter().map(|k| (k.client, k.failures)).collect();
    c.sort();
    c
}

#[tokio::test]
async fn two_nodes_add_up_reset_and_forget_each_others_counts() {
    let pg = Postgres::start().unwrap();
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    let a = PgAuthFailures::new(store.clone(), FORGET);
    let b = PgAuthFailures::new(store.clone(), FORGET);
    let (x, y) = (ip("192.0.2.1"), ip("2001:db8:1:2::"));

    let learned_a = a
        .exchange(&[failures(x, 2, Duration::ZERO)], 0)
        .await
        .unwrap();
    assert_eq!(counts(&learned_a.known), [(x, 2)], "its own report");
    let learned_b = b
        .exchange(
            &[
                failures(x, 1, Duration::from_secs(5)),
                failures(y, 4, Duration::ZERO),
            ],
            0,
        )
        .await
        .unwrap();
    assert_eq!(counts(&learned_b.known), [(x, 3), (y, 4)]);
    let age_x = learned_b.known.iter().find(|k| k.client == x).unwrap().age;
    assert!(
        age_x < Duration::from_secs(5),
        "the latest failure: {age_x:?}"
    );

    // `a` learns only what changed since its last look.
    let learned_a = a.exchange(&[], learned_a.version).await.unwrap();
    assert_eq!(counts(&learned_a.known), [(x, 3), (y, 4)]);
    let quiet = a.exchange(&[], learned_a.version).await.unwrap();
    assert!(quiet.known.is_empty(), "{quiet:?}");
    assert_eq!(quiet.version, learned_a.version);

    // The admin token from `x` through `a`, then one more wrong token.
    let reset = Reported {
        client: x,
        reset: true,
        failures: 1,
        age: Duration::ZERO,
    };
    a.exchange(&[reset], learned_a.version).await.unwrap();
    let learned_b = b.exchange(&[], learned_b.version).await.unwrap();
    assert_eq!(counts(&learned_b.known), [(x, 1)]);

    // A count reported with its last failure past the forgetting time
    // goes at once; one whose last failure got that old meanwhile starts
    // afresh.
    let old = ip("198.51.100.9");
    let learned_b = b
        .exchange(&[failures(old, 7, FORGET * 2)], learned_b.version)
        .await
        .unwrap();
    assert!(learned_b.known.is_empty(), "{:?}", learned_b.known);
    let hour_ms = i64::try_from(FORGET.as_millis()).unwrap();
    store
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE auth_failures SET last_at = last_at - $1 WHERE client = $2",
            &[&(2 * hour_ms), &y],
        )
        .await
        .unwrap();
    let learned_b = b
        .exchange(&[failures(y, 1, Duration::ZERO)], learned_b.version)
        .await
        .unwrap();
    assert_eq!(counts(&learned_b.known), [(y, 1)]);
}
