//! Laconic: a transparent MongoDB wire-protocol proxy.
pub mod wire;
