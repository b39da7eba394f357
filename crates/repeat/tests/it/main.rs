//! The integration tests of `estafeta-repeat`, in one test binary: each
//! module tests the scheduler through the crate's public API only;
//! `common` (a probe handler that records every hand-out, a running
//! dispatcher) is their harness.

mod clock_steps;
mod close;
mod common;
mod crash;
mod dispatch;
mod durability;
mod failing_source;
mod held;
mod misfire;
mod replace;
mod store;
