//! Cluster mode with the real binary: `estafeta serve` nodes over throwaway
//! PostgreSQL servers, each node's log kept in a file for a failing test to
//! show, signals for killing and pausing a node, and the polling helpers the
//! fault tests wait with.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use estafeta_client::{Client, ClientError};
use estafeta_exchange::MessageId;
use estafeta_exchange::wire::Folder;
use estafeta_postgres::testing::Postgres;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout};

use super::recorder::Hit;
use super::{ADMIN_TOKEN, Binary, PATIENCE, estafeta, id, message, next, wait_ready};

/// How often a poll asks again.
const POLL: Duration = Duration::from_millis(20);

/// One `estafeta serve` process in cluster mode.
pub(crate) struct Node {
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    /// The admin token, when this node made it (the cluster's first start).
    pub(crate) printed_token: Option<String>,
    name: String,
    child: Child,
    pid: i32,
    log: PathBuf,
    _stdout: BufReader<ChildStdout>,
}

impl Node {
    /// Starts a node named `name` with its data folder and log under `dir`,
    /// over the store `url`, with `env` added; waits for `listening on`.
    pub(crate) async fn start(dir: &Path, name: &str, url: &str, env: &[(&str, &str)]) -> Node {
        let data = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).unwrap();
        let mut cmd = estafeta(dir);
        cmd.arg("serve")
            .env("ESTAFETA_LISTEN", "127.0.0.1:0")
            .env("ESTAFETA_DATA_DIR", &data)
            .env("ESTAFETA_STORE", url)
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let pid = i32::try_from(child.id().unwrap()).unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut printed_token = None;
        let addr = loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).await.unwrap();
            if n == 0 {
                panic!(
                    "node {name} exited before listening ({:?}):\n{}",
                    child.wait().await,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Some(rest) = line.trim().strip_prefix("admin token: ") {
                printed_token = rest.split_whitespace().next().map(str::to_owned);
            }
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                break addr.to_owned();
            }
        };
        Node {
            base: format!("http://{addr}"),
            printed_token,
            name: name.to_owned(),
            child,
            pid,
            log,
            _stdout: stdout,
        }
    }

    /// A client of this node with `token`.
    pub(crate) fn client(&self, token: &str) -> Client {
        Client::new(&self.base, token).unwrap()
    }

    /// The node's process id.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process still runs (not exited, not a zombie).
    pub(crate) fn alive(&self) -> bool {
        self.state().is_some_and(|s| s != "Z" && s != "X")
    }

    /// The process's state letter in `/proc/<pid>/stat`, if it exists.
    fn state(&self) -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // The state letter follows the command name, which ends with `)`.
        let after = &stat[stat.rfind(')')? + 1..];
        after.split_whitespace().next().map(str::to_owned)
    }

    /// Whether the process is stopped (paused by SIGSTOP).
    pub(crate) fn frozen(&self) -> bool {
        self.state().as_deref() == Some("T")
    }

    /// What the node logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9`, and waits until the process is gone.
    pub(crate) async fn kill9(mut self) {
        self.signal(rustix::process::Signal::KILL);
        let status = self.child.wait().await.unwrap();
        assert_eq!(status.code(), None, "the node exited by itself");
    }

    /// SIGSTOP: the process stays, frozen, holding whatever it held.
    pub(crate) fn pause(&self) {
        self.signal(rustix::process::Signal::STOP);
    }

    /// SIGCONT after [`Node::pause`].
    pub(crate) fn resume(&self) {
        self.signal(rustix::process::Signal::CONT);
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A paused node must be able to die with its test.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(rustix::process::Signal::KILL);
        }
        // A failing test shows what each of its nodes logged.
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.name, self.log());
        }
    }
}

/// Starts `n` nodes named `node-0`, `node-1`, … over `url` (the first one
/// alone, so that it makes the admin token); returns them and the token.
pub(crate) async fn start_nodes(
    dir: &Path,
    url: &str,
    n: usize,
    env: &[(&str, &str)],
) -> (Vec<Node>, String) {
    let first = Node::start(dir, "node-0", url, env).await;
    let admin = first
        .printed_token
        .clone()
        .expect("the cluster's first node prints the admin token");
    let mut nodes = vec![first];
    for i in 1..n {
        let node = Node::start(dir, &format!("node-{i}"), url, env).await;
        assert_eq!(
            node.printed_token, None,
            "only the first node makes a token"
        );
        nodes.push(node);
    }
    (nodes, admin)
}

/// Calls `f` until it gives `Some`, at most for [`PATIENCE`]; `what` names
/// the condition in the failure.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Runs `call` until it gives an answer that is not a retryable failure
/// (no HTTP answer, or 503), at most for [`PATIENCE`]. Every 503 on the way
/// must carry `Retry-After`.
pub(crate) async fn retrying<T, F, Fut>(what: &str, mut call: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match call().await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                assert_retryable(&e);
                tokio::time::sleep(POLL).await;
            }
            other => return other.inspect_err(|e| eprintln!("{what}: {e}")),
        }
    }
}

/// A failure a client may retry unchanged: no HTTP answer, or 503 with
/// `Retry-After`; never another status.
pub(crate) fn assert_retryable(e: &ClientError) {
    match e {
        ClientError::Transport(_) => {}
        ClientError::Api {
            status,
            retry_after,
            ..
        } => {
            assert_eq!(status.as_u16(), 503, "not a retryable answer: {e}");
            assert!(retry_after.is_some(), "a 503 without Retry-After: {e}");
        }
        other => panic!("not a retryable failure: {other}"),
    }
}

/// The ids in folder `folder` of mailbox `db`, asked through `admin`;
/// fails on an id listed twice.
pub(crate) async fn folder_ids(admin: &Client, db: &str, folder: Folder) -> BTreeSet<MessageId> {
    let mailbox = id(db);
    let listing = retrying("folder listing", || admin.folder(&mailbox, folder))
        .await
        .unwrap();
    let mut ids = BTreeSet::new();
    for file in listing.files {
        assert!(
            ids.insert(file.id),
            "{} listed twice in {folder:?}",
            file.id
        );
    }
    ids
}

/// `postgres://` URL `url` with `params` (`key=value`, percent-encoded)
/// added to its query.
pub(crate) fn with_params(url: &str, params: &[&str]) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{}", params.join("&"))
}

/// The settings of a test node over `url`: the test's admin token, no
/// health probes and no disk alert (which would add deliveries a test does
/// not count), then `extra`.
pub(crate) fn node_env<'a>(url: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("ESTAFETA_STORE", url),
        ("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN),
        ("ESTAFETA_ALERT_PROBE", "0"),
        ("ESTAFETA_DISK_ALERT_MB", "0"),
    ];
    env.extend_from_slice(extra);
    env
}

/// Two ready `estafeta serve` binaries over `pg` with the settings of
/// [`node_env`] and `extra`, their data folders `a` and `b` under `dir`,
/// and their admin clients.
pub(crate) async fn two_nodes(
    pg: &Postgres,
    dir: &Path,
    extra: &[(&str, &str)],
) -> [(Binary, Client); 2] {
    let url = pg.url();
    let env = node_env(&url, extra);
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let node = Binary::serve(dir, &dir.join(name), &[], &env).await;
        let admin = Client::new(&node.base, ADMIN_TOKEN).unwrap();
        wait_ready(&admin).await;
        nodes.push((node, admin));
    }
    let [a, b] = <[_; 2]>::try_from(nodes).unwrap_or_else(|_| unreachable!());
    [a, b]
}

/// Sets (`Some`) or removes (`None`) database `db`'s webhook through `node`.
pub(crate) async fn set_webhook(node: &Binary, db: &str, url: Option<String>) {
    let http = reqwest::Client::new();
    let path = format!("{}/v1/admin/databases/{db}/webhook", node.base);
    let sent = match url {
        Some(url) => http
            .put(path)
            .json(&serde_json::json!({"version": 1, "url": url})),
        None => http.delete(path),
    };
    let answer = sent.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(
        answer.status(),
        reqwest::StatusCode::OK,
        "{:?}",
        answer.text().await
    );
}

/// Uploads one message to `db` through `phone`; waits for the one POST it
/// makes and returns it, once no notification is pending in the store (so
/// no node can send one more), checking that no second POST came.
pub(crate) async fn pushed_once(
    phone: &Client,
    db: &str,
    hits: &mut tokio::sync::mpsc::UnboundedReceiver<Hit>,
    store: &estafeta_postgres::Store,
) -> Hit {
    phone.send(&message(db, "{}", None)).await.unwrap();
    let hit = next(hits).await;
    assert!(hit.body.contains("messages_waiting"), "{}", hit.body);
    assert!(hit.body.contains(db), "{}", hit.body);
    wait_count(
        store,
        "SELECT count(*) FROM repeat_entries WHERE source = 'push'",
        0,
    )
    .await;
    assert!(hits.try_recv().is_err(), "a second POST for one arrival");
    hit
}

/// Polls `sql` (one count) on `db` until it gives `want`.
pub(crate) async fn wait_count(db: &estafeta_postgres::Store, sql: &str, want: i64) {
    eventually(&format!("{sql} to give {want}"), || async {
        let client = db.client().await.ok()?;
        let n: i64 = client.query_one(sql, &[]).await.ok()?.get(0);
        (n == want).then_some(())
    })
    .await;
}

/// Makes every save of `phone-1`'s device session fail (`true`), or lets
/// them through again (`false`).
pub(crate) async fn refuse_device_saves(db: &estafeta_postgres::Store, refuse: bool) {
    let client = db.client().await.unwrap();
    let sql = match refuse {
        true => {
            "CREATE FUNCTION refuse_save() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'save refused by the test'; END $$;
             CREATE TRIGGER refuse_device_saves BEFORE UPDATE ON sessions FOR EACH ROW
               WHEN (position('phone-1'::bytea in NEW.key) > 0 AND NEW.record IS NOT NULL)
               EXECUTE FUNCTION refuse_save()"
        }
        false => "DROP TRIGGER refuse_device_saves ON sessions; DROP FUNCTION refuse_save()",
    };
    client.batch_execute(sql).await.unwrap();
}
