//! The actor's writes: acks, failed attempts, requeues, presence, the lease and
//! deadline extensions, collected between wake-ups and sent as one script per kind.

use super::*;

/// One failed attempt to report.
pub(super) struct FailItem {
    pub(super) sid: String,
    pub(super) reason: String,
    pub(super) delay_ms: i64,
    pub(super) term: bool,
    pub(super) first_ms: u64,
}

/// One ack to apply.
pub(super) struct AckItem {
    /// Empty for a late ack (the event is not held here).
    sid: String,
    event_id: Arc<str>,
    ordering_key: Option<String>,
}

/// Appends the terminal-log line of a completed event to `lines` (joined by '\n'): the
/// JSON of its `LogEntry`, written from borrowed parts (no copy of the id, channel or
/// failures).
fn write_completed(
    lines: &mut Vec<u8>,
    event_id: &str,
    channel: &str,
    attempts: u32,
    first_ms: u64,
    now: u64,
    failures: &[Failure],
) {
    use std::io::Write as _;
    if !lines.is_empty() {
        lines.push(b'\n');
    }
    // Writing into a Vec cannot fail; JSON escapes any '\n' inside the strings.
    lines.extend_from_slice(b"{\"event_id\":");
    let _ = serde_json::to_writer(&mut *lines, event_id);
    lines.extend_from_slice(b",\"channel\":");
    let _ = serde_json::to_writer(&mut *lines, channel);
    let _ = write!(
        lines,
        ",\"status\":\"Completed\",\"attempts\":{attempts},\"first_delivered_ms\":{first_ms},\"finished_ms\":{now},\"failures\":"
    );
    let _ = serde_json::to_writer(&mut *lines, failures);
    lines.push(b'}');
}

impl AckItem {
    /// An ack of an event held here; its log line is appended to `lines` (joined by '\n').
    pub(super) fn held(event_id: Arc<str>, held: Held, lines: &mut Vec<u8>, now: u64) -> Self {
        let Ready { sid, event, attempt, ordering_key, failures, .. } = held.entry;
        write_completed(lines, &event_id, &event.channel, attempt, held.first_ms, now, &failures);
        Self { sid, event_id, ordering_key }
    }

    pub(super) fn late(event_id: String) -> Self {
        Self { sid: String::new(), event_id: event_id.into(), ordering_key: None }
    }
}

impl FailItem {
    /// `delay_ms` -1 = the backoff; `term` dead-letters at once.
    pub(super) fn of(held: Held, reason: String, delay_ms: i64, term: bool) -> Self {
        Self { sid: held.entry.sid, reason, delay_ms, term, first_ms: held.first_ms }
    }
}

impl Actor {
    /// Sends the changes collected so far, one script per kind.
    pub(super) fn flush(&mut self) {
        let base = self.rt.base.clone();
        let maxlen = self.shared.retention.max_entries.max(1);
        if !self.acks.is_empty() {
            let newest = self.acks.iter().filter_map(|a| Some((stream_id_order(&a.sid)?, a.sid.as_str()))).max();
            let mut args = Args::logging(&self.shared.scripts.ack, &self.rt);
            args.push(&base).push(GROUP).push(maxlen).push(now_ms()).push(&self.ack_lines);
            args.push(newest.map_or("", |(_, sid)| sid));
            self.ack_lines.clear();
            for a in self.acks.drain(..) {
                args.push(a.sid).push(&*a.event_id).push(a.ordering_key.as_deref().unwrap_or(""));
            }
            self.script(|s| &s.ack, args, "ack failed", |_| Outcome::default());
        }
        if !self.fails.is_empty() {
            let mut args = Args::logging(&self.shared.scripts.fail, &self.rt);
            args.push(&base).push(GROUP).push(now_ms()).push(maxlen).push(&self.shared.instance);
            args.retry_config(&self.config);
            for f in self.fails.drain(..) {
                args.push(f.sid).push(f.reason).push(f.delay_ms).push(u8::from(f.term)).push(f.first_ms);
            }
            self.script(|s| &s.fail, args, "recording a failed attempt failed", |v| outcome_of(v, false));
        }
        if !self.requeue.is_empty() {
            let mut args = Args::new(&self.shared.scripts.requeue, &self.rt);
            args.push(&base).push(GROUP).push(&self.shared.instance);
            for sid in self.requeue.drain(..) {
                args.push(sid);
            }
            self.script(|s| &s.requeue, args, "requeue failed", |_| Outcome::default());
        }
        if std::mem::take(&mut self.presence_due) {
            let now = now_ms();
            let mut args = Args::new(&self.shared.scripts.presence, &self.rt);
            args.push(&base)
                .push(&self.shared.instance)
                .push(self.clients.len())
                .push(now)
                .push(now + PRESENCE_TTL.as_millis() as u64);
            self.script(|s| &s.presence, args, "recording attached clients failed", |_| Outcome::default());
        }
        if let Some(want) = self.want_lease.take() {
            let mut args = Args::new(&self.shared.scripts.lease, &self.rt);
            args.push(&base)
                .push(GROUP)
                .push(&self.shared.instance)
                .push(LEASE_TTL.as_millis() as u64)
                .push(u8::from(want));
            self.script(
                |s| &s.lease,
                args,
                "the exclusive consumer's lease failed",
                |v| Outcome { lease: Some(matches!(v, Value::Int(1))), ..Outcome::default() },
            );
        }
        if !self.touches.is_empty() {
            let mut cmd = redis::cmd("XCLAIM");
            cmd.arg(&self.stream).arg(GROUP).arg(&self.shared.instance).arg(0);
            for sid in self.touches.drain(..) {
                cmd.arg(sid);
            }
            cmd.arg("JUSTID");
            let mut conn = self.shared.conn();
            self.ops.push(Box::pin(async move {
                match cmd.query_async::<Value>(&mut conn).await {
                    Ok(_) => Outcome::default(),
                    Err(err) => Outcome {
                        error: Some(format!("redis: extending deadlines failed: {err}")),
                        ..Outcome::default()
                    },
                }
            }));
        }
    }

    /// Runs a script in the background; its outcome comes back through `ops`.
    pub(super) fn script(
        &mut self,
        pick: fn(&Scripts) -> &Script,
        args: Args,
        what: &'static str,
        parse: fn(Value) -> Outcome,
    ) {
        let shared = Arc::clone(&self.shared);
        self.ops.push(Box::pin(async move {
            let mut conn = shared.conn();
            let mut result = args.0.query_async::<Value>(&mut conn).await;
            if let Err(err) = &result
                && err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            {
                // Redis lost its script cache (restarted, SCRIPT FLUSH): load it, once.
                result = match pick(&shared.scripts).load_async(&mut conn).await {
                    Ok(_) => args.0.query_async::<Value>(&mut conn).await,
                    Err(err) => Err(err),
                };
            }
            match result {
                Ok(value) => parse(value),
                Err(err) => Outcome { error: Some(format!("redis: {what}: {err}")), ..Outcome::default() },
            }
        }));
    }
}

/// A script call (EVALSHA), its arguments written straight into the command
/// (owned: the script runs after the actor moves on).
pub(super) struct Args(redis::Cmd);

impl Args {
    /// Its one key is the consumer's stream (it routes the script on a cluster).
    pub(super) fn new(script: &Script, rt: &Runtime) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(&rt.stream);
        Self(cmd)
    }

    /// For a script that writes the terminal log: its one key is the log's format.
    pub(super) fn logging(script: &Script, rt: &Runtime) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(&rt.log_key);
        Self(cmd)
    }

    pub(super) fn push(&mut self, value: impl redis::ToRedisArgs) -> &mut Self {
        self.0.arg(value);
        self
    }

    pub(super) fn retry_config(&mut self, config: &ConsumerConfig) -> &mut Self {
        let linear = u8::from(config.backoff.kind == eventbus_core::durable::BackoffKind::Linear);
        self.push(config.max_attempts)
            .push(config.backoff.initial_ms)
            .push(config.backoff.multiplier)
            .push(config.backoff.max_ms)
            .push(linear)
    }
}

/// A stream id's place in the stream (`"{ms}-{seq}"`); None for a late ack's empty id.
fn stream_id_order(sid: &str) -> Option<(u64, u64)> {
    let (ms, seq) = sid.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use eventbus_core::durable::{LogEntry, LogStatus};

    use super::*;

    #[test]
    fn completed_lines_read_back_as_log_entries() {
        let failures = vec![Failure { at_ms: 5, reason: "odd \"reason\"\nover lines".into() }];
        let mut lines = Vec::new();
        write_completed(&mut lines, "id-1", "a.b", 2, 3, 9, &failures);
        write_completed(&mut lines, "id-\u{e9}\n", "c", 1, 4, 10, &[]);
        let read: Vec<LogEntry> =
            lines.split(|&b| b == b'\n').map(|l| serde_json::from_slice(l).expect("a log line")).collect();
        let entry = |event_id: &str, channel: &str, attempts, first, finished, failures: &[Failure]| LogEntry {
            event_id: event_id.into(),
            channel: channel.into(),
            status: LogStatus::Completed,
            attempts,
            first_delivered_ms: Some(first),
            finished_ms: finished,
            failures: failures.to_vec(),
        };
        assert_eq!(read, [entry("id-1", "a.b", 2, 3, 9, &failures), entry("id-\u{e9}\n", "c", 1, 4, 10, &[])]);
    }
}
