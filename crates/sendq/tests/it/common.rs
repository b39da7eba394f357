//! Shared test harness: a transport the test drives by hand, a recorder of
//! completions, and helpers to let the queue's tasks run until idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use estafeta_sendq::{Done, Kind, QueueConfig, Reply, Request, SendError, SendQueue, Transport};
use tokio::sync::{mpsc, oneshot};

/// The host key used by the queue tests.
pub(crate) type Host = &'static str;

/// One call of [`Manual::send`], handed to the test.
pub(crate) struct Call {
    pub(crate) host: Host,
    pub(crate) kind: Kind,
    pub(crate) payload: u32,
    /// Answer through this; keep it to leave the entry unanswered.
    pub(crate) reply: Reply<u32>,
    /// When writes are held: send on this to finish writing (the sent event).
    pub(crate) written: Option<oneshot::Sender<()>>,
}

/// A transport driven by the test: every send is handed over as a [`Call`].
pub(crate) struct Manual {
    calls: mpsc::UnboundedSender<Call>,
    hold_writes: bool,
    writing: Arc<Mutex<HashMap<Host, (usize, usize)>>>,
}

impl Manual {
    /// Sends resolve at once (written at once); answers wait for the test.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Call>) {
        Self::build(false)
    }

    /// Sends stay "being written" until the test fires [`Call::written`].
    pub(crate) fn holding_writes() -> (Self, mpsc::UnboundedReceiver<Call>) {
        Self::build(true)
    }

    fn build(hold_writes: bool) -> (Self, mpsc::UnboundedReceiver<Call>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let transport = Self {
            calls: tx,
            hold_writes,
            writing: Arc::default(),
        };
        (transport, rx)
    }

    /// Per host: (sends being written now, the most ever written at once).
    pub(crate) fn max_writing(&self) -> Arc<Mutex<HashMap<Host, (usize, usize)>>> {
        Arc::clone(&self.writing)
    }
}

impl Transport<Host, u32> for Manual {
    type Answer = u32;

    async fn send(
        &self,
        request: Request<'_, Host, u32>,
        reply: Reply<u32>,
    ) -> Result<(), SendError> {
        {
            let mut w = self.writing.lock().unwrap();
            let slot = w.entry(*request.host).or_default();
            slot.0 += 1;
            slot.1 = slot.1.max(slot.0);
        }
        let (written, wait) = if self.hold_writes {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let call = Call {
            host: request.host,
            kind: request.kind,
            payload: *request.payload,
            reply,
            written,
        };
        let _ = self.calls.send(call);
        if let Some(wait) = wait {
            let _ = wait.await;
        }
        self.writing
            .lock()
            .unwrap()
            .entry(*request.host)
            .or_default()
            .0 -= 1;
        Ok(())
    }
}

/// A queue of `config` over `manual` (a [`Manual`] transport and its
/// calls), the calls, and a recorder for the queue's completions.
pub(crate) fn queue_over(
    (transport, calls): (Manual, mpsc::UnboundedReceiver<Call>),
    config: QueueConfig,
) -> (
    SendQueue<Host, u32, Manual>,
    mpsc::UnboundedReceiver<Call>,
    Recorder,
) {
    let q = SendQueue::new(config, transport).unwrap();
    (q, calls, Recorder::new())
}

/// What an [`Answering`] transport does with each payload and its reply.
type Answer = dyn Fn(u32, Reply<u32>) -> Result<(), SendError> + Send + Sync;

/// A transport that deals with each send at once, from the sending task, as
/// its function says: for the tests whose transport is a few lines.
pub(crate) struct Answering(Box<Answer>);

impl Answering {
    pub(crate) fn new(
        answer: impl Fn(u32, Reply<u32>) -> Result<(), SendError> + Send + Sync + 'static,
    ) -> Self {
        Self(Box::new(answer))
    }

    /// Answers every request at once with its payload.
    pub(crate) fn echo() -> Self {
        Self::new(|payload, reply| {
            reply.answer(Ok(payload));
            Ok(())
        })
    }
}

impl Transport<Host, u32> for Answering {
    type Answer = u32;

    async fn send(&self, req: Request<'_, Host, u32>, reply: Reply<u32>) -> Result<(), SendError> {
        (self.0)(*req.payload, reply)
    }
}

/// What a completion saw: the payload and the outcome in short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) host: Host,
    pub(crate) payload: u32,
    pub(crate) result: Result<u32, String>,
}

/// Short names for errors, for compact assertions.
pub(crate) fn short(e: &SendError) -> String {
    match e {
        SendError::HostDown => "host down".into(),
        SendError::Busy => "busy".into(),
        SendError::ConnectionAborted => "aborted".into(),
        SendError::Expired => "expired".into(),
        SendError::HostRemoved => "removed".into(),
        SendError::Transport(t) => format!("transport: {t}"),
        SendError::Config(c) => format!("config: {c}"),
        SendError::ShuttingDown => "shutdown".into(),
    }
}

/// Collects completions in the order the finalizer ran them.
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<Outcome>,
    pub(crate) rx: mpsc::UnboundedReceiver<Outcome>,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self { tx, rx }
    }

    /// A completion callback that records into this recorder.
    pub(crate) fn callback(&self) -> impl FnOnce(Done<Host, u32, u32>) + Send + 'static {
        let tx = self.tx.clone();
        move |done| {
            let _ = tx.send(Outcome {
                host: done.host,
                payload: done.payload,
                result: done.result.map_err(|e| short(&e)),
            });
        }
    }

    /// Everything recorded so far.
    pub(crate) fn drain(&mut self) -> Vec<Outcome> {
        let mut out = Vec::new();
        while let Ok(o) = self.rx.try_recv() {
            out.push(o);
        }
        out
    }
}

/// Lets every task of a paused current-thread runtime run until all are
/// idle: the paused clock only moves on when nothing else can run.
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// Takes every call made so far.
pub(crate) fn drain_calls(rx: &mut mpsc::UnboundedReceiver<Call>) -> Vec<Call> {
    let mut out = Vec::new();
    while let Ok(c) = rx.try_recv() {
        out.push(c);
    }
    out
}

/// Payloads of calls, for order assertions.
pub(crate) fn payloads(calls: &[Call]) -> Vec<u32> {
    calls.iter().map(|c| c.payload).collect()
}

/// Serves `router` on a port-0 loopback listener; returns its address.
pub(crate) async fn serve(router: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A loopback address with nothing listening on it.
pub(crate) async fn closed_port() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
