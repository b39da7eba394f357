//! Estafeta exchange (work in progress).
#![deny(missing_docs)]
