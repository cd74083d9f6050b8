//! What a durable backend keeps, and the trait it implements.
//!
//! The engine holds the working state in memory and sends every change to the store as
//! [`StoreOp`]s, many at a time: [`Store::apply`] commits a batch atomically, so
//! concurrent publishes share one commit (and one fsync). [`Store::load`] rebuilds the
//! engine after a restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::durable::config::ConsumerConfig;
use crate::event::Event;

/// Why the store failed. Publishes and acks that hit it are refused, never faked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the durable store at {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("durable store error: {0}")]
    Io(String),
    #[error("corrupt record in the durable store: {0}")]
    Corrupt(String),
}

/// One failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub reason: String,
}

/// How an event finished for a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStatus {
    Completed,
    DeadLettered,
}

/// One line of a consumer's terminal log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub event_id: String,
    pub channel: String,
    pub status: LogStatus,
    pub attempts: u32,
    pub first_delivered_ms: Option<u64>,
    pub finished_ms: u64,
    pub failures: Vec<Failure>,
}

/// An unfinished event of one consumer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRecord {
    /// Deliveries so far.
    pub attempts: u32,
    pub first_delivered_ms: Option<u64>,
    pub failures: Vec<Failure>,
    /// When a failed event is due again (ms since the epoch); `None` = ready now.
    pub due_ms: Option<u64>,
}

/// An idempotency key seen, and the event it named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    pub key: String,
    pub event_id: String,
    pub expires_ms: u64,
}

/// A change to durable state.
#[derive(Debug, Clone)]
pub enum StoreOp {
    PutConsumer(ConsumerConfig),
    /// Removes the consumer and everything it still holds.
    DeleteConsumer(String),
    /// A published event, kept for each consumer whose filter matched it.
    Capture {
        seq: u64,
        event: Arc<Event>,
        ordering_key: Option<Arc<str>>,
        consumers: Vec<Arc<str>>,
        dedup: Option<DedupRecord>,
    },
    /// An idempotency key of a publish no consumer captured.
    Dedup(DedupRecord),
    /// New attempt count, failures or due time of an unfinished event.
    Update {
        consumer: Arc<str>,
        seq: u64,
        entry: EntryRecord,
    },
    /// The event is done for this consumer: into the terminal log.
    Finish {
        consumer: Arc<str>,
        seq: u64,
        log: LogEntry,
    },
}

/// A captured event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: u64,
    pub event: Event,
    pub ordering_key: Option<String>,
}

/// Everything needed to rebuild the engine.
#[derive(Debug, Default)]
pub struct Loaded {
    pub consumers: Vec<ConsumerConfig>,
    pub events: Vec<StoredEvent>,
    /// (consumer, seq, state), in seq order per consumer.
    pub entries: Vec<(String, u64, EntryRecord)>,
    pub dedup: Vec<DedupRecord>,
    pub next_seq: u64,
    /// Consumer → (acked, dead-lettered) counted in the log, for stats after restart.
    pub finished: HashMap<String, (u64, u64)>,
}

/// A page of the terminal log.
#[derive(Debug, Clone, Default)]
pub struct LogPage {
    pub entries: Vec<LogEntry>,
    /// Pass back to continue after the last entry; `None` at the end.
    pub next: Option<u64>,
}

/// A durable backend: the embedded one ([`crate::durable::redb_store`]) or Redis Streams.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Reads the whole durable state (at start-up).
    fn load(&self) -> Result<Loaded, StoreError>;

    /// Commits `ops` atomically; on return they survive a crash (per the fsync policy).
    fn apply(&self, ops: &[StoreOp]) -> Result<(), StoreError>;

    /// True when commits are cheap, in-process memory writes: the engine then applies
    /// them inline instead of through the writer thread (deterministic under paused
    /// time in tests).
    fn inline(&self) -> bool {
        false
    }

    /// The terminal log of `consumer`, oldest first, after position `after`.
    fn log(
        &self,
        consumer: &str,
        status: Option<LogStatus>,
        limit: usize,
        after: Option<u64>,
    ) -> Result<LogPage, StoreError>;
}

/// Milliseconds since the Unix epoch.
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn from_epoch_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Compact binary form of a captured event (payloads are bytes; JSON would bloat them).
pub(crate) fn encode_event(event: &Event, ordering_key: Option<&str>, refs: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(event.approx_size() + 32);
    out.extend_from_slice(&refs.to_le_bytes());
    let micros = event.timestamp.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    out.extend_from_slice(&micros.to_le_bytes());
    for s in [&event.id, &event.channel, &event.source, &event.content_type] {
        put(&mut out, s.as_bytes());
    }
    match ordering_key {
        Some(k) => {
            out.push(1);
            put(&mut out, k.as_bytes());
        }
        None => out.push(0),
    }
    out.extend_from_slice(&(event.metadata.len() as u32).to_le_bytes());
    for (k, v) in &event.metadata {
        put(&mut out, k.as_bytes());
        put(&mut out, v.as_bytes());
    }
    put(&mut out, &event.payload);
    out
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(StoreError::Corrupt("truncated event record".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| StoreError::Corrupt("non-UTF-8 text in event".into()))
    }
}

/// Decodes [`encode_event`]: (event, ordering key, remaining references).
pub(crate) fn decode_event(bytes: &[u8]) -> Result<(Event, Option<String>, u32), StoreError> {
    let mut r = Reader(bytes);
    let refs = r.u32()?;
    let micros = r.u64()?;
    let (id, channel, source, content_type) = (r.string()?, r.string()?, r.string()?, r.string()?);
    let ordering_key = match r.take(1)?[0] {
        0 => None,
        _ => Some(r.string()?),
    };
    let n = r.u32()? as usize;
    let mut metadata = HashMap::with_capacity(n.min(64));
    for _ in 0..n {
        metadata.insert(r.string()?, r.string()?);
    }
    let payload = Bytes::copy_from_slice(r.bytes()?);
    let timestamp = UNIX_EPOCH + Duration::from_micros(micros);
    Ok((Event::from_parts(id, channel, timestamp, source, payload, metadata, content_type), ordering_key, refs))
}

/// Sets the remaining-references count of an encoded event in place.
pub(crate) fn set_refs(bytes: &mut [u8], refs: u32) {
    bytes[..4].copy_from_slice(&refs.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_codec_round_trips() {
        let event = Event::from_parts(
            "id-1".into(),
            "orders.created".into(),
            UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_001),
            "src".into(),
            Bytes::from_static(b"\x00\xffpayload"),
            [("k".to_owned(), "v".to_owned())].into(),
            "application/json".into(),
        );
        let mut bytes = encode_event(&event, Some("order-7"), 3);
        set_refs(&mut bytes, 2);
        let (back, key, refs) = decode_event(&bytes).unwrap();
        assert_eq!((key.as_deref(), refs), (Some("order-7"), 2));
        assert_eq!((back.id, back.channel, back.timestamp), (event.id, event.channel, event.timestamp));
        assert_eq!(
            (back.payload, back.metadata, back.content_type),
            (event.payload, event.metadata, event.content_type)
        );
        assert!(decode_event(&bytes[..bytes.len() - 1]).is_err(), "truncation is detected");
    }
}
