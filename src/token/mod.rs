//! Tokens: the reversible token namespace, and the name store that allocates
//! token numbers in the upstream.

pub mod namespace;
pub mod policy;
pub mod store;

pub use policy::{Migration, Policies, Policy, State as MigrationState};
pub use store::{
    value_scope, Consistent, Dictionary, NameStore, Names, Recorder, RoundTrips, Snapshot,
    StoreError,
};

/// Tokenization as the proxy runs it: which names, and the store that holds them.
#[derive(Clone, Debug)]
pub struct Tokens {
    pub policies: Policies,
    pub store: NameStore,
}
