//! Estafeta session (work in progress).
#![deny(missing_docs)]
