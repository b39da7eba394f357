//! The HTTP handlers, one module per group of the HTTP API: operations, the
//! administration calls, the device calls and the processor calls. Each
//! handler authenticates, parses its path and body into domain types, calls
//! one method of the exchange and turns its answer into HTTP.

pub mod admin;
pub mod device;
pub mod ops;
pub mod process;

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

/// An answer whose body the exchange assembled as JSON bytes already.
fn raw_json(bytes: Vec<u8>) -> Response {
    ([(CONTENT_TYPE, "application/json")], bytes).into_response()
}
