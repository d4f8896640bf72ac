//! Observability for sidecars: counters and the HTTP port that serves them.

pub mod http;
mod metrics;

pub use metrics::{Leg, Metrics, Way};
