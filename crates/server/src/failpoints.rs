//! Named failpoints armed from the environment, for the fault-injection
//! harness only (cargo feature `failpoints`; a production build has none).
//! The points are those of [`POINTS`] (listed, and split into the embedded
//! store's and those of both stores, by `estafeta_exchange::failpoints`,
//! which the harness reads too).
//!
//! - `ESTAFETA_CRASH_AT=<point>` or `<point>@<n>`: the server sends itself
//!   SIGKILL (a real `kill -9`: no clean-up, no flush) the n-th time (the
//!   first by default) it passes the point.
//! - `ESTAFETA_FAILPOINTS=<point>=<actions>;…`: the `fail` crate's syntax,
//!   e.g. `mailbox::rename=5%return` makes one rename in twenty fail as on a
//!   full disk (`ENOSPC`).

use std::sync::atomic::{AtomicU64, Ordering};

pub use estafeta_exchange::failpoints::POINTS;

/// The environment asked for something that cannot be armed.
#[derive(Debug, thiserror::Error)]
pub enum FailpointError {
    /// `ESTAFETA_CRASH_AT` names no point or has a bad count.
    #[error(
        "ESTAFETA_CRASH_AT={0:?}: expected one of {POINTS:?}, optionally followed by @<n> (n ≥ 1)"
    )]
    CrashAt(String),
    /// `ESTAFETA_FAILPOINTS` has an entry the `fail` crate refuses.
    #[error("ESTAFETA_FAILPOINTS entry {entry:?}: {reason}")]
    Actions {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Arms the points the environment names; what it armed, one entry per
/// point (empty when the environment names none).
pub fn arm_from_env() -> Result<Vec<String>, FailpointError> {
    let mut armed = Vec::new();
    if let Ok(spec) = std::env::var("ESTAFETA_CRASH_AT") {
        let (point, nth) = parse_crash_at(&spec)?;
        arm_crash(point, nth);
        tracing::warn!(point, nth, "failpoint armed: kill -9 of this server there");
        armed.push(format!("{point}@{nth}=kill"));
    }
    if let Ok(spec) = std::env::var("ESTAFETA_FAILPOINTS") {
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |reason: String| FailpointError::Actions {
                entry: entry.to_owned(),
                reason,
            };
            let (point, actions) = entry
                .split_once('=')
                .ok_or_else(|| bad("expected <point>=<actions>".to_owned()))?;
            if !POINTS.contains(&point) {
                return Err(bad(format!("no such point; the points are {POINTS:?}")));
            }
            fail::cfg(point, actions).map_err(bad)?;
            tracing::warn!(point, actions, "failpoint armed");
            armed.push(format!("{point}={actions}"));
        }
    }
    Ok(armed)
}

/// `point` or `point@n` → the point and n.
fn parse_crash_at(spec: &str) -> Result<(&'static str, u64), FailpointError> {
    let bad = || FailpointError::CrashAt(spec.to_owned());
    let (name, nth) = match spec.split_once('@') {
        Some((name, n)) => (name, n.parse::<u64>().map_err(|_| bad())?),
        None => (spec, 1),
    };
    let point = POINTS.iter().find(|p| **p == name).ok_or_else(bad)?;
    if nth == 0 {
        return Err(bad());
    }
    Ok((point, nth))
}

/// On the `nth` pass of `point`, SIGKILL this process.
fn arm_crash(point: &'static str, nth: u64) {
    let passes = AtomicU64::new(0);
    let armed = fail::cfg_callback(point, move || {
        if passes.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            eprintln!("{}", estafeta_exchange::failpoints::crash_line(point));
            let me = rustix::process::getpid();
            // Only fails if the process does not exist; it does.
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        }
    });
    if let Err(e) = armed {
        // `cfg_callback` only refuses an empty name; POINTS has none.
        tracing::error!(point, error = %e, "failpoint not armed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_specs_parse() {
        assert_eq!(
            parse_crash_at("mailbox::rename").unwrap(),
            ("mailbox::rename", 1)
        );
        assert_eq!(
            parse_crash_at("session::commit@7").unwrap(),
            ("session::commit", 7)
        );
        for bad in ["nowhere", "mailbox::rename@0", "mailbox::rename@x", ""] {
            assert!(parse_crash_at(bad).is_err(), "{bad}");
        }
    }
}
