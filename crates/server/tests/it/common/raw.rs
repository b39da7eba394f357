//! Raw HTTP/1.1 over a socket, for requests the typed clients cannot make
//! (half-sent heads, pipelines, made-up methods) and answers read byte by
//! byte.

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::PATIENCE;

/// An answer read off a socket: status, headers (lower-case names), body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {self:?}"))
    }

    pub(crate) fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Reads one answer from `tcp`. A server that does not answer fails the
/// test after [`PATIENCE`] rather than hanging it.
pub(crate) async fn read_answer(tcp: &mut (impl AsyncRead + Unpin)) -> Answer {
    tokio::time::timeout(PATIENCE, read_answer_inner(tcp))
        .await
        .expect("the server did not answer")
}

async fn read_answer_inner(tcp: &mut (impl AsyncRead + Unpin)) -> Answer {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before an answer: {bytes:?}");
        bytes.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = bytes[head_end + 4..].to_vec();
    while body.len() < length {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed in the answer's body");
        body.extend_from_slice(&buf[..n]);
    }
    Answer {
        status: status.parse().unwrap(),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends `bytes` on a new connection to `addr` and reads the answer.
pub(crate) async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    read_answer(&mut tcp).await
}

/// A request head (no body) with the given extra header lines.
pub(crate) fn head(method: &str, path: &str, extra: &[String]) -> String {
    let mut h = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\n");
    for line in extra {
        h.push_str(line);
        h.push_str("\r\n");
    }
    h.push_str("\r\n");
    h
}

/// Sends `bytes` on a new connection to `addr` while reading the answer,
/// for a server that answers before it has read them all (and may close
/// the connection on the rest).
pub(crate) async fn send_while_answered(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let (mut read, mut write) = TcpStream::connect(addr).await.unwrap().into_split();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        // The server may stop reading once it has answered.
        let _ = write.write_all(&bytes).await;
        write
    });
    let answer = read_answer(&mut read).await;
    writer.abort();
    answer
}
