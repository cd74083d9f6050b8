//! Logging setup: `log.level` (or `RUST_LOG`, which wins) and `log.format`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. Logs go to stdout, as containers expect.
pub fn init(log: &LogSettings) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            EnvFilter::try_new(&directives).map_err(|e| format!("invalid RUST_LOG {directives:?}: {e}"))?
        }
        _ => EnvFilter::try_new(&log.level).map_err(|e| format!("invalid log.level {:?}: {e}", log.level))?,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}
