//! ① accept, ② read frame, ⑧ write back: the driver-facing side.

pub mod listener;
pub mod session;

pub use listener::{Proxy, ProxyContext, ProxyHandle};
