//! Each script run as the engine runs it (EVALSHA, loaded on NOSCRIPT) on a
//! redis-server of the test's own: the keys it touches, its answers and what it
//! refuses.

mod capture;
mod consumers;
mod delivery;

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use bytes::Bytes;
use eventbus_core::Event;
use eventbus_core::durable::LogEntry;
use redis::{Connection, FromRedisValue, Value};

use super::Scripts;
use crate::test_redis::TestRedis;

/// The consumer the tests work on: its key base, as the engine names it (prefix `p`).
const B: &str = "p:durable:c";
const GROUP: &str = "eventbus";
/// This instance's name in the group.
const ME: &str = "instance-1";
/// The fleet's terminal-log format (KEYS[1] of the scripts that log).
const LOG_FORMAT: &str = "p:durable:log_format";
/// A clock for the scripts' `now` arguments (ms).
const NOW: u64 = 1_700_000_000_000;

/// Key `suffix` of the consumer (`s`, `d`, `q:k1`…).
fn key(suffix: &str) -> String {
    format!("{B}:{suffix}")
}

/// The machine's clock (ms), for what Redis expires by it.
fn clock_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The envelope of event `id` on `channel`, as the engine stores it.
fn envelope(id: &str, channel: &str) -> Vec<u8> {
    let event = Event::from_parts(
        id.into(),
        channel.into(),
        SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(NOW),
        "test".into(),
        Bytes::from_static(b"payload"),
        HashMap::new(),
        String::new(),
    );
    crate::envelope::encode(&event)
}

struct Fixture {
    redis: TestRedis,
    conn: Connection,
    s: Scripts,
}

impl Fixture {
    /// An empty Redis; None when the test is skipped.
    fn bare() -> Option<Self> {
        let redis = TestRedis::start()?;
        let conn = redis.conn();
        Some(Self { redis, conn, s: Scripts::new() })
    }

    /// A Redis holding the consumer's stream and group (as `DEFINE` leaves them).
    fn consumer() -> Option<Self> {
        let mut fx = Self::bare()?;
        fx.q::<()>(&["XGROUP", "CREATE", &key("s"), GROUP, "0", "MKSTREAM"]);
        Some(fx)
    }

    /// A command's answer.
    fn q<T: FromRedisValue>(&mut self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.conn).unwrap_or_else(|err| panic!("{args:?}: {err}"))
    }

    /// Every key in Redis.
    fn keys(&mut self) -> BTreeSet<String> {
        self.q(&["KEYS", "*"])
    }

    fn len(&mut self, suffix: &str) -> usize {
        match self.q::<String>(&["TYPE", &key(suffix)]).as_str() {
            "stream" => self.q(&["XLEN", &key(suffix)]),
            "hash" => self.q(&["HLEN", &key(suffix)]),
            "zset" => self.q(&["ZCARD", &key(suffix)]),
            "list" => self.q(&["LLEN", &key(suffix)]),
            _ => 0,
        }
    }

    fn counter(&mut self, field: &str) -> Option<i64> {
        self.q(&["HGET", &key("n"), field])
    }

    /// Captures events `(id, ordering key)` for the consumer (the capture script, as
    /// on a cluster), on channel `a.b`.
    fn capture(&mut self, events: &[(&str, &str)]) {
        let mut call = self.s.capture.key(key("s"));
        call.arg(B).arg(0).arg(NOW).arg(60_000);
        for (id, ordering) in events {
            call.arg(*id).arg(envelope(id, "a.b")).arg("a.b").arg(*ordering).arg(0);
        }
        assert_eq!(call.invoke::<i64>(&mut self.conn).unwrap(), 1);
    }

    /// Reads every new entry as [`ME`]; their stream ids, in order.
    fn deliver(&mut self) -> Vec<String> {
        self.q::<Value>(&["XREADGROUP", "GROUP", GROUP, ME, "COUNT", "100", "STREAMS", &key("s"), ">"]);
        self.in_flight().into_iter().map(|(sid, _)| sid).collect()
    }

    /// The pending entries: stream id and owner.
    fn in_flight(&mut self) -> Vec<(String, String)> {
        let rows: Vec<(String, String, i64, i64)> = self.q(&["XPENDING", &key("s"), GROUP, "-", "+", "100"]);
        rows.into_iter().map(|(sid, owner, _, _)| (sid, owner)).collect()
    }

    /// The stream's entries: stream id and fields.
    fn stream(&mut self) -> Vec<(String, HashMap<String, Vec<u8>>)> {
        self.q(&["XRANGE", &key("s"), "-", "+"])
    }

    /// The terminal log's entries (their fields).
    fn log_entries(&mut self) -> Vec<HashMap<String, String>> {
        let rows: Vec<(String, HashMap<String, String>)> = self.q(&["XRANGE", &key("l"), "-", "+"]);
        rows.into_iter().map(|(_, fields)| fields).collect()
    }

    /// The terminal log's lines, parsed, whichever way they are packed.
    fn log_lines(&mut self) -> Vec<LogEntry> {
        let mut lines = Vec::new();
        for entry in self.log_entries() {
            let text = entry.get("j").or_else(|| entry.get("m")).expect("a log entry holds j or m");
            lines.extend(text.split('\n').map(|l| serde_json::from_str::<LogEntry>(l).expect("a LogEntry")));
        }
        lines
    }

    /// Fails the pending entry `sid` (owned by [`ME`]) once, `delay_ms` later (-1:
    /// the backoff), `term` at once; up to `max_attempts`. The script's answer.
    fn fail(&mut self, sid: &str, delay_ms: i64, term: bool, max_attempts: u32) -> Vec<Value> {
        let mut call = self.s.fail.key(LOG_FORMAT);
        call.arg(B).arg(GROUP).arg(NOW).arg(100).arg(ME);
        call.arg(max_attempts).arg(1000).arg(2.0).arg(60_000).arg(0);
        call.arg(sid).arg("it broke").arg(delay_ms).arg(u8::from(term)).arg(NOW - 5);
        call.invoke(&mut self.conn).unwrap()
    }
}

/// A text in a script's answer.
fn text(value: &Value) -> String {
    redis::from_redis_value_ref(value).unwrap()
}
