//! The Lua scripts: every change to a consumer's state is one atomic script, so any
//! instance may run any step and two instances racing on one event cannot both win.
//!
//! Stream entry fields: `e` the event envelope, `k` ordering key (absent = none), and
//! for an event appended again after a failure `a` (failed attempts so far), `f`
//! (first delivery, ms) and `x` (failures, JSON `[{"at_ms":…,"reason":…}]`). The event
//! id and channel are read from the envelope (`meta` in the prelude): every field costs
//! on each read, and only the rare failure paths need them here. A record in `:r` is `cmsgpack({e, c, k, i, a, f, x})`
//! (`k`, `f`, `x` empty when unset). A terminal-log entry holds the lines (each the JSON
//! of a `LogEntry`) of one script: one line in field `j` (the only format before lines
//! were packed, and still the only one written while `P:durable:log_format` is not `2`,
//! so that instances of the earlier release keep reading the log during a rolling
//! upgrade), or `c` their count and `m` the lines joined by '\n'; `:n` field `logged`
//! counts the lines (absent: a log of `j` entries only).
//!
//! Files: `prelude` (functions the delivery scripts share), `capture`, `delivery`,
//! `consumers`.

mod capture;
mod consumers;
mod delivery;
mod prelude;

use redis::Script;

use capture::{CAPTURE, CAPTURE_ONE, PUBLISH};
use consumers::{DEFINE, DELETE, INIT, PAUSE, PENDING, PURGE, PURGE_ONE, REDRIVE};
use delivery::{ACK, FAIL, LEASE, PRESENCE, REQUEUE, TICK};
use prelude::PRELUDE;

/// The scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) capture: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) requeue: Script,
    pub(crate) tick: Script,
    pub(crate) define: Script,
    pub(crate) delete: Script,
    pub(crate) init: Script,
    pub(crate) purge: Script,
    pub(crate) presence: Script,
    pub(crate) redrive: Script,
    pub(crate) pending: Script,
    pub(crate) pause: Script,
    pub(crate) lease: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Self {
            publish: Script::new(&format!("{CAPTURE_ONE}\n{}\n{PUBLISH}", crate::history::RETAIN)),
            capture: Script::new(&format!("{CAPTURE_ONE}\n{CAPTURE}")),
            ack: with_prelude(ACK),
            fail: with_prelude(FAIL),
            requeue: with_prelude(REQUEUE),
            tick: with_prelude(TICK),
            define: Script::new(DEFINE),
            delete: Script::new(&format!("{PURGE_ONE}\n{DELETE}")),
            init: Script::new(INIT),
            purge: Script::new(&format!("{PURGE_ONE}\n{PURGE}")),
            presence: Script::new(PRESENCE),
            redrive: with_prelude(&format!("{CAPTURE_ONE}\n{REDRIVE}")),
            pending: with_prelude(PENDING),
            pause: Script::new(PAUSE),
            lease: Script::new(LEASE),
        }
    }
}
