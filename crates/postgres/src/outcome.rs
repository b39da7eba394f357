//! What became of a transaction whose answer to `COMMIT` was lost.
//!
//! A connection that fails after `COMMIT` was sent leaves the outcome open:
//! the server may have committed before the failure. Guessing either way
//! is wrong (taken as not made, a retry makes a second change or a
//! compensation removes what a committed record refers to; taken as made,
//! an answer claims what never happened), so the transaction's id, read
//! inside it, is looked up on a fresh connection instead.

use crate::{Error, Store};

/// The id of the transaction it runs in (`xid8`, as text).
pub(crate) const CURRENT_XID: &str = "SELECT pg_current_xact_id()::text";
/// What became of a transaction whose `COMMIT` was sent.
const STATUS: &str = "SELECT pg_xact_status($1::text::xid8)";
/// How long a lost answer's transaction may stay in progress before its
/// outcome counts as unknown: its backend ends it once it reads the
/// `COMMIT` or finds the connection gone, within the hold limit.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

impl Store {
    /// Whether transaction `xid` committed: asked on another connection,
    /// waiting while it is still in progress. `Err` when that cannot be
    /// found out (the store out of reach, or the transaction in progress
    /// past [`PATIENCE`]).
    async fn committed(&self, xid: &str) -> Result<bool, Error> {
        let started = tokio::time::Instant::now();
        loop {
            let client = self.client().await?;
            let status: Option<String> = client.query_one(STATUS, &[&xid]).await?.get(0);
            match status.as_deref() {
                Some("committed") => return Ok(true),
                Some("aborted") => return Ok(false),
                _ if started.elapsed() > PATIENCE => {
                    return Err(Error::Unavailable(format!(
                        "the outcome of transaction {xid} is unknown (still {status:?})"
                    )));
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    /// The outcome of transaction `xid` whose `COMMIT` failed with
    /// `failed`: `Ok` when it committed all the same (the answer was lost
    /// with its connection, which the caller has let go so that a pool of
    /// one has a connection to ask on); `failed` when it did not commit;
    /// [`Error::Unavailable`] when that cannot be found out.
    pub(crate) async fn found_out(&self, failed: Error, xid: &str) -> Result<(), Error> {
        if !failed.is_unavailable() {
            return Err(failed);
        }
        match self.committed(xid).await {
            Ok(true) => {
                tracing::warn!(error = %failed, "the answer to a COMMIT was lost; it was committed");
                Ok(())
            }
            Ok(false) => Err(failed),
            Err(unknown) => {
                tracing::error!(error = %failed, %unknown, "the answer to a COMMIT was lost and its outcome is unknown");
                Err(unknown)
            }
        }
    }
}
