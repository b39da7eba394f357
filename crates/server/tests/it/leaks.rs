//! What the server keeps to itself: a storage failure answers a client
//! with its code and no file or folder of the server.

use crate::common::broken_folder::BrokenFolder;
use crate::common::{Tenancy, TestServer, message};
use estafeta_client::ClientError;

#[tokio::test]
async fn a_storage_failure_answers_without_a_server_path() {
    let server = TestServer::start().await;
    let t = Tenancy::provision(&server.admin).await;
    // The database's queue cannot take files: the upload fails on storage.
    let queue = server.data.path().join("db-a/Messages");
    let _broken = BrokenFolder::new(&queue);
    let err = t
        .phone1
        .send(&message("db-a", r#"{"order":1}"#, None))
        .await
        .unwrap_err();
    let ClientError::Api {
        status,
        code,
        message,
        ..
    } = err
    else {
        panic!("an API error: {err:?}");
    };
    assert_eq!(status.as_u16(), 503);
    assert_eq!(code, "storage_error");
    let data = server.data.path().display().to_string();
    assert!(!message.contains(&data), "{message}");
    assert!(!message.contains("db-a/Messages"), "{message}");
    assert!(!message.contains('/'), "no path at all: {message}");
}
