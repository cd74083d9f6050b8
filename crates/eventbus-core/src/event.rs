//! The event envelope and the checks a publish goes through before it is accepted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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
    pub id: std::sync::Arc<str>,
    /// Exact channel it was published on.
    pub channel: String,
    /// When the broker accepted it.
    pub timestamp: SystemTime,
    /// The publisher's `source`, else its peer address (shared by the events of one
    /// connection's stream, not copied per event).
    pub source: Arc<str>,
    /// Opaque payload.
    pub payload: Bytes,
    /// Free-form key/value pairs.
    pub metadata: HashMap<String, String>,
    /// MIME type of the payload, possibly empty.
    pub content_type: String,
    /// Its place in the channel's history, when the channel keeps one.
    pub position: Option<crate::history::Position>,
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
            id: id.into(),
            channel,
            timestamp,
            source: source.into(),
            payload,
            metadata,
            content_type,
            counters: None,
            position: None,
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
    /// The publisher's address, the fallback source (shared, not copied per event).
    pub peer: Arc<str>,
    /// Durable consumers deliver events of one key one at a time, in order (docs/durable.md).
    pub ordering_key: String,
    /// A key seen within the dedup window makes this publish a no-op duplicate.
    pub idempotency_key: String,
    /// Whose keys `idempotency_key` is among: keys of different scopes never collide,
    /// so one publisher can neither suppress another's events nor learn their ids (the
    /// publishing principal's name; empty = the one scope of unauthenticated callers).
    pub idempotency_scope: String,
}

/// Whether a publish's channel still has to be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChannelCheck {
    Needed,
    /// The same name was just checked, for the publish before it.
    Done,
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
    /// Checks the docs/concepts.md limits and turns the input into an event with a fresh id.
    /// The channel check is left out when `channel` says it was done (a run of publishes
    /// on one channel checks it once).
    /// `stamp` is the clock reading of the publish (shared by the events of one call).
    pub(crate) fn into_event(
        self,
        max_payload_bytes: usize,
        channel: ChannelCheck,
        stamp: Stamp,
    ) -> Result<Event, Error> {
        if channel == ChannelCheck::Needed {
            validate_channel(&self.channel)?;
        }
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
        let source = if self.source.is_empty() { self.peer } else { Arc::from(self.source) };
        Ok(Event {
            id: new_id_at(stamp.unix_ms),
            channel: self.channel,
            timestamp: stamp.at,
            source,
            payload: self.payload,
            metadata: self.metadata,
            content_type: self.content_type,
            counters: None,
            position: None,
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

/// One reading of the clock, shared by the events published together: their
/// timestamp, and the millisecond their ids are made in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    pub(crate) at: SystemTime,
    unix_ms: u64,
}

impl Stamp {
    pub(crate) fn now() -> Self {
        let at = SystemTime::now();
        Self { at, unix_ms: at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64) }
    }
}

/// The newest id's time and counter, process-wide: `unix_ms << 12 | counter`.
static LAST_ID_STAMP: AtomicU64 = AtomicU64::new(0);

/// A new time-ordered unique id (UUIDv7): 48 bits of Unix milliseconds, a 12-bit
/// counter within the millisecond (RFC 9562 §6.2, method 1), 62 random bits.
///
/// Ids sort in the order they were made across the whole process, even when the clock
/// steps back, and the 4,097th id of a millisecond borrows the next one. One atomic
/// read-modify-write, no lock: `uuid`'s own generator takes a process-wide mutex for
/// each id, on every publish.
pub fn new_id() -> Arc<str> {
    new_id_at(Stamp::now().unix_ms)
}

/// [`new_id`] for an event made at `now_ms` (one clock read for its timestamp and its id).
fn new_id_at(now_ms: u64) -> Arc<str> {
    let fresh = now_ms << 12;
    let next = |last: u64| if fresh > last { fresh } else { last + 1 };
    let stamp = match LAST_ID_STAMP.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| Some(next(last))) {
        Ok(last) | Err(last) => next(last),
    };
    id_from(stamp, rand::random())
}

/// Two lowercase hex digits per byte value.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        pairs[i] = [DIGITS[i >> 4], DIGITS[i & 0xf]];
        i += 1;
    }
    pairs
};

fn id_from(stamp: u64, random: u64) -> Arc<str> {
    let ms = stamp >> 12;
    let counter = (stamp & 0xfff) as u16;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6..8].copy_from_slice(&(0x7000 | counter).to_be_bytes());
    bytes[8..].copy_from_slice(&(random & (u64::MAX >> 2) | 1 << 63).to_be_bytes());
    // The hyphenated text (8-4-4-4-12) through a table into a stack buffer, then one
    // exact allocation: no formatting machinery, no growing string.
    let mut text = [b'-'; 36];
    let mut at = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        text[at..at + 2].copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
        at += 2;
    }
    // Only ASCII hex digits and hyphens were written.
    let text = std::str::from_utf8(&text).unwrap_or_default();
    Arc::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(channel: &str) -> PublishInput {
        PublishInput { channel: channel.into(), peer: "127.0.0.1:1".into(), ..Default::default() }
    }

    #[test]
    fn source_defaults_to_peer() {
        let ev = input("a.b").into_event(10, ChannelCheck::Needed, Stamp::now()).unwrap();
        assert_eq!(&*ev.source, "127.0.0.1:1");
        let ev = PublishInput { source: "billing".into(), ..input("a.b") }
            .into_event(10, ChannelCheck::Needed, Stamp::now())
            .unwrap();
        assert_eq!(&*ev.source, "billing");
    }

    #[test]
    fn limits_are_enforced() {
        let big = PublishInput { payload: Bytes::from(vec![0; 11]), ..input("a") };
        assert!(matches!(
            big.into_event(10, ChannelCheck::Needed, Stamp::now()),
            Err(Error::PayloadTooLarge { size: 11, limit: 10 })
        ));
        let mut meta = HashMap::new();
        meta.insert(String::new(), "v".into());
        let bad = PublishInput { metadata: meta, ..input("a") };
        assert!(matches!(
            bad.into_event(10, ChannelCheck::Needed, Stamp::now()),
            Err(Error::Metadata(MetadataError::BadKey { .. }))
        ));
        let many: HashMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        let bad = PublishInput { metadata: many, ..input("a") };
        assert!(matches!(
            bad.into_event(10, ChannelCheck::Needed, Stamp::now()),
            Err(Error::Metadata(MetadataError::TooManyEntries { count: 65 }))
        ));
        let long: HashMap<_, _> = [("k".to_owned(), "v".repeat(4097))].into();
        let bad = PublishInput { metadata: long, ..input("a") };
        assert!(matches!(
            bad.into_event(10, ChannelCheck::Needed, Stamp::now()),
            Err(Error::Metadata(MetadataError::ValueTooLong { .. }))
        ));
    }

    #[test]
    fn memory_overhead_is_what_the_readme_says() {
        // docs/concepts.md "Memory bounds" quotes it; a change of the envelope shows up here.
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
        assert_eq!(parsed.hyphenated().to_string(), &*a, "lower-case, hyphenated");
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn ids_are_the_text_uuid_writes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let (stamp, random) = (seed >> 16, seed.rotate_left(29));
            let id = id_from(stamp, random);
            let parsed = uuid::Uuid::parse_str(&id).unwrap();
            assert_eq!(parsed.hyphenated().to_string(), &*id);
        }
    }

    #[test]
    fn ids_carry_their_millisecond_and_counter_and_roll_over() {
        let at = 1_764_000_000_123u64;
        let id = uuid::Uuid::parse_str(&id_from(at << 12 | 5, u64::MAX)).unwrap();
        let (secs, nanos) = id.get_timestamp().unwrap().to_unix();
        assert_eq!(secs * 1000 + u64::from(nanos) / 1_000_000, at);
        assert_eq!(id.as_bytes()[6..8], [0x70, 0x05]);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        // The last counter value of a millisecond, then the next millisecond: in order.
        assert!(id_from(at << 12 | 0xfff, u64::MAX) < id_from((at << 12 | 0xfff) + 1, 0));
    }

    #[test]
    fn ids_from_many_threads_are_unique_and_each_thread_sees_them_rise() {
        let per_thread: Vec<Vec<Arc<str>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| (0..20_000).map(|_| new_id()).collect())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for ids in &per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids rise within a thread");
        }
        let all: std::collections::HashSet<&Arc<str>> = per_thread.iter().flatten().collect();
        assert_eq!(all.len(), 80_000);
    }
}
