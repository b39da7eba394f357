//! What the HTTP transports share: the client, a request body that reports
//! when it has been written out (the queue's *sent* event), and reading the
//! answer.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use reqwest::header::CONTENT_LENGTH;
use tokio::sync::oneshot;

use crate::error::{ConfigError, SendError, TransportError};
use crate::transport::Reply;

/// Most bytes of an answer body kept in [`HttpAnswer::body`].
const ANSWER_LIMIT: usize = 64 * 1024;

/// A 2xx answer from an HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The answer body as text (lossy UTF-8), cut at 64 KiB.
    pub body: String,
}

/// Builds a client with the given timeouts, resolving host names through
/// `resolver` when one is given (else the system's resolver). Redirects
/// are never followed: a `3xx` is the answer (an error for a webhook or a
/// gateway), so a target cannot send the request on to an address its own
/// URL was checked against.
pub(crate) fn client(
    connect_timeout: Duration,
    resolver: Option<std::sync::Arc<dyn reqwest::dns::Resolve>>,
) -> Result<reqwest::Client, ConfigError> {
    let builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none());
    match resolver {
        Some(r) => builder.dns_resolver(r),
        None => builder,
    }
    .build()
    .map_err(|e| ConfigError::Invalid {
        what: "HTTP client",
        reason: e.to_string(),
    })
}

/// Checks that a URL parses, so a bad one fails as a configuration error.
pub(crate) fn parse_url(url: &str) -> Result<reqwest::Url, ConfigError> {
    reqwest::Url::parse(url).map_err(|e| ConfigError::InvalidUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })
}

/// Sends a request with a body: resolves once the body has been handed to
/// the connection (the sent event) and answers `reply` from a task of its
/// own when the response arrives, so the host can take its next send meanwhile.
pub(crate) async fn send_with_body(
    request: reqwest::RequestBuilder,
    body: Vec<u8>,
    reply: Reply<HttpAnswer>,
) -> Result<(), SendError> {
    let (written, was_written) = oneshot::channel();
    let len = body.len();
    let request = request
        .header(CONTENT_LENGTH, len)
        .body(reqwest::Body::wrap(SignalBody {
            data: Some(Bytes::from(body)),
            len,
            written: Some(written),
        }));
    tokio::spawn(async move { reply.answer(exchange(request).await) });
    // Resolves when the body is written, or dropped unwritten (the request
    // failed first; its error then comes through the reply).
    let _ = was_written.await;
    Ok(())
}

/// Sends a request without a body and waits for the answer: the sent event
/// and the answer are one here.
pub(crate) async fn send_without_body(
    request: reqwest::RequestBuilder,
    reply: Reply<HttpAnswer>,
) -> Result<(), SendError> {
    reply.answer(exchange(request).await);
    Ok(())
}

async fn exchange(request: reqwest::RequestBuilder) -> Result<HttpAnswer, SendError> {
    let mut response = request.send().await.map_err(TransportError::Http)?;
    let status = response.status();
    if !status.is_success() {
        return Err(TransportError::Status(status.as_u16()).into());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(TransportError::Http)? {
        let room = ANSWER_LIMIT - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == ANSWER_LIMIT {
            break;
        }
    }
    Ok(HttpAnswer {
        status: status.as_u16(),
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A one-chunk request body that signals once the connection has taken it
/// all, or when it is dropped.
struct SignalBody {
    data: Option<Bytes>,
    len: usize,
    written: Option<oneshot::Sender<()>>,
}

impl SignalBody {
    fn signal(&mut self) {
        if let Some(tx) = self.written.take() {
            let _ = tx.send(());
        }
    }
}

impl Body for SignalBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.data.take() {
            Some(data) => {
                self.len = 0;
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => {
                self.signal();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len as u64)
    }
}

impl Drop for SignalBody {
    fn drop(&mut self) {
        self.signal();
    }
}
