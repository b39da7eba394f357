//! Estafeta repeat (work in progress).
#![deny(missing_docs)]
