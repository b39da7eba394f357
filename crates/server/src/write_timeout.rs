//! [`WriteTimeout`]: a connection whose writes may stall only so long. A
//! client that stops reading (it pipelines requests for large answers and
//! never takes them) leaves the server's writes pending; once no byte has
//! been taken for the timeout, the write fails with `TimedOut` and the
//! connection ends, instead of holding its place and a graceful stop
//! forever. A slow reader that keeps taking bytes is not cut off.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner` with a bound on how long a write or flush may make no progress.
pub struct WriteTimeout<T> {
    inner: T,
    /// How long a write may stay pending without a byte taken.
    timeout: Duration,
    /// Running while a write is pending; cleared by progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    /// `inner`, whose writes fail once pending for `timeout` without progress.
    pub fn new(inner: T, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// What a write's poll gave: progress clears the stall; pending starts
    /// it (or goes on with it) and fails once it has run out.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stalled.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no bytes of the answer for {timeout:?}"),
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_reads_fails_after_the_timeout_and_progress_restarts_it() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = WriteTimeout::new(near, Duration::from_secs(5));
        // The pipe takes 64 bytes; then the writer waits for the reader.
        io.write_all(&[1; 64]).await.unwrap();
        let stalled = tokio::spawn(async move {
            let result = io.write_all(&[2; 64]).await;
            (io, result)
        });
        tokio::time::sleep(Duration::from_secs(4)).await;
        // Taking bytes is progress: the stall starts over.
        let mut buf = [0u8; 32];
        tokio::io::AsyncReadExt::read_exact(&mut far, &mut buf)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!stalled.is_finished(), "progress restarted the timeout");
        let (_io, result) = stalled.await.unwrap();
        let err = result.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }
}
