//! [`CommitLoss`]: a TCP proxy in front of a PostgreSQL server that can
//! lose the answer to a `COMMIT` the server made, as a network that fails
//! at the wrong moment does: the transaction is committed, and the client
//! sees its connection reset instead of the answer.
//!
//! [`Conversation`] follows the protocol's framing of one connection in
//! both directions (the startup, with its optional SSL or GSS request,
//! then typed messages), so that it knows the connection's
//! `application_name` (which pool of a node it belongs to), the tables
//! each transaction writes and the answers to the `COMMIT`s of those that
//! wrote (an `INSERT`, `UPDATE` or `DELETE` before it). Armed, the proxy
//! picks such a `COMMIT` on a connection of the application named, lets
//! the server answer it, then cuts both sides without passing the answer
//! on. The fault-injection harness's own proxy loses answers it picks at
//! random with the same [`Conversation`].

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The request codes of an SSL and a GSS encryption request (a startup
/// message the server answers with one byte).
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

/// What an armed proxy waits for.
struct Arm {
    /// The `application_name` of the connections it acts on.
    application: String,
    /// A table the transaction must have written (`None`: any writing
    /// transaction).
    table: Option<String>,
    /// Writing `COMMIT`s of such connections still to let through.
    skip: usize,
}

/// The proxy's state, shared by its connections.
#[derive(Default)]
struct Shared {
    arm: Mutex<Option<Arm>>,
    /// Answers dropped so far.
    dropped: AtomicUsize,
    dropping: Notify,
}

impl Shared {
    /// Whether the writing `COMMIT` just answered on a connection of
    /// `application` is the one to lose (the arm is spent then).
    fn take(&self, commit: &Commit) -> bool {
        let mut arm = self.arm.lock().unwrap_or_else(|e| e.into_inner());
        let Some(a) = arm.as_mut().filter(|a| {
            a.application == commit.application
                && a.table.as_ref().is_none_or(|t| commit.tables.contains(t))
        }) else {
            return false;
        };
        if a.skip > 0 {
            a.skip -= 1;
            return false;
        }
        *arm = None;
        true
    }
}

/// A proxy to a PostgreSQL server that loses a chosen `COMMIT` answer.
/// Stops when dropped.
pub struct CommitLoss {
    port: u16,
    shared: Arc<Shared>,
    accepting: tokio::task::JoinHandle<()>,
}

impl CommitLoss {
    /// A proxy on a free loopback port to the server at `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<CommitLoss> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let accepting = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(upstream).await {
                            relay(client, server, shared).await;
                        }
                    });
                }
            }
        });
        Ok(CommitLoss {
            port,
            shared,
            accepting,
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the answer to the `nth` (from 1) writing `COMMIT` from now on
    /// a connection whose `application_name` is `application`.
    pub fn arm(&self, application: &str, nth: usize) {
        self.arm_with(application, None, nth);
    }

    /// Loses the answer to the `nth` (from 1) `COMMIT` from now on of a
    /// transaction that wrote `table`, on a connection whose
    /// `application_name` is `application`.
    pub fn arm_writing(&self, application: &str, table: &str, nth: usize) {
        self.arm_with(application, Some(table), nth);
    }

    fn arm_with(&self, application: &str, table: Option<&str>, nth: usize) {
        *self.shared.arm.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arm {
            application: application.to_owned(),
            table: table.map(str::to_owned),
            skip: nth.saturating_sub(1),
        });
    }

    /// How many answers were lost so far.
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Waits until one more answer than `seen` was lost.
    pub async fn wait_dropped(&self, seen: usize) {
        loop {
            let notified = self.shared.dropping.notified();
            if self.dropped() > seen {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for CommitLoss {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Relays one connection until either side closes or its answer is lost.
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let conversation = Arc::new(Mutex::new(Conversation::new()));
    let upward = {
        let conversation = conversation.clone();
        tokio::spawn(async move {
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n) = client_in.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                conversation
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .client_sent(&buf[..n]);
                if server_out.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n) = server_in.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let bytes = &buf[..n];
        let commits = conversation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .server_sent(bytes);
        if let Some(lost) = commits.iter().find(|c| shared.take(c)) {
            // What came before the answer goes on; the answer and what
            // follows it are lost with the connection.
            let _ = client_out.write_all(&bytes[..lost.at]).await;
            shared.dropped.fetch_add(1, Ordering::SeqCst);
            shared.dropping.notify_waiters();
            break;
        }
        if client_out.write_all(bytes).await.is_err() {
            break;
        }
    }
    upward.abort();
}

/// The answer to the `COMMIT` of a transaction that wrote, among bytes a
/// server sent ([`Conversation::server_sent`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The connection's `application_name` (empty when it set none).
    pub application: String,
    /// The tables the transaction's statements write, as their SQL names
    /// them (an `INSERT INTO`, `UPDATE` or `DELETE FROM`): what kind of
    /// transaction it was.
    pub tables: BTreeSet<String>,
    /// Where in the bytes given the answer begins: what comes before it
    /// belongs to earlier answers.
    pub at: usize,
}

/// One connection's protocol, followed both ways from its first byte:
/// every byte the client sends to [`client_sent`](Self::client_sent),
/// every byte the server sends to [`server_sent`](Self::server_sent), each
/// direction in its order.
pub struct Conversation {
    /// The client's messages (untyped during its startup).
    upward: Frames,
    /// The server's messages.
    downward: Frames,
    /// One-byte answers owed to SSL or GSS requests, which come before any
    /// typed message.
    owed: usize,
    application: String,
    /// The tables each prepared statement's SQL writes, by its name.
    statements: HashMap<String, BTreeSet<String>>,
    /// The tables the transaction under way wrote so far, as the client
    /// sent its statements.
    writing: BTreeSet<String>,
    /// For each request the client sent and the server has not yet ended
    /// with `ReadyForQuery` (a simple query, or an extended query's
    /// `Sync`), oldest first: for a `COMMIT`, the tables its transaction
    /// wrote.
    pending: VecDeque<Option<BTreeSet<String>>>,
    /// Whether the server answered a write since the last transaction
    /// ended.
    wrote: bool,
}

impl Default for Conversation {
    fn default() -> Self {
        Conversation::new()
    }
}

impl Conversation {
    /// A connection before its first byte.
    pub fn new() -> Conversation {
        Conversation {
            upward: Frames::startup(),
            downward: Frames::typed(),
            owed: 0,
            application: String::new(),
            statements: HashMap::new(),
            writing: BTreeSet::new(),
            pending: VecDeque::new(),
            wrote: false,
        }
    }

    /// The connection's `application_name` (empty until its startup, or
    /// when it sets none).
    pub fn application(&self) -> &str {
        &self.application
    }

    /// Bytes the client sent, in order.
    pub fn client_sent(&mut self, bytes: &[u8]) {
        for (_, frame) in self.upward.push(bytes) {
            match frame {
                Frame::Request => self.owed += 1,
                Frame::Startup(params) => {
                    if let Some(name) = param(&params, "application_name") {
                        self.application = name;
                    }
                }
                // Parse: a statement's name and its SQL.
                Frame::Typed(b'P', payload) => {
                    let mut parts = payload.split(|b| *b == 0);
                    let name = String::from_utf8_lossy(parts.next().unwrap_or_default());
                    let sql = String::from_utf8_lossy(parts.next().unwrap_or_default());
                    self.statements.insert(name.into_owned(), written(&sql));
                }
                // Bind: the portal, then the statement it runs.
                Frame::Typed(b'B', payload) => {
                    let statement = payload.split(|b| *b == 0).nth(1).unwrap_or_default();
                    if let Some(tables) = self
                        .statements
                        .get(String::from_utf8_lossy(statement).as_ref())
                    {
                        self.writing.extend(tables.iter().cloned());
                    }
                }
                Frame::Typed(b'S', _) => self.pending.push_back(None),
                Frame::Typed(b'Q', payload) => {
                    let sql = String::from_utf8_lossy(
                        payload.split(|b| *b == 0).next().unwrap_or_default(),
                    )
                    .trim()
                    .to_ascii_uppercase();
                    let ends = (sql.starts_with("COMMIT") || sql.starts_with("END"))
                        .then(|| std::mem::take(&mut self.writing));
                    if sql.starts_with("BEGIN") || sql.starts_with("START TRANSACTION") {
                        self.writing.clear();
                    }
                    if ends.is_none() {
                        self.writing.extend(written(&sql));
                    }
                    self.pending.push_back(ends);
                }
                _ => {}
            }
        }
    }

    /// Bytes the server sent, in order: the answers among them to the
    /// `COMMIT`s of transactions that wrote.
    pub fn server_sent(&mut self, bytes: &[u8]) -> Vec<Commit> {
        let mut skipped = 0;
        while skipped < bytes.len() && self.owed > 0 && self.downward.is_empty() {
            self.owed -= 1;
            skipped += 1;
        }
        let mut commits = Vec::new();
        for (start, frame) in self.downward.push(&bytes[skipped..]) {
            match frame {
                // CommandComplete: its tag.
                Frame::Typed(b'C', payload) => {
                    let tag =
                        String::from_utf8_lossy(payload.split(|b| *b == 0).next().unwrap_or(&[]));
                    let ender = self.pending.front().and_then(Option::as_ref);
                    if ["INSERT", "UPDATE", "DELETE"]
                        .iter()
                        .any(|w| tag.starts_with(w))
                    {
                        self.wrote = true;
                    } else if tag == "COMMIT" && self.wrote {
                        commits.push(Commit {
                            application: self.application.clone(),
                            tables: ender.cloned().unwrap_or_default(),
                            at: skipped + start,
                        });
                        self.wrote = false;
                    } else if tag == "COMMIT" || (tag == "ROLLBACK" && ender.is_some()) {
                        self.wrote = false;
                    }
                }
                // ReadyForQuery: the oldest request is over.
                Frame::Typed(b'Z', _) => {
                    self.pending.pop_front();
                }
                _ => {}
            }
        }
        commits
    }
}

/// The tables an SQL text writes: the names after `INSERT INTO`, `UPDATE`
/// and `DELETE FROM`, in lower case.
fn written(sql: &str) -> BTreeSet<String> {
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == '(' || c == ',' || c == ';')
        .filter(|w| !w.is_empty())
        .map(|w| w.trim_matches('"').to_ascii_lowercase())
        .collect();
    let mut tables = BTreeSet::new();
    for (i, word) in words.iter().enumerate() {
        let target = match word.as_str() {
            "insert" | "delete" if words.get(i + 1).is_some_and(|w| w == "into" || w == "from") => {
                words.get(i + 2)
            }
            // Not a row lock (`FOR UPDATE`, `FOR NO KEY UPDATE`) or an
            // upsert's `DO UPDATE SET`.
            "update" if i > 0 && matches!(words[i - 1].as_str(), "for" | "key") => None,
            "update" => words.get(i + 1).filter(|w| *w != "set"),
            _ => None,
        };
        if let Some(table) = target {
            tables.insert(table.clone());
        }
    }
    tables
}

/// The value of `key` among a startup message's parameters.
fn param(params: &[u8], key: &str) -> Option<String> {
    let mut parts = params.split(|b| *b == 0);
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        if k == key.as_bytes() {
            return Some(String::from_utf8_lossy(v).into_owned());
        }
    }
    None
}

/// A message of the protocol.
enum Frame<'a> {
    /// An SSL or GSS encryption request.
    Request,
    /// A startup message's parameters (key, NUL, value, NUL, ...).
    Startup(Vec<u8>),
    /// A typed message: its type byte and payload.
    Typed(u8, &'a [u8]),
}

/// Splits a byte stream into the protocol's messages as they arrive.
struct Frames {
    /// Bytes of a message not yet whole.
    pending: Vec<u8>,
    /// Whether messages are still untyped (the client's startup phase).
    startup: bool,
    /// The carried bytes and those of the last push.
    whole: Vec<u8>,
}

impl Frames {
    fn startup() -> Frames {
        Frames {
            pending: Vec::new(),
            startup: true,
            whole: Vec::new(),
        }
    }

    fn typed() -> Frames {
        Frames {
            startup: false,
            ..Frames::startup()
        }
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The messages `bytes` completes, each with the offset in `bytes`
    /// where it begins (0 when it began in an earlier push).
    fn push(&mut self, bytes: &[u8]) -> Vec<(usize, Frame<'_>)> {
        let carried = self.pending.len();
        self.whole = std::mem::take(&mut self.pending);
        self.whole.extend_from_slice(bytes);
        let mut spans = Vec::new();
        let mut at = 0;
        loop {
            let rest = &self.whole[at..];
            let untyped = self.startup;
            let len_at = usize::from(!untyped);
            if rest.len() < len_at + 4 {
                break;
            }
            let len = u32::from_be_bytes([
                rest[len_at],
                rest[len_at + 1],
                rest[len_at + 2],
                rest[len_at + 3],
            ]) as usize;
            let total = len + len_at;
            if len < 4 || rest.len() < total {
                break;
            }
            spans.push((at, total, untyped));
            if untyped {
                let code = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
                if code != SSL_REQUEST && code != GSS_REQUEST {
                    self.startup = false;
                }
            }
            at += total;
        }
        self.pending = self.whole[at..].to_vec();
        spans
            .into_iter()
            .map(|(start, total, untyped)| {
                let message = &self.whole[start..start + total];
                let frame = match untyped {
                    true => {
                        let code =
                            u32::from_be_bytes([message[4], message[5], message[6], message[7]]);
                        match code {
                            SSL_REQUEST | GSS_REQUEST => Frame::Request,
                            _ => Frame::Startup(message[8..].to_vec()),
                        }
                    }
                    false => Frame::Typed(message[0], &message[5..]),
                };
                (start.saturating_sub(carried), frame)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typed message.
    fn typed(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&u32::try_from(payload.len() + 4).unwrap().to_be_bytes());
        m.extend_from_slice(payload);
        m
    }

    fn nul(parts: &[&str]) -> Vec<u8> {
        parts
            .iter()
            .flat_map(|p| [p.as_bytes(), b"\0"].concat())
            .collect()
    }

    #[test]
    fn the_tables_an_sql_text_writes() {
        let sql = "WITH m AS (UPDATE messages SET place = $1 RETURNING id) \
                   INSERT INTO replies (id) SELECT id FROM m ON CONFLICT (id) DO UPDATE SET id = 1; \
                   DELETE FROM keys WHERE k = $2; \
                   SELECT * FROM sessions FOR UPDATE SKIP LOCKED; SELECT 1 FROM t FOR NO KEY UPDATE";
        let want: BTreeSet<String> = ["messages", "replies", "keys"].map(String::from).into();
        assert_eq!(written(sql), want);
        assert!(written("SELECT 1").is_empty());
    }

    /// A startup with an SSL request refused, a prepared write, its
    /// commit: the commit's answer is found where it begins, split over
    /// two chunks, with its application and table; a read-only
    /// transaction's commit is not.
    #[test]
    fn a_writing_commit_is_found_with_its_application_and_tables() {
        let mut c = Conversation::new();
        let mut ssl = 8u32.to_be_bytes().to_vec();
        ssl.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        c.client_sent(&ssl);
        let params = nul(&["user", "postgres", "application_name", "node a", ""]);
        let mut startup = u32::try_from(params.len() + 8)
            .unwrap()
            .to_be_bytes()
            .to_vec();
        startup.extend_from_slice(&196_608u32.to_be_bytes());
        startup.extend_from_slice(&params);
        c.client_sent(&startup);
        assert!(c.server_sent(b"N").is_empty());
        assert!(c.server_sent(&typed(b'Z', b"I")).is_empty());
        assert_eq!(c.application(), "node a");

        let mut sent = typed(b'Q', &nul(&["BEGIN"]));
        sent.extend(typed(
            b'P',
            &[nul(&["s1", "UPDATE sessions SET r = $1"]), vec![0, 0]].concat(),
        ));
        sent.extend(typed(b'B', &[nul(&["", "s1"]), vec![0; 6]].concat()));
        sent.extend(typed(b'E', &[0, 0, 0, 0, 0]));
        sent.extend(typed(b'S', b""));
        sent.extend(typed(b'Q', &nul(&["COMMIT"])));
        c.client_sent(&sent);
        let mut answers = typed(b'C', &nul(&["BEGIN"]));
        answers.extend(typed(b'Z', b"T"));
        answers.extend(typed(b'1', b""));
        answers.extend(typed(b'2', b""));
        answers.extend(typed(b'C', &nul(&["UPDATE 1"])));
        answers.extend(typed(b'Z', b"T"));
        let commit_at = answers.len();
        answers.extend(typed(b'C', &nul(&["COMMIT"])));
        answers.extend(typed(b'Z', b"I"));
        let (first, second) = answers.split_at(commit_at + 3);
        assert!(c.server_sent(first).is_empty(), "the tag is not whole yet");
        assert_eq!(
            c.server_sent(second),
            [Commit {
                application: "node a".into(),
                tables: ["sessions".to_owned()].into(),
                at: 0,
            }]
        );

        c.client_sent(
            &[
                typed(b'Q', &nul(&["BEGIN"])),
                typed(b'Q', &nul(&["COMMIT"])),
            ]
            .concat(),
        );
        let read_only = [
            typed(b'C', &nul(&["BEGIN"])),
            typed(b'Z', b"T"),
            typed(b'C', &nul(&["COMMIT"])),
            typed(b'Z', b"I"),
        ]
        .concat();
        assert!(c.server_sent(&read_only).is_empty());
    }
}
