//! Logging setup: `log.level` (or `RUST_LOG`, which wins) and `log.format`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;

use crate::config::{LogFormat, LogSettings};

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `RUST_LOG` is set but holds no valid filter directives.
    #[error("invalid RUST_LOG {value:?}: {source}")]
    RustLog {
        value: String,
        #[source]
        source: ParseError,
    },
    /// `log.level` holds no valid filter directives.
    #[error("invalid log.level {value:?}: {source}")]
    Level {
        value: String,
        #[source]
        source: ParseError,
    },
    /// A global subscriber is already installed.
    #[error("cannot install the logger: {source}")]
    Install {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Installs the global subscriber. Logs go to stdout, as containers expect.
pub fn init(log: &LogSettings) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.is_empty() => {
            EnvFilter::try_new(&value).map_err(|source| TelemetryError::RustLog { value, source })?
        }
        _ => EnvFilter::try_new(&log.level)
            .map_err(|source| TelemetryError::Level { value: log.level.clone(), source })?,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).try_init(),
    };
    result.map_err(|source| TelemetryError::Install { source })
}
