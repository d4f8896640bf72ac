//! ⑤⑥ The upstream leg: where requests are forwarded and replies read from.

mod connection;

pub use connection::{connect, next_reply, send, Leg, UpstreamAddr, UpstreamConn};
