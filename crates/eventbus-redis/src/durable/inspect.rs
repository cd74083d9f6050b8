//! Reading a consumer's state for the operator: its counts (`GetConsumer`), its
//! terminal log (`ListEventLog`) and its pending events (`ListPending`).

use super::*;

impl Shared {
    /// A consumer's state. A consumer whose stream is gone (deleted a moment ago, or
    /// lost with a Redis that kept nothing) is reported unknown after a reload.
    pub(super) async fn info(self: &Arc<Self>, rt: &Runtime) -> Result<ConsumerInfo, DurableError> {
        match self.try_info(rt).await {
            Err(err) if reply::is_missing_stream(&err) => {
                self.reload().await?;
                Err(DurableError::UnknownConsumer(rt.name.to_string()))
            }
            other => other.map_err(unavailable),
        }
    }

    async fn try_info(&self, rt: &Runtime) -> Result<ConsumerInfo, redis::RedisError> {
        let stream = format!("{}:s", rt.base);
        type Counters = (Option<u64>, Option<u64>, Option<u64>, Option<u64>, Option<u64>);
        type Presence = HashMap<String, String>;
        type Row = (u64, Value, u64, Counters, Presence, u64);
        // The consumer's keys in one pipeline (one slot on a cluster); whether it is
        // paused beside it (the definitions' slot).
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN")
            .arg(&stream)
            .cmd("XPENDING")
            .arg(&stream)
            .arg(GROUP)
            .cmd("HLEN")
            .arg(format!("{}:r", rt.base))
            .cmd("HMGET")
            .arg(format!("{}:n", rt.base))
            .arg("acked")
            .arg("dead_lettered")
            .arg("redelivered")
            .arg("redriven")
            .arg("dropped")
            .cmd("HGETALL")
            .arg(format!("{}:c", rt.base))
            .cmd("ZCARD")
            .arg(format!("{}:w", rt.base));
        let mut paused = redis::cmd("HEXISTS");
        paused.arg(&self.keys.paused).arg(&*rt.name);
        let (mut conn, mut paused_conn) = (self.conn(), self.conn());
        let keys = pipe.query_async::<Row>(&mut conn);
        let paused = paused.query_async::<bool>(&mut paused_conn);
        let ((len, pel, waiting, counters, presence, redrivable), paused) = tokio::try_join!(keys, paused)?;
        let in_flight = match pel {
            Value::Array(items) => match items.first() {
                Some(Value::Int(n)) => *n as u64,
                _ => 0,
            },
            _ => 0,
        };
        Ok(ConsumerInfo {
            config: rt.config().as_ref().clone(),
            pending: len.saturating_sub(in_flight) + waiting,
            in_flight,
            clients: cluster_clients(rt.local_clients(), &self.instance, &presence, now_ms()),
            acked: counters.0.unwrap_or(0),
            dead_lettered: counters.1.unwrap_or(0),
            redelivered: counters.2.unwrap_or(0),
            redriven: counters.3.unwrap_or(0),
            dropped: counters.4.unwrap_or(0),
            paused,
            redrivable,
        })
    }

    pub(super) async fn log(
        &self,
        rt: &Runtime,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &str,
    ) -> Result<LogSlice, DurableError> {
        let Some((after, line)) = log_token(page_token) else {
            return Err(DurableError::bad_page_token(page_token));
        };
        let limit = limit.clamp(1, 1000);
        let key = format!("{}:l", rt.base);
        // With `line` n: resume inside entry `after`, from its line n.
        let mut start = match (after, line) {
            ("", _) => "-".to_owned(),
            (id, None) => format!("({id}"),
            (id, Some(_)) => id.to_owned(),
        };
        let mut skip = line.unwrap_or(0);
        let mut page = LogSlice::default();
        loop {
            let rows: Value = redis::cmd("XRANGE")
                .arg(&key)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(limit.max(100))
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            let rows = reply::entries_of(rows).map_err(corrupt)?;
            let Some(last) = rows.last() else { return Ok(page) };
            start = format!("({}", last.id);
            for row in &rows {
                if skip > 0 && row.id != after {
                    skip = 0; // that entry went (trimmed) meanwhile: what follows is all unread
                }
                for (i, line) in log_lines(row).map_err(corrupt)?.enumerate().skip(skip) {
                    if page.entries.len() == limit {
                        page.next_page_token = format!("{}.{i}", row.id);
                        return Ok(page);
                    }
                    let entry: LogEntry =
                        serde_json::from_slice(line).map_err(|e| corrupt(format!("log line: {e}")))?;
                    if status.is_none_or(|s| s == entry.status) {
                        page.entries.push(entry);
                    }
                }
                skip = 0;
            }
        }
    }
}

impl Shared {
    /// One page of the consumer's pending events (the `PENDING` script's order).
    pub(super) async fn pending(
        &self,
        rt: &Runtime,
        limit: usize,
        page_token: &str,
    ) -> Result<PendingSlice, DurableError> {
        let well_formed = page_token.is_empty()
            || page_token.strip_prefix("s:").is_some_and(is_stream_id)
            || page_token.strip_prefix("r:").is_some_and(|id| !id.is_empty());
        if !well_formed {
            return Err(DurableError::bad_page_token(page_token));
        }
        let config = rt.config();
        let reply: Vec<Value> = self
            .scripts
            .pending
            .key(&rt.stream)
            .arg(&rt.base)
            .arg(GROUP)
            .arg(now_ms())
            .arg(config.ack_deadline_ms)
            .arg(limit.clamp(1, 1000))
            .arg(page_token)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let mut reply = reply.into_iter();
        let next_page_token = match reply.next() {
            Some(Value::BulkString(token)) => String::from_utf8(token).map_err(corrupt)?,
            _ => String::new(),
        };
        let entries = reply.map(|row| pending_entry(row).map_err(corrupt)).collect::<Result<_, _>>()?;
        Ok(PendingSlice { entries, next_page_token })
    }
}

/// A row of the `PENDING` script: `{envelope, attempt, next delivery ms or '', failures
/// JSON, state}`.
fn pending_entry(row: Value) -> Result<PendingEntry, String> {
    let Value::Array(parts) = row else { return Err("a pending row that is not a list".into()) };
    let mut parts = parts.into_iter();
    let (Some(Value::BulkString(env)), Some(attempt), Some(next), Some(failures), Some(Value::Int(state))) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a pending row without its five fields".into());
    };
    let text = |v: Value| match v {
        Value::BulkString(b) => String::from_utf8(b).map_err(|e| e.to_string()),
        Value::Int(n) => Ok(n.to_string()),
        _ => Err("a pending field that is not text".to_owned()),
    };
    let event = envelope::decode_own(bytes::Bytes::from(env)).ok_or("a pending row without an event")?;
    let next = text(next)?;
    let state = match state {
        1 => PendingState::Ready,
        2 => PendingState::Delayed,
        3 => PendingState::InFlight,
        4 => PendingState::BlockedByOrderingKey,
        other => return Err(format!("unknown pending state {other}")),
    };
    Ok(PendingEntry {
        event: Arc::new(event),
        attempt: text(attempt)?.parse().map_err(|e| format!("pending attempt: {e}"))?,
        // Redis scores read back as floats ("1732...0" or "1.7e12" style): parse as f64.
        next_delivery_ms: if next.is_empty() {
            None
        } else {
            Some(next.parse::<f64>().map_err(|e| format!("pending due time: {e}"))? as u64)
        },
        failures: serde_json::from_str(&text(failures)?).map_err(|e| format!("pending failures: {e}"))?,
        state,
    })
}

/// Clients attached across the cluster: this instance's own, live, plus the counts the
/// other instances recorded in `:c` (`"{clients} {expires at ms}"`) that have not expired.
fn cluster_clients(local: u32, instance: &str, presence: &HashMap<String, String>, now: u64) -> u32 {
    let others = presence.iter().filter(|(name, _)| name.as_str() != instance).filter_map(|(_, value)| {
        let (clients, expires) = value.split_once(' ')?;
        let (clients, expires) = (clients.parse::<u32>().ok()?, expires.parse::<u64>().ok()?);
        (expires >= now).then_some(clients)
    });
    others.fold(local, u32::saturating_add)
}

fn is_stream_id(s: &str) -> bool {
    let mut parts = s.splitn(2, '-');
    let ms = parts.next().unwrap_or("");
    let seq = parts.next().unwrap_or("");
    !ms.is_empty()
        && !seq.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
        && seq.bytes().all(|b| b.is_ascii_digit())
}

/// A ListEventLog page token: `""` (from the start: `("", None)`), a log entry id (past
/// that entry, `(id, None)`: every token before lines were packed) or `"{entry id}.{n}"`
/// (that entry from its line `n` on, `(id, Some(n))`). None when malformed.
fn log_token(token: &str) -> Option<(&str, Option<usize>)> {
    if token.is_empty() {
        return Some(("", None));
    }
    match token.split_once('.') {
        None => is_stream_id(token).then_some((token, None)),
        Some((id, n)) => {
            let n = n.bytes().all(|b| b.is_ascii_digit()).then(|| n.parse().ok()).flatten()?;
            is_stream_id(id).then_some((id, Some(n)))
        }
    }
}

/// The lines of a terminal-log entry: `j` one line (the only format before lines were
/// packed), or `m` several joined by '\n' (one entry per script that finished events).
fn log_lines(row: &reply::Entry) -> Result<impl Iterator<Item = &[u8]>, String> {
    // `split` of a lone line (`j`, never holding a '\n'): the line itself.
    let lines = row.get("m").or_else(|| row.get("j")).ok_or_else(|| format!("log entry {} holds no line", row.id))?;
    Ok(lines.split(|&b| b == b'\n'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_clients_adds_the_live_counts_of_other_instances() {
        let presence: HashMap<String, String> = [
            ("me", "7 2000"), // this instance: its live count is used instead
            ("b", "2 2000"),  // live
            ("c", "3 999"),   // expired: an instance that died
            ("d", "garbage"), // unreadable: ignored
            ("e", "4 1000"),  // expires exactly now: still counts
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(cluster_clients(1, "me", &presence, 1000), 1 + 2 + 4);
        assert_eq!(cluster_clients(0, "me", &HashMap::new(), 1000), 0);
    }

    #[test]
    fn log_tokens_are_entry_ids_with_an_optional_line() {
        assert_eq!(log_token(""), Some(("", None)));
        assert_eq!(log_token("17-3"), Some(("17-3", None)), "a token from before lines were packed");
        assert_eq!(log_token("17-3.0"), Some(("17-3", Some(0))));
        assert_eq!(log_token("17-3.12"), Some(("17-3", Some(12))));
        for bad in ["x", "17", "17-", "17-3.", "17-3.x", "17-3.-1", ".3", "17-3.1.2", "17-3.99999999999999999999999"] {
            assert_eq!(log_token(bad), None, "{bad}");
        }
    }
}
