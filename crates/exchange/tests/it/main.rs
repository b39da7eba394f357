//! The integration tests of `estafeta-exchange`, in one test binary: each
//! module tests one part through the crate's public API only; `common`
//! (mailboxes on a temporary data folder, ids and messages) and `world` (a
//! whole provisioned exchange with a controlled clock) are their harness.

mod common;
mod discard;
mod index;
mod mailbox;
mod model;
mod names;
mod protocol;
mod push;
mod recovery;
mod tallies;
mod tenancy;
mod totals;
mod upload;
mod world;
