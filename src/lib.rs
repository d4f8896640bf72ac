//! Laconic: a transparent MongoDB wire-protocol proxy.
//!
//! The data path, one module per stage:
//!
//! 1. **accept** — [`downstream::listener`]: the accept loop, the connection
//!    limit, graceful shutdown; each session then runs on the
//!    [`downstream::workers`];
//! 2. **read frame** — [`downstream::session`] reads frames through
//!    [`wire::MessageCodec`];
//! 3. **decode** — [`wire`]: the sans-IO codec (OP_MSG, OP_QUERY/OP_REPLY,
//!    OP_COMPRESSED);
//! 4. **rewrite request** — [`rewrite::request`];
//! 5. **forward** and 6. **read reply** — [`upstream`];
//! 7. **expand reply** — [`rewrite::reply`];
//! 8. **write back** — [`downstream::session`].
//!
//! Errors become wire replies in one place, [`error::error_reply`].
//! [`capture`] records sessions and replays them.

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

/// This build's version (`laconic --version`, `laconic_build_info`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How this binary was built: `pgo` for the profile-guided build
/// (`scripts/build-pgo.sh` sets `LACONIC_BUILD` for it, and so the Docker
/// image's), `release` or `debug` for cargo's profiles.
pub const BUILD: &str = match option_env!("LACONIC_BUILD") {
    Some(build) => build,
    None if cfg!(debug_assertions) => "debug",
    None => "release",
};

pub mod budget;
pub mod capture;
pub mod config;
pub mod context;
pub mod convert;
pub mod downstream;
pub mod error;
pub mod exchange;
pub mod fuzzing;
pub mod locality;
pub mod observe;
pub mod random;
pub mod rewrite;
pub mod shutdown;
pub mod tls;
pub mod token;
pub mod tools;
pub mod upstream;
pub mod wire;
