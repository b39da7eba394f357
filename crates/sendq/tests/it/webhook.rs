//! Webhooks against a real axum server on a loopback port.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{closed_port, serve};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use estafeta_sendq::{
    ConfigError, Kind, Pending, QueueConfig, SendError, SendQueue, TransportError, TypeConfig,
    WebhookAnswer, WebhookConfig, WebhookRequest, WebhookTransport,
};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};

type Hooks = SendQueue<&'static str, WebhookRequest, WebhookTransport>;

fn hooks(config: &WebhookConfig, window: usize) -> Hooks {
    let transport = WebhookTransport::new(config).unwrap();
    SendQueue::new(
        QueueConfig::new(vec![TypeConfig::new("push", window)]),
        transport,
    )
    .unwrap()
}

/// The webhook of `body` to `url`, submitted on the host `hooks`.
fn submit(
    q: &Hooks,
    url: String,
    body: Value,
) -> Pending<&'static str, WebhookRequest, WebhookAnswer> {
    q.submit("hooks", Kind(0), WebhookRequest { url, body })
        .unwrap()
}

#[derive(Clone)]
struct Seen {
    tx: mpsc::UnboundedSender<(String, Value)>,
    answer: Arc<Semaphore>,
}

async fn record(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, &'static str) {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let _ = seen.tx.send((
        content_type,
        serde_json::from_str(&body).unwrap_or(Value::Null),
    ));
    // Wait for the test's go-ahead before answering.
    seen.answer.acquire().await.unwrap().forget();
    (StatusCode::OK, "thanks")
}

fn recorder(
    answers: usize,
) -> (
    Router,
    mpsc::UnboundedReceiver<(String, Value)>,
    Arc<Semaphore>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let answer = Arc::new(Semaphore::new(answers));
    let router = Router::new()
        .route("/hook", post(record))
        .route(
            "/fail",
            post(|| async { (StatusCode::SERVICE_UNAVAILABLE, "down") }),
        )
        .route("/hang", post(std::future::pending::<&'static str>))
        .with_state(Seen {
            tx,
            answer: Arc::clone(&answer),
        });
    (router, rx, answer)
}

#[tokio::test]
async fn a_json_post_with_a_2xx_status_is_the_answer() {
    let (router, mut seen, _) = recorder(10);
    let addr = serve(router).await;
    let q = hooks(&WebhookConfig::default(), 4);
    let body = json!({"event": "message", "database": "db-1", "count": 3});
    let answer = submit(&q, format!("http://{addr}/hook"), body.clone())
        .await
        .unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "thanks"));
    let (content_type, got) = seen.recv().await.unwrap();
    assert_eq!(content_type, "application/json");
    assert_eq!(got, body);
    q.shutdown().await;
}

#[tokio::test]
async fn any_other_status_is_an_error() {
    let (router, _, _) = recorder(0);
    let addr = serve(router).await;
    let q = hooks(&WebhookConfig::default(), 4);
    let result = submit(&q, format!("http://{addr}/fail"), json!({})).await;
    assert!(
        matches!(
            result,
            Err(SendError::Transport(TransportError::Status(503)))
        ),
        "{result:?}"
    );
    q.shutdown().await;
}

/// The host's single send slot is freed when the body is written, not when
/// the answer comes: two webhooks are both at the server before either is answered.
#[tokio::test]
async fn sent_and_answered_are_separate_events() {
    let (router, mut seen, answer) = recorder(0);
    let addr = serve(router).await;
    let q = hooks(&WebhookConfig::default(), 2);
    let first = submit(&q, format!("http://{addr}/hook"), json!({"n": 1}));
    let second = submit(&q, format!("http://{addr}/hook"), json!({"n": 2}));
    let third = submit(&q, format!("http://{addr}/hook"), json!({"n": 3}));
    let a = seen.recv().await.unwrap().1;
    let b = seen.recv().await.unwrap().1;
    assert_eq!((a["n"].as_u64(), b["n"].as_u64()), (Some(1), Some(2)));
    assert_eq!(q.stats(&"hooks", Kind(0)).unwrap().in_flight, 2);
    assert!(q.window_is_full(&"hooks", Kind(0)));
    answer.add_permits(3);
    first.await.unwrap();
    second.await.unwrap();
    third.await.unwrap();
    assert_eq!(seen.recv().await.unwrap().1["n"].as_u64(), Some(3));
    q.shutdown().await;
}

#[tokio::test]
async fn a_webhook_that_does_not_answer_in_time_fails_with_a_timeout() {
    let (router, _, _) = recorder(0);
    let addr = serve(router).await;
    let config = WebhookConfig {
        timeout: Duration::from_millis(200),
        ..WebhookConfig::default()
    };
    let q = hooks(&config, 1);
    let result = submit(&q, format!("http://{addr}/hang"), json!({})).await;
    match result {
        Err(SendError::Transport(TransportError::Http(e))) => assert!(e.is_timeout(), "{e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    q.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_webhook_or_a_bad_url_fails_with_a_typed_error() {
    let addr = closed_port().await;
    let q = hooks(&WebhookConfig::default(), 1);
    let refused = submit(&q, format!("http://{addr}/hook"), json!({})).await;
    assert!(
        matches!(refused, Err(SendError::Transport(TransportError::Http(_)))),
        "{refused:?}"
    );
    let bad = submit(&q, "not a url".into(), json!({})).await;
    assert!(
        matches!(bad, Err(SendError::Config(ConfigError::InvalidUrl { .. }))),
        "{bad:?}"
    );
    q.shutdown().await;
}
