//! ⑤⑥ The upstream leg: where requests are forwarded and replies read from.

mod connection;
pub mod srv;
pub mod topology;

pub use connection::{
    connect, connect_host, next_reply, send, Leg, SrvSource, UpstreamAddr, UpstreamConn,
};
pub use topology::Topology;
