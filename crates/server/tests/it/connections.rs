//! Connections that hold on: the connection cap and its reserve for the
//! operator, the write timeout, the idle timeout and the bounded graceful
//! stop, against the real binary over real sockets. Every wait is bounded
//! by [`PATIENCE`]: a guard against a hang, not what the tests measure.

use std::net::SocketAddr;
use std::path::Path;

use crate::common;
use crate::common::raw::{head, read_answer, send_raw};
use crate::common::{ADMIN_TOKEN, Binary, PATIENCE, estafeta_after, wait_ready};
use estafeta_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Starts the binary on a new data folder under `dir` with the test admin
/// token, `env` and at most `open_files` open files.
async fn serve(dir: &Path, open_files: u32, env: &[(&str, &str)]) -> Binary {
    let cmd = estafeta_after(dir, &format!("ulimit -n {open_files}"));
    let mut env = env.to_vec();
    env.push(("ESTAFETA_ADMIN_TOKEN", ADMIN_TOKEN));
    let server = Binary::serve_as(cmd, None, &dir.join("data"), &[], &env).await;
    wait_ready(&Client::new(&server.base, "").unwrap()).await;
    server
}

#[tokio::test]
async fn past_the_connection_cap_health_readiness_and_the_admin_api_still_answer() {
    let dir = tempfile::tempdir().unwrap();
    // 256 open files, and ten minutes for a request head: the half-sent
    // heads below hold their connections for the whole test unless the
    // server refuses them (and the stop closes them after a second).
    let env = [
        ("ESTAFETA_REQUEST_TIMEOUT", "10m"),
        ("ESTAFETA_STOP_TIMEOUT", "1s"),
    ];
    let server = serve(dir.path(), 256, &env).await;
    let mut stalled = Vec::new();
    for _ in 0..300 {
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        // A refused connection may already be closed: its write may fail.
        let _ = tcp
            .write_all(b"GET /v1/inbox HTTP/1.1\r\nhost: x\r\n")
            .await;
        stalled.push(tcp);
    }
    let answer = send_raw(server.addr, head("GET", "/healthz", &[]).as_bytes()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = send_raw(server.addr, head("GET", "/readyz", &[]).as_bytes()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let stats = head(
        "GET",
        "/v1/admin/stats",
        &[format!("authorization: Bearer {ADMIN_TOKEN}")],
    );
    let answer = send_raw(server.addr, stats.as_bytes()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // Past the cap, the other routes are refused until places free up.
    let answer = send_raw(server.addr, head("GET", "/v1/inbox", &[]).as_bytes()).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.error_code(), "too_busy");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
    // The stalled clients do not hold the stop either.
    assert_eq!(terminate(server).await, Some(0));
    drop(stalled);
}

/// A reply of about `mb` megabytes in `phone-1`'s inbox; the token that
/// reads it.
async fn large_inbox(server: &Binary, mb: usize) -> String {
    let admin = Client::new(&server.base, ADMIN_TOKEN).unwrap();
    let reply = format!(r#"{{"pad":"{}"}}"#, "x".repeat(mb << 20));
    common::reply_waiting(&admin, &reply).await
}

/// A client that pipelines three requests for its inbox (an answer larger
/// than every buffer between it and the server) and never reads; returns
/// once the answer has begun to arrive, so that the server is writing it.
async fn stuck_reader(addr: SocketAddr, token: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    let request = head(
        "GET",
        "/v1/inbox",
        &[format!("authorization: Bearer {token}")],
    );
    tcp.write_all(request.repeat(3).as_bytes()).await.unwrap();
    tokio::time::timeout(PATIENCE, tcp.readable())
        .await
        .expect("the answer did not begin")
        .unwrap();
    tcp
}

/// SIGTERM, then the exit code; a stop that does not end fails the test.
async fn terminate(server: Binary) -> Option<i32> {
    tokio::time::timeout(PATIENCE, server.terminate())
        .await
        .expect("the server did not stop")
}

/// What is left to read on `tcp`, up to its end.
async fn rest(mut tcp: TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut bytes)).await;
    // A reset (unread requests left behind) ends the read as well.
    let _ = read.expect("the connection did not end");
    bytes
}

#[tokio::test]
async fn clients_that_stop_reading_are_cut_off_by_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // The stop would wait ten minutes: only the write timeout ends them.
    let env = [
        ("ESTAFETA_WRITE_TIMEOUT", "1s"),
        ("ESTAFETA_STOP_TIMEOUT", "10m"),
    ];
    let server = serve(dir.path(), 1024, &env).await;
    const MB: usize = 16;
    let phone = large_inbox(&server, MB).await;
    let mut stuck = Vec::new();
    for _ in 0..3 {
        stuck.push(stuck_reader(server.addr, &phone).await);
    }
    assert_eq!(terminate(server).await, Some(0));
    for tcp in stuck {
        let received = rest(tcp).await.len();
        assert!(
            received < MB << 20,
            "{received} bytes: the answer went out whole"
        );
    }
}

#[tokio::test]
async fn a_graceful_stop_ends_within_its_bound_whatever_the_clients_do() {
    let dir = tempfile::tempdir().unwrap();
    // The write timeout would wait ten minutes: only the stop's bound ends them.
    let env = [
        ("ESTAFETA_WRITE_TIMEOUT", "10m"),
        ("ESTAFETA_STOP_TIMEOUT", "1s"),
    ];
    let server = serve(dir.path(), 1024, &env).await;
    let phone = large_inbox(&server, 16).await;
    let mut stuck = Vec::new();
    for _ in 0..3 {
        stuck.push(stuck_reader(server.addr, &phone).await);
    }
    // Half-sent heads and an idle kept-alive connection beside them.
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(head("GET", "/healthz", &[]).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut idle).await.status, 200);
    assert_eq!(terminate(server).await, Some(0));
    drop((stuck, half, idle));
}

#[tokio::test]
async fn a_kept_alive_connection_without_a_request_is_closed_after_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), 1024, &[("ESTAFETA_REQUEST_TIMEOUT", "1s")]).await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(head("GET", "/healthz", &[]).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut tcp).await.status, 200);
    // Idle after its answer: the server closes it on its own.
    let rest = rest(tcp).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    terminate(server).await;
}
