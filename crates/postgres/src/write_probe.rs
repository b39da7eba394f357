//! [`Store::takes_writes`]: whether the database takes a write now, for a
//! node's `/readyz`. Reading would not tell: a standby, a database set
//! read-only and a server that cannot write its write-ahead log all answer
//! reads. So the probe writes: one durable commit of an update to the one
//! row of `write_probe`.

use crate::{Error, Store};

impl Store {
    /// Commits an update to `write_probe` (durably, as every write of a
    /// node is): `Ok` when the database takes writes.
    pub async fn takes_writes(&self) -> Result<(), Error> {
        let client = self.client().await?;
        client
            .execute("UPDATE write_probe SET writes = writes + 1", &[])
            .await?;
        Ok(())
    }
}
