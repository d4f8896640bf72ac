//! The command-line tools beside the proxy: libraries the `laconic`
//! binary's subcommands call, built on the same runtime parts.

pub mod store;
