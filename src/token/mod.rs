//! Tokens: the reversible token namespace, and the name store that allocates
//! token numbers in the upstream.

pub mod namespace;
pub mod store;

pub use store::{NameStore, RoundTrips, StoreError};
