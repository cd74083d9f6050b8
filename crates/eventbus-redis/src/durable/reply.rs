//! Reading Redis replies: stream entries, script outcomes, and the errors that mean a
//! stream is gone.

use bytes::Bytes;
use redis::Value;

use super::actor::{DeadLetter, Outcome};

/// NOGROUP, or a blocked read whose stream was deleted.
pub(crate) fn is_missing_stream(err: &redis::RedisError) -> bool {
    // Inside a pipeline the server's code is only in the text.
    let text = err.to_string();
    text.contains("NOGROUP") || (text.contains("UNBLOCKED") && text.contains("no longer exists"))
}

/// FAIL: `{next due, dead...}`; TICK: `{next due, more, dead...}`.
pub(crate) fn outcome_of(value: Value, with_more: bool) -> Outcome {
    let mut out = Outcome::default();
    let Value::Array(items) = value else { return out };
    let mut items = items.into_iter();
    out.next_due = items.next().and_then(|v| text(&v)).and_then(|s| s.parse::<f64>().ok()).map(|f| f as u64);
    if with_more {
        out.more = matches!(items.next(), Some(Value::Int(1)));
    }
    for dead in items {
        let Value::Array(parts) = dead else { continue };
        let mut parts = parts.into_iter();
        let (Some(Value::BulkString(env)), Some(attempts), Some(failures), Some(id)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        out.dead.push(DeadLetter {
            envelope: Bytes::from(env),
            attempts: text(&attempts).and_then(|a| a.parse().ok()).unwrap_or(0),
            failures: text(&failures).unwrap_or_default(),
            event_id: text(&id).unwrap_or_default(),
        });
    }
    out
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A stream entry: its id and fields, moved out of the reply (no copies).
pub(crate) struct Entry {
    pub(crate) id: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.as_slice())
    }

    pub(crate) fn take(&mut self, name: &str) -> Option<Vec<u8>> {
        let at = self.fields.iter().position(|(k, _)| k == name.as_bytes())?;
        Some(self.fields.swap_remove(at).1)
    }

    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// Stream entries `[[id, [field, value, ...]], ...]`.
pub(crate) fn entries_of(value: Value) -> Result<Vec<Entry>, String> {
    let Value::Array(rows) = value else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Value::Array(row) = row else { return Err("stream entry is not an array".into()) };
        let mut row = row.into_iter();
        let (Some(Value::BulkString(id)), Some(Value::Array(kv))) = (row.next(), row.next()) else {
            // A deleted entry still in the pending list comes back as [id, nil].
            continue;
        };
        let id = String::from_utf8(id).map_err(|_| "stream entry id is not text")?;
        let mut fields = Vec::with_capacity(kv.len() / 2);
        let mut kv = kv.into_iter();
        while let (Some(Value::BulkString(k)), Some(Value::BulkString(v))) = (kv.next(), kv.next()) {
            fields.push((k, v));
        }
        out.push(Entry { id, fields });
    }
    Ok(out)
}
