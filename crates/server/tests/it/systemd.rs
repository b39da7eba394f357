//! The binary under a `Type=notify` systemd unit: it says `READY=1` on
//! `NOTIFY_SOCKET` only once start-up recovery is done (so `/readyz` already
//! answers 200 when systemd hears it), and `STOPPING=1` when asked to stop.

use std::time::Duration;

use crate::common::Binary;
use estafeta_client::Client;
use tokio::net::UnixDatagram;

/// Waits for the next datagram on the notify socket; the deadline only
/// stops a broken test from hanging, it is not what the test checks.
async fn next_state(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(60), socket.recv(&mut buf))
        .await
        .expect("no notification from the server")
        .unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

#[tokio::test]
async fn tells_systemd_ready_after_recovery_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let data = dir.path().join("data");
    let server = Binary::serve(
        dir.path(),
        &data,
        &[],
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())],
    )
    .await;

    assert_eq!(next_state(&socket).await, "READY=1\n");
    let probe = Client::new(&server.base, "unused").unwrap();
    assert!(
        probe.readyz().await.unwrap(),
        "READY=1 came before /readyz answered 200"
    );

    let exit = tokio::spawn(server.terminate());
    assert_eq!(next_state(&socket).await, "STOPPING=1\n");
    assert_eq!(exit.await.unwrap(), Some(0));
}
