//! The integration tests of `estafeta-server`, in one test binary (the
//! server is linked once, not once per file): each module tests the server
//! from outside, through the library's `Server` on a loopback port or the
//! real `estafeta` binary as a child process, over the embedded store or
//! PostgreSQL; `common` is their harness.

mod admin_api;
mod backup;
mod cluster;
mod cluster_ack;
mod cluster_alerts;
mod cluster_failover;
// Its tests need the failpoints compiled in (`--features failpoints`).
#[cfg(feature = "failpoints")]
mod cluster_faults;
mod cluster_nodes;
mod cluster_owner;
mod cluster_push;
mod cluster_recovery;
mod cluster_unavailable;
mod cluster_upload;
mod common;
mod completions;
mod config_cli;
mod connections;
mod dashboard;
mod dashboard_browser;
mod dashboard_scale;
// `estafeta demo` exists only with the feature `demo`.
#[cfg(feature = "demo")]
mod demo;
mod hardening;
mod http_cli;
mod http_crash;
mod http_disk_full;
mod http_flow;
mod http_layer;
mod leaks;
mod metrics;
mod notify;
mod notify_schedule;
mod notify_stats;
mod openapi;
mod push;
mod request_id;
mod state_check;
mod systemd;
mod waiting_index;
