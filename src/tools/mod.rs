//! The command-line tools beside the proxy (`analyze`, `bench`, `migrate`,
//! `replay`, `store`, `top`): libraries the `laconic` binary's subcommands
//! call, built on the same runtime parts, and kept apart from them.

/// Returns a tool error made of a formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(crate::tools::Error::from(format!($($arg)*)))
    };
}

/// A tool error made of a formatted message.
macro_rules! fail {
    ($($arg:tt)*) => {
        crate::tools::Error::from(format!($($arg)*))
    };
}

/// Returns a tool error unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            crate::tools::bail!($($arg)*);
        }
    };
}

pub(crate) use {bail, ensure, fail};

pub mod analyze;
pub mod bench;
pub mod migrate;
pub mod replay;
pub mod store;
pub mod top;

/// A tool's failure, with its cause: what the binary reports.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = Error> = std::result::Result<T, E>;
