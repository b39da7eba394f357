//! The integration tests of `estafeta-session`, in one test binary: each
//! module tests the session engine through the crate's public API only;
//! `common` (recording hooks, engines over memory or redb storage) is
//! their harness.

mod commands;
mod common;
mod crash;
mod disk_full;
mod lifecycle;
mod update;
