//! Why a durable call was refused, for both engines.

use std::borrow::Cow;

use crate::durable::config::{ConfigError, ConsumerConfig};
use crate::error::quoted;

/// An error from below a durable engine (a store, a Redis client), kept as the source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a durable call was refused. The wire layers map each variant to one status
/// (docs/errors.md): callers branch on the variant, never on the text.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("no consumer named {}", quoted(.0))]
    UnknownConsumer(String),
    /// `differences`: each field that differs, the existing value then the one asked.
    #[error("consumer {} already exists with a different configuration: {differences}", quoted(name))]
    AlreadyExists { name: String, differences: String },
    #[error("invalid consumer configuration: {0}")]
    InvalidConfig(#[from] ConfigError),
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: &'static str, message: String },
    /// Try again later: the store cannot be reached (Redis away) or the engine is
    /// stopping. Nothing was lost; the call did nothing, or may be repeated.
    #[error("durable consumers are unavailable: {reason}")]
    Unavailable {
        reason: Cow<'static, str>,
        #[source]
        source: Option<BoxError>,
    },
    /// The store's disk is nearly full: captures are refused until space is freed
    /// (docs/limits.md).
    #[error("the durable store's disk is nearly full: {free} bytes free, below durable.min_free_disk_bytes ({min})")]
    DiskFull { free: u64, min: u64 },
    /// A publish matches more durable consumers than `durable.max_captures_per_publish`:
    /// refused whole, so one publish cannot multiply into unbounded stored copies.
    #[error(
        "the publish on {} matches {matched} durable consumers, more than durable.max_captures_per_publish ({limit})",
        quoted(channel)
    )]
    TooManyCaptures { channel: String, matched: usize, limit: usize },
    /// The store failed in a way retrying will not fix: corrupt or unreadable records, a
    /// write the disk refused. Logged with its cause; the client sees no internals.
    #[error("the durable store failed ({context})")]
    Internal {
        context: &'static str,
        #[source]
        source: BoxError,
    },
}

impl DurableError {
    /// [`DurableError::AlreadyExists`] for `asked`, naming each field that differs from
    /// `existing` (`max_attempts 5, asked 3; channels ["a.>"], asked ["b.>"]`).
    ///
    /// The message goes to whoever asked, who need not be the owner: both definitions
    /// are shown redacted, as every read path shows them, and fields are compared as
    /// shown, so neither a credential nor whether a guessed one is right comes out.
    pub fn already_exists(existing: &ConsumerConfig, asked: ConsumerConfig) -> Self {
        let (Ok(serde_json::Value::Object(old)), Ok(serde_json::Value::Object(new))) =
            (serde_json::to_value(existing.redacted()), serde_json::to_value(asked.redacted()))
        else {
            return Self::AlreadyExists { name: asked.name, differences: "the definitions differ".to_owned() };
        };
        let mut differences: Vec<String> = new
            .iter()
            .filter_map(|(field, value)| {
                let current = old.get(field).unwrap_or(&serde_json::Value::Null);
                (current != value).then(|| format!("{field} {current}, asked {value}"))
            })
            .chain(
                old.iter()
                    .filter(|(field, _)| !new.contains_key(*field))
                    .map(|(field, current)| format!("{field} {current}, asked none")),
            )
            .collect();
        if differences.is_empty() {
            // Only what redaction hides differs.
            differences.push("push credentials (header values or secret, not shown)".to_owned());
        }
        Self::AlreadyExists { name: asked.name, differences: differences.join("; ") }
    }

    /// [`DurableError::Unavailable`] without an underlying error.
    pub fn unavailable(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::Unavailable { reason: reason.into(), source: None }
    }

    /// [`DurableError::Unavailable`] caused by `source`.
    pub fn unavailable_because(reason: impl Into<Cow<'static, str>>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable { reason: reason.into(), source: Some(source.into()) }
    }

    /// [`DurableError::Internal`] caused by `source`.
    pub fn internal(context: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Internal { context, source: source.into() }
    }

    /// A `page_token` this broker did not issue.
    pub fn bad_page_token(token: &str) -> Self {
        Self::InvalidArgument {
            field: "page_token",
            message: format!("{} is not a page token this broker issued", quoted(token)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::PushConfig;

    fn hooked(secret: &str, key: &str) -> ConsumerConfig {
        let mut push = PushConfig::new("https://hooks.example.com/x");
        push.secret = secret.to_owned();
        push.headers = [("x-api-key".to_owned(), key.to_owned())].into();
        ConsumerConfig { push: Some(push), owner: "alice".into(), ..ConsumerConfig::new("red-1", vec!["red.>".into()]) }
    }

    fn differences(err: DurableError) -> String {
        match err {
            DurableError::AlreadyExists { differences, .. } => differences,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_conflict_shows_both_definitions_redacted() {
        let existing = hooked("owner-signing-secret", "owner-api-key");
        let asked = ConsumerConfig { max_attempts: 9, owner: "mallory".into(), ..hooked("guess", "guess") };
        let shown = differences(DurableError::already_exists(&existing, asked));
        assert!(shown.contains("max_attempts 5, asked 9") && shown.contains("owner \"alice\""), "{shown}");
        for secret in ["owner-signing-secret", "owner-api-key", "guess"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(!shown.contains("push"), "credentials are not compared where the asker sees them: {shown}");
        let pulled = ConsumerConfig { push: None, ..existing.clone() };
        let shown = differences(DurableError::already_exists(&existing, pulled));
        assert!(
            shown.starts_with("push {") && shown.contains("(redacted)") && shown.ends_with("asked none"),
            "{shown}"
        );
        assert!(!shown.contains("owner-signing-secret") && !shown.contains("owner-api-key"), "{shown}");
    }

    #[test]
    fn a_conflict_on_credentials_alone_says_so_without_them() {
        let shown = differences(DurableError::already_exists(&hooked("s1", "k1"), hooked("s2", "k1")));
        assert_eq!(shown, "push credentials (header values or secret, not shown)");
    }
}
