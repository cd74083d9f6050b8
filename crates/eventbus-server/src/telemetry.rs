//! Logging setup: `log.level` (or `RUST_LOG`, which wins) and `log.format`.
//!
//! A bare level in `log.level` (`info`, `debug`) applies to eventbusd's own crates;
//! dependencies (the store library, hyper, h2, …) log WARN and above unless the level is
//! stricter still. Filter directives (`info,fjall=debug`) and `RUST_LOG` are taken as
//! written, so a dependency's lines are one directive away. Directives name a target
//! (a module path) and a level, the subset of `RUST_LOG` that needs no regular
//! expressions (span and field filters are refused, saying so).

use std::io::IsTerminal;

use tracing_subscriber::filter::{LevelFilter, ParseError, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, LogSettings};

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `RUST_LOG` is set but holds no valid filter directives.
    #[error("invalid RUST_LOG {value:?}: {source} ({DIRECTIVES})")]
    RustLog {
        value: String,
        #[source]
        source: ParseError,
    },
    /// `log.level` holds no valid filter directives.
    #[error("invalid log.level {value:?}: {source} ({DIRECTIVES})")]
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

/// What a filter is, for the messages that refuse one.
pub(crate) const DIRECTIVES: &str =
    "a level, or comma-separated directives `level` and `target=level`, e.g. `info,eventbus_core=debug`";

/// Installs the global subscriber. Logs go to stdout, as containers expect.
pub fn init(log: &LogSettings) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.is_empty() => filter(&value).map_err(|source| TelemetryError::RustLog { value, source })?,
        _ => filter(&directives(&log.level))
            .map_err(|source| TelemetryError::Level { value: log.level.clone(), source })?,
    };
    let logs = tracing_subscriber::registry().with(filter);
    let layer = tracing_subscriber::fmt::layer();
    let result = match log.format {
        LogFormat::Json => logs.with(layer.json().flatten_event(true)).try_init(),
        LogFormat::Text => logs.with(layer.with_ansi(std::io::stdout().is_terminal())).try_init(),
    };
    result.map_err(|source| TelemetryError::Install { source: source.into() })
}

/// The filter that filter directives (`warn,eventbus_core=debug`) describe.
pub fn filter(directives: &str) -> Result<Targets, ParseError> {
    directives.parse()
}

/// The crates whose INFO lines are eventbusd's own.
const OWN_CRATES: &[&str] =
    &["eventbusd", "eventbus_server", "eventbus_core", "eventbus_durable", "eventbus_redis", "eventbus_auth"];

/// The filter directives for `log.level`: a bare level becomes that level for
/// [`OWN_CRATES`] and at most WARN for everything else; directives stay as written.
pub fn directives(level: &str) -> String {
    let Ok(own) = level.trim().parse::<LevelFilter>() else {
        return level.to_owned();
    };
    let others = own.min(LevelFilter::WARN);
    let own_directives = OWN_CRATES.iter().map(|krate| format!(",{krate}={own}"));
    format!("{others}{}", own_directives.collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_level_keeps_dependencies_at_warn() {
        let info = directives("info");
        assert!(info.starts_with("warn,") && info.contains("eventbus_server=info"), "{info}");
        assert!(info.contains("eventbusd=info") && info.contains("eventbus_durable=info"), "{info}");
        assert!(directives("error").starts_with("error,"), "a stricter level applies to all");
        assert!(directives("DEBUG").contains("eventbus_core=debug"));
        assert_eq!(directives("info,fjall=debug"), "info,fjall=debug", "directives as written");
        filter(&directives("trace")).unwrap();
    }

    #[test]
    fn directives_name_targets_and_levels() {
        let targets = filter("warn,eventbus_core=debug,h2=off").unwrap();
        assert_eq!(targets.default_level(), Some(LevelFilter::WARN));
        assert_eq!(targets.iter().count(), 2);
        assert!(filter("info,fjall=loud").is_err(), "an unknown level is refused");
        assert!(filter("info,[request{id=1}]=debug").is_err(), "span filters are not taken");
    }
}
