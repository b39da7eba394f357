//! Named failpoints armed from the environment, for the fault-injection
//! harness only (cargo feature `failpoints`; a production build has none).
//! The points are those of [`POINTS`] (listed, and split into the embedded
//! store's and those of both stores, by `estafeta_exchange::failpoints`,
//! which the harness reads too).
//!
//! - `ESTAFETA_CRASH_AT=<point>` or `<point>@<n>`: the server sends itself
//!   SIGKILL (a real `kill -9`: no clean-up, no flush) the n-th time (the
//!   first by default) it passes the point.
//! - `ESTAFETA_PAUSE_AT=<point>=<ms>` or `<point>@<n>=<ms>`: the n-th pass
//!   (the first by default) of the point blocks its thread for `ms`
//!   milliseconds (a node stalled inside a step, as under a long
//!   stop-the-world pause), saying so on stderr before and after, and on
//!   stdout before.
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
    /// `ESTAFETA_PAUSE_AT` names no point, or has a bad count or length.
    #[error(
        "ESTAFETA_PAUSE_AT={0:?}: expected one of {POINTS:?}, optionally followed by @<n> (n ≥ 1), then =<milliseconds>"
    )]
    PauseAt(String),
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
    if let Ok(spec) = std::env::var("ESTAFETA_PAUSE_AT") {
        let (point, nth, ms) = parse_pause_at(&spec)?;
        arm_pause(point, nth, ms);
        tracing::warn!(
            point,
            nth,
            ms,
            "failpoint armed: a pause of this server there"
        );
        armed.push(format!("{point}@{nth}=pause({ms})"));
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

/// `point[@n]=ms` → the point, n and ms.
fn parse_pause_at(spec: &str) -> Result<(&'static str, u64, u64), FailpointError> {
    let bad = || FailpointError::PauseAt(spec.to_owned());
    let (at, ms) = spec.rsplit_once('=').ok_or_else(bad)?;
    let ms = ms.parse::<u64>().map_err(|_| bad())?;
    let (point, nth) = parse_crash_at(at).map_err(|_| bad())?;
    Ok((point, nth, ms))
}

/// On the `nth` pass of `point`, block the passing thread for `ms`.
fn arm_pause(point: &'static str, nth: u64, ms: u64) {
    let passes = AtomicU64::new(0);
    let armed = fail::cfg_callback(point, move || {
        if passes.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            // On stdout too, where the harness that armed it counts it.
            println!("failpoint {point}: pausing for {ms} ms");
            eprintln!("failpoint {point}: pausing for {ms} ms");
            std::thread::sleep(std::time::Duration::from_millis(ms));
            eprintln!("failpoint {point}: going on after {ms} ms");
        }
    });
    if let Err(e) = armed {
        // `cfg_callback` only refuses an empty name; POINTS has none.
        tracing::error!(point, error = %e, "failpoint not armed");
    }
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

    #[test]
    fn pause_specs_parse() {
        assert_eq!(
            parse_pause_at("messages::apply=4000").unwrap(),
            ("messages::apply", 1, 4000)
        );
        assert_eq!(
            parse_pause_at("prepare::recorded@3=12500").unwrap(),
            ("prepare::recorded", 3, 12500)
        );
        for bad in [
            "messages::apply",
            "messages::apply=",
            "messages::apply=1s",
            "nowhere=10",
            "messages::apply@0=10",
        ] {
            assert!(parse_pause_at(bad).is_err(), "{bad}");
        }
    }
}
