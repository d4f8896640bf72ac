//! ① accept, ② read frame, ⑧ write back: the driver-facing side, and the
//! sidecar's HTTP port (`/metrics`, `/healthz`, `/readyz`).

pub mod http;
pub mod listener;
pub mod session;
pub mod workers;

pub use listener::{Proxy, ProxyHandle};
