//! The terminal log: how each event finished for a consumer, with its failed attempts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

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
    /// A dead letter put back to its consumer (`RedriveDeadLetters`): it is pending
    /// again, and a later line tells how it finished this time.
    Redriven,
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

/// A page of a consumer's terminal log.
#[derive(Debug, Clone, Default)]
pub struct LogSlice {
    pub entries: Vec<LogEntry>,
    /// Pass back as `page_token` to continue; empty at the end.
    pub next_page_token: String,
}

/// Terminal log bounds, per consumer (`durable.log_max_entries`, `durable.log_max_age_ms`).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_entries: u64,
    pub max_age_ms: u64,
}

/// Milliseconds since the Unix epoch.
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn from_epoch_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
