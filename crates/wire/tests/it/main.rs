//! The integration tests of `estafeta-wire`, in one test binary: each
//! module checks the wire types through the crate's public API only.

mod bodies;
