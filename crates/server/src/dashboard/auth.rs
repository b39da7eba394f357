//! Dashboard login: the admin token, typed once into a form, opens a
//! server-side session under a random id ([`Logins`](super::logins::Logins)),
//! which travels in a cookie (`HttpOnly`, `SameSite=Strict`, `Secure` when
//! the request came over TLS through a proxy that says so in `X-Forwarded-Proto`). Each
//! session has its own CSRF token, which every state-changing form sends
//! back, and holds only while the admin token it was opened with is the
//! admin token: a rotation (or a restart with another configured token)
//! ends every session opened with the old one. The login form itself is
//! protected by a double-submit nonce, and wrong tokens go through the
//! server's one throttle for failed authentications
//! ([`AuthThrottle`](crate::throttle::AuthThrottle)).

use askama::Template;
use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use estafeta_exchange::tenancy::Principal;
use estafeta_exchange::token::{Token, TokenHash};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::page::{PageError, render};
use crate::client_addr::ClientAddr;
use crate::state::AppState;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "estafeta_admin";
/// The login form's nonce cookie.
pub const LOGIN_COOKIE: &str = "estafeta_login";
/// The login form.
#[derive(Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// The double-submit nonce.
    pub nonce: String,
    /// Why the last try failed.
    pub error: Option<String>,
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
            Some(id) => match state.logins().touch(&id).await {
                Ok(Some((csrf, admin))) => match state.exchange().is_admin_hash(&admin).await {
                    Ok(true) => Some(AdminSession { id, csrf }),
                    // Opened with an admin token that is no longer the one.
                    Ok(false) => {
                        if let Err(e) = state.logins().remove(&id).await {
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
        .logins()
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
    if let Err(e) = state.logins().remove(&session.id).await {
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
    use crate::dashboard::logins::Logins;

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

    #[tokio::test]
    async fn csrf_must_match() {
        let (id, csrf) = Logins::default()
            .create(&TokenHash::of("the-admin-token"))
            .await
            .unwrap();
        assert!(!same("", ""));
        assert!(same(&csrf, &csrf.clone()));
        let session = AdminSession { id, csrf };
        assert!(session.check_csrf("nope").is_err());
        assert!(session.check_csrf("").is_err());
    }
}
