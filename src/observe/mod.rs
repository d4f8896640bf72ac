//! Observability for sidecars: the counters `/metrics` serves, and shadow
//! mode's comparisons.

mod metrics;
pub mod shadow;

pub use metrics::{Leg, Metrics, Way};
pub use shadow::Shadow;
