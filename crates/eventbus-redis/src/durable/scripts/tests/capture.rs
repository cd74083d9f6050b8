//! `PUBLISH` (one Redis) and `CAPTURE` (a consumer's slot on a cluster).

use std::time::Duration;

use super::*;

const VERSION: &str = "p:durable:version";

/// One event of a publish batch.
struct Published<'a> {
    id: &'a str,
    ordering: &'a str,
    idempotency: &'a str,
    /// History size (0: the channel keeps none).
    history: u32,
    /// (key base, max_pending) of each consumer it matches.
    consumers: &'a [(&'a str, u32)],
}

impl Published<'_> {
    fn plain<'a>(id: &'a str, consumers: &'a [(&'a str, u32)]) -> Published<'a> {
        Published { id, ordering: "", idempotency: "", history: 0, consumers }
    }
}

fn publish(fx: &mut Fixture, known: &str, events: &[Published]) -> Vec<String> {
    let mut call = fx.s.publish.key(VERSION);
    call.arg(known).arg(60_000).arg("p:").arg("p:history:").arg("p:history-meta:").arg("p:history-channels");
    call.arg("b").arg(NOW);
    for e in events {
        call.arg(e.id).arg(envelope(e.id, "a.b")).arg("").arg("a.b").arg(e.ordering).arg(e.idempotency);
        call.arg(e.history).arg(1 << 20).arg(0).arg(NOW).arg(e.consumers.len());
        for (base, max) in e.consumers {
            call.arg(*base).arg(*max);
        }
    }
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn publish_refuses_a_stale_version_and_writes_nothing() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.q::<()>(&["SET", VERSION, "3"]);
    let before = fx.keys();
    let reply = publish(&mut fx, "2", &[Published::plain("e1", &[(B, 0)])]);
    assert_eq!(reply, ["stale", "3"]);
    assert_eq!(fx.keys(), before);
    assert_eq!(fx.len("s"), 0);
    // No version yet reads as 0.
    fx.q::<()>(&["DEL", VERSION]);
    assert_eq!(publish(&mut fx, "1", &[Published::plain("e1", &[(B, 0)])]), ["stale", "0"]);
}

#[test]
fn publish_stores_each_event_for_its_consumers_and_publishes_it() {
    let Some(mut fx) = Fixture::consumer() else { return };
    let mut sub = fx.redis.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sub = sub.as_pubsub();
    sub.subscribe("p:a.b").unwrap();
    let other = "p:durable:other";
    let both: &[(&str, u32)] = &[(B, 0), (other, 0)];
    let reply = publish(&mut fx, "0", &[Published::plain("e1", both)]);
    // One receiver: the subscriber, sent the envelope.
    assert_eq!(reply, ["ok", "1"]);
    assert_eq!(sub.get_message().unwrap().get_payload_bytes(), &envelope("e1", "a.b")[..]);
    assert_eq!(fx.len("s"), 1);
    assert_eq!(fx.q::<usize>(&["XLEN", &format!("{other}:s")]), 1);
    let (_, fields) = fx.stream().remove(0);
    assert_eq!(fields.get("e").map(Vec::as_slice), Some(&envelope("e1", "a.b")[..]));
    assert!(!fields.contains_key("k"), "no ordering key, no `k`");
    let mut expected: BTreeSet<String> = [key("s"), format!("{other}:s")].into();
    assert_eq!(fx.keys(), expected);

    // The second event of an ordering key waits behind the first, off the stream.
    let mine: &[(&str, u32)] = &[(B, 0)];
    let keyed = |id| Published { ordering: "k1", ..Published::plain(id, mine) };
    assert_eq!(publish(&mut fx, "0", &[keyed("e2"), keyed("e3")]), ["ok", "1", "1"]);
    assert_eq!(fx.len("s"), 2);
    assert_eq!(fx.q::<String>(&["HGET", &key("k"), "k1"]), "e2");
    assert_eq!(fx.q::<Vec<String>>(&["LRANGE", &key("q:k1"), "0", "-1"]), ["e3"]);
    assert_eq!(fx.q::<Vec<String>>(&["ZRANGE", &key("y"), "0", "-1"]), ["e3"]);
    assert_eq!(fx.len("r"), 1);
    expected.extend([key("k"), key("q:k1"), key("y"), key("r")]);
    assert_eq!(fx.keys(), expected);

    // A repeated idempotency key answers the first event's id and stores nothing.
    let idem = "p:durable:idem:x";
    let once = |id| Published { idempotency: idem, ..Published::plain(id, mine) };
    assert_eq!(publish(&mut fx, "0", &[once("e4"), once("e5")]), ["ok", "1", "e4"]);
    assert_eq!(fx.len("s"), 3);
    let ttl: i64 = fx.q(&["PTTL", idem]);
    assert!(ttl > 0 && ttl <= 60_000, "the idempotency key expires with the window: {ttl}");
    expected.insert(idem.to_owned());
    assert_eq!(fx.keys(), expected);
}

#[test]
fn publish_drops_what_a_full_consumer_cannot_take_and_keeps_history() {
    let Some(mut fx) = Fixture::consumer() else { return };
    let full: &[(&str, u32)] = &[(B, 1)];
    let reply = publish(&mut fx, "0", &[Published::plain("e1", full), Published::plain("e2", full)]);
    assert_eq!(reply, ["ok", "0", "0"]);
    assert_eq!(fx.len("s"), 1);
    assert_eq!(fx.counter("dropped"), Some(1));

    let kept = Published { history: 10, ..Published::plain("e3", &[]) };
    assert_eq!(publish(&mut fx, "0", &[kept]), ["ok", "0"]);
    assert_eq!(fx.q::<usize>(&["XLEN", "p:history:a.b"]), 1);
    assert_eq!(fx.q::<Vec<String>>(&["SMEMBERS", "p:history-channels"]), ["a.b"]);
    let meta: HashMap<String, String> = fx.q(&["HGETALL", "p:history-meta:a.b"]);
    assert_eq!((meta["epoch"].as_str(), meta["offset"].as_str()), ("e3", "1"));
    let expected: BTreeSet<String> =
        [key("s"), key("n"), "p:history:a.b".into(), "p:history-meta:a.b".into(), "p:history-channels".into()].into();
    assert_eq!(fx.keys(), expected);
}

/// `CAPTURE`: KEYS stream; ARGV base, max_pending, now, window, then (id, envelope,
/// channel, ordering key, once) per event.
fn capture(fx: &mut Fixture, now: u64, events: &[(&str, bool)]) -> i64 {
    let mut call = fx.s.capture.key(key("s"));
    call.arg(B).arg(0).arg(now).arg(60_000);
    for (id, once) in events {
        call.arg(*id).arg(envelope(id, "a.b")).arg("a.b").arg("").arg(u8::from(*once));
    }
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn capture_stores_an_event_with_an_idempotency_key_once_and_refuses_a_gone_consumer() {
    let Some(mut fx) = Fixture::bare() else { return };
    assert_eq!(capture(&mut fx, NOW, &[("e1", false)]), 0);
    assert!(fx.keys().is_empty(), "nothing is written for a consumer that is gone");

    fx.q::<()>(&["XGROUP", "CREATE", &key("s"), GROUP, "0", "MKSTREAM"]);
    assert_eq!(capture(&mut fx, NOW, &[("e1", true), ("e2", false)]), 1);
    // The retry of a publish: e1 is stored already, e2 (no idempotency key) again.
    assert_eq!(capture(&mut fx, NOW + 1, &[("e1", true), ("e2", false)]), 1);
    assert_eq!(fx.len("s"), 3);
    assert_eq!(fx.q::<Vec<String>>(&["ZRANGE", &key("e"), "0", "-1"]), ["e1"]);
    assert_eq!(fx.keys(), [key("s"), key("e")].into());
    // Ids older than the window go when a later one is stored.
    assert_eq!(capture(&mut fx, NOW + 60_001, &[("e3", true)]), 1);
    assert_eq!(fx.q::<Vec<String>>(&["ZRANGE", &key("e"), "0", "-1"]), ["e3"]);
}
