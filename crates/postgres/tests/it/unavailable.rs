//! A database server that cannot be reached is an unavailable store, told
//! apart from failed I/O: the message store, the key store and the
//! session storage over PostgreSQL give the exchange's (and the session
//! engine's) "unavailable" errors when the server is down, and the
//! exchange answers them as a store unavailable (503 `storage_error`, to be
//! retried).

use estafeta_exchange::keys::{KeysError, UploadKeys};
use estafeta_exchange::store::{Folder, Location, MessageReads};
use estafeta_exchange::wire::ErrorCode;
use estafeta_exchange::{ExchangeError, Id, Timestamp};
use estafeta_postgres::testing::Postgres;
use estafeta_postgres::{PgKeys, PgMessages, SessionStorage, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_is_an_unavailable_store_not_failed_io() {
    let pg = Postgres::start().unwrap();
    let store = Store::connect(&pg.url()).unwrap();
    store.migrate().await.unwrap();
    let messages = PgMessages::new(store.clone());
    let keys = PgKeys::new(store.clone());
    let sessions = SessionStorage::open(store).await.unwrap();
    let queue = Location::new(Id::new("db-a").unwrap(), Folder::Messages);
    assert_eq!(messages.count(&queue).await.unwrap(), 0);

    pg.stop().unwrap();
    let down = messages.count(&queue).await.unwrap_err();
    assert!(down.is_unavailable(), "{down}");
    let answered = ExchangeError::from(down);
    assert!(answered.is_store_unavailable(), "{answered}");
    assert_eq!(answered.code(), ErrorCode::StorageError);

    let phone = Id::new("phone-1").unwrap();
    let down =
        tokio::task::spawn_blocking(move || keys.get(&phone, "key-1", Timestamp::from_millis(0)))
            .await
            .unwrap()
            .unwrap_err();
    assert!(matches!(down, KeysError::Unavailable(_)), "{down}");
    assert!(ExchangeError::from(down).is_store_unavailable());

    let down = tokio::task::spawn_blocking(move || {
        use estafeta_session::Storage;
        sessions.load(b"db-a")
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(
        matches!(down, estafeta_session::StorageError::Unavailable(_)),
        "{down}"
    );
    let answered = ExchangeError::from(estafeta_session::Error::Storage(down));
    assert!(answered.is_store_unavailable(), "{answered}");
}
