//! The integration tests of `estafeta-sendq`, in one test binary: each
//! module tests the send queue or one of its transports through the crate's
//! public API only, against real servers on loopback where there is a
//! transport; `common` (a transport the test drives by hand, a recorder of
//! completions) is their harness.

mod batches;
mod common;
mod lifecycle;
mod probe;
mod queue;
mod sms;
mod smtp;
mod webhook;
