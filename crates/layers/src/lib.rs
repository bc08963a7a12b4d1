//! The layer store.
pub mod unpack;
