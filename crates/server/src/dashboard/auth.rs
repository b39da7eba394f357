//! Dashboard login: the admin token, typed once into a form, opens a
//! server-side session under a random id ([`Sessions`]: in the node's
//! memory, or in the cluster's store so that a login holds on every node),
//! which travels in a cookie (`HttpOnly`, `SameSite=Strict`, `Secure` when the request came
//! over TLS through a proxy that says so in `X-Forwarded-Proto`). Each
//! session has its own CSRF token, which every state-changing form sends
//! back, and holds only while the admin token it was opened with is the
//! admin token: a rotation (or a restart with another configured token)
//! ends every session opened with the old one. The login form itself is
//! protected by a double-submit nonce, and wrong tokens go through the
//! server's one throttle for failed authentications
//! ([`AuthThrottle`](crate::throttle::AuthThrottle)).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::token::{Token, TokenHash};
use estafeta_session::BoxFuture;
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::pages::{LoginPage, PageError, render};
use crate::client_addr::ClientAddr;
use crate::state::AppState;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "estafeta_admin";
/// The login form's nonce cookie.
pub const LOGIN_COOKIE: &str = "estafeta_login";
/// A session unused this long is gone.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(8 * 3600);

/// A login session store failed (the cluster's store is unreachable).
#[derive(Debug, thiserror::Error)]
#[error("login sessions: {0}")]
pub struct LoginError(String);

/// Where login sessions are kept, by session id: each ends when unused for
/// [`IDLE_TIMEOUT`].
pub trait LoginStore: Send + Sync {
    /// Keeps a new session `id` with its `csrf` token, durably.
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>>;

    /// The CSRF token of the live session `id`, marking it used; `None` if
    /// there is none or it ended.
    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>>;

    /// Ends session `id`.
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>>;
}

/// Sessions in this node's memory (the embedded store: one node), on the
/// runtime's clock.
#[derive(Default)]
pub struct MemoryLogins {
    map: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    csrf: String,
    last_seen: Instant,
}

impl LoginStore for MemoryLogins {
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, e| now.duration_since(e.last_seen) < IDLE_TIMEOUT);
        map.insert(
            id.to_owned(),
            Entry {
                csrf: csrf.to_owned(),
                last_seen: now,
            },
        );
        Box::pin(std::future::ready(Ok(())))
    }

    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let found = match map.get_mut(id) {
            Some(e) if now.duration_since(e.last_seen) < IDLE_TIMEOUT => {
                e.last_seen = now;
                Some(e.csrf.clone())
            }
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        };
        Box::pin(std::future::ready(Ok(found)))
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Sessions in the cluster's store, by the hash of the session id; the
/// idle deadline runs on the database server's clock.
impl LoginStore for estafeta_cluster::PgLogins {
    fn create<'a>(&'a self, id: &'a str, csrf: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        Box::pin(async move {
            estafeta_cluster::PgLogins::create(self, &TokenHash::of(id).0, csrf, IDLE_TIMEOUT)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }

    fn touch<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<String>, LoginError>> {
        Box::pin(async move {
            estafeta_cluster::PgLogins::touch(self, &TokenHash::of(id).0, IDLE_TIMEOUT)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LoginError>> {
        Box::pin(async move {
            estafeta_cluster::PgLogins::remove(self, &TokenHash::of(id).0)
                .await
                .map_err(|e| LoginError(e.to_string()))
        })
    }
}

/// The logged-in sessions.
pub struct Sessions {
    store: Box<dyn LoginStore>,
}

impl Default for Sessions {
    /// In this node's memory.
    fn default() -> Self {
        Sessions::new(MemoryLogins::default())
    }
}

impl Sessions {
    /// Sessions kept in `store`.
    pub fn new(store: impl LoginStore + 'static) -> Sessions {
        Sessions {
            store: Box::new(store),
        }
    }

    /// A new session opened with the admin token whose hash is `admin`:
    /// its id and CSRF token (both random).
    pub async fn create(&self, admin: &TokenHash) -> Result<(String, String), LoginError> {
        let random = || {
            Token::generate()
                .map(|t| t.expose().to_owned())
                .map_err(|e| LoginError(e.to_string()))
        };
        let (id, csrf) = (random()?, random()?);
        // The store keeps, with the CSRF token (hex), the hash of the admin
        // token the session was opened with.
        let kept = format!("{csrf}.{}", admin.to_hex());
        self.store.create(&id, &kept).await?;
        Ok((id, csrf))
    }

    /// A live session's CSRF token and the hash of the admin token it was
    /// opened with (and marks it used).
    pub async fn touch(&self, id: &str) -> Result<Option<(String, TokenHash)>, LoginError> {
        let Some(kept) = self.store.touch(id).await? else {
            return Ok(None);
        };
        let opened_with = kept
            .split_once('.')
            .and_then(|(csrf, hash)| Some((csrf.to_owned(), TokenHash::from_hex(hash)?)));
        Ok(opened_with)
    }

    /// Ends a session.
    pub async fn remove(&self, id: &str) -> Result<(), LoginError> {
        self.store.remove(id).await
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Whether the client reached us over TLS (as a TLS-terminating proxy says).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    max_age: Option<u64>,
    secure: bool,
) -> HeaderValue {
    let mut c = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    if secure {
        c.push_str("; Secure");
    }
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Equal strings, compared in constant time.
fn same(a: &str, b: &str) -> bool {
    !a.is_empty() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A logged-in operator. Without a session, a page (GET) redirects to the
/// login form and anything else is 403.
pub struct AdminSession {
    /// The session id.
    pub id: String,
    /// The session's CSRF token, for the forms of the page.
    pub csrf: String,
}

impl AdminSession {
    /// Refuses (403) unless `given` is this session's CSRF token.
    pub fn check_csrf(&self, given: &str) -> Result<(), Refused> {
        if same(&self.csrf, given) {
            Ok(())
        } else {
            Err(Refused("missing or wrong CSRF token"))
        }
    }
}

/// A request refused (403), with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        refused(self.0)
    }
}

/// A 403 page.
pub fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, format!("403 Forbidden: {why}")).into_response()
}

impl FromRequestParts<AppState> for AdminSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            tracing::error!(error = %e, "{what} failed");
            (StatusCode::SERVICE_UNAVAILABLE, "503: try again").into_response()
        };
        let session = match cookie(&parts.headers, SESSION_COOKIE) {
            Some(id) => match state.sessions().touch(&id).await {
                Ok(Some((csrf, admin))) => match state.exchange().is_admin_hash(&admin).await {
                    Ok(true) => Some(AdminSession { id, csrf }),
                    // Opened with an admin token that is no longer the one.
                    Ok(false) => {
                        if let Err(e) = state.sessions().remove(&id).await {
                            return Err(unavailable("ending a dashboard login", &e));
                        }
                        None
                    }
                    Err(e) => return Err(unavailable("checking the admin token", &e)),
                },
                Ok(None) => None,
                Err(e) => return Err(unavailable("reading a dashboard login", &e)),
            },
            None => None,
        };
        match session {
            Some(s) => Ok(s),
            None if parts.method == Method::GET || parts.method == Method::HEAD => {
                Err(Redirect::to("/admin/login").into_response())
            }
            None => Err(refused("not logged in")),
        }
    }
}

/// `GET /admin/login`: the form, with a fresh nonce in a cookie and a field.
pub async fn login_form(headers: HeaderMap) -> Response {
    login_page(&headers, None, StatusCode::OK)
}

fn login_page(headers: &HeaderMap, error: Option<&str>, status: StatusCode) -> Response {
    let Some(nonce) = Token::generate().ok().map(|t| t.expose().to_owned()) else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no randomness available").into_response();
    };
    let page = LoginPage {
        nonce: nonce.clone(),
        error: error.map(str::to_owned),
    };
    let mut response = (status, render(&page)).into_response();
    response.headers_mut().append(
        SET_COOKIE,
        set_cookie(
            LOGIN_COOKIE,
            &nonce,
            "/admin/login",
            Some(600),
            over_tls(headers),
        ),
    );
    response
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// The admin token.
    pub token: String,
    /// The nonce of the form (also in the login cookie).
    #[serde(default)]
    pub nonce: String,
}

/// `POST /admin/login`: a session for the admin token. A client address
/// that gave wrong tokens waits between tries
/// ([`AuthThrottle`](crate::throttle::AuthThrottle)): a try before its wait
/// is over is answered 429 without looking at the token.
pub async fn login(
    State(state): State<AppState>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let now = Instant::now();
    if let Some(wait) = state.auth_throttle().wait(client, now) {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let message = format!("Too many wrong tokens from your address: try again in {secs} s.");
        let mut response = login_page(&headers, Some(&message), StatusCode::TOO_MANY_REQUESTS);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
        return response;
    }
    let expected = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if !same(&expected, &form.nonce) {
        return refused("the login form expired or came from elsewhere; reload it");
    }
    let who = match state.exchange().authenticate(form.token.trim()).await {
        Ok(who) => who,
        Err(e) => {
            let failed = PageError::unavailable("checking a dashboard login's token", &e);
            return login_page(&headers, Some(&failed.1), failed.0);
        }
    };
    if who != Some(Principal::Admin) {
        state
            .auth_throttle()
            .failed(client, now, crate::throttle::Via::Dashboard);
        // Counted, and logged in aggregate once a minute.
        tracing::debug!(%client, "dashboard login refused: not the admin token");
        return login_page(
            &headers,
            Some("That is not the admin token."),
            StatusCode::UNAUTHORIZED,
        );
    }
    state.auth_throttle().succeeded(client, now);
    let id = match state
        .sessions()
        .create(&TokenHash::of(form.token.trim()))
        .await
    {
        Ok((id, _csrf)) => id,
        Err(e) => {
            let failed = PageError::unavailable("keeping a dashboard login", &e);
            return login_page(&headers, Some(&failed.1), failed.0);
        }
    };
    tracing::info!(target: "estafeta::event", "dashboard login");
    let secure = over_tls(&headers);
    let mut response = Redirect::to("/admin").into_response();
    let h = response.headers_mut();
    h.append(
        SET_COOKIE,
        set_cookie(SESSION_COOKIE, &id, "/admin", None, secure),
    );
    h.append(
        SET_COOKIE,
        set_cookie(LOGIN_COOKIE, "", "/admin/login", Some(0), secure),
    );
    response
}

/// A form that carries only the CSRF token.
#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    /// The session's CSRF token.
    #[serde(default)]
    pub csrf: String,
}

/// `POST /admin/logout`.
pub async fn logout(
    State(state): State<AppState>,
    session: AdminSession,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(r) = session.check_csrf(&form.csrf) {
        return r.into_response();
    }
    if let Err(e) = state.sessions().remove(&session.id).await {
        tracing::error!(error = %e, "ending a dashboard login failed");
        return (StatusCode::SERVICE_UNAVAILABLE, "503: try again").into_response();
    }
    let mut response = Redirect::to("/admin/login").into_response();
    response.headers_mut().append(
        SET_COOKIE,
        set_cookie(SESSION_COOKIE, "", "/admin", Some(0), over_tls(&headers)),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1; estafeta_admin=xyz"));
        h.append(COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&h, SESSION_COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&h, "b").as_deref(), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn cookie_flags() {
        let c = set_cookie("n", "v", "/admin", None, false);
        assert_eq!(c, "n=v; Path=/admin; HttpOnly; SameSite=Strict");
        let c = set_cookie("n", "v", "/admin", Some(0), true);
        assert_eq!(
            c,
            "n=v; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0; Secure"
        );
    }

    /// What every login store does: a session is found by its id until
    /// removed, with its own CSRF token.
    async fn a_login_store_keeps_sessions(one: &Sessions, other: &Sessions) {
        let admin = TokenHash::of("the-admin-token");
        let (id, csrf) = one.create(&admin).await.unwrap();
        assert_eq!(other.touch(&id).await.unwrap(), Some((csrf.clone(), admin)));
        let (second, csrf2) = other.create(&admin).await.unwrap();
        assert_ne!((&id, &csrf), (&second, &csrf2));
        assert_eq!(one.touch("unknown").await.unwrap(), None);
        other.remove(&id).await.unwrap();
        assert_eq!(one.touch(&id).await.unwrap(), None);
        assert_eq!(one.touch(&second).await.unwrap(), Some((csrf2, admin)));
    }

    #[tokio::test]
    async fn memory_logins_keep_sessions() {
        let s = Sessions::default();
        a_login_store_keeps_sessions(&s, &s).await;
    }

    /// Two nodes' stores over one PostgreSQL: a login through one holds
    /// through the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_logins_keep_sessions_across_nodes() {
        let pg = estafeta_cluster::testing::Postgres::start().unwrap();
        let db = estafeta_cluster::Store::connect(&pg.url()).unwrap();
        db.migrate().await.unwrap();
        let a = Sessions::new(estafeta_cluster::PgLogins::new(db.clone()));
        let b = Sessions::new(estafeta_cluster::PgLogins::new(db));
        a_login_store_keeps_sessions(&a, &b).await;
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire_when_idle_and_csrf_must_match() {
        let s = Sessions::default();
        let admin = TokenHash::of("the-admin-token");
        let (id, csrf) = s.create(&admin).await.unwrap();
        assert_eq!(s.touch(&id).await.unwrap(), Some((csrf.clone(), admin)));
        tokio::time::advance(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert!(s.touch(&id).await.unwrap().is_some(), "use keeps it alive");
        tokio::time::advance(IDLE_TIMEOUT).await;
        assert_eq!(s.touch(&id).await.unwrap(), None);
        assert!(!same("", ""));
        assert!(same(&csrf, &csrf.clone()));
        let session = AdminSession { id, csrf };
        assert!(session.check_csrf("nope").is_err());
        assert!(session.check_csrf("").is_err());
    }
}
