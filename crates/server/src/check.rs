//! The health of the state folder's redb files: `estafeta check`, which
//! reports on each file and repairs what redb can, and the look before
//! serving, which refuses to start on a damaged file with a message that
//! names it and says what to do. In cluster mode the state is in the
//! cluster's database and no file under the data folder holds any of it:
//! `estafeta check` then reports whether the database answers and how its
//! schema stands against this build ([`check_cluster`]).
//!
//! The session database's save log (`sessions.redb.log`) is looked at as
//! the next start will find it: the saves it holds are folded in then, a
//! log the database does not record is replaced, and one that is not a
//! save log stops the start.
//!
//! After a crash (`kill -9`, a power loss) redb repairs a file when it is
//! next opened: the time that takes grows with the file's size, not with
//! what the crash interrupted. A file cut short or overwritten is beyond
//! that repair: only a backup, or starting with the file empty, helps.

use estafeta_exchange::DataLayout;
use estafeta_session::{RedbStorage, SaveLogState};
use redb::{Database, DatabaseError, StorageError};
use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One redb file of the state folder and what it holds.
struct StateFile {
    path: PathBuf,
    holds: &'static str,
    /// Whether a save log sits beside it (the session database).
    save_log: bool,
}

/// Every redb file of the data folder `data_dir`.
fn state_files(data_dir: &Path) -> [StateFile; 8] {
    let layout = DataLayout::new(data_dir);
    let file = |path, holds| StateFile {
        path,
        holds,
        save_log: false,
    };
    [
        file(
            layout.registry(),
            "the enterprises, subsystems, databases, devices and their token hashes",
        ),
        StateFile {
            path: layout.sessions(),
            holds: "the processes and the databases' and devices' counters",
            save_log: true,
        },
        file(layout.keys(), "the idempotency keys of devices' uploads"),
        file(
            layout.scheduled(),
            "the replies waiting for their deliver_at",
        ),
        file(
            layout.alerts(),
            "the raised alerts and their acknowledgements",
        ),
        file(layout.alert_deliveries(), "the alert notices not yet sent"),
        file(
            layout.push_deliveries(),
            "the push notifications not yet sent",
        ),
        file(layout.events(), "the event log"),
    ]
}

/// What was found in one state file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// No such file: it is made at the next start.
    Absent,
    /// The file passed redb's integrity check.
    Whole,
    /// redb found damage (or an unfinished write of a crash) and repaired it.
    Repaired,
    /// A running server holds the file.
    InUse,
    /// The file cannot be opened or repaired; the error says why.
    Damaged(String),
    /// The session database's own save log, with this many batches of
    /// saves that the next start folds into the database.
    Unfolded(usize),
    /// A save log the session database does not record as its own: the
    /// next start replaces it and replays none of it.
    Foreign,
    /// The session database records a save log and there is none: what
    /// was saved since its last fold is lost; the next start makes a new
    /// one.
    Missing,
}

/// The finding on one state file.
#[derive(Clone, Debug)]
pub struct FileReport {
    /// The file.
    pub path: PathBuf,
    /// What it holds (what is lost if it is set aside).
    pub holds: &'static str,
    /// What was found.
    pub health: Health,
}

impl FileReport {
    /// Whether the file is fit to serve from (absent, whole or repaired).
    pub fn is_fit(&self) -> bool {
        !matches!(self.health, Health::InUse | Health::Damaged(_))
    }
}

impl fmt::Display for FileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.health {
            Health::Absent => write!(f, "{path}: absent (made at the next start)"),
            Health::Whole => write!(f, "{path}: ok"),
            Health::Repaired => write!(f, "{path}: repaired"),
            Health::InUse => write!(
                f,
                "{path}: in use by a running server; stop it, then check again"
            ),
            Health::Damaged(e) => write!(
                f,
                "{path}: DAMAGED, it cannot be repaired ({e}). It holds {}: restore it from a \
                 backup, or move it aside to start with it empty (losing what it held)",
                self.holds
            ),
            Health::Unfolded(0) => write!(f, "{path}: ok"),
            Health::Unfolded(n) => write!(
                f,
                "{path}: ok, {n} {} of saves to fold into the database at the next start",
                if *n == 1 { "batch" } else { "batches" }
            ),
            Health::Foreign => write!(
                f,
                "{path}: not the session database's own save log (left beside a database \
                 moved aside?); the next start replaces it and replays none of it"
            ),
            Health::Missing => write!(
                f,
                "{path}: MISSING, the session database records a save log and it is gone: \
                 {} since the last fold are lost; the next start makes a new one",
                self.holds
            ),
        }
    }
}

/// Opens `file` as redb does at a start (repairing what a crash left
/// unfinished); `check` adds redb's full integrity check. The session
/// database's report is followed by its save log's.
fn examine(file: &StateFile, check: bool) -> Vec<FileReport> {
    let (health, db) = match file.path.try_exists() {
        Ok(false) => (Health::Absent, None),
        Err(e) => (Health::Damaged(e.to_string()), None),
        Ok(true) => match open(&file.path, check) {
            Ok((db, health)) => (health, Some(db)),
            Err(health) => (health, None),
        },
    };
    let log = file
        .save_log
        .then(|| examine_save_log(&file.path, &health, db.as_ref()))
        .flatten();
    let report = FileReport {
        path: file.path.clone(),
        holds: file.holds,
        health,
    };
    std::iter::once(report).chain(log).collect()
}

/// The database at `path` open, and whether it is whole or was repaired;
/// or, when it cannot be opened or checked, why.
fn open(path: &Path, check: bool) -> Result<(Database, Health), Health> {
    let repaired = Arc::new(AtomicBool::new(false));
    let seen = repaired.clone();
    let mut builder = Database::builder();
    builder.set_repair_callback(move |_| seen.store(true, Ordering::Relaxed));
    let mut db = match builder.open(path) {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => return Err(Health::InUse),
        Err(e) => return Err(Health::Damaged(damage(e))),
    };
    let whole = if check {
        db.check_integrity()
            .map_err(|e| Health::Damaged(e.to_string()))?
    } else {
        true
    };
    let health = if whole && !repaired.load(Ordering::Relaxed) {
        Health::Whole
    } else {
        Health::Repaired
    };
    Ok((db, health))
}

/// The save log beside the session database at `path` (found `health`,
/// open as `db`), as the next start will find it; `None` when the database
/// could not be opened (held by a running server, or damaged: its own
/// report says what to do).
fn examine_save_log(path: &Path, health: &Health, db: Option<&Database>) -> Option<FileReport> {
    let log = RedbStorage::save_log_path(path);
    let health = match (health, db) {
        // A new database is made, and any log there replaced.
        (Health::Absent, _) => match log.try_exists() {
            Ok(true) => Health::Foreign,
            Ok(false) => Health::Absent,
            Err(e) => Health::Damaged(e.to_string()),
        },
        (_, Some(db)) => match RedbStorage::inspect_save_log(db, path) {
            Ok(SaveLogState::Absent) => Health::Absent,
            Ok(SaveLogState::Own { batches }) => Health::Unfolded(batches),
            Ok(SaveLogState::Foreign) => Health::Foreign,
            Ok(SaveLogState::Missing) => Health::Missing,
            Err(e) => Health::Damaged(e.to_string()),
        },
        (_, None) => return None,
    };
    Some(FileReport {
        path: log,
        holds: "the session saves not yet folded into the session database",
        health,
    })
}

/// What is wrong with a file redb cannot open, in an operator's words.
fn damage(e: DatabaseError) -> String {
    match e {
        DatabaseError::Storage(StorageError::Io(io)) if io.kind() == ErrorKind::UnexpectedEof => {
            "the file is cut short: it ends before its own header says it does".into()
        }
        e => e.to_string(),
    }
}

/// `estafeta check`: every state file of `data_dir` opened (repaired if a
/// crash left it unfinished) and checked by redb, one report each.
pub fn check(data_dir: &Path) -> Vec<FileReport> {
    state_files(data_dir)
        .iter()
        .flat_map(|f| examine(f, true))
        .collect()
}

/// What `estafeta check` found of a cluster's database.
#[derive(Debug)]
pub struct ClusterReport {
    /// The store's URL, its password masked.
    pub url: String,
    /// The schema's version, or why it could not be read.
    pub schema: Result<estafeta_postgres::SchemaVersion, estafeta_postgres::Error>,
    /// What a committed step's durability rests on, or why it could not be
    /// read.
    pub durability: Result<estafeta_postgres::Durability, estafeta_postgres::Error>,
}

impl ClusterReport {
    /// Whether a node of this build can serve from the database: it
    /// answers, and its schema is not newer than this build's (an older
    /// one is brought up to date at the next start).
    pub fn is_fit(&self) -> bool {
        matches!(&self.schema, Ok(v) if v.applied <= v.built)
    }
}

impl fmt::Display for ClusterReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = &self.url;
        match &self.schema {
            Err(e) => write!(f, "{url}: UNREACHABLE or refused ({e})"),
            Ok(v) if v.applied == 0 => {
                write!(f, "{url}: empty (the schema is made at the next start)")
            }
            Ok(v) if v.applied < v.built => write!(
                f,
                "{url}: ok, schema version {} (brought up to {} at the next start)",
                v.applied, v.built
            ),
            Ok(v) if v.applied == v.built => write!(f, "{url}: ok, schema version {}", v.applied),
            Ok(v) => write!(
                f,
                "{url}: schema version {} is NEWER than this build's {}: run a build at least as \
                 new as the cluster's other nodes",
                v.applied, v.built
            ),
        }?;
        let Ok(d) = &self.durability else {
            return Ok(());
        };
        let commit = &d.synchronous_commit;
        match (d.flushes(), d.survives_the_primary()) {
            (false, _) => write!(
                f,
                "\n{url}: WARNING synchronous_commit is {commit}: the server answers a COMMIT \
                 before it is on disk, so a crash of it can lose steps a node answered; set it to on"
            ),
            (true, true) => write!(
                f,
                "\n{url}: synchronous_commit {commit}, {} synchronous standby(s) attached: a \
                 committed step survives losing the primary",
                d.synchronous_standbys
            ),
            (true, false) if d.standby_names.is_empty() => write!(
                f,
                "\n{url}: WARNING no synchronous standby is configured \
                 (synchronous_standby_names is empty): a committed step is lost with the \
                 primary's disk; configure one to survive losing the primary"
            ),
            (true, false) => write!(
                f,
                "\n{url}: WARNING synchronous_standby_names is {:?} but no synchronous standby is \
                 attached now (synchronous_commit {commit}): commits wait for one",
                d.standby_names
            ),
        }
    }
}

/// `estafeta check` in cluster mode: whether the database at `url` answers,
/// how its schema stands, and whether `synchronous_commit` is on and a
/// synchronous standby attached; `masked` is the URL as the report shows it.
pub async fn check_cluster(url: &str, masked: String) -> ClusterReport {
    let (schema, durability) = match estafeta_postgres::Store::connect(url) {
        Ok(store) => (store.schema_version().await, store.durability().await),
        Err(e) => {
            let again = estafeta_postgres::Error::Unavailable(e.to_string());
            (Err(e), Err(again))
        }
    };
    ClusterReport {
        url: masked,
        schema,
        durability,
    }
}

/// A state file the server cannot start on.
#[derive(Debug, thiserror::Error)]
#[error(
    "{report}. The server does not start on a damaged state file; `estafeta check --data-dir {}` \
     reports on every state file and repairs what redb can",
    data_dir.display()
)]
pub struct DamagedState {
    /// The file and what was found.
    pub report: FileReport,
    /// The data folder.
    pub data_dir: PathBuf,
}

/// Before serving: every state file of `data_dir` that exists is opened
/// (and repaired if a crash left it unfinished); the first that redb
/// cannot open stops the start. `event_log`: the event log this process's
/// log subscriber opened (and redb repaired) already, passed over.
pub fn before_serving(
    data_dir: &Path,
    event_log: Option<&std::sync::Arc<crate::events::EventStore>>,
) -> Result<(), DamagedState> {
    for file in state_files(data_dir) {
        if event_log.is_some_and(|log| log.path() == file.path) {
            continue;
        }
        for report in examine(&file, false) {
            if !report.is_fit() {
                return Err(DamagedState {
                    report,
                    data_dir: data_dir.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check looks at every redb file a server makes in its state
    /// folder, and at nothing else.
    #[tokio::test]
    async fn every_redb_file_a_server_makes_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = estafeta_exchange::ExchangeConfig::new(dir.path());
        config.admin_token = Some("a".repeat(40));
        let (server, _) = crate::Server::open(
            config,
            std::sync::Arc::new(estafeta_session::SystemClock),
            crate::HttpSettings::default(),
            crate::notify::NotifySettings::log_only(dir.path()),
        )
        .await
        .unwrap();
        drop(server);
        // The event log, which `serve` opens before the server.
        let events = DataLayout::new(dir.path()).events();
        drop(crate::events::EventLog::open(&events, Default::default()).unwrap());
        let made: std::collections::BTreeSet<PathBuf> =
            std::fs::read_dir(DataLayout::new(dir.path()).state_dir())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "redb"))
                .collect();
        let checked = state_files(dir.path()).map(|f| f.path).into();
        assert_eq!(made, checked);
    }

    fn made(dir: &Path) {
        let layout = DataLayout::new(dir);
        std::fs::create_dir_all(layout.state_dir()).unwrap();
        for f in state_files(dir) {
            drop(Database::create(&f.path).unwrap());
        }
    }

    #[test]
    fn whole_files_pass_and_absent_ones_are_made_later() {
        let dir = tempfile::tempdir().unwrap();
        let reports = check(dir.path());
        assert!(reports.iter().all(|r| r.health == Health::Absent));
        made(dir.path());
        let reports = check(dir.path());
        let log = RedbStorage::save_log_path(&DataLayout::new(dir.path()).sessions());
        assert!(
            reports.iter().all(|r| r.health == Health::Whole
                || (r.path == log && r.health == Health::Absent)),
            "{reports:?}"
        );
        before_serving(dir.path(), None).unwrap();
    }

    /// The session database's save log is reported as the next start will
    /// find it, and one that is not a save log stops the start, named.
    #[test]
    fn the_session_save_log_is_looked_at_as_the_start_will_find_it() {
        use estafeta_session::Storage;
        let dir = tempfile::tempdir().unwrap();
        made(dir.path());
        let sessions = DataLayout::new(dir.path()).sessions();
        let log = RedbStorage::save_log_path(&sessions);
        std::fs::remove_file(&sessions).unwrap();
        let storage = RedbStorage::open(&sessions).unwrap();
        storage
            .write(&[estafeta_session::storage::Write::Delete { key: b"a".to_vec() }])
            .unwrap();
        // A crash now: the files as they are while the storage is open.
        let crashed = tempfile::tempdir().unwrap();
        made(crashed.path());
        let crashed_sessions = DataLayout::new(crashed.path()).sessions();
        let crashed_log = RedbStorage::save_log_path(&crashed_sessions);
        std::fs::copy(&sessions, &crashed_sessions).unwrap();
        std::fs::copy(&log, &crashed_log).unwrap();
        drop(storage);
        let report = |dir: &Path| {
            let reports = check(dir);
            let found = reports
                .iter()
                .find(|r| r.path.extension().is_some_and(|x| x == "log"));
            found.cloned().expect("the save log is reported")
        };
        let unfolded = report(crashed.path());
        assert_eq!(unfolded.health, Health::Unfolded(1));
        assert!(
            unfolded.to_string().contains("1 batch of saves to fold"),
            "{unfolded}"
        );
        assert_eq!(
            report(dir.path()).health,
            Health::Unfolded(0),
            "folded at the close"
        );
        before_serving(crashed.path(), None).unwrap();

        std::fs::write(&crashed_log, b"not a save log").unwrap();
        let damaged = report(crashed.path());
        assert!(!damaged.is_fit());
        assert!(damaged.to_string().contains("DAMAGED"), "{damaged}");
        let err = before_serving(crashed.path(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&crashed_log.display().to_string()), "{err}");
        assert!(err.contains("is not a save log"), "{err}");

        std::fs::remove_file(&crashed_log).unwrap();
        let missing = report(crashed.path());
        assert_eq!(missing.health, Health::Missing);
        assert!(missing.is_fit());
        assert!(missing.to_string().contains("MISSING"), "{missing}");

        std::fs::write(&log, b"left over").unwrap();
        std::fs::remove_file(&sessions).unwrap();
        assert_eq!(report(dir.path()).health, Health::Foreign);
    }

    /// The event log this process's subscriber holds open is passed over
    /// (redb would not open it a second time), and only that file.
    #[test]
    fn the_event_log_open_in_this_process_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        made(dir.path());
        let log = crate::events::EventStore::open(&DataLayout::new(dir.path()).events()).unwrap();
        before_serving(dir.path(), Some(&log)).unwrap();
        let err = before_serving(dir.path(), None).unwrap_err().to_string();
        assert!(err.contains("events.redb"), "{err}");
    }

    #[test]
    fn a_truncated_file_is_named_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        made(dir.path());
        let sessions = DataLayout::new(dir.path()).sessions();
        for len in [100, 3000] {
            std::fs::File::options()
                .write(true)
                .open(&sessions)
                .unwrap()
                .set_len(len)
                .unwrap();
            let err = before_serving(dir.path(), None).unwrap_err().to_string();
            assert!(err.contains(&sessions.display().to_string()), "{err}");
            assert!(err.contains("estafeta check"), "{err}");
            assert!(err.contains("restore it from a backup"), "{err}");
            let reports = check(dir.path());
            let bad: Vec<_> = reports.iter().filter(|r| !r.is_fit()).collect();
            assert_eq!(bad.len(), 1, "{reports:?}");
            assert_eq!(bad[0].path, sessions);
        }
    }

    #[test]
    fn a_file_held_by_a_server_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        made(dir.path());
        let held = Database::open(DataLayout::new(dir.path()).registry()).unwrap();
        let reports = check(dir.path());
        assert_eq!(reports[0].health, Health::InUse);
        drop(held);
    }
}
