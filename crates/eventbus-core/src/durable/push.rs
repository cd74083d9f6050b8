//! A push consumer's endpoint: the broker itself POSTs the consumer's events to an
//! HTTP(S) URL and takes the answer as the ack (docs/push.md). This module holds the
//! definition and its checks; the server crate sends the requests.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// [`PushConfig::timeout_ms`] when not given.
pub const DEFAULT_PUSH_TIMEOUT_MS: u64 = 10_000;
/// [`PushConfig::max_concurrency`] when not given.
pub const DEFAULT_PUSH_CONCURRENCY: u32 = 16;
/// Most requests one instance keeps open to one push endpoint.
pub const MAX_PUSH_CONCURRENCY: u32 = 1_024;
/// Most events in one push request.
pub const MAX_PUSH_BATCH: u32 = 1_000;
/// Longest push URL, in bytes.
pub const MAX_PUSH_URL_BYTES: usize = 2_048;
/// Most extra headers of a push request.
pub const MAX_PUSH_HEADERS: usize = 32;
/// Longest extra header value (and signing secret), in bytes.
pub const MAX_PUSH_HEADER_BYTES: usize = 4_096;

/// How a push request carries its events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PushEnvelope {
    /// The payload is the body, with the event's content type; the event's fields are
    /// `eventbus-*` headers. One event per request.
    #[default]
    Raw,
    /// The body is JSON: `{"consumer", "deliveries": [{"attempt", "event"}]}`.
    Json,
}

/// Where and how a push consumer's events are sent. Its `Debug` shows the
/// credentials redacted, so that no log line can carry them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// `http://` or `https://` URL every request is POSTed to.
    pub url: String,
    /// Extra request headers (for example `authorization`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// A request not answered within this long fails (and is retried); at most the
    /// consumer's ack deadline.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests each instance keeps open to the endpoint at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: u32,
    /// Events per request; above 1 needs the JSON envelope.
    #[serde(default = "default_batch")]
    pub batch: u32,
    #[serde(default)]
    pub envelope: PushEnvelope,
    /// Key of the `eventbus-signature` header (HMAC-SHA256); none when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

fn default_timeout_ms() -> u64 {
    DEFAULT_PUSH_TIMEOUT_MS
}

fn default_concurrency() -> u32 {
    DEFAULT_PUSH_CONCURRENCY
}

fn default_batch() -> u32 {
    1
}

/// Headers a push request sets itself: a configured one may not replace them.
const RESERVED_HEADERS: [&str; 8] =
    ["content-type", "content-length", "host", "connection", "transfer-encoding", "te", "upgrade", "trailer"];

/// Prefix of the headers that carry an event's fields.
pub const PUSH_HEADER_PREFIX: &str = "eventbus-";

impl PushConfig {
    /// A push to `url` with the documented defaults.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: BTreeMap::new(),
            timeout_ms: DEFAULT_PUSH_TIMEOUT_MS,
            max_concurrency: DEFAULT_PUSH_CONCURRENCY,
            batch: 1,
            envelope: PushEnvelope::Raw,
            secret: String::new(),
        }
    }

    /// Checks the endpoint and the bounds against the consumer's `ack_deadline_ms` and
    /// `max_in_flight`.
    pub fn validate(&self, ack_deadline_ms: u64, max_in_flight: u32) -> Result<(), PushError> {
        if self.url.len() > MAX_PUSH_URL_BYTES {
            return Err(PushError::Url(format!("is {} bytes; the limit is {MAX_PUSH_URL_BYTES}", self.url.len())));
        }
        let url =
            url::Url::parse(&self.url).map_err(|e| PushError::Url(format!("{:?} is not a URL: {e}", self.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(PushError::Url(format!("{:?}: only http:// and https:// URLs are pushed to", self.url)));
        }
        if url.host().is_none() {
            return Err(PushError::Url(format!("{:?} names no host", self.url)));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(PushError::Url(
                "carries credentials; put them in push.headers (they are never shown back)".to_owned(),
            ));
        }
        if url.fragment().is_some() {
            return Err(PushError::Url(format!("{:?} has a fragment, which is never sent", self.url)));
        }
        if self.headers.len() > MAX_PUSH_HEADERS {
            return Err(PushError::Headers(format!("{} headers; the limit is {MAX_PUSH_HEADERS}", self.headers.len())));
        }
        for (name, value) in &self.headers {
            check_header(name, value)?;
        }
        if self.timeout_ms == 0 {
            return Err(PushError::Range("push.timeout_ms must be positive".to_owned()));
        }
        if self.timeout_ms > ack_deadline_ms {
            return Err(PushError::Range(format!(
                "push.timeout_ms ({}) exceeds ack_deadline_ms ({ack_deadline_ms}): the ack deadline covers the request",
                self.timeout_ms
            )));
        }
        if !(1..=MAX_PUSH_CONCURRENCY).contains(&self.max_concurrency) {
            return Err(PushError::Range(format!(
                "push.max_concurrency must be 1 to {MAX_PUSH_CONCURRENCY}, not {}",
                self.max_concurrency
            )));
        }
        if !(1..=MAX_PUSH_BATCH).contains(&self.batch) {
            return Err(PushError::Range(format!("push.batch must be 1 to {MAX_PUSH_BATCH}, not {}", self.batch)));
        }
        if self.batch > 1 && self.envelope == PushEnvelope::Raw {
            return Err(PushError::Range(
                "push.batch above 1 needs push.envelope: json (a raw body holds one payload)".to_owned(),
            ));
        }
        let window = u64::from(self.max_concurrency) * u64::from(self.batch);
        if window > u64::from(max_in_flight) {
            return Err(PushError::Range(format!(
                "push.max_concurrency × push.batch ({window}) exceeds max_in_flight ({max_in_flight})"
            )));
        }
        if self.secret.len() > MAX_PUSH_HEADER_BYTES {
            return Err(PushError::Range(format!("push.secret is over {MAX_PUSH_HEADER_BYTES} bytes")));
        }
        Ok(())
    }

    /// The definition as shown to callers: header values and the secret replaced by
    /// [`REDACTED`] (they are credentials).
    pub fn redacted(&self) -> Self {
        let hide = |s: &String| if s.is_empty() { String::new() } else { REDACTED.to_owned() };
        Self {
            headers: self.headers.iter().map(|(k, v)| (k.clone(), hide(v))).collect(),
            secret: hide(&self.secret),
            ..self.clone()
        }
    }
}

impl fmt::Debug for PushConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { url, headers, timeout_ms, max_concurrency, batch, envelope, secret } = &self.redacted();
        f.debug_struct("PushConfig")
            .field("url", url)
            .field("headers", headers)
            .field("timeout_ms", timeout_ms)
            .field("max_concurrency", max_concurrency)
            .field("batch", batch)
            .field("envelope", envelope)
            .field("secret", secret)
            .finish()
    }
}

/// What a credential is shown as.
pub const REDACTED: &str = "(redacted)";

/// An HTTP field name is a token (RFC 9110 §5.6.2).
fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn check_header(name: &str, value: &str) -> Result<(), PushError> {
    let shown = || format!("{:?}", name.chars().take(64).collect::<String>());
    if !is_token(name) || name.len() > 256 {
        return Err(PushError::Headers(format!("{} is not a header name", shown())));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with(PUSH_HEADER_PREFIX) || RESERVED_HEADERS.contains(&lower.as_str()) {
        return Err(PushError::Headers(format!("{} is set by the broker itself", shown())));
    }
    if value.len() > MAX_PUSH_HEADER_BYTES {
        return Err(PushError::Headers(format!("the value of {} is over {MAX_PUSH_HEADER_BYTES} bytes", shown())));
    }
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(PushError::Headers(format!("the value of {} holds a control character", shown())));
    }
    Ok(())
}

/// What is wrong with a push definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("push.url {0}")]
    Url(String),
    #[error("push.headers: {0}")]
    Headers(String),
    #[error("{0}")]
    Range(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: &PushConfig) -> Result<(), String> {
        p.validate(30_000, 1_000).map_err(|e| e.to_string())
    }

    #[test]
    fn urls_are_http_with_a_host_and_no_credentials() {
        assert_eq!(check(&PushConfig::new("https://hooks.example.com/orders?x=1")), Ok(()));
        assert_eq!(check(&PushConfig::new("http://127.0.0.1:9000/")), Ok(()));
        for (url, says) in [
            ("ftp://example.com/", "only http:// and https://"),
            ("file:///etc/passwd", "only http:// and https://"),
            ("not a url", "is not a URL"),
            ("http://user:pw@example.com/", "credentials"),
            ("https://example.com/#frag", "fragment"),
        ] {
            let err = check(&PushConfig::new(url)).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_PUSH_URL_BYTES));
        assert!(check(&PushConfig::new(long)).unwrap_err().contains("bytes"));
    }

    #[test]
    fn headers_are_tokens_and_never_the_brokers_own() {
        let with = |name: &str, value: &str| {
            let mut p = PushConfig::new("http://h/");
            p.headers.insert(name.to_owned(), value.to_owned());
            check(&p)
        };
        assert_eq!(with("Authorization", "Bearer abc"), Ok(()));
        assert!(with("eventbus-id", "x").unwrap_err().contains("set by the broker"));
        assert!(with("Content-Type", "x").unwrap_err().contains("set by the broker"));
        assert!(with("bad name", "x").unwrap_err().contains("not a header name"));
        assert!(with("x-a", "line\nbreak").unwrap_err().contains("control character"));
    }

    #[test]
    fn bounds_name_the_field() {
        let base = PushConfig::new("http://h/");
        let err = |p: PushConfig| check(&p).unwrap_err();
        assert!(err(PushConfig { timeout_ms: 0, ..base.clone() }).contains("push.timeout_ms"));
        assert!(err(PushConfig { timeout_ms: 30_001, ..base.clone() }).contains("ack_deadline_ms"));
        assert!(err(PushConfig { max_concurrency: 0, ..base.clone() }).contains("push.max_concurrency"));
        assert!(err(PushConfig { batch: 10, ..base.clone() }).contains("push.envelope: json"));
        let json = PushConfig { envelope: PushEnvelope::Json, ..base.clone() };
        assert_eq!(check(&PushConfig { batch: 10, ..json.clone() }), Ok(()));
        assert!(err(PushConfig { batch: 100, max_concurrency: 20, ..json }).contains("max_in_flight"));
    }

    #[test]
    fn credentials_are_redacted_and_the_rest_kept() {
        let mut p = PushConfig::new("http://h/");
        p.headers.insert("authorization".into(), "Bearer abc".into());
        p.secret = "s3cret".into();
        let shown = p.redacted();
        assert_eq!(shown.headers["authorization"], REDACTED);
        assert_eq!(shown.secret, REDACTED);
        assert_eq!(shown.url, p.url);
        assert_eq!(PushConfig::new("http://h/").redacted().secret, "");
        let debug = format!("{p:?}");
        assert!(!debug.contains("abc") && !debug.contains("s3cret") && debug.contains(REDACTED), "{debug}");
    }

    #[test]
    fn stored_definitions_read_back_with_defaults() {
        let p: PushConfig = serde_json::from_str(r#"{"url":"http://h/"}"#).unwrap();
        assert_eq!(p, PushConfig::new("http://h/"));
        let unknown = serde_json::from_str::<PushConfig>(r#"{"url":"http://h/","retries":3}"#);
        assert!(unknown.unwrap_err().to_string().contains("retries"));
    }
}
