//! The integration tests of `estafeta-sim`, in one test binary: the
//! simulators against a real server (the server library on loopback, set
//! up by `common`).

mod common;
mod sim;
