//! What the estafeta server's tests (`tests/it`) and its benches both
//! need, kept once here: each bench is a crate of its own and cannot share
//! a module with the tests' binary. A dev-dependency of the server only,
//! never published.
//!
//! It is not part of `estafeta-test-support`, the helpers of several
//! crates' tests: that crate stays free of the workspace's crates, since
//! the session crate's tests use it and the client here brings in the wire
//! types, which bring in the session crate (a second copy of it in its own
//! tests).
//!
//! - [`binary`]: the real `estafeta` binary as a child process.
//! - [`api`]: a running server driven over HTTP with the typed client (a
//!   provisioned tenancy, a process ready to commit, the requests and the
//!   prepares).
//! - [`measure`]: the sizes a bench measures at and the disk it writes on,
//!   from the environment, and the runtime it measures on.
#![deny(missing_docs)]

pub mod api;
pub mod binary;
pub mod measure;
