//! Extractors that answer every bad request with the error JSON instead of
//! axum's plain-text rejections: [`Caller`] (the bearer token's principal),
//! [`ApiJson`] (a JSON body, within the size limit and the request timeout),
//! [`ApiPath`] and [`ApiQuery`], and the id parsers for path segments.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::wire::ErrorCode;
use estafeta_exchange::{Id, Presented};
use serde::de::DeserializeOwned;

use crate::body_limit::{BodyLimit, too_large};
use crate::client_addr::client_addr;
use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller: `Authorization: Bearer <token>` resolved by the
/// exchange. A missing, malformed or unknown token is 401; more than one
/// `Authorization` header is 400 (no header wins over another); an address
/// that gave too many wrong tokens is 429 for a while (see `throttled`);
/// rights are the exchange's to check (403).
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        let who = state.exchange().authenticate(token).await?;
        let who = throttled(state, parts, who.as_ref())
            .and_then(|()| who.ok_or_else(|| ApiError::unauthorized("unknown token")))?;
        state.last_seen().saw(&who, std::time::SystemTime::now());
        Ok(Caller(who))
    }
}

/// The throttle's say on a bearer token whose owner is `who` (`None`: an
/// unknown token) from the request's client address. While the address
/// waits ([`crate::throttle`]), it gets 429 for an unknown token and for
/// the admin token alike (the one token an operator may choose is never
/// tried then, and the answer tells nothing of a guess), while the random
/// tokens of databases and devices go on working: a device whose token was
/// revoked, polling from behind the same address as others, locks out
/// none of them. An unknown token is counted; the admin token starts the
/// address afresh.
fn throttled(state: &AppState, parts: &Parts, who: Option<&Principal>) -> Result<(), ApiError> {
    if matches!(who, Some(p) if *p != Principal::Admin) {
        return Ok(());
    }
    let client = client_addr(parts, state.http().trusted_proxies.as_ref());
    let throttle = state.auth_throttle();
    let now = tokio::time::Instant::now();
    if let Some(wait) = throttle.wait(client, now) {
        return Err(ApiError::too_many_attempts(wait));
    }
    match who {
        None => {
            throttle.failed(client, now, crate::throttle::Via::Bearer);
            tracing::debug!(%client, "unknown bearer token");
        }
        Some(_) => throttle.succeeded(client, now),
    }
    Ok(())
}

/// The caller of a call that takes its caller's session (an upload, an
/// acknowledgement, the processor's calls) and confirms the token inside
/// that session's step ([`Presented`]): a token the registry's copy in
/// memory knows, or else one it knows once what other servers of a shared
/// registry changed is read. The same answers as [`Caller`] for a
/// missing, malformed or unknown token.
#[derive(Debug, Clone)]
pub struct Presenting(pub Presented);

impl FromRequestParts<AppState> for Presenting {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        let presented = state.exchange().present(token).await?;
        throttled(state, parts, presented.as_ref().map(Presented::principal))?;
        let presented = presented.ok_or_else(|| ApiError::unauthorized("unknown token"))?;
        state
            .last_seen()
            .saw(presented.principal(), std::time::SystemTime::now());
        Ok(Presenting(presented))
    }
}

/// The token of the request's one `Authorization: Bearer <token>` header.
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let mut headers = parts.headers.get_all(AUTHORIZATION).iter();
    let header = headers
        .next()
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <token>"))?;
    if headers.next().is_some() {
        return Err(ApiError::bad_request(
            ErrorCode::BadRequest,
            "more than one Authorization header",
        ));
    }
    header
        .to_str()
        .ok()
        .and_then(bearer_token)
        .ok_or_else(|| ApiError::unauthorized("the Authorization header is not Bearer <token>"))
}

/// The token of a `Bearer <token>` header value (the scheme is
/// case-insensitive, RFC 9110).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The deepest nesting of arrays and objects a JSON request body may have.
/// A message body travels inside at most three levels of envelope (the
/// `messages` of a start answer or an inbox), so every document the server
/// hands out stays within the 128 levels that common JSON parsers accept.
pub const MAX_JSON_DEPTH: usize = 100;

/// A JSON request body. Malformed JSON, JSON nested deeper than
/// [`MAX_JSON_DEPTH`], a wrong `version`, a missing field, a field of the
/// wrong type or a content type other than JSON is 400; a body over its
/// route's limit ([`crate::body_limit`]) is 413; a body that does not arrive within the request
/// timeout is 408. The timeout covers only receiving the body, so an
/// exchange call, once started, is never cut off halfway.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::bad_request(
                ErrorCode::BadContentType,
                "expected a request with Content-Type: application/json",
            ));
        }
        let timeout = state.http().request_timeout;
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map_or(state.http().max_body_bytes, |l| l.0);
        let bytes = match tokio::time::timeout(timeout, Bytes::from_request(req, state)).await {
            Err(_) => return Err(ApiError::request_timeout()),
            Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(too_large(limit));
            }
            Ok(Err(rejection)) => {
                return Err(ApiError::bad_request(
                    ErrorCode::BadRequest,
                    rejection.body_text(),
                ));
            }
            Ok(Ok(bytes)) => bytes,
        };
        if nested_deeper_than(&bytes, MAX_JSON_DEPTH) {
            return Err(ApiError::bad_request(
                ErrorCode::BadJson,
                format!("the JSON is nested more than {MAX_JSON_DEPTH} levels deep"),
            ));
        }
        axum::Json::<T>::from_bytes(&bytes)
            .map(|axum::Json(value)| ApiJson(value))
            .map_err(|rejection| json_rejection(&rejection))
    }
}

/// Whether the request says its body is JSON: `application/json` or
/// `application/…+json`, parameters allowed.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case("application") && (subtype == "json" || subtype.ends_with("+json"))
}

/// Whether JSON text nests arrays and objects more than `max` levels deep
/// (brackets inside strings do not count; the text need not be valid).
fn nested_deeper_than(text: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The error answer for a JSON body that does not parse into its type.
fn json_rejection(rejection: &JsonRejection) -> ApiError {
    let code = match rejection {
        JsonRejection::JsonSyntaxError(_) => ErrorCode::BadJson,
        _ => ErrorCode::BadRequest,
    };
    ApiError::bad_request(code, rejection.body_text())
}

/// Path parameters; a segment that does not decode is 400.
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| ApiPath(v))
            .map_err(|r| ApiError::bad_request(ErrorCode::BadPath, r.body_text()))
    }
}

/// Query parameters; a bad one is 400.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|r| ApiError::bad_request(ErrorCode::BadQuery, r.body_text()))
    }
}

/// An id from a path segment (`what` names it in the message); bad is 400.
pub fn path_id(what: &str, text: &str) -> Result<Id, ApiError> {
    Id::new(text).map_err(|e| {
        ApiError::bad_request(ErrorCode::BadId, format!("bad {what} id {text:?}: {e}"))
    })
}

/// A folder name from a path segment; bad is 400.
pub fn path_folder(text: &str) -> Result<Folder, ApiError> {
    Folder::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = Folder::ALL.iter().map(|f| f.as_str()).collect();
        ApiError::bad_request(
            ErrorCode::BadFolder,
            format!("bad folder {text:?}: one of {}", names.join(", ")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn nesting_depth_skips_strings() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nested_deeper_than(nested(3).as_bytes(), 3));
        assert!(nested_deeper_than(nested(4).as_bytes(), 3));
        let in_strings = r#"{"a":"[[[[{{{{","b":"\\\"[[[[","c":[[1]]}"#;
        assert!(!nested_deeper_than(in_strings.as_bytes(), 3));
        assert!(nested_deeper_than(in_strings.as_bytes(), 2));
        assert!(
            !nested_deeper_than(b"]]]]}}}}[[", 2),
            "stray closers do not go negative"
        );
    }

    #[test]
    fn json_content_types() {
        let ok = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, v.parse().unwrap());
            json_content_type(&h)
        };
        assert!(ok("application/json"));
        assert!(ok("application/json; charset=utf-8"));
        assert!(ok("Application/JSON;charset=utf-8"));
        assert!(ok("application/cloudevents+json"));
        assert!(!ok("text/json"));
        assert!(!ok("application/jsonp"));
        assert!(!ok("json"));
        assert!(!json_content_type(&HeaderMap::new()));
    }

    #[test]
    fn path_segments() {
        assert_eq!(path_id("database", "db-a").unwrap().as_str(), "db-a");
        let e = path_id("database", "..").unwrap_err();
        assert_eq!(
            (e.status(), e.code()),
            (StatusCode::BAD_REQUEST, ErrorCode::BadId)
        );
        assert_eq!(path_folder("Log").unwrap(), Folder::Log);
        assert_eq!(path_folder("log").unwrap_err().code(), ErrorCode::BadFolder);
    }
}
