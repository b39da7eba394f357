//! The status words of the API, in the exact spelling of the JSON bodies.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The answer of a start call (API_1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StartStatus {
    /// No message waits for this database (within the filters).
    Idle,
    /// The database already has a process that has not ended.
    Busy,
    /// A process started; its id and messages follow.
    Ok,
}

/// The answer of API_2 … API_6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CallStatus {
    /// Done as asked.
    Ok,
    /// The process is unknown or not in a state that allows the call.
    Cancelled,
    /// Commit only: files could not be moved; the server keeps retrying.
    Failed,
}

/// The state of a process, as `GET /v1/processes/{pid}` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProcessState {
    /// Messages handed out; waiting for prepare.
    Started,
    /// Replies durable in `Prepared`; waiting for commit or rollback.
    ReadyToCommit,
    /// Commit confirmed; files being moved.
    Cleanup,
    /// Commit confirmed but files could not be moved; retried with backoff.
    Failed,
    /// Committed and all files moved.
    Done,
    /// The processor rolled back (API_5).
    RolledBack,
    /// The processor aborted (API_6).
    Aborted,
    /// STARTED for longer than the STARTED timeout.
    TimedOut,
    /// READY_TO_COMMIT for too long (or found so at start-up); files in `Unknown`.
    InDoubt,
}

impl ProcessState {
    /// True for the states in which the database is BUSY (the process has not ended).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Self::Started | Self::ReadyToCommit | Self::Cleanup | Self::Failed
        )
    }
}

/// The processor's verdict on one message (API_3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResultStatus {
    /// Processed; the message goes to `Log` on commit.
    Processed,
    /// Hit a deadlock; the message stays in `Messages` and comes again.
    ProcessedDeadlock,
    /// Failed; the message goes to `Error` on commit.
    ProcessedIncorrect,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word<T: Serialize>(v: T) -> String {
        serde_json::to_value(v)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn exact_spelling() {
        assert_eq!(word(StartStatus::Idle), "IDLE");
        assert_eq!(word(StartStatus::Busy), "BUSY");
        assert_eq!(word(StartStatus::Ok), "OK");
        assert_eq!(word(CallStatus::Cancelled), "CANCELLED");
        assert_eq!(word(CallStatus::Failed), "FAILED");
        let states = [
            (ProcessState::Started, "STARTED"),
            (ProcessState::ReadyToCommit, "READY_TO_COMMIT"),
            (ProcessState::Cleanup, "CLEANUP"),
            (ProcessState::Failed, "FAILED"),
            (ProcessState::Done, "DONE"),
            (ProcessState::RolledBack, "ROLLED_BACK"),
            (ProcessState::Aborted, "ABORTED"),
            (ProcessState::TimedOut, "TIMED_OUT"),
            (ProcessState::InDoubt, "IN_DOUBT"),
        ];
        for (state, text) in states {
            assert_eq!(word(state), text);
            let back: ProcessState = serde_json::from_value(text.into()).unwrap();
            assert_eq!(back, state);
        }
        assert_eq!(word(ResultStatus::Processed), "PROCESSED");
        assert_eq!(word(ResultStatus::ProcessedDeadlock), "PROCESSED_DEADLOCK");
        assert_eq!(
            word(ResultStatus::ProcessedIncorrect),
            "PROCESSED_INCORRECT"
        );
        assert!(serde_json::from_str::<CallStatus>("\"ok\"").is_err());
    }

    #[test]
    fn live_states_are_the_busy_ones() {
        assert!(ProcessState::Failed.is_live());
        assert!(ProcessState::Cleanup.is_live());
        assert!(!ProcessState::Done.is_live());
        assert!(!ProcessState::InDoubt.is_live());
    }
}
