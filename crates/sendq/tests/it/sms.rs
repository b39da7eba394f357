//! SMS through an HTTP gateway: a real axum server on loopback plays the gateway.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::common::serve;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use estafeta_sendq::{
    HttpAnswer, Kind, QueueConfig, SendError, SendQueue, SmsConfig, SmsMessage, SmsTransport,
    TransportError, TypeConfig,
};
use tokio::sync::mpsc;

type Gateway = mpsc::UnboundedSender<(String, String)>;

/// A gateway on loopback that tells what it got at `/json` (the content
/// type and body) and `/get` (the recipient and text), and refuses at
/// `/busy`; its address.
async fn gateway() -> (SocketAddr, mpsc::UnboundedReceiver<(String, String)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let router = Router::new()
        .route(
            "/json",
            post(
                |State(tx): State<Gateway>, headers: HeaderMap, body: String| async move {
                    let ct = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default();
                    let _ = tx.send((ct.to_owned(), body));
                    "queued"
                },
            ),
        )
        .route(
            "/get",
            get(
                |State(tx): State<Gateway>, Query(q): Query<HashMap<String, String>>| async move {
                    let _ = tx.send((q["to"].clone(), q["msg"].clone()));
                    "queued"
                },
            ),
        )
        .route(
            "/busy",
            post(|| async { (StatusCode::TOO_MANY_REQUESTS, "slow down") }),
        )
        .with_state(tx);
    (serve(router).await, rx)
}

fn queue(config: SmsConfig) -> SendQueue<&'static str, SmsMessage, SmsTransport> {
    let transport = SmsTransport::new(config).unwrap();
    SendQueue::new(QueueConfig::new(vec![TypeConfig::new("sms", 1)]), transport).unwrap()
}

/// Sends [`sms`] through `q`.
async fn send_sms(
    q: &SendQueue<&'static str, SmsMessage, SmsTransport>,
) -> Result<HttpAnswer, SendError> {
    q.submit("gw", Kind(0), sms()).unwrap().await
}

fn sms() -> SmsMessage {
    SmsMessage {
        recipient: "+7 900 123-45-67".into(),
        text: "Процесс 7 \"в сомнении\" & {text}\n".into(),
    }
}

#[tokio::test]
async fn a_json_body_template_carries_recipient_and_text() {
    let (addr, mut got) = gateway().await;
    let q = queue(SmsConfig {
        url: format!("http://{addr}/json"),
        ..SmsConfig::default()
    });
    let answer = send_sms(&q).await.unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "queued"));
    let (content_type, body) = got.recv().await.unwrap();
    assert_eq!(content_type, "application/json");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["to"], sms().recipient);
    assert_eq!(body["text"], sms().text);
    q.shutdown().await;
}

#[tokio::test]
async fn a_get_gateway_gets_recipient_and_text_in_the_query() {
    let (addr, mut got) = gateway().await;
    let q = queue(SmsConfig {
        url: format!("http://{addr}/get?to={{recipient}}&msg={{text}}"),
        method: "GET".into(),
        body: None,
        ..SmsConfig::default()
    });
    send_sms(&q).await.unwrap();
    assert_eq!(got.recv().await.unwrap(), (sms().recipient, sms().text));
    q.shutdown().await;
}

#[tokio::test]
async fn a_form_body_is_percent_encoded() {
    let router = Router::new().route(
        "/form",
        post(
            |axum::Form(form): axum::Form<HashMap<String, String>>| async move {
                format!("{}|{}", form["to"], form["text"])
            },
        ),
    );
    let addr = serve(router).await;
    let q = queue(SmsConfig {
        url: format!("http://{addr}/form"),
        body: Some("to={recipient}&text={text}".into()),
        content_type: "application/x-www-form-urlencoded".into(),
        ..SmsConfig::default()
    });
    let answer = send_sms(&q).await.unwrap();
    assert_eq!(answer.body, format!("{}|{}", sms().recipient, sms().text));
    q.shutdown().await;
}

#[tokio::test]
async fn a_gateway_refusal_is_an_error() {
    let (addr, _) = gateway().await;
    let q = queue(SmsConfig {
        url: format!("http://{addr}/busy"),
        ..SmsConfig::default()
    });
    let result = send_sms(&q).await;
    assert!(
        matches!(
            result,
            Err(SendError::Transport(TransportError::Status(429)))
        ),
        "{result:?}"
    );
    q.shutdown().await;
}
