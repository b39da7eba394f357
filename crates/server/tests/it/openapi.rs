//! The OpenAPI document and the router agree: every path the server's
//! router serves (the dashboard's HTML pages aside) is in the document with
//! exactly the methods the router answers, and every operation of the
//! document is routed.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::open_server;
use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, StatusCode};
use estafeta_server::app;
use estafeta_server::openapi::document;
use serde_json::Value;
use tower::ServiceExt;

/// The methods a route may have.
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
];

/// The path templates the router matches. axum lists its routes nowhere
/// but in its `Debug` output, where each path template is a quoted string;
/// the fallback's own routes come after `fallback_router`.
fn served_paths(router: &axum::Router) -> BTreeSet<String> {
    let debug = format!("{router:?}");
    let (routes, _fallback) = debug
        .split_once("fallback_router")
        .unwrap_or_else(|| panic!("axum's Debug output changed: {debug}"));
    let paths: BTreeSet<String> = routes
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with('/'))
        .map(str::to_owned)
        .collect();
    assert!(
        paths.contains("/healthz") && paths.contains("/admin/login"),
        "axum's Debug output no longer lists the routes: {routes}"
    );
    paths
}

/// The dashboard's pages, which are not part of the JSON API.
fn is_dashboard(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/")
}

/// A concrete path for a template: every `{name}` becomes `x`.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|part| if part.starts_with('{') { "x" } else { part })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether the router routed `method path` to a handler: neither its
/// "no such route" 404 nor its 405.
async fn routed(router: &axum::Router, method: &Method, path: &str) -> bool {
    let response = router
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let no_route = status == StatusCode::NOT_FOUND
        && serde_json::from_slice::<Value>(&body)
            .is_ok_and(|v| v["error"]["message"] == "no such route");
    status != StatusCode::METHOD_NOT_ALLOWED && !no_route
}

#[tokio::test]
async fn the_document_describes_exactly_the_routes_served() {
    let data = tempfile::tempdir().unwrap();
    let server = open_server(data.path()).await;
    let router = app(server.state().clone());
    let doc = serde_json::to_value(document()).unwrap();
    let documented: BTreeMap<String, BTreeSet<String>> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| METHODS.iter().any(|m| m.as_str().eq_ignore_ascii_case(k)))
                .map(|k| k.to_ascii_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect();

    let served: BTreeSet<String> = served_paths(&router)
        .into_iter()
        .filter(|p| !is_dashboard(p))
        .collect();
    let in_doc: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(
        served.difference(&in_doc).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "served but not documented"
    );
    assert_eq!(
        in_doc.difference(&served).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented but not served"
    );

    for (template, methods) in &documented {
        assert!(!methods.is_empty(), "{template} has no operation");
        let path = concrete(template);
        for method in &METHODS {
            let in_doc = methods.contains(method.as_str());
            assert_eq!(
                routed(&router, method, &path).await,
                in_doc,
                "{method} {template}: routed must equal documented ({in_doc})"
            );
        }
    }
}
