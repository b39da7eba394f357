//! [`PgAuthFailures`]: wrong tokens by client address in the
//! `auth_failures` table, so that an address one node makes wait waits on
//! every node.
//!
//! A node counts wrong tokens in memory, where each request looks them up,
//! and swaps what it counted for what every node counted now and then
//! ([`PgAuthFailures::exchange`]): its reports in one transaction, then the
//! rows changed since its last look. A flood of wrong tokens costs the
//! store one exchange per period, whatever its size, never a statement or
//! a connection per request.
//!
//! Times are the database server's: a node sends how long ago its last
//! failure of an address was, and reads back how long ago the cluster's
//! was, so that nodes whose clocks differ agree.

use std::net::IpAddr;
use std::time::Duration;

use crate::{Error, Store};

/// The database server's clock, in milliseconds since the Unix epoch.
const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The advisory lock that orders the nodes' reports: the bytes of
/// "estafeta" read as a number, plus one (the migrations' lock is the
/// number itself). Taken for the length of a report's transaction, so that
/// the versions of committed rows rise in commit order and a node that has
/// read version `v` has seen every change before it.
const REPORT_LOCK: i64 = 0x6573_7461_6665_7461 + 1;

/// What a node counted for one client address since its last report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported {
    /// The client address (an IPv6 client by its /64 prefix).
    pub client: IpAddr,
    /// It gave the admin token: its count starts afresh, before `failures`
    /// are added.
    pub reset: bool,
    /// Wrong tokens since the last report.
    pub failures: u32,
    /// How long ago the last of them was.
    pub age: Duration,
}

/// The cluster's count for one client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    /// The client address (an IPv6 client by its /64 prefix).
    pub client: IpAddr,
    /// Its wrong tokens in a row, on every node (0: it gave the admin token
    /// since).
    pub failures: u32,
    /// How long ago its last wrong token was.
    pub age: Duration,
}

/// The answer of an [`exchange`](PgAuthFailures::exchange).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Learned {
    /// The rows changed since the version asked for, oldest change first.
    pub known: Vec<Known>,
    /// The version to ask from next time.
    pub version: i64,
}

/// Wrong tokens by client address in the cluster store. Cheap to clone.
#[derive(Clone)]
pub struct PgAuthFailures {
    store: Store,
    /// A count whose last failure is this old starts afresh, and its row
    /// goes.
    forget_after: Duration,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl PgAuthFailures {
    /// The counts of `store` (migrated); an address whose last wrong token
    /// is `forget_after` old starts afresh.
    pub fn new(store: Store, forget_after: Duration) -> PgAuthFailures {
        PgAuthFailures {
            store,
            forget_after,
        }
    }

    /// Adds `reported` (each address at most once) to the cluster's counts
    /// in one transaction, removing the counts forgotten, then reads every
    /// count changed after `since` (0 the first time, then the version of
    /// the last answer), this node's own reports included.
    pub async fn exchange(&self, reported: &[Reported], since: i64) -> Result<Learned, Error> {
        let mut client = self.store.client().await?;
        if !reported.is_empty() {
            let tx = client.transaction().await?;
            let mut sorted = reported.to_vec();
            sorted.sort_by_key(|r| r.client);
            let forget = millis(self.forget_after);
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&REPORT_LOCK])
                .await?;
            let resets: Vec<IpAddr> = sorted
                .iter()
                .filter(|r| r.reset)
                .map(|r| r.client)
                .collect();
            if !resets.is_empty() {
                tx.execute(
                    &format!(
                        "UPDATE auth_failures SET failures = 0, last_at = {NOW},
                         version = nextval('auth_failures_version') WHERE client = ANY($1)"
                    ),
                    &[&resets],
                )
                .await?;
            }
            let added: Vec<&Reported> = sorted.iter().filter(|r| r.failures > 0).collect();
            if !added.is_empty() {
                let clients: Vec<IpAddr> = added.iter().map(|r| r.client).collect();
                let failures: Vec<i32> = added
                    .iter()
                    .map(|r| i32::try_from(r.failures).unwrap_or(i32::MAX))
                    .collect();
                let ages: Vec<i64> = added.iter().map(|r| millis(r.age)).collect();
                tx.execute(
                    &format!(
                        "INSERT INTO auth_failures (client, failures, last_at, version)
                         SELECT c, n, {NOW} - age, nextval('auth_failures_version')
                         FROM unnest($1::inet[], $2::int4[], $3::int8[]) AS t(c, n, age)
                         ORDER BY c
                         ON CONFLICT (client) DO UPDATE SET
                           failures = CASE
                             WHEN auth_failures.last_at <= {NOW} - $4 THEN excluded.failures
                             ELSE least(auth_failures.failures::int8 + excluded.failures,
                                        2147483647)::int4 END,
                           last_at = greatest(auth_failures.last_at, excluded.last_at),
                           version = excluded.version"
                    ),
                    &[&clients, &failures, &ages, &forget],
                )
                .await?;
            }
            tx.execute(
                &format!("DELETE FROM auth_failures WHERE last_at <= {NOW} - $1"),
                &[&forget],
            )
            .await?;
            tx.commit().await?;
        }
        let rows = client
            .query(
                &format!(
                    "SELECT client, failures, greatest({NOW} - last_at, 0), version
                     FROM auth_failures WHERE version > $1 ORDER BY version"
                ),
                &[&since],
            )
            .await?;
        let mut learned = Learned {
            known: Vec::with_capacity(rows.len()),
            version: since,
        };
        for row in rows {
            let failures: i32 = row.get(1);
            let age: i64 = row.get(2);
            learned.known.push(Known {
                client: row.get(0),
                failures: u32::try_from(failures).unwrap_or(0),
                age: Duration::from_millis(u64::try_from(age).unwrap_or(0)),
            });
            learned.version = learned.version.max(row.get(3));
        }
        Ok(learned)
    }
}
