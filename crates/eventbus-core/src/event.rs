//! The event envelope and the checks a publish goes through before it is accepted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::SystemTime;

use bytes::Bytes;

use crate::error::Error;
use crate::name::validate_channel;
use crate::stats::ChannelCounters;

/// Most metadata entries on one event.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 128;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 4096;

/// An event as subscribers see it. Shared (`Arc<Event>`) by every queue it lands in;
/// the payload is `Bytes`, so fan-out never copies it.
#[derive(Debug, Clone)]
pub struct Event {
    /// UUIDv7: unique across instances and restarts, and sorted by time.
    pub id: String,
    /// Exact channel it was published on.
    pub channel: String,
    /// When the broker accepted it.
    pub timestamp: SystemTime,
    /// The publisher's `source`, else its peer address.
    pub source: String,
    /// Opaque payload.
    pub payload: Bytes,
    /// Free-form key/value pairs.
    pub metadata: HashMap<String, String>,
    /// MIME type of the payload, possibly empty.
    pub content_type: String,
    /// Counters of the channel on this instance, attached when the event is routed
    /// here, so a drop far from the publish (DROP_OLDEST, a closing queue) is counted
    /// against its channel without a lookup.
    pub(crate) counters: Option<Arc<ChannelCounters>>,
    /// What the event costs while queued, for the byte bounds.
    pub(crate) residency: Residency,
}

/// What an event costs in memory beyond [`Event::approx_size`]: the envelope itself,
/// its allocation header and its id (about 270 bytes), so that floods of tiny events
/// are counted near what they hold.
pub const MEMORY_OVERHEAD: usize = std::mem::size_of::<Event>() + 16 + 36;

/// An event's weight in queues: its size, fixed when it is routed, and how many queues
/// hold it now. The shared budget (`eventbus.max_queued_bytes`) counts the event once,
/// when its first copy is queued, and frees it when the last copy leaves: the payload
/// is shared, not copied per queue. A clone is a fresh event, queued nowhere.
#[derive(Debug, Default)]
pub(crate) struct Residency {
    /// [`Event::approx_size`] plus [`MEMORY_OVERHEAD`], at routing time.
    pub(crate) size: usize,
    /// Queues holding the event now.
    pub(crate) copies: AtomicUsize,
}

impl Clone for Residency {
    fn clone(&self) -> Self {
        Self { size: self.size, copies: AtomicUsize::new(0) }
    }
}

impl Event {
    /// An event from all its fields: what a transport rebuilds from the wire.
    pub fn from_parts(
        id: String,
        channel: String,
        timestamp: SystemTime,
        source: String,
        payload: Bytes,
        metadata: HashMap<String, String>,
        content_type: String,
    ) -> Self {
        Self {
            id,
            channel,
            timestamp,
            source,
            payload,
            metadata,
            content_type,
            counters: None,
            residency: Residency::default(),
        }
    }

    /// Rough size on the wire (payload, names, metadata and a fixed overhead), used to
    /// keep stream messages well under gRPC limits.
    pub fn approx_size(&self) -> usize {
        let meta: usize = self.metadata.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
        self.payload.len() + meta + self.channel.len() + self.source.len() + self.content_type.len() + 64
    }

    pub(crate) fn counters(&self) -> Option<&ChannelCounters> {
        self.counters.as_deref()
    }
}

/// What a publisher hands to [`crate::Bus::publish`].
#[derive(Debug, Clone, Default)]
pub struct PublishInput {
    /// Exact channel name.
    pub channel: String,
    /// Opaque payload.
    pub payload: Bytes,
    /// Free-form key/value pairs (see the `MAX_METADATA_*` limits).
    pub metadata: HashMap<String, String>,
    /// MIME type of the payload.
    pub content_type: String,
    /// Publisher-given source; empty means `peer`.
    pub source: String,
    /// The publisher's address, the fallback source.
    pub peer: String,
    /// Durable consumers deliver events of one key one at a time, in order (README "Durable consumers (at-least-once)").
    pub ordering_key: String,
    /// A key seen within the dedup window makes this publish a no-op duplicate.
    pub idempotency_key: String,
}

/// Why a publish's metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata has {count} entries; the limit is {MAX_METADATA_ENTRIES}")]
    TooManyEntries { count: usize },
    #[error("metadata key {} is {len} bytes; keys are 1 to {MAX_METADATA_KEY_BYTES} bytes", crate::error::quoted(key))]
    BadKey { key: String, len: usize },
    #[error(
        "metadata value of key {} is {len} bytes; the limit is {MAX_METADATA_VALUE_BYTES}",
        crate::error::quoted(key)
    )]
    ValueTooLong { key: String, len: usize },
}

impl PublishInput {
    /// Checks the README "How it behaves" limits and turns the input into an event with a fresh id.
    pub(crate) fn into_event(self, max_payload_bytes: usize) -> Result<Event, Error> {
        validate_channel(&self.channel)?;
        if self.payload.len() > max_payload_bytes {
            return Err(Error::PayloadTooLarge { size: self.payload.len(), limit: max_payload_bytes });
        }
        validate_metadata(&self.metadata)?;
        if self.ordering_key.len() > MAX_METADATA_VALUE_BYTES || self.idempotency_key.len() > MAX_METADATA_VALUE_BYTES {
            return Err(Error::InvalidOption {
                field: "ordering_key/idempotency_key",
                message: format!("keys are at most {MAX_METADATA_VALUE_BYTES} bytes"),
            });
        }
        let source = if self.source.is_empty() { self.peer } else { self.source };
        Ok(Event {
            id: new_id(),
            channel: self.channel,
            timestamp: SystemTime::now(),
            source,
            payload: self.payload,
            metadata: self.metadata,
            content_type: self.content_type,
            counters: None,
            residency: Residency::default(),
        })
    }
}

fn validate_metadata(metadata: &HashMap<String, String>) -> Result<(), MetadataError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(MetadataError::TooManyEntries { count: metadata.len() });
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
            let shown: String = key.chars().take(40).collect();
            return Err(MetadataError::BadKey { key: shown, len: key.len() });
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Err(MetadataError::ValueTooLong { key: key.clone(), len: value.len() });
        }
    }
    Ok(())
}

/// A new time-ordered unique id (UUIDv7).
pub fn new_id() -> String {
    // Into a stack buffer, then one exact allocation: `to_string` would go through the
    // formatting machinery and grow its string, on every publish.
    let mut buf = uuid::Uuid::encode_buffer();
    uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(channel: &str) -> PublishInput {
        PublishInput { channel: channel.into(), peer: "127.0.0.1:1".into(), ..Default::default() }
    }

    #[test]
    fn source_defaults_to_peer() {
        let ev = input("a.b").into_event(10).unwrap();
        assert_eq!(ev.source, "127.0.0.1:1");
        let ev = PublishInput { source: "billing".into(), ..input("a.b") }.into_event(10).unwrap();
        assert_eq!(ev.source, "billing");
    }

    #[test]
    fn limits_are_enforced() {
        let big = PublishInput { payload: Bytes::from(vec![0; 11]), ..input("a") };
        assert!(matches!(big.into_event(10), Err(Error::PayloadTooLarge { size: 11, limit: 10 })));
        let mut meta = HashMap::new();
        meta.insert(String::new(), "v".into());
        let bad = PublishInput { metadata: meta, ..input("a") };
        assert!(matches!(bad.into_event(10), Err(Error::Metadata(MetadataError::BadKey { .. }))));
        let many: HashMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        let bad = PublishInput { metadata: many, ..input("a") };
        assert!(matches!(bad.into_event(10), Err(Error::Metadata(MetadataError::TooManyEntries { count: 65 }))));
        let long: HashMap<_, _> = [("k".to_owned(), "v".repeat(4097))].into();
        let bad = PublishInput { metadata: long, ..input("a") };
        assert!(matches!(bad.into_event(10), Err(Error::Metadata(MetadataError::ValueTooLong { .. }))));
    }

    #[test]
    fn memory_overhead_is_what_the_readme_says() {
        // README "Memory bounds" quotes it; a change of the envelope shows up here.
        assert!((200..=400).contains(&(MEMORY_OVERHEAD + 64)), "{}", MEMORY_OVERHEAD + 64);
        eprintln!("per-event overhead: {} bytes", MEMORY_OVERHEAD + 64);
    }

    #[test]
    fn ids_are_unique_and_time_ordered() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert!(a < b, "UUIDv7 sorts by creation time");
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.hyphenated().to_string(), a, "lower-case, hyphenated");
        assert_eq!(parsed.get_version_num(), 7);
    }
}
