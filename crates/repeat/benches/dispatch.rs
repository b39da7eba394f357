//! One million entries over 16 sources, 100,000 of them due in one second,
//! a no-op handler: entries dispatched per second and the lag distribution,
//! for estafeta-repeat on redb and for the asynq/Sidekiq way (a Redis sorted
//! set per source, polled with a Lua script that moves up to 100 due entries
//! per call to a pending list that workers pop from), driven through the
//! `redis` crate as a Redis user would: multiplexed async connections,
//! pipelined writes, the script sent once and run by its hash.
//!
//! Each round schedules 100,000 entries due two seconds ahead (not timed),
//! then times from that due second until every one was handled (for
//! estafeta: and its removal committed; for Redis: acknowledged). The other
//! 900,000 entries stay scheduled for later all along. The two sides take
//! turns round by round, so that a change in the machine meets both; the
//! figure is the median of the rounds' ratios.
//!
//! Run: `cargo bench -p estafeta-repeat --bench dispatch` (needs
//! `redis-server` on the PATH: without it the bench fails).
//! `DISPATCH_ROUNDS` (default 7) sets the rounds per side, `DISPATCH_LATER`
//! (default 900,000) the entries scheduled for later.

/// The `estafeta` binary's allocator: the scheduler is measured as the
/// server runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use estafeta_repeat::bench::{self, DUE, Round, SOURCES, WORKERS, lag_since};
use estafeta_repeat::{Clock, Entry, Options, RedbStore, Scheduler, SystemClock};
use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;
use tokio::sync::Notify;

/// How far ahead of now a round's entries fall due: time to schedule
/// 100,000 of them first (each side's timing starts at the due second).
const LEAD: u64 = 2;
/// The baseline's poll interval when nothing was due (asynq's forwarder
/// default is 5 s, Sidekiq's poller about as long; shorter favours the baseline).
const POLL: Duration = Duration::from_millis(100);

fn due_ahead() -> u64 {
    SystemClock.now_secs() + LEAD
}

/// estafeta-repeat on a redb file.
struct Estafeta {
    scheduler: Scheduler<RedbStore, SystemClock>,
    round: usize,
    _dir: tempfile::TempDir,
}

impl Estafeta {
    async fn setup() -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let store = RedbStore::open(dir.path().join("bench.redb")).unwrap();
        let scheduler = Scheduler::new(store, SystemClock, Options::default());
        let later = SystemClock.now_secs() + 3_600;
        let entries: Vec<Entry> = (0..bench::later())
            .map(|i| Entry {
                source: bench::source(i),
                due: later + (i % 86_400) as u64,
                id: format!("later-{i:07}"),
                payload: vec![0; 16],
                attempt: 0,
            })
            .collect();
        for chunk in entries.chunks(100_000) {
            scheduler.schedule_all(chunk.to_vec()).await.unwrap();
        }
        Self {
            scheduler,
            round: 0,
            _dir: dir,
        }
    }

    async fn round(&mut self) -> Round {
        self.round += 1;
        let round = self.round;
        let due = due_ahead();
        let entries = (0..DUE)
            .map(|i| Entry {
                source: bench::source(i),
                due,
                id: format!("r{round}-{i:06}"),
                payload: vec![0; 16],
                attempt: 0,
            })
            .collect();
        self.scheduler.schedule_all(entries).await.unwrap();
        assert!(
            SystemClock.now_secs() < due,
            "scheduling the round's entries took past the due second"
        );
        bench::dispatch_round(&self.scheduler, due).await
    }
}

/// A local redis-server with one sorted set per source.
struct Redis {
    server: Child,
    client: redis::Client,
    round: AtomicUsize,
}

const FORWARD: &str = r#"
local ids = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, 100)
for _, id in ipairs(ids) do
  redis.call("LPUSH", KEYS[2], id)
  redis.call("ZREM", KEYS[1], id)
end
return #ids
"#;

impl Redis {
    /// Started, answering and filled; panics (failing the bench) when it
    /// cannot run.
    async fn setup() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server, the baseline, must be installed (apt-get install redis-server)");
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let redis = Self {
            server,
            client,
            round: AtomicUsize::new(0),
        };
        let mut conn = None;
        for _ in 0..100 {
            if let Ok(c) = redis.connect().await {
                conn = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut conn = conn.expect("redis-server did not answer within 5 s");
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let later = SystemClock.now_secs() + 3_600;
        let members: Vec<(usize, u64, String)> = (0..bench::later())
            .map(|i| {
                (
                    i % SOURCES,
                    later + (i % 86_400) as u64,
                    format!("later-{i:07}"),
                )
            })
            .collect();
        Redis::zadd(&mut conn, &members).await;
        redis
    }

    /// A multiplexed connection (blocking commands hold theirs, so each
    /// worker has its own, as with a Redis client's pool).
    async fn connect(&self) -> redis::RedisResult<MultiplexedConnection> {
        self.client.get_multiplexed_async_connection().await
    }

    /// Adds `members` (source, due, id) in pipelines of 10,000, one `ZADD`
    /// per source each.
    async fn zadd(conn: &mut MultiplexedConnection, members: &[(usize, u64, String)]) {
        for chunk in members.chunks(10_000) {
            let mut pipe = redis::pipe();
            for source in 0..SOURCES {
                let scored: Vec<(u64, String)> = chunk
                    .iter()
                    .filter(|m| m.0 == source)
                    .map(|(_, due, id)| (*due, format!("{due}:{id}")))
                    .collect();
                if !scored.is_empty() {
                    pipe.zadd_multiple(format!("scheduled:{source:02}"), &scored)
                        .ignore();
                }
            }
            pipe.query_async::<()>(conn).await.unwrap();
        }
    }

    async fn round(&self) -> Round {
        let round = self.round.fetch_add(1, Ordering::SeqCst);
        let due = due_ahead();
        let mut conn = self.connect().await.unwrap();
        let members: Vec<_> = (0..DUE)
            .map(|i| (i % SOURCES, due, format!("r{round}-{i:06}")))
            .collect();
        Redis::zadd(&mut conn, &members).await;
        assert!(
            SystemClock.now_secs() < due,
            "scheduling the round's entries took past the due second"
        );
        let forward = redis::Script::new(FORWARD);
        forward
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handled = Arc::new(AtomicUsize::new(0));
        let all = Arc::new(Notify::new());

        // The forwarder: moves due entries, 100 per script call, from each
        // source's sorted set to the pending list; polls when nothing is due.
        let forwarder = {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let now = SystemClock.now_secs();
                    let mut moved = 0;
                    for source in 0..SOURCES {
                        let key = format!("scheduled:{source:02}");
                        loop {
                            let n: i64 = forward
                                .key(&key)
                                .key("pending")
                                .arg(now)
                                .invoke_async(&mut conn)
                                .await
                                .unwrap();
                            moved += n;
                            if n < 100 {
                                break;
                            }
                        }
                    }
                    if moved == 0 {
                        tokio::time::sleep(POLL).await;
                    }
                }
            })
        };
        // The workers: take one entry (pending → active), handle it, ack it.
        let mut workers = Vec::new();
        let lags = Arc::new(Mutex::new(Vec::with_capacity(DUE)));
        for _ in 0..WORKERS {
            let (stop, handled, all, lags) =
                (stop.clone(), handled.clone(), all.clone(), lags.clone());
            let mut conn = self.connect().await.unwrap();
            workers.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let member: Option<String> = redis::cmd("BLMOVE")
                        .arg("pending")
                        .arg("active")
                        .arg("RIGHT")
                        .arg("LEFT")
                        .arg(0.05)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    let Some(member) = member else {
                        continue;
                    };
                    let due: u64 = member.split(':').next().unwrap().parse().unwrap();
                    lags.lock().unwrap().push(lag_since(due));
                    redis::cmd("LREM")
                        .arg("active")
                        .arg(1)
                        .arg(&member)
                        .query_async::<()>(&mut conn)
                        .await
                        .unwrap();
                    if handled.fetch_add(1, Ordering::SeqCst) + 1 == DUE {
                        all.notify_one();
                    }
                }
            }));
        }
        all.notified().await;
        let elapsed = lag_since(due);
        stop.store(true, Ordering::SeqCst);
        forwarder.await.unwrap();
        for worker in workers {
            worker.await.unwrap();
        }
        let lags = std::mem::take(&mut *lags.lock().unwrap());
        (elapsed, lags)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn main() {
    let rounds: usize = std::env::var("DISPATCH_ROUNDS")
        .ok()
        .map_or(7, |n| n.parse().expect("DISPATCH_ROUNDS=N"));
    let runtime = Runtime::new().unwrap();
    let mut estafeta = runtime.block_on(Estafeta::setup());
    let redis = runtime.block_on(Redis::setup());
    println!("set up; load average {}", bench::load());
    bench::alternate(
        rounds,
        ["estafeta-repeat (redb)", "Redis sorted set + Lua poll"],
        |side| match side {
            0 => runtime.block_on(estafeta.round()),
            _ => runtime.block_on(redis.round()),
        },
    );
}
