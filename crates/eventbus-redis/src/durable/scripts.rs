//! The Lua scripts: every change to a consumer's state is one atomic script, so any
//! instance may run any step and two instances racing on one event cannot both win.
//!
//! Stream entry fields: `e` the event envelope, `k` ordering key (absent = none), and
//! for an event appended again after a failure `a` (failed attempts so far), `f`
//! (first delivery, ms) and `x` (failures, JSON `[{"at_ms":…,"reason":…}]`). The event
//! id and channel are read from the envelope (`meta` in the prelude): every field costs
//! on each read, and only the rare failure paths need them here. A record in `:r` is
//! `cmsgpack({e, c, k, i, a, f, x})` (`k`, `f`, `x` empty when unset). A terminal-log
//! entry holds the lines (each the JSON of a `LogEntry`) of one script: one line in
//! field `j` (the only format before lines were packed, and still the only one written
//! while `P:durable:log_format` is not `2`, so that instances of the earlier release
//! keep reading the log during a rolling upgrade), or `c` their count and `m` the lines
//! joined by '\n'; `:n` field `logged` counts the lines (absent: a log of `j` entries
//! only).
//!
//! Each script is a file in `lua/`, its arguments and answers described at its top; a
//! script that uses shared functions is those pieces followed by its body, put together
//! at compile time: `prelude.lua` (what the delivery scripts share), `capture_one.lua`
//! (storing one event for one consumer), `purge_one.lua` (deleting a consumer's keys),
//! and the history's `retain.lua` (`crate::history`). `.luacheckrc` at the root of the
//! repository lints them with the same pieces in view.

use redis::Script;

/// The text of a script: the named files of `lua/` (or paths from there), in order.
macro_rules! lua {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!("lua/", $file, ".lua"))),+)
    };
}

pub(crate) const PUBLISH: &str = lua!("capture_one", "../../history/retain", "publish");
pub(crate) const CAPTURE: &str = lua!("capture_one", "capture");
pub(crate) const ACK: &str = lua!("prelude", "ack");
pub(crate) const FAIL: &str = lua!("prelude", "fail");
pub(crate) const REQUEUE: &str = lua!("prelude", "requeue");
pub(crate) const TICK: &str = lua!("prelude", "tick");
pub(crate) const DEFINE: &str = lua!("define");
pub(crate) const DELETE: &str = lua!("purge_one", "delete");
pub(crate) const INIT: &str = lua!("init");
pub(crate) const PURGE: &str = lua!("purge_one", "purge");
pub(crate) const PRESENCE: &str = lua!("presence");
pub(crate) const REDRIVE: &str = lua!("prelude", "capture_one", "redrive");
pub(crate) const PENDING: &str = lua!("prelude", "pending");
pub(crate) const PAUSE: &str = lua!("pause");
pub(crate) const LEASE: &str = lua!("lease");

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
        Self {
            publish: Script::new(PUBLISH),
            capture: Script::new(CAPTURE),
            ack: Script::new(ACK),
            fail: Script::new(FAIL),
            requeue: Script::new(REQUEUE),
            tick: Script::new(TICK),
            define: Script::new(DEFINE),
            delete: Script::new(DELETE),
            init: Script::new(INIT),
            purge: Script::new(PURGE),
            presence: Script::new(PRESENCE),
            redrive: Script::new(REDRIVE),
            pending: Script::new(PENDING),
            pause: Script::new(PAUSE),
            lease: Script::new(LEASE),
        }
    }
}

#[cfg(test)]
mod tests;
