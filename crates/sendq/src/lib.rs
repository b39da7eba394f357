//! Estafeta sendq (work in progress).
#![deny(missing_docs)]
