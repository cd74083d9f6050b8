//! `DEFINE`, `DELETE`, `INIT`, `PURGE`, `PAUSE`, `REDRIVE` and `PENDING`.

use std::time::Duration;

use eventbus_core::durable::LogStatus;

use super::*;

const CONSUMERS: &str = "p:durable:consumers";
const PAUSED: &str = "p:durable:paused";
const VERSION: &str = "p:durable:version";
const NOTIFY: &str = "p/durable/changes";

/// `DEFINE` of consumer `name` (key base `p:durable:{name}`).
fn define(fx: &mut Fixture, name: &str, json: &str, replace: bool, make: bool) -> Vec<String> {
    let mut call = fx.s.define.prepare_invoke();
    call.key(CONSUMERS).key(VERSION).key(LOG_FORMAT).arg(name).arg(json).arg(format!("p:durable:{name}"));
    call.arg(GROUP).arg(NOTIFY).arg(u8::from(replace)).arg(u8::from(make));
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn define_creates_or_replaces_a_definition_and_announces_the_new_version() {
    let Some(mut fx) = Fixture::bare() else { return };
    let mut sub = fx.redis.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sub = sub.as_pubsub();
    sub.subscribe(NOTIFY).unwrap();

    assert_eq!(define(&mut fx, "c", "{\"v\":1}", false, true), ["ok", "1", "1"]);
    assert_eq!(sub.get_message().unwrap().get_payload::<String>().unwrap(), "1");
    let groups: Vec<HashMap<String, Value>> = fx.q(&["XINFO", "GROUPS", &key("s")]);
    assert_eq!(groups.len(), 1);
    // The first definition ever made: the log may be packed.
    assert_eq!(fx.q::<String>(&["GET", LOG_FORMAT]), "2");
    assert_eq!(fx.keys(), [CONSUMERS.to_owned(), VERSION.to_owned(), LOG_FORMAT.to_owned(), key("s")].into());

    // Refused without `replace`: the existing definition is the answer.
    assert_eq!(define(&mut fx, "c", "{\"v\":2}", false, true), ["exists", "{\"v\":1}"]);
    // The same definition again changes nothing; another one replaces it.
    assert_eq!(define(&mut fx, "c", "{\"v\":1}", true, true), ["ok", "1", "0"]);
    assert_eq!(define(&mut fx, "c", "{\"v\":2}", true, true), ["ok", "2", "0"]);
    assert_eq!(sub.get_message().unwrap().get_payload::<String>().unwrap(), "2");
    assert_eq!(fx.q::<String>(&["HGET", CONSUMERS, "c"]), "{\"v\":2}");

    // On a cluster the stream is made in its own slot (INIT); no version yet is not
    // the first definition once there is one.
    fx.q::<()>(&["DEL", LOG_FORMAT]);
    assert_eq!(define(&mut fx, "d", "{}", false, false), ["ok", "3", "1"]);
    assert_eq!(fx.q::<i64>(&["EXISTS", "p:durable:d:s", LOG_FORMAT]), 0);
}

/// `DELETE` of consumer `c` (base [`B`]).
fn delete(fx: &mut Fixture, name: &str, purge: bool) -> i64 {
    let mut call = fx.s.delete.prepare_invoke();
    call.key(CONSUMERS).key(VERSION).key(PAUSED).arg(name).arg(B).arg(NOTIFY).arg(u8::from(purge));
    call.invoke(&mut fx.conn).unwrap()
}

/// Writes a key of every kind a consumer has, and one of another consumer.
fn fill(fx: &mut Fixture) {
    fx.capture(&[("e1", "k1"), ("e2", "k1")]);
    for suffix in ["d", "w", "e"] {
        fx.q::<()>(&["ZADD", &key(suffix), "1", "x"]);
    }
    for suffix in ["n", "c", "o", "v"] {
        fx.q::<()>(&["HSET", &key(suffix), "x", "1"]);
    }
    for suffix in ["lock", "x", "f"] {
        fx.q::<()>(&["SET", &key(suffix), "1"]);
    }
    fx.q::<String>(&["XADD", &key("l"), "*", "j", "{}"]);
    fx.q::<()>(&["SET", "p:durable:other:s", "1"]);
}

#[test]
fn delete_removes_the_definition_and_with_it_every_key_of_the_consumer() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fill(&mut fx);
    let mut expected = fx.keys();
    assert!(expected.contains(&key("q:k1")) && expected.len() == 17, "{expected:?}");
    assert_eq!(delete(&mut fx, "c", true), 0, "no such consumer");
    assert_eq!(fx.keys(), expected, "nothing done");

    let define = |fx: &mut Fixture| {
        fx.q::<()>(&["HSET", CONSUMERS, "c", "{}", "other", "{}"]);
        fx.q::<()>(&["HSET", PAUSED, "c", "1"]);
    };
    define(&mut fx);
    // On a cluster the keys go by PURGE, in their own slot.
    assert_eq!(delete(&mut fx, "c", false), 1);
    assert_eq!(fx.q::<String>(&["GET", VERSION]), "1");
    assert_eq!(fx.q::<Vec<String>>(&["HKEYS", CONSUMERS]), ["other"]);
    expected.extend([CONSUMERS.to_owned(), VERSION.to_owned()]);
    assert_eq!(fx.keys(), expected, "the paused mark went, the consumer's keys stay");

    define(&mut fx);
    assert_eq!(delete(&mut fx, "c", true), 1);
    assert_eq!(fx.keys(), [CONSUMERS.to_owned(), VERSION.to_owned(), "p:durable:other:s".to_owned()].into());
}

#[test]
fn init_makes_a_consumers_stream_and_purge_deletes_its_keys() {
    let Some(mut fx) = Fixture::bare() else { return };
    let init =
        |fx: &mut Fixture| -> i64 { fx.s.init.key(key("s")).key(key("f")).arg(GROUP).invoke(&mut fx.conn).unwrap() };
    assert_eq!(init(&mut fx), 1);
    assert_eq!(init(&mut fx), 1, "again: the group exists, fine");
    assert_eq!(fx.q::<String>(&["GET", &key("f")]), "2");
    fx.deliver();
    assert_eq!(fx.keys(), [key("s"), key("f")].into());

    fill(&mut fx);
    let purged: i64 = fx.s.purge.key(key("s")).arg(B).invoke(&mut fx.conn).unwrap();
    assert_eq!(purged, 1);
    assert_eq!(fx.keys(), ["p:durable:other:s".to_owned()].into());
}

/// `PAUSE` of `name`.
fn pause(fx: &mut Fixture, name: &str, paused: bool) -> i64 {
    let mut call = fx.s.pause.prepare_invoke();
    call.key(CONSUMERS).key(PAUSED).key(VERSION).arg(name).arg(u8::from(paused)).arg(NOW).arg(NOTIFY);
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn pause_marks_a_known_consumer_and_bumps_the_version_only_on_a_change() {
    let Some(mut fx) = Fixture::bare() else { return };
    assert_eq!(pause(&mut fx, "c", true), 0);
    assert!(fx.keys().is_empty(), "nothing written for an unknown consumer");
    fx.q::<()>(&["HSET", CONSUMERS, "c", "{}"]);
    assert_eq!(pause(&mut fx, "c", true), 1);
    assert_eq!(pause(&mut fx, "c", true), 1);
    assert_eq!(fx.q::<u64>(&["HGET", PAUSED, "c"]), NOW, "paused since");
    assert_eq!(fx.q::<String>(&["GET", VERSION]), "1");
    assert_eq!(pause(&mut fx, "c", false), 1);
    assert_eq!(pause(&mut fx, "c", false), 1);
    assert_eq!(fx.q::<String>(&["GET", VERSION]), "2");
    assert_eq!(fx.keys(), [CONSUMERS.to_owned(), VERSION.to_owned()].into());
}

/// `REDRIVE`: ARGV base, now, maxlen, limit, event ids.
fn redrive(fx: &mut Fixture, limit: u32, ids: &[&str]) -> (i64, i64) {
    let mut call = fx.s.redrive.key(LOG_FORMAT);
    call.arg(B).arg(NOW).arg(100).arg(limit);
    for id in ids {
        call.arg(*id);
    }
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn redrive_sends_kept_dead_letters_back_and_refuses_a_gone_consumer() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e2", ""), ("e3", "")]);
    for sid in fx.deliver() {
        fx.fail(&sid, 0, true, 5);
    }
    assert_eq!(fx.len("w"), 3);
    // By id (unknown ids are passed over); then the oldest kept, up to the limit.
    assert_eq!(redrive(&mut fx, 10, &["e2", "e9"]), (1, 2));
    assert_eq!(redrive(&mut fx, 1, &[]), (1, 1));
    let stream = fx.stream();
    let envelopes: Vec<&[u8]> = stream.iter().map(|(_, f)| f["e"].as_slice()).collect();
    assert_eq!(envelopes, [&envelope("e2", "a.b")[..], &envelope("e1", "a.b")[..]]);
    assert!(stream.iter().all(|(_, f)| f.len() == 1), "back as fresh captures");
    assert_eq!(fx.q::<Vec<String>>(&["HKEYS", &key("v")]), ["e3"]);
    let redriven: Vec<(String, u32)> = fx
        .log_lines()
        .into_iter()
        .filter(|l| l.status == LogStatus::Redriven)
        .map(|l| (l.event_id, l.attempts))
        .collect();
    assert_eq!(redriven, [("e2".to_owned(), 1), ("e1".to_owned(), 1)]);
    assert_eq!(fx.counter("redriven"), Some(2));

    fx.q::<()>(&["DEL", &key("s")]);
    assert_eq!(redrive(&mut fx, 10, &["e3"]), (-1, 0));
    assert_eq!(fx.len("v"), 1);
}

/// A row of `PENDING`: envelope, attempt, next delivery, failures, state.
type Row = (Vec<u8>, String, String, String, i64);

/// One page of `PENDING` (ack deadline 30 s, `limit` rows): next token and rows.
fn pending(fx: &mut Fixture, limit: u32, token: &str) -> (String, Vec<Row>) {
    let mut call = fx.s.pending.prepare_invoke();
    call.key(key("s")).arg(B).arg(GROUP).arg(NOW).arg(30_000).arg(limit).arg(token);
    let reply: Vec<Value> = call.invoke(&mut fx.conn).unwrap();
    let rows = reply[1..].iter().map(|r| redis::from_redis_value_ref(r).unwrap()).collect();
    (text(&reply[0]), rows)
}

#[test]
fn pending_pages_the_live_stream_then_the_events_waiting_off_it() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e5", "")]);
    let sids = fx.deliver();
    fx.fail(&sids[1], 60_000, false, 5);
    fx.capture(&[("e2", "k1"), ("e3", "k1"), ("e4", "")]);
    let before = fx.keys();
    let state = |rows: &[Row]| rows.iter().map(|r| (r.0.clone(), r.4)).collect::<Vec<_>>();

    let (token, rows) = pending(&mut fx, 2, "");
    assert_eq!(state(&rows), [(envelope("e1", "a.b"), 3), (envelope("e2", "a.b"), 1)]);
    // In flight: its first attempt, due back by its ack deadline.
    let due: u64 = rows[0].2.parse().unwrap();
    assert_eq!(rows[0].1, "1");
    assert!(due > NOW && due <= NOW + 30_000, "{due}");
    assert_eq!((rows[1].1.as_str(), rows[1].2.as_str(), rows[1].3.as_str()), ("0", "", "[]"));
    assert!(token.starts_with("s:"), "{token}");

    let (token, rows) = pending(&mut fx, 2, &token);
    assert_eq!(state(&rows), [(envelope("e4", "a.b"), 1), (envelope("e3", "a.b"), 4)]);
    assert_eq!(token, "r:e3");

    let (token, rows) = pending(&mut fx, 2, &token);
    assert_eq!(state(&rows), [(envelope("e5", "a.b"), 2)]);
    assert_eq!((rows[0].1.as_str(), rows[0].2.clone()), ("1", (NOW + 60_000).to_string()));
    assert!(rows[0].3.contains("it broke"));
    assert_eq!(token, "");
    assert_eq!(fx.keys(), before, "a read");
}
