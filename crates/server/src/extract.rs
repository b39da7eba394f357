//! Extractors that answer every bad request with the error JSON instead of
//! axum's plain-text rejections: [`Caller`] (the bearer token's principal),
//! [`ApiJson`] (a JSON body, within the size limit and the request timeout),
//! [`ApiPath`] and [`ApiQuery`], and the id parsers for path segments.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use estafeta_exchange::Id;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::tenancy::Principal;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller: `Authorization: Bearer <token>` resolved by the
/// exchange. A missing, malformed or unknown token is 401; more than one
/// `Authorization` header is 400 (no header wins over another); rights are
/// the exchange's to check (403).
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let mut headers = parts.headers.get_all(AUTHORIZATION).iter();
        let header = headers
            .next()
            .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <token>"))?;
        if headers.next().is_some() {
            return Err(ApiError::bad_request(
                "bad_request",
                "more than one Authorization header",
            ));
        }
        let token = header.to_str().ok().and_then(bearer_token).ok_or_else(|| {
            ApiError::unauthorized("the Authorization header is not Bearer <token>")
        })?;
        let who = state
            .exchange()
            .authenticate(token)
            .ok_or_else(|| ApiError::unauthorized("unknown token"))?;
        state.last_seen().saw(&who, std::time::SystemTime::now());
        Ok(Caller(who))
    }
}

/// The token of a `Bearer <token>` header value (the scheme is
/// case-insensitive, RFC 9110).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A JSON request body. Malformed JSON, a wrong `version`, a missing field,
/// a field of the wrong type or a content type other than JSON is 400; a
/// body over the configured size is 413; a body that does not arrive within
/// the request timeout is 408. The timeout covers only receiving the body,
/// so an exchange call, once started, is never cut off halfway.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let timeout = state.http().request_timeout;
        match tokio::time::timeout(timeout, axum::Json::<T>::from_request(req, state)).await {
            Err(_) => Err(ApiError::request_timeout()),
            Ok(Ok(axum::Json(value))) => Ok(ApiJson(value)),
            Ok(Err(rejection)) => Err(json_rejection(&rejection, state)),
        }
    }
}

/// The error answer for a JSON rejection.
fn json_rejection(rejection: &JsonRejection, state: &AppState) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::body_too_large(format!(
            "the request body is larger than {} bytes",
            state.http().max_body_bytes
        ));
    }
    let code = match rejection {
        JsonRejection::MissingJsonContentType(_) => "bad_content_type",
        JsonRejection::JsonSyntaxError(_) => "bad_json",
        _ => "bad_request",
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
            .map_err(|r| ApiError::bad_request("bad_path", r.body_text()))
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
            .map_err(|r| ApiError::bad_request("bad_query", r.body_text()))
    }
}

/// An id from a path segment (`what` names it in the message); bad is 400.
pub fn path_id(what: &str, text: &str) -> Result<Id, ApiError> {
    Id::new(text)
        .map_err(|e| ApiError::bad_request("bad_id", format!("bad {what} id {text:?}: {e}")))
}

/// A folder name from a path segment; bad is 400.
pub fn path_folder(text: &str) -> Result<Folder, ApiError> {
    Folder::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = Folder::ALL.iter().map(|f| f.as_str()).collect();
        ApiError::bad_request(
            "bad_folder",
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
    fn path_segments() {
        assert_eq!(path_id("database", "db-a").unwrap().as_str(), "db-a");
        let e = path_id("database", "..").unwrap_err();
        assert_eq!((e.status(), e.code()), (StatusCode::BAD_REQUEST, "bad_id"));
        assert_eq!(path_folder("Log").unwrap(), Folder::Log);
        assert_eq!(path_folder("log").unwrap_err().code(), "bad_folder");
    }
}
