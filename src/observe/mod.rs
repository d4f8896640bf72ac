//! Observability for sidecars: counters and the HTTP port that serves them.

pub mod http;
mod metrics;
pub mod shadow;

pub use metrics::{Leg, Metrics, Way};
pub use shadow::Shadow;
