//! Observability for sidecars: the counters `/metrics` serves, and shadow
//! mode's comparisons.

mod metrics;
pub mod shadow;

pub use metrics::{Held, Leg, Limits, Metrics, Shadowed, Way};
pub use shadow::Shadow;

/// A text for a log line with its control characters escaped (`\n` as
/// `\\n`…): what a client sent (a command name in an error) cannot start a
/// forged line in the text log.
pub fn escaped(text: impl std::fmt::Display) -> String {
    let text = text.to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(super::escaped("plain"), "plain");
        assert_eq!(
            super::escaped("a\nINFO forged\r\u{1b}[0m"),
            "a\\nINFO forged\\r\\u{1b}[0m"
        );
    }
}
