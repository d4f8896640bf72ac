//! ⑤⑥ The upstream leg: where requests are forwarded and replies read from.

mod connection;
pub mod topology;

pub use connection::{connect, connect_host, next_reply, send, Leg, UpstreamAddr, UpstreamConn};
pub use topology::Topology;
