//! What an attached client receives, and how both engines share events among clients.

use std::sync::Arc;
use std::time::SystemTime;

use crate::event::Event;

/// Reason recorded when an ack deadline passes.
pub const REASON_DEADLINE: &str = "ack deadline exceeded";
/// Reason recorded when a client leaves with events in flight.
pub const REASON_DISCONNECT: &str = "consumer disconnected";
/// Reason recorded by a `term` without one.
pub const REASON_TERM: &str = "terminated by the consumer";
/// Default events per delivery message.
pub const DEFAULT_MAX_BATCH: u32 = 256;

/// One event handed to a client.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: Arc<Event>,
    /// 1-based.
    pub attempt: u32,
    /// Ack before this, or the event counts as failed and is redelivered.
    pub deadline: SystemTime,
}

/// What a client asks for when it attaches.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientOptions {
    /// 0 = the consumer's `max_in_flight` (also the ceiling).
    pub max_in_flight: u32,
    /// 0 = [`DEFAULT_MAX_BATCH`].
    pub max_batch: u32,
}

impl ClientOptions {
    /// (max_in_flight, max_batch) in force for a consumer whose ceiling is `ceiling`.
    pub fn resolve(self, ceiling: u32) -> (u32, u32) {
        let max_in_flight = match self.max_in_flight {
            0 => ceiling,
            n => n.min(ceiling),
        };
        let max_batch = match self.max_batch {
            0 => DEFAULT_MAX_BATCH,
            n => n,
        };
        (max_in_flight, max_batch)
    }
}

/// Round-robin over `len` clients from `*next`: the first with room, and its room
/// (`room_of` answers 0 for a full or departed client); `None` when none has any.
/// Both engines hand out events with it.
pub fn next_with_room(len: usize, next: &mut usize, room_of: impl Fn(usize) -> usize) -> Option<(usize, usize)> {
    for _ in 0..len {
        let i = *next % len;
        *next = next.wrapping_add(1);
        let room = room_of(i);
        if room > 0 {
            return Some((i, room));
        }
    }
    None
}
