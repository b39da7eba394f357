//! [`Closing`]: a pooled connection inside a transaction begun by hand.

use deadpool_postgres::Object;

use crate::Error;

/// A pooled connection inside a transaction begun by hand: until the
/// `COMMIT` is answered the connection may still be inside it, so dropped
/// before (a cancelled call, an error on the way), it is closed rather
/// than handed back to the pool, and the database aborts the transaction.
pub(crate) struct Closing(Option<Object>);

impl Closing {
    /// Takes `client`, which is about to begin a transaction.
    pub(crate) fn new(client: Object) -> Closing {
        Closing(Some(client))
    }

    /// The connection.
    pub(crate) fn get(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a Closing holds its connection until kept or dropped")
    }

    /// The transaction is over: the connection goes back to the pool.
    pub(crate) fn keep(mut self) {
        drop(self.0.take());
    }

    /// Commits; the connection goes back to the pool.
    pub(crate) async fn commit(self) -> Result<(), Error> {
        self.get().batch_execute("COMMIT").await?;
        self.keep();
        Ok(())
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}
