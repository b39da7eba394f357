//! Health probes over HTTP against a real axum server: failures past the
//! threshold mark the host down, a success marks it up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use crate::common::{closed_port, serve};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use estafeta_sendq::{
    HttpProbe, Kind, ProbeRequest, QueueConfig, SendError, SendQueue, TypeConfig,
};

const WORK: Kind = Kind(0);
const PROBE: Kind = Kind(1);

/// A server on loopback whose `path` answers with the status that the
/// returned number holds (`initial` until the test changes it).
async fn answering(path: &str, initial: u16) -> (SocketAddr, Arc<AtomicU16>) {
    let status = Arc::new(AtomicU16::new(initial));
    let router = Router::new()
        .route(
            path,
            get(|State(s): State<Arc<AtomicU16>>| async move {
                StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap()
            }),
        )
        .with_state(Arc::clone(&status));
    (serve(router).await, status)
}

/// A queue of health probes with a five-second timeout: a type `work` of
/// window `work`, and the probe type, which marks a host down after
/// `failures` in a row.
fn health_probes(work: usize, failures: u32) -> SendQueue<&'static str, ProbeRequest, HttpProbe> {
    let types = vec![
        TypeConfig::new("work", work),
        TypeConfig::probe("health", failures),
    ];
    let probe = HttpProbe::new(Duration::from_secs(5)).unwrap();
    SendQueue::new(QueueConfig::new(types), probe).unwrap()
}

#[tokio::test]
async fn failing_probes_mark_the_host_down_and_a_passing_one_marks_it_up() {
    let (addr, status) = answering("/health", 503).await;
    let q = health_probes(2, 2);
    let probe = || ProbeRequest {
        url: format!("http://{addr}/health"),
    };

    assert!(q.submit("api", PROBE, probe()).unwrap().await.is_err());
    assert_eq!(
        q.is_down(&"api"),
        Some(false),
        "one failure is below the threshold"
    );
    assert!(q.submit("api", PROBE, probe()).unwrap().await.is_err());
    assert_eq!(q.is_down(&"api"), Some(true));
    assert!(matches!(
        q.submit("api", WORK, probe()),
        Err(SendError::HostDown)
    ));

    status.store(200, Ordering::SeqCst);
    let answer = q.submit("api", PROBE, probe()).unwrap().await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(q.is_down(&"api"), Some(false));
    q.submit("api", WORK, probe()).unwrap().await.unwrap();
    q.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_host_is_marked_down() {
    let addr = closed_port().await;
    let q = health_probes(1, 1);
    let url = format!("http://{addr}/health");
    assert!(
        q.submit("api", PROBE, ProbeRequest { url })
            .unwrap()
            .await
            .is_err()
    );
    assert_eq!(q.is_down(&"api"), Some(true));
    q.shutdown().await;
}

#[tokio::test]
async fn a_reachability_probe_counts_any_answer_below_500_as_up() {
    let (addr, status) = answering("/", 404).await;
    let types = vec![TypeConfig::new("work", 2), TypeConfig::probe("health", 1)];
    let timeout = Duration::from_secs(5);
    let reach = SendQueue::new(
        QueueConfig::new(types.clone()),
        HttpProbe::reachability(timeout).unwrap(),
    )
    .unwrap();
    let health = SendQueue::new(QueueConfig::new(types), HttpProbe::new(timeout).unwrap()).unwrap();
    let probe = || ProbeRequest {
        url: format!("http://{addr}/"),
    };

    let answer = reach.submit("hook", PROBE, probe()).unwrap().await.unwrap();
    assert_eq!(answer.status, 404);
    assert_eq!(reach.is_down(&"hook"), Some(false));
    assert!(
        health
            .submit("hook", PROBE, probe())
            .unwrap()
            .await
            .is_err()
    );
    assert_eq!(
        health.is_down(&"hook"),
        Some(true),
        "a health URL must answer 2xx"
    );

    status.store(503, Ordering::SeqCst);
    assert!(reach.submit("hook", PROBE, probe()).unwrap().await.is_err());
    assert_eq!(reach.is_down(&"hook"), Some(true), "a 5xx is down");

    let closed = closed_port().await;
    let nobody = ProbeRequest {
        url: format!("http://{closed}/"),
    };
    assert!(reach.submit("gone", PROBE, nobody).unwrap().await.is_err());
    assert_eq!(reach.is_down(&"gone"), Some(true), "no answer is down");
    reach.shutdown().await;
    health.shutdown().await;
}
