//! [`ApiError`]: every HTTP error answer, rendered as the error JSON of
//! the HTTP API (`{"version":1,"error":{"code":"…","message":"…"}}`);
//! [`ServeError`]: why opening or serving the server failed.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use estafeta_exchange::wire::{ErrorBody, ErrorCode};
use estafeta_exchange::{ErrorKind, ExchangeError};

use crate::events::EventStoreError;
use crate::notify::NotifyError;

/// Seconds a client is asked to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u64 = 2;

/// An HTTP error answer: status, stable code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    /// The cause is a store that cannot be reached now.
    store_unavailable: bool,
    /// Seconds to wait before a retry, for a 429.
    retry_after: Option<u64>,
}

/// Marks an answer whose cause was a store that could not be reached (a
/// database server down or handing over), as opposed to failing storage:
/// the client sees the same 503 `storage_error`; the metrics count these.
#[derive(Debug, Clone, Copy)]
pub struct StoreUnavailable;

impl ApiError {
    /// An error answer with the given status, code and message.
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            store_unavailable: false,
            retry_after: None,
        }
    }

    /// 429: too many wrong tokens from the caller's address; retry after
    /// `wait` (rounded up to whole seconds).
    pub fn too_many_attempts(wait: std::time::Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        ApiError {
            retry_after: Some(secs),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TooManyAttempts,
                format!("too many wrong tokens from your address: try again in {secs} s"),
            )
        }
    }

    /// 400: the request is malformed.
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 401: no token, or one the server does not know.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, message)
    }

    /// 404: no such route.
    pub fn no_route() -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route")
    }

    /// 405: the route exists, the method does not.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::MethodNotAllowed,
            "method not allowed on this route",
        )
    }

    /// 408: the client did not send its request body in time.
    pub fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::RequestTimeout,
            "the request body did not arrive in time",
        )
    }

    /// 413: the request body is over the configured size.
    pub fn body_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BodyTooLarge,
            message,
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<ExchangeError> for ApiError {
    fn from(e: ExchangeError) -> Self {
        let status = match e.kind() {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError {
            store_unavailable: e.is_store_unavailable(),
            ..ApiError::new(status, e.code(), e.message())
        }
    }
}

/// What a client is told of a storage failure: never its detail, which
/// names files and folders of the server (the log keeps it, and says
/// whether the store could not be reached).
fn storage_answer(code: ErrorCode, detail: &str, unavailable: bool) -> Option<&'static str> {
    let answer = match code {
        ErrorCode::StorageError => "the server's storage failed; retry later",
        ErrorCode::StorageFull => "the server's storage is full; retry later",
        _ => return None,
    };
    match unavailable {
        true => tracing::error!(%code, detail, "store unavailable, answered without its detail"),
        false => tracing::error!(%code, detail, "storage failure answered without its detail"),
    }
    Some(answer)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match storage_answer(self.code, &self.message, self.store_unavailable) {
            Some(answer) => answer.to_owned(),
            None => self.message,
        };
        let body = ErrorBody::new(self.code, message);
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.store_unavailable {
            response.extensions_mut().insert(StoreUnavailable);
        }
        response
    }
}

/// Opening or serving ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The alert notifier or the pusher could not open.
    #[error("starting alert delivery failed: {0}")]
    Notify(#[from] NotifyError),
    /// The exchange could not open its data folder.
    #[error("opening the exchange failed: {0}")]
    Open(ExchangeError),
    /// The `store` setting is neither unset nor a `postgres://` URL.
    #[error(
        "the store setting must be a postgres:// (or postgresql://) URL, or unset for the embedded store"
    )]
    StoreUrl,
    /// The cluster store could not be reached or its schema brought up to
    /// date.
    #[error("opening the cluster store failed: {0}")]
    Store(#[source] estafeta_postgres::Error),
    /// A cluster node could not make its own state folder under the data
    /// folder (what `/readyz` writes to).
    #[error("making the node's folder {0} failed: {1}")]
    NodeFolder(std::path::PathBuf, #[source] std::io::Error),
    /// The event log the dashboard reads could not open.
    #[error("opening the event log failed: {0}")]
    Events(#[from] EventStoreError),
    /// The exchange could not save its state when stopping.
    #[error("stopping the exchange failed: {0}")]
    Shutdown(ExchangeError),
}

impl ServeError {
    /// Whether opening failed only because the cluster store could not be
    /// reached (no writable PostgreSQL, a connection lost mid-way): worth
    /// trying again, as opposed to a refusal that will repeat.
    pub fn is_store_unavailable(&self) -> bool {
        match self {
            ServeError::Store(e) => e.is_unavailable(),
            ServeError::Open(e) => e.is_store_unavailable(),
            ServeError::Notify(NotifyError::Repeat(estafeta_repeat::StoreError::Backend(e))) => e
                .downcast_ref::<estafeta_postgres::Error>()
                .is_some_and(estafeta_postgres::Error::is_unavailable),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    async fn render(e: ApiError) -> (StatusCode, Option<String>, serde_json::Value) {
        render_response(e.into_response()).await
    }

    async fn render_response(r: Response) -> (StatusCode, Option<String>, serde_json::Value) {
        let status = r.status();
        let retry = r
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn exchange_errors_keep_their_kind_code_and_message() {
        let cases = [
            (ErrorKind::BadRequest, 400),
            (ErrorKind::Unauthorized, 401),
            (ErrorKind::Forbidden, 403),
            (ErrorKind::NotFound, 404),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Unprocessable, 422),
            (ErrorKind::Unavailable, 503),
        ];
        for (kind, code) in cases {
            let e = ExchangeError::new(kind, ErrorCode::NotInDoubt, "some text");
            let (status, retry, json) = render(e.into()).await;
            assert_eq!(status.as_u16(), code);
            assert_eq!(retry.is_some(), code == 503);
            assert_eq!(
                json,
                serde_json::json!({"version":1,"error":{"code":"not_in_doubt","message":"some text"}})
            );
        }
    }

    /// A store that cannot be reached and failing storage give the client
    /// the same answer; only the first is marked for the metrics.
    #[tokio::test]
    async fn an_unavailable_store_is_a_storage_error_marked_for_the_metrics() {
        let down = ExchangeError::store_unavailable("store unavailable at postgres:put: refused");
        let disk = ExchangeError::new(
            ErrorKind::Unavailable,
            ErrorCode::StorageError,
            "storage I/O failed at /data/x: EIO",
        );
        for (e, marked) in [(down, true), (disk, false)] {
            let r = ApiError::from(e).into_response();
            assert_eq!(r.extensions().get::<StoreUnavailable>().is_some(), marked);
            let (status, retry, json) = render_response(r).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(retry.as_deref(), Some("2"));
            assert_eq!(
                json,
                serde_json::json!({"version":1,"error":{"code":"storage_error","message":"the server's storage failed; retry later"}})
            );
        }
    }

    #[tokio::test]
    async fn unauthorized_names_the_scheme() {
        let r = ApiError::unauthorized("no token").into_response();
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
