//! How things are printed.

use std::fmt::Write as _;

use base64::Engine as _;
use eventbus_client::pb;
use serde_json::{Value, json};

pub(crate) fn time(t: Option<&prost_types::Timestamp>) -> String {
    t.map(ToString::to_string).unwrap_or_else(|| "-".to_owned())
}

/// The payload as text when it is UTF-8, else its size.
pub(crate) fn payload_text(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("<{} bytes binary>", payload.len()),
    }
}

/// Content type of dead letters published by the broker.
const DEAD_LETTER: &str = "application/x-protobuf; type=eventbus.v1.DeadLetter";

/// A dead letter in words, or `None` when the event is not one.
pub(crate) fn dead_letter_text(e: &pb::Event) -> Option<String> {
    if e.content_type != DEAD_LETTER {
        return None;
    }
    let dl = <pb::DeadLetter as prost::Message>::decode(e.payload.clone()).ok()?;
    let reasons: Vec<&str> = dl.failures.iter().map(|f| f.reason.as_str()).collect();
    let original =
        dl.event.as_ref().map(|o| format!("{} {} {}", o.channel, o.id, payload_text(&o.payload))).unwrap_or_default();
    Some(format!(
        "dead letter from consumer {} after {} attempt(s) [{}]: {original}",
        dl.consumer,
        dl.attempts,
        reasons.join("; ")
    ))
}

/// `EPOCH:OFFSET`, as `subscribe --since` takes it.
pub(crate) fn position(p: &pb::EventPosition) -> String {
    format!("{}:{}", p.epoch, p.offset)
}

/// One line per event: time, channel, id, `@position` on a channel with a history,
/// payload, then metadata.
pub(crate) fn event_line(e: &pb::Event) -> String {
    let body = dead_letter_text(e).unwrap_or_else(|| payload_text(&e.payload));
    let mut line = format!("[{}] {} {} ", time(e.timestamp.as_ref()), e.channel, e.id);
    if let Some(p) = &e.position {
        let _ = write!(line, "@{} ", position(p));
    }
    line.push_str(&body);
    let mut meta: Vec<_> = e.metadata.iter().collect();
    meta.sort();
    for (k, v) in meta {
        let _ = write!(line, " {k}={v}");
    }
    line
}

/// An event as a JSON object; a payload that is not UTF-8 goes in `payload_base64`;
/// `position` only on a channel with a history.
pub(crate) fn event_json(e: &pb::Event) -> Value {
    let mut v = json!({
        "id": e.id,
        "channel": e.channel,
        "timestamp": time(e.timestamp.as_ref()),
        "source": e.source,
        "content_type": e.content_type,
        "metadata": e.metadata,
    });
    match std::str::from_utf8(&e.payload) {
        Ok(text) => v["payload"] = json!(text),
        Err(_) => v["payload_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(&e.payload)),
    }
    if let Some(p) = &e.position {
        v["position"] = json!({ "epoch": p.epoch, "offset": p.offset });
    }
    v
}

/// A left-aligned table with a header row.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let text: Vec<String> = cells.zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_print_as_text_or_size() {
        assert_eq!(payload_text(b"{\"id\":1}"), "{\"id\":1}");
        assert_eq!(payload_text(&[0xff, 0x00]), "<2 bytes binary>");
    }

    #[test]
    fn json_event_uses_base64_for_binary() {
        let e = pb::Event { payload: vec![0xff, 0x00].into(), ..Default::default() };
        let v = event_json(&e);
        assert_eq!(v["payload_base64"], "/wA=");
        assert!(v.get("payload").is_none());
        let e = pb::Event { payload: "hi".into(), ..Default::default() };
        assert_eq!(event_json(&e)["payload"], "hi");
    }

    #[test]
    fn event_line_shows_time_channel_id_payload_and_metadata() {
        let mut e = pb::Event {
            id: "id1".into(),
            channel: "a.b".into(),
            timestamp: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5_000 }),
            payload: "x".into(),
            ..Default::default()
        };
        e.metadata.insert("k".into(), "v".into());
        assert_eq!(event_line(&e), "[2023-11-14T22:13:20.000005Z] a.b id1 x k=v");
        e.position = Some(pb::EventPosition { epoch: "18f0a".into(), offset: 42 });
        assert_eq!(event_line(&e), "[2023-11-14T22:13:20.000005Z] a.b id1 @18f0a:42 x k=v");
        assert_eq!(event_json(&e)["position"], json!({ "epoch": "18f0a", "offset": 42 }));
    }

    #[test]
    fn dead_letters_print_in_words() {
        let dl = pb::DeadLetter {
            event: Some(pb::Event {
                id: "e1".into(),
                channel: "pay".into(),
                payload: "p".into(),
                ..Default::default()
            }),
            consumer: "billing".into(),
            owner: String::new(),
            attempts: 2,
            failures: vec![pb::Failure { at: None, reason: "declined".into() }],
        };
        let e = pb::Event {
            content_type: DEAD_LETTER.into(),
            payload: prost::Message::encode_to_vec(&dl).into(),
            ..Default::default()
        };
        assert_eq!(
            dead_letter_text(&e).unwrap(),
            "dead letter from consumer billing after 2 attempt(s) [declined]: pay e1 p"
        );
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
    }
}
