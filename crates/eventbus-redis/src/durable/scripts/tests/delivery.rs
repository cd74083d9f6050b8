//! `ACK`, `FAIL`, `REQUEUE`, `TICK`, `PRESENCE` and `LEASE`.

use eventbus_core::durable::LogStatus;

use super::*;

/// `ACK`: ARGV base, group, maxlen, now, lines, newest stream id, then (stream id,
/// event id, ordering key) triples.
fn ack(fx: &mut Fixture, lines: &str, newest: &str, acks: &[(&str, &str, &str)]) -> i64 {
    let mut call = fx.s.ack.key(LOG_FORMAT);
    call.arg(B).arg(GROUP).arg(100).arg(NOW).arg(lines).arg(newest);
    for (sid, id, ordering) in acks {
        call.arg(*sid).arg(*id).arg(*ordering);
    }
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn ack_completes_held_events_logs_their_lines_and_takes_them_off_the_stream() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e2", ""), ("e3", "")]);
    let sids = fx.deliver();
    assert_eq!(sids.len(), 3);
    // Acked ahead of e1, still in flight: e2 goes by XDEL, e3 would by the trim.
    assert_eq!(ack(&mut fx, "L2\nL3", &sids[2], &[(&sids[1], "e2", ""), (&sids[2], "e3", "")]), 2);
    assert_eq!(fx.stream().into_iter().map(|(sid, _)| sid).collect::<Vec<_>>(), [sids[0].clone()]);
    assert_eq!(fx.in_flight(), [(sids[0].clone(), ME.to_owned())]);
    // The fleet reads one line per entry (no log format yet): an entry a line.
    let entries = fx.log_entries();
    assert_eq!(entries.iter().map(|e| e["j"].as_str()).collect::<Vec<_>>(), ["L2", "L3"]);
    assert_eq!(fx.counter("logged"), Some(2));
    assert_eq!(fx.counter("acked"), Some(2));

    // Packed once every instance reads packed entries; the stream is trimmed up to the
    // oldest entry still pending (none now).
    fx.q::<()>(&["SET", LOG_FORMAT, "2"]);
    assert_eq!(ack(&mut fx, "L1", &sids[0], &[(&sids[0], "e1", "")]), 1);
    fx.capture(&[("e4", ""), ("e5", "")]);
    let later = fx.deliver();
    assert_eq!(ack(&mut fx, "L4\nL5", &later[1], &[(&later[0], "e4", ""), (&later[1], "e5", "")]), 2);
    assert_eq!(fx.len("s"), 0);
    assert!(fx.in_flight().is_empty());
    let last = fx.log_entries().pop().unwrap();
    assert_eq!((last["c"].as_str(), last["m"].as_str()), ("2", "L4\nL5"));
    assert_eq!(fx.counter("logged"), Some(5));
    assert_eq!(fx.counter("acked"), Some(5));
    assert_eq!(fx.keys(), [key("s"), key("l"), key("n"), LOG_FORMAT.to_owned()].into());
}

#[test]
fn an_ack_of_an_event_no_longer_held_completes_it_from_its_retry_or_not_at_all() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e2", "")]);
    let sids = fx.deliver();
    // e2 failed meanwhile (its deadline passed, say): it waits for its retry.
    fx.fail(&sids[1], 60_000, false, 5);
    assert_eq!(ack(&mut fx, "L1\nL2", &sids[1], &[(&sids[0], "e1", ""), (&sids[1], "e2", "")]), 2);
    // e1's line as sent; e2's built from its retry record (L2 left out).
    let entries = fx.log_entries();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["j"], "L1");
    let line: LogEntry = serde_json::from_str(&entries[1]["j"]).unwrap();
    assert_eq!((line.event_id.as_str(), line.channel.as_str()), ("e2", "a.b"));
    assert_eq!((line.status, line.attempts, line.failures.len()), (LogStatus::Completed, 1, 1));
    assert_eq!((fx.len("d"), fx.len("r"), fx.len("y")), (0, 0, 0));
    // A late ack of what is neither held nor waiting does nothing.
    assert_eq!(ack(&mut fx, "", "", &[("", "e9", "")]), 0);
    assert_eq!(fx.log_entries().len(), 2);
    assert_eq!(fx.counter("acked"), Some(2));
}

#[test]
fn an_ack_releases_its_ordering_key_to_the_next_event_waiting_on_it() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", "k1"), ("e2", "k1")]);
    let sids = fx.deliver();
    assert_eq!(sids.len(), 1, "e2 waits behind e1");
    assert_eq!(ack(&mut fx, "L1", &sids[0], &[(&sids[0], "e1", "k1")]), 1);
    let stream = fx.stream();
    assert_eq!(stream.len(), 1);
    assert_eq!(stream[0].1.get("k").map(Vec::as_slice), Some(&b"k1"[..]));
    assert_eq!(stream[0].1.get("e").map(Vec::as_slice), Some(&envelope("e2", "a.b")[..]));
    assert_eq!(fx.q::<String>(&["HGET", &key("k"), "k1"]), "e2");
    assert_eq!((fx.len("q:k1"), fx.len("r"), fx.len("y")), (0, 0, 0));
}

#[test]
fn fail_schedules_a_retry_and_skips_entries_another_instance_holds() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", "")]);
    let sid = fx.deliver().remove(0);
    let mut call = fx.s.fail.key(LOG_FORMAT);
    call.arg(B).arg(GROUP).arg(NOW).arg(100).arg("instance-2").arg(5).arg(1000).arg(2.0).arg(60_000).arg(0);
    call.arg(&sid).arg("not mine").arg(-1).arg(0).arg(NOW);
    let reply: Vec<String> = call.invoke(&mut fx.conn).unwrap();
    assert_eq!(reply, [""]);
    assert_eq!(fx.in_flight(), [(sid.clone(), ME.to_owned())]);

    // The backoff's first step (1000 ms); the event waits off the stream.
    let reply = fx.fail(&sid, -1, false, 5);
    assert_eq!(reply.iter().map(text).collect::<Vec<_>>(), [(NOW + 1000).to_string()]);
    assert_eq!((fx.len("s"), fx.in_flight().len()), (0, 0));
    assert_eq!(fx.q::<Option<u64>>(&["ZSCORE", &key("d"), "e1"]), Some(NOW + 1000));
    assert_eq!(fx.q::<Vec<String>>(&["ZRANGE", &key("y"), "0", "-1"]), ["e1"]);
    assert_eq!(fx.len("r"), 1);
    assert_eq!(fx.keys(), [key("s"), key("d"), key("r"), key("y")].into());
}

#[test]
fn fail_dead_letters_on_term_and_at_max_attempts() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e2", "")]);
    let sids = fx.deliver();
    let reply = fx.fail(&sids[0], -1, true, 5);
    assert_eq!(reply.len(), 2);
    assert_eq!(text(&reply[0]), "");
    let (env, attempts, failures, id): (Vec<u8>, String, String, String) =
        redis::from_redis_value_ref(&reply[1]).unwrap();
    assert_eq!((env, attempts.as_str(), id.as_str()), (envelope("e1", "a.b"), "1", "e1"));
    assert!(failures.contains("it broke"), "{failures}");
    // One attempt allowed: the first failure is the last.
    let reply = fx.fail(&sids[1], 0, false, 1);
    assert_eq!(reply.len(), 2);

    assert_eq!(fx.q::<Vec<String>>(&["HKEYS", &key("o")]).len(), 2, "both in the outbox");
    assert_eq!(fx.q::<Vec<String>>(&["ZRANGE", &key("w"), "0", "-1"]), ["e1", "e2"]);
    assert_eq!(fx.len("v"), 2);
    let lines = fx.log_lines();
    assert!(lines.iter().all(|l| l.status == LogStatus::DeadLettered && l.attempts == 1));
    assert_eq!(lines.iter().map(|l| l.event_id.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
    assert_eq!(fx.counter("dead_lettered"), Some(2));
    assert_eq!((fx.len("s"), fx.len("d")), (0, 0));
    assert_eq!(fx.keys(), [key("s"), key("l"), key("n"), key("o"), key("v"), key("w")].into());
}

#[test]
fn requeue_puts_held_entries_back_without_an_attempt() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", "k1")]);
    let sid = fx.deliver().remove(0);
    let requeue = |fx: &mut Fixture, owner: &str| {
        let reply: i64 =
            fx.s.requeue.key(key("s")).arg(B).arg(GROUP).arg(owner).arg(&sid).invoke(&mut fx.conn).unwrap();
        assert_eq!(reply, 0);
    };
    requeue(&mut fx, "instance-2");
    assert_eq!(fx.in_flight(), [(sid.clone(), ME.to_owned())]);
    requeue(&mut fx, ME);
    assert!(fx.in_flight().is_empty());
    let stream = fx.stream();
    assert_eq!(stream.len(), 1);
    assert_ne!(stream[0].0, sid, "appended again");
    let mut names: Vec<&str> = stream[0].1.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["e", "k"], "no attempt counted");
    assert_eq!(fx.deliver().len(), 1, "delivered again");
}

/// `TICK` as `instance` at `now`: ack deadline 0 (everything in flight has expired),
/// outbox grace 1000 ms, the log's oldest kept id `keep_from`.
fn tick(fx: &mut Fixture, instance: &str, now: u64, keep_from: &str) -> Vec<Value> {
    let mut call = fx.s.tick.key(LOG_FORMAT);
    call.arg(B).arg(GROUP).arg(now).arg(100).arg(instance).arg(30_000).arg(0).arg(100).arg(keep_from);
    call.arg(5).arg(1000).arg(2.0).arg(60_000).arg(0).arg(1000);
    call.invoke(&mut fx.conn).unwrap()
}

#[test]
fn tick_reclaims_expired_deliveries_hands_back_stale_dead_letters_and_moves_due_retries() {
    let Some(mut fx) = Fixture::consumer() else { return };
    fx.capture(&[("e1", ""), ("e2", "")]);
    let sids = fx.deliver();
    assert_eq!(fx.fail(&sids[0], 0, true, 5).len(), 2, "e1 dead-lettered at NOW");

    // Another instance holds the lock: nothing is reclaimed or handed back.
    fx.q::<()>(&["SET", &key("lock"), "instance-2", "PX", "30000"]);
    let reply = tick(&mut fx, ME, NOW + 2000, "1-0");
    assert_eq!((text(&reply[0]), text(&reply[1]), reply.len()), (String::new(), "0".to_owned(), 2));
    assert_eq!(fx.in_flight().len(), 1);
    fx.q::<()>(&["DEL", &key("lock")]);

    // e2 is reclaimed as a failed attempt (retry 1000 ms on); e1's letter, left in the
    // outbox past the grace, is handed back and restamped.
    let reply = tick(&mut fx, ME, NOW + 2000, "1-0");
    assert_eq!(text(&reply[0]), (NOW + 3000).to_string());
    assert_eq!(reply.len(), 3);
    let (_, _, _, id): (Vec<u8>, String, String, String) = redis::from_redis_value_ref(&reply[2]).unwrap();
    assert_eq!(id, "e1");
    assert!(fx.in_flight().is_empty());
    assert_eq!(fx.q::<Option<u64>>(&["ZSCORE", &key("d"), "e2"]), Some(NOW + 3000));
    assert_eq!(fx.q::<String>(&["GET", &key("lock")]), ME);
    fx.q::<()>(&["DEL", &key("lock")]);
    let reply = tick(&mut fx, ME, NOW + 2500, "1-0");
    assert_eq!(reply.len(), 2, "not handed back again within the grace");
    fx.q::<()>(&["DEL", &key("lock")]);

    // Due: e2 goes back on the stream with its attempt. The log (written at the
    // machine's time) is trimmed by age, and the dead letters kept for redrive with it.
    assert_eq!(fx.log_lines().len(), 1);
    let reply = tick(&mut fx, "instance-2", NOW + 3000, &format!("{}-0", clock_ms() + 60_000));
    assert_eq!((text(&reply[0]), reply.len()), (String::new(), 3), "past the grace again: handed back again");
    let stream = fx.stream();
    assert_eq!(stream.len(), 1);
    assert_eq!(stream[0].1.get("a").map(Vec::as_slice), Some(&b"1"[..]));
    assert_eq!((fx.len("d"), fx.len("r"), fx.len("y")), (0, 0, 0));
    assert_eq!(fx.counter("redelivered"), Some(1));
    assert_eq!((fx.len("l"), fx.counter("logged")), (0, Some(0)));
    assert_eq!(fx.len("w"), 0, "kept dead letters go with the log's age");
}

/// `PRESENCE`: ARGV base, instance, clients, now, expiry (10 s on).
fn presence(fx: &mut Fixture, instance: &str, clients: u32, now: u64) -> i64 {
    fx.s.presence
        .key(key("s"))
        .arg(B)
        .arg(instance)
        .arg(clients)
        .arg(now)
        .arg(now + 10_000)
        .invoke(&mut fx.conn)
        .unwrap()
}

#[test]
fn presence_counts_each_instances_clients_until_they_expire() {
    let Some(mut fx) = Fixture::bare() else { return };
    // The hash expires with its counts, by the machine's clock.
    let now = clock_ms();
    assert_eq!(presence(&mut fx, ME, 2, now), 0);
    assert!(fx.keys().is_empty(), "nothing is written for a consumer that is gone");
    fx.q::<()>(&["XGROUP", "CREATE", &key("s"), GROUP, "0", "MKSTREAM"]);
    assert_eq!(presence(&mut fx, ME, 2, now), 1);
    assert_eq!(presence(&mut fx, "instance-2", 1, now), 1);
    let counts: HashMap<String, String> = fx.q(&["HGETALL", &key("c")]);
    assert_eq!(counts[ME], format!("2 {}", now + 10_000));
    assert_eq!(counts["instance-2"], format!("1 {}", now + 10_000));
    let ttl: i64 = fx.q(&["PTTL", &key("c")]);
    assert!(ttl > 0 && ttl <= 10_000, "the hash expires with the counts: {ttl}");
    // Past instance-2's expiry its count goes; a count of 0 removes the instance.
    assert_eq!(presence(&mut fx, ME, 3, now + 10_001), 1);
    assert_eq!(fx.q::<Vec<String>>(&["HKEYS", &key("c")]), [ME]);
    assert_eq!(presence(&mut fx, ME, 0, now + 10_002), 1);
    assert_eq!(fx.keys(), [key("s")].into());
}

/// `LEASE`: ARGV base, group, instance, ttl, want.
fn lease(fx: &mut Fixture, instance: &str, want: bool) -> i64 {
    fx.s.lease
        .key(key("s"))
        .arg(B)
        .arg(GROUP)
        .arg(instance)
        .arg(30_000)
        .arg(u8::from(want))
        .invoke(&mut fx.conn)
        .unwrap()
}

#[test]
fn lease_is_held_by_one_instance_and_waits_for_the_others_events_in_flight() {
    let Some(mut fx) = Fixture::bare() else { return };
    assert_eq!(lease(&mut fx, ME, true), 0, "no lease on a consumer that is gone");
    fx.q::<()>(&["XGROUP", "CREATE", &key("s"), GROUP, "0", "MKSTREAM"]);
    fx.capture(&[("e1", "")]);
    fx.deliver();
    assert_eq!(lease(&mut fx, "instance-2", true), 0, "ME still holds an event");
    assert_eq!(lease(&mut fx, ME, true), 1);
    assert_eq!(fx.q::<String>(&["GET", &key("x")]), ME);
    assert_eq!(lease(&mut fx, ME, true), 1, "renewed");
    assert!(fx.q::<i64>(&["PTTL", &key("x")]) > 0);
    assert_eq!(lease(&mut fx, "instance-2", true), 0, "taken");
    assert_eq!(lease(&mut fx, "instance-2", false), 0);
    assert_eq!(fx.q::<String>(&["GET", &key("x")]), ME, "only its holder gives it up");
    assert_eq!(lease(&mut fx, ME, false), 0);
    assert_eq!(fx.q::<Option<String>>(&["GET", &key("x")]), None);
}
