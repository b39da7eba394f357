//! Estafeta client (work in progress).
#![deny(missing_docs)]
