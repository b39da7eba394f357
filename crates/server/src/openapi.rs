//! [`document`]: the OpenAPI document served on `/v1/openapi.json`: the
//! frame of [`ApiDoc`] (title, tags, shared schemas) with the operations of
//! every route of [`router`] (those [`routes::api`] registers, and the
//! document's own), from the handlers' `#[utoipa::path]` annotations, and
//! the conventions every authenticated call shares.

use std::sync::LazyLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr};

use axum::response::Response;
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::routes;
use crate::routes::ops::OPERATIONS;
use crate::state::AppState;

/// The name of the bearer security scheme in the document.
pub const BEARER: &str = "bearer";

/// The frame of the API's OpenAPI document; its operations come from
/// the router ([`document`]).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Estafeta",
        description = "Reliable message exchange between devices and database processors (API.md, version 1). \
                       Every JSON body carries \"version\": 1; errors are {\"version\":1,\"error\":{\"code\",\"message\"}}. \
                       A request body nested more than 100 levels deep is 400 bad_json."
    ),
    components(schemas(estafeta_exchange::wire::ErrorBody)),
    tags(
        (name = "operations", description = "Health, readiness, metrics, this document"),
        (name = "admin", description = "Provisioning and inspection (admin token)"),
        (name = "devices", description = "Uploads and inbox (device token)"),
        (name = "processes", description = "The six-call protocol (database token)"),
    )
)]
pub struct ApiDoc;

/// Every route of the API: the handlers' ([`routes::api`]) and
/// `/v1/openapi.json`, which describes them all.
pub fn router() -> OpenApiRouter<AppState> {
    routes::api().routes(routes!(openapi))
}

/// The API's OpenAPI document: every route of [`router`], and only those.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(router())
        .into_openapi();
    Conventions.modify(&mut doc);
    doc
}

/// The document never changes while the server runs: built once.
static OPENAPI_JSON: LazyLock<Vec<u8>> =
    LazyLock::new(|| serde_json::to_vec(&document()).unwrap_or_default());

/// `GET /v1/openapi.json`: this API's OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = OPERATIONS, responses(
    (status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi() -> Response {
    routes::raw_json(OPENAPI_JSON.clone())
}

/// Adds what every authenticated call (every operation but those tagged
/// [`OPERATIONS`]) shares: the bearer scheme, and the error answers 400,
/// 401, 403 and 503 (and 408 and 413 where there is a body).
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                BEARER,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some("An admin, database or device token"))
                        .build(),
                ),
            );
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.delete.as_mut(),
            ];
            for op in operations.into_iter().flatten() {
                let open = (op.tags.iter().flatten()).any(|tag| tag == OPERATIONS);
                if !open {
                    op.security = Some(vec![SecurityRequirement::new(BEARER, [""; 0])]);
                    add_errors(op);
                }
            }
        }
    }
}

/// The shared error answers of an authenticated operation.
fn add_errors(op: &mut Operation) {
    let mut errors = vec![
        (
            "400",
            "Malformed request: bad JSON, wrong version, missing field, bad id",
        ),
        ("401", "Missing or unknown token"),
        ("403", "The token may not do this"),
        (
            "503",
            "Recovering, stopping, or storage failing; see Retry-After",
        ),
    ];
    if op.request_body.is_some() {
        errors.push(("408", "The request body did not arrive in time"));
        errors.push(("413", "The request body is over the configured size"));
    }
    for (code, description) in errors {
        op.responses
            .responses
            .entry(code.to_owned())
            .or_insert_with(|| {
                RefOr::T(
                    ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/json",
                            Content::new(Some(Ref::from_schema_name("ErrorBody"))),
                        )
                        .build(),
                )
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_operations_carry_bearer_and_errors() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(
            doc["components"]["securitySchemes"][BEARER]["scheme"],
            "bearer"
        );
        let send = &doc["paths"]["/v1/messages"]["post"];
        for code in ["200", "201", "400", "401", "403", "408", "413", "503"] {
            assert!(send["responses"][code].is_object(), "{code}");
        }
        assert!(send["security"][0][BEARER].is_array());
        assert!(doc["paths"]["/healthz"]["get"]["responses"]["401"].is_null());
        assert!(doc["paths"]["/healthz"]["get"]["security"].is_null());
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    }
}
