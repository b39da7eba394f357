//! The integration tests of `estafeta-postgres`, in one test binary: each
//! module runs one part of the store against throwaway PostgreSQL servers
//! (`estafeta_postgres::testing`), through the crate's public API only;
//! `common` holds the helpers several of them use.

mod auth_failures;
mod common;
mod connect;
mod engine;
mod failover;
mod held_claims;
mod hold;
mod keys;
mod lock;
mod messages;
mod migrate;
mod node_state;
mod registry;
mod schedule;
mod schema;
mod session_storage;
mod unavailable;
