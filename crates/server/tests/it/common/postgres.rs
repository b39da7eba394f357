//! The PostgreSQL instance one test binary's tests share: a throwaway
//! instance (initdb, its own port) started by the first test that asks,
//! and a new database in it for each test, so tests stay independent and
//! run in parallel without an initdb each.
//!
//! A static is never dropped, so the instance cannot be stopped by its
//! value's drop. A watchdog process stops it instead: it waits for the end
//! of a pipe whose writing end only this process holds, which the kernel
//! closes when this process ends, however it ends (a normal exit, a panic
//! outside a test, a signal), and then shuts the instance down
//! (`SIGQUIT`, PostgreSQL's immediate shutdown) and removes its folder.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use estafeta_postgres::testing::Postgres;

/// Connections the shared instance accepts: tests run in parallel, each
/// server pools up to 16, and a node killed by a crash test leaves its
/// connections until the instance notices.
const MAX_CONNECTIONS: u32 = 300;

/// Waits for the end of its standard input, then stops the instance whose
/// folder is `$0` and removes that folder.
const WATCHDOG: &str = r#"
cat >/dev/null
pid=$(head -n 1 "$0/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
rm -rf "$0"
"#;

struct Shared {
    pg: Postgres,
    /// The watchdog, its standard input (a pipe) held open here: closed
    /// only when this process ends, which is the watchdog's signal.
    _watchdog: Child,
}

static SHARED: OnceLock<Shared> = OnceLock::new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The instance, started on first use.
fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let connections = format!("max_connections = {MAX_CONNECTIONS}");
        let pg =
            Postgres::start_with(&[&connections]).expect("start the tests' PostgreSQL instance");
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(pg.socket_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C to the tests does not stop
            // it before it has stopped the instance.
            .process_group(0)
            .spawn()
            .expect("start the PostgreSQL watchdog");
        Shared {
            pg,
            _watchdog: watchdog,
        }
    })
}

/// The URL of a new, empty database on the shared instance.
pub(crate) fn database() -> String {
    let shared = shared();
    let name = format!("test_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    shared
        .pg
        .psql(&format!("CREATE DATABASE {name}"))
        .expect("create a test database");
    format!("postgres://postgres@{}/{name}", shared.pg.host_port())
}
