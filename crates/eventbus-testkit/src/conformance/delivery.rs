//! The checks of consumers, captures, deliveries, acks, retries and dead letters.

use super::*;

// ---- the checks ----

pub async fn create(h: &mut Harness) {
    // The owner (docs/security.md) is part of the definition and kept with it.
    let config = ConsumerConfig { max_attempts: 3, owner: "team-billing".into(), ..consumer("billing", &["orders.>"]) };
    let info = h.create(config.clone()).await;
    assert_eq!(info.config, config, "the definition is kept as given");
    assert_eq!(h.info("billing").await.config.owner, "team-billing");
    assert_eq!((info.pending, info.in_flight, info.clients), (0, 0, 0));
    assert_eq!((info.acked, info.dead_lettered, info.redelivered), (0, 0, 0));
    // Identical again: idempotent, same answer.
    assert_eq!(h.create(config.clone()).await, info);
    // Different: refused, and the first definition stays.
    let other = ConsumerConfig { max_attempts: 9, ..config.clone() };
    let refused = within(h.engine.create_consumer(other)).await;
    assert!(matches!(refused, Err(DurableError::AlreadyExists { ref name, .. }) if name == "billing"), "{refused:?}");
    // The message says what differs, and nothing else.
    let message = refused.unwrap_err().to_string();
    assert!(message.ends_with("max_attempts 3, asked 9"), "{message}");
    assert_eq!(h.info("billing").await.config, config);
    // Invalid: refused before anything is stored.
    let bad = ConsumerConfig { ack_deadline_ms: 0, ..consumer("bad", &["x"]) };
    let refused = within(h.engine.create_consumer(bad)).await;
    assert!(matches!(refused, Err(DurableError::InvalidConfig(_))), "{refused:?}");
    // Unknown names.
    let missing = within(h.engine.get_consumer("nope")).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(ref n)) if n == "nope"), "{missing:?}");
    let missing = within(h.engine.attach("nope", ClientOptions::default(), None)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
    // create_if_missing on attach; an empty name takes the attached one.
    let made = within(h.engine.attach("audit", ClientOptions::default(), Some(consumer("", &["users.*"]))))
        .await
        .expect("attach with create_if_missing");
    assert_eq!(made.info.config.name, "audit");
    assert_eq!(made.info.clients, 1, "the attaching client counts");
    let mismatch = within(h.engine.attach("x", ClientOptions::default(), Some(consumer("y", &["a"])))).await;
    assert!(matches!(mismatch, Err(DurableError::InvalidConfig(ConfigError::NameMismatch { .. }))), "{mismatch:?}");
    let listed = within(h.engine.list_consumers()).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|i| i.config.name.as_str()).collect();
    assert_eq!(names, ["audit", "billing"], "sorted by name, the refused ones absent");
}

pub async fn capture(h: &mut Harness) {
    h.create(consumer("all-orders", &["orders.>"])).await;
    h.create(consumer("created", &["orders.created"])).await;
    h.create(consumer("users", &["users.*"])).await;
    assert_eq!(stored(&h.publish_keyed("orders.created", "1", None, None).await.1), 2);
    assert_eq!(stored(&h.publish_keyed("orders.paid", "2", None, None).await.1), 1);
    assert_eq!(stored(&h.publish_keyed("billing.run", "3", None, None).await.1), 0);
    // A batch is answered in order, one answer per event.
    let events: Vec<Arc<Event>> = ["orders.x.y", "users.new"].iter().map(|c| new_event(c, "batch")).collect();
    let batch: Vec<CaptureRequest<'_>> =
        events.iter().map(|event| CaptureRequest { event, ordering_key: None, idempotency_key: None }).collect();
    let answers = within(h.engine.capture_many(&batch)).await;
    let counts: Vec<usize> = answers.iter().map(|a| stored(a.as_ref().expect("captured"))).collect();
    assert_eq!(counts, [1, 1]);
    assert_eq!(h.info("all-orders").await.pending, 3);
    assert_eq!(h.info("created").await.pending, 1);
    assert_eq!(h.info("users").await.pending, 1);
}

pub async fn deliver(h: &mut Harness) {
    h.create(consumer("inbox", &["orders.>"])).await;
    let sent = h.publish("orders.created", "hello").await;
    let before = SystemTime::now();
    let mut a = h.attach("inbox").await;
    let d = one(&mut a.deliveries).await;
    assert_eq!(d.attempt, 1, "attempts are 1-based");
    let e = &d.event;
    assert_eq!((&e.id, &e.channel, &e.payload), (&sent.id, &sent.channel, &sent.payload));
    assert_eq!((&e.metadata, &e.content_type, &e.source), (&sent.metadata, &sent.content_type, &sent.source));
    assert!(d.deadline > before, "the deadline lies ahead");
    assert!(d.deadline <= SystemTime::now() + Duration::from_millis(30_000) + GRANULARITY, "deadline = ack deadline");
    // The attach answer counts the event once, pending or already in flight: the
    // engines take it at different moments (docs/durable.md "Mode differences").
    let i = &a.info;
    assert_eq!((i.config.name.as_str(), i.clients, i.pending + i.in_flight), ("inbox", 1, 1), "{i:?}");
    let info = h.wait_info("inbox", "the delivery to be in flight", |i| i.in_flight == 1).await;
    assert_eq!((info.pending, info.clients), (0, 1));
    // Published while attached: pushed too.
    h.publish("orders.paid", "second").await;
    assert_eq!(payload(&one(&mut a.deliveries).await), "second");
}

pub async fn ack(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "first").await;
    let first = one(&mut a.deliveries).await;
    a.client.ack(vec![first.event.id.to_string()]).await;
    a.client.ack(vec![first.event.id.to_string()]).await; // a second ack is a no-op
    a.client.ack(vec!["not-an-event".into()]).await; // unknown ids are ignored
    // Failing a finished event does nothing (a zero delay would bring it straight back).
    a.client.nack(first.event.id.to_string(), "too late".into(), Some(Duration::ZERO)).await;
    let info = h.wait_info("inbox", "the ack", |i| i.acked == 1).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0), "nothing left to redeliver");
    // Well past the first one's ack deadline, the only delivery is the next event.
    h.publish("jobs", "second").await;
    let second = one(&mut a.deliveries).await;
    assert_eq!((payload(&second), second.attempt), ("second".into(), 1));
    a.client.ack(vec![second.event.id.to_string()]).await;
    h.wait_info("inbox", "the second ack", |i| i.acked == 2).await;
    assert_nothing_delivered(&mut a.deliveries, "an acked event is never redelivered");
    let log = h.log("inbox", None).await;
    assert_eq!(logged(&log), [first.event.id.to_string(), second.event.id.to_string()]);
    for entry in &log {
        assert_eq!((entry.status, entry.attempts, entry.channel.as_str()), (LogStatus::Completed, 1, "jobs"));
        assert!(entry.failures.is_empty());
        assert!(entry.first_delivered_ms.is_some_and(|ms| ms <= entry.finished_ms), "{entry:?}");
    }
}

pub async fn nack_with_delay(h: &mut Harness) {
    // A backoff far beyond DEADLINE: only the nack's own delay can bring it back in time.
    let backoff = Backoff { initial_ms: 60_000, multiplier: 2.0, max_ms: 60_000, kind: BackoffKind::Exponential };
    h.create(ConsumerConfig { backoff, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let first = one(&mut a.deliveries).await;
    let delay = Duration::from_millis(300);
    let nacked = Instant::now();
    a.client.nack(first.event.id.to_string(), "try later".into(), Some(delay)).await;
    let again = one(&mut a.deliveries).await;
    assert!(nacked.elapsed() + GRANULARITY >= delay, "redelivered after {:?}, before the delay", nacked.elapsed());
    assert_eq!((&again.event.id, again.attempt), (&first.event.id, 2));
    let (info, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!((info.redelivered, reasons(&entry)), (1, vec!["try later"]));
}

pub async fn deadline_expiry(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "slow").await;
    let first = one(&mut a.deliveries).await;
    let delivered = Instant::now();
    // Not acked: the deadline passes, then the backoff (200 ms), then it is back.
    let again = one(&mut a.deliveries).await;
    assert!(delivered.elapsed() + GRANULARITY >= Duration::from_millis(300), "back before its deadline");
    assert_eq!((&again.event.id, again.attempt), (&first.event.id, 2));
    let (info, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!((info.redelivered, reasons(&entry)), (1, vec![REASON_DEADLINE]));
}

pub async fn backoff(h: &mut Harness) {
    // 200 ms, then 400 ms: a second wait at least 400 ms shows the multiplier applies.
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let mut d = one(&mut a.deliveries).await;
    for (attempt, wait_ms) in [(1, 200), (2, 400)] {
        assert_eq!(d.attempt, attempt);
        let nacked = Instant::now();
        a.client.nack(d.event.id.to_string(), format!("boom {attempt}"), None).await;
        d = one(&mut a.deliveries).await;
        let waited = nacked.elapsed();
        assert!(waited + GRANULARITY >= Duration::from_millis(wait_ms), "attempt {attempt}: back after {waited:?}");
    }
    assert_eq!(d.attempt, 3);
    let (info, entry) = h.complete_first("inbox", &*a.client, &d).await;
    assert_eq!((info.redelivered, reasons(&entry)), (2, vec!["boom 1", "boom 2"]));
}

pub async fn max_attempts_dead_letter(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 2, ..consumer("inbox", &["jobs.>"]) }).await;
    let mut a = h.attach("inbox").await;
    let sent = h.publish("jobs.run", "x").await;
    for attempt in 1..=2 {
        let d = one(&mut a.deliveries).await;
        assert_eq!((&d.event.id, d.attempt), (&sent.id, attempt));
        a.client.nack(d.event.id.to_string(), format!("boom {attempt}"), None).await;
    }
    let letter = h.letter().await;
    assert_eq!(letter, ("dlq.jobs.run".into(), "inbox|2|boom 1;boom 2".into(), "text/plain".into()));
    let info = h.wait_info("inbox", "the dead letter to be counted", |i| i.dead_lettered == 1).await;
    assert_eq!((info.pending, info.in_flight, info.acked, info.redelivered), (0, 0, 0, 1));
    let log = h.log("inbox", Some(LogStatus::DeadLettered)).await;
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].event_id.as_str(), log[0].attempts), (&*sent.id, 2));
    assert_eq!(reasons(&log[0]), ["boom 1", "boom 2"]);
    assert!(h.log("inbox", Some(LogStatus::Completed)).await.is_empty());
    assert_nothing_delivered(&mut a.deliveries, "a dead letter is not redelivered");
}

pub async fn term(h: &mut Harness) {
    // A backoff beyond DEADLINE: a term that merely failed the attempt would never
    // produce a letter in time.
    let backoff = Backoff { initial_ms: 60_000, multiplier: 2.0, max_ms: 60_000, kind: BackoffKind::Exponential };
    let config =
        ConsumerConfig { backoff, dead_letter_channel: Some("dead.jobs".into()), ..consumer("inbox", &["jobs"]) };
    h.create(config).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "one").await;
    h.publish("jobs", "two").await;
    let got = take(&mut a.deliveries, 2).await;
    a.client.term(got[0].event.id.to_string(), "bad input".into()).await;
    assert_eq!(h.letter().await, ("dead.jobs".into(), "inbox|1|bad input".into(), "text/plain".into()));
    a.client.term(got[1].event.id.to_string(), String::new()).await;
    assert_eq!(h.letter().await, ("dead.jobs".into(), format!("inbox|1|{REASON_TERM}"), "text/plain".into()));
    let info = h.wait_info("inbox", "both dead letters counted", |i| i.dead_lettered == 2).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
    let log = h.log("inbox", None).await;
    assert!(log.iter().all(|e| e.status == LogStatus::DeadLettered && e.attempts == 1), "{log:?}");
}

/// docs/durable.md "Dead letters": a channel too long for the `dlq.` prefix (16 tokens) gets the
/// documented shortened dead-letter channel, in both engines.
pub async fn dead_letter_of_a_sixteen_token_channel(h: &mut Harness) {
    let channel = (1..=16).map(|i| format!("t{i}")).collect::<Vec<_>>().join(".");
    h.create(consumer("deep", &["t1.>"])).await;
    let mut a = h.attach("deep").await;
    h.publish(&channel, "x").await;
    let got = one(&mut a.deliveries).await;
    a.client.term(got.event.id.to_string(), "too deep".into()).await;
    let (letter_channel, body, _) = h.letter().await;
    assert_eq!(letter_channel, eventbus_core::durable::default_dead_letter_channel(&channel));
    assert!(eventbus_core::name::validate_channel(&letter_channel).is_ok(), "{letter_channel}");
    assert!(letter_channel.starts_with("dlq.t1."), "{letter_channel}");
    assert_eq!(body, "deep|1|too deep");
}

pub async fn ordering_keys(h: &mut Harness) {
    h.create(consumer("inbox", &["orders"])).await;
    let a1 = h.publish_keyed("orders", "a1", Some("a"), None).await.0;
    let a2 = h.publish_keyed("orders", "a2", Some("a"), None).await.0;
    let a3 = h.publish_keyed("orders", "a3", Some("a"), None).await.0;
    let b1 = h.publish_keyed("orders", "b1", Some("b"), None).await.0;
    let mut a = h.attach("inbox").await;
    // The first of each key; "b" is not held up by "a".
    let mut first = take(&mut a.deliveries, 2).await;
    first.sort_by_key(payload);
    assert_eq!(ids(&first), [a1.id.to_string(), b1.id.to_string()]);
    // Acking b1 frees nothing of "a": a2 still waits behind a1.
    a.client.ack(vec![b1.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack of b1", |i| i.acked == 1).await;
    assert_eq!((info.in_flight, info.pending), (1, 2), "a2 and a3 wait behind their key");
    assert_nothing_delivered(&mut a.deliveries, "a2 before a1 is finished");
    // A nack does not let a2 overtake a1 either.
    a.client.nack(a1.id.to_string(), "again".into(), None).await;
    let again = one(&mut a.deliveries).await;
    assert_eq!((&again.event.id, again.attempt), (&a1.id, 2), "a1 again before a2");
    a.client.ack(vec![a1.id.to_string()]).await;
    let next = one(&mut a.deliveries).await;
    assert_eq!((&next.event.id, next.attempt), (&a2.id, 1));
    // A dead letter frees its key too.
    a.client.term(a2.id.to_string(), "bad".into()).await;
    let last = one(&mut a.deliveries).await;
    assert_eq!((&last.event.id, last.attempt), (&a3.id, 1));
}

pub async fn idempotency(h: &mut Harness) {
    h.create(consumer("inbox", &["orders"])).await;
    let (original, captured) = h.publish_keyed("orders", "first", None, Some("order-1")).await;
    assert_eq!(stored(&captured), 1);
    let (_, again) = h.publish_keyed("orders", "second", None, Some("order-1")).await;
    assert_eq!(again, Captured::Duplicate(original.id.to_string()));
    // Keys are global, not per channel, and remembered with no consumer matching.
    let (_, elsewhere) = h.publish_keyed("users", "third", None, Some("order-1")).await;
    assert_eq!(elsewhere, Captured::Duplicate(original.id.to_string()));
    let (unmatched, captured) = h.publish_keyed("users", "fourth", None, Some("user-1")).await;
    assert_eq!(stored(&captured), 0);
    let (_, again) = h.publish_keyed("users", "fifth", None, Some("user-1")).await;
    assert_eq!(again, Captured::Duplicate(unmatched.id.to_string()));
    // Within one batch too.
    let events: Vec<Arc<Event>> = (0..2).map(|_| new_event("orders", "batch")).collect();
    let batch: Vec<CaptureRequest<'_>> = events
        .iter()
        .map(|event| CaptureRequest { event, ordering_key: None, idempotency_key: Some("order-2") })
        .collect();
    let answers: Vec<Captured> =
        within(h.engine.capture_many(&batch)).await.into_iter().map(|a| a.expect("captured")).collect();
    assert_eq!(stored(&answers[0]), 1);
    assert_eq!(answers[1], Captured::Duplicate(events[0].id.to_string()));
    assert_eq!(h.info("inbox").await.pending, 2, "one stored per key");
    let mut a = h.attach("inbox").await;
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(ids(&got), [original.id.to_string(), events[0].id.to_string()]);
}

pub async fn log_paging(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    // Finished one at a time, so the log's order is known: every third dead-lettered.
    let mut finished = Vec::new();
    for i in 0..7u64 {
        let sent = h.publish("jobs", &format!("{i}")).await;
        let d = one(&mut a.deliveries).await;
        assert_eq!(d.event.id, sent.id);
        if i % 3 == 2 {
            a.client.term(sent.id.to_string(), "no".into()).await;
            h.letter().await;
        } else {
            a.client.ack(vec![sent.id.to_string()]).await;
        }
        let done = i + 1;
        h.wait_info("inbox", "the event to finish", |info| info.acked + info.dead_lettered == done).await;
        finished.push(sent.id.to_string());
    }
    let mut walked = Vec::new();
    let mut token = String::new();
    loop {
        let page = within(h.engine.log("inbox", None, 3, &token)).await.expect("log page");
        assert!(page.entries.len() <= 3, "a page holds at most `limit`");
        walked.extend(page.entries);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(logged(&walked), finished, "every entry once, in order");
    assert_eq!(walked, h.log("inbox", None).await, "pages add up to the whole log");
    let dead = h.log("inbox", Some(LogStatus::DeadLettered)).await;
    assert_eq!(logged(&dead), [finished[2].clone(), finished[5].clone()]);
    let page = within(h.engine.log("inbox", Some(LogStatus::Completed), 2, "")).await.expect("filtered page");
    assert_eq!(logged(&page.entries), finished[..2]);
    let rest =
        within(h.engine.log("inbox", Some(LogStatus::Completed), 10, &page.next_page_token)).await.expect("rest");
    let rest: Vec<String> = rest.entries.into_iter().map(|e| e.event_id).collect();
    assert_eq!(rest, [finished[3].clone(), finished[4].clone(), finished[6].clone()], "the filter holds across pages");
    let bad = within(h.engine.log("inbox", None, 3, "not a token")).await;
    assert!(matches!(bad, Err(DurableError::InvalidArgument { field: "page_token", .. })), "{bad:?}");
    let missing = within(h.engine.log("nope", None, 3, "")).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

pub async fn delete_while_attached(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "held").await;
    one(&mut a.deliveries).await;
    within(h.engine.delete_consumer("inbox")).await.expect("delete");
    // The attached client's stream ends (normally: nothing went wrong).
    assert_ends(&mut a.deliveries, "after the delete").await;
    assert!(a.client.closed_reason().is_none(), "a delete is a normal end");
    let gone = within(h.engine.get_consumer("inbox")).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    let gone = within(h.engine.attach("inbox", ClientOptions::default(), None)).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    let gone = within(h.engine.delete_consumer("inbox")).await;
    assert!(matches!(gone, Err(DurableError::UnknownConsumer(_))), "{gone:?}");
    assert!(within(h.engine.list_consumers()).await.expect("list").is_empty());
    assert_eq!(stored(&h.publish_keyed("jobs", "after", None, None).await.1), 0, "nothing captures for it");
    // The name is free again, and starts empty.
    let fresh = h.create(consumer("inbox", &["jobs"])).await;
    assert_eq!((fresh.pending, fresh.in_flight, fresh.acked), (0, 0, 0));
}

pub async fn disconnect(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut first = h.attach("inbox").await;
    let sent = h.publish("jobs", "x").await;
    assert_eq!(one(&mut first.deliveries).await.attempt, 1);
    let mut second = h.attach("inbox").await;
    h.wait_info("inbox", "two clients", |i| i.clients == 2).await;
    drop(first);
    let d = one(&mut second.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&sent.id, 2), "released to the other client");
    let (info, entry) = h.complete_first("inbox", &*second.client, &d).await;
    assert_eq!((info.clients, info.redelivered, reasons(&entry)), (1, 1, vec![REASON_DISCONNECT]));
}

pub async fn late_ack(h: &mut Harness) {
    // An ack while the event waits for its redelivery completes it (docs/durable.md "Durable
    // consumers (at-least-once)": "also a late ack").
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let d = one(&mut a.deliveries).await;
    a.client.nack(d.event.id.to_string(), "later".into(), Some(Duration::from_secs(60))).await;
    h.wait_info("inbox", "the nack", |i| i.in_flight == 0 && i.pending == 1).await;
    let (info, entry) = h.complete_first("inbox", &*a.client, &d).await;
    assert_eq!((info.pending, info.in_flight), (0, 0), "nothing left to redeliver");
    assert_eq!(reasons(&entry), ["later"]);
}

pub async fn extend(h: &mut Harness) {
    h.create(ConsumerConfig { ack_deadline_ms: 300, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let d = one(&mut a.deliveries).await;
    // Without the extension it would be back after 300 + 200 ms.
    let extended = Instant::now();
    a.client.extend(vec![d.event.id.to_string()], Duration::from_millis(700)).await;
    let again = one(&mut a.deliveries).await;
    let waited = extended.elapsed();
    assert!(waited + GRANULARITY >= Duration::from_millis(700 + 200), "back after {waited:?}: extension ignored");
    assert_eq!((&again.event.id, again.attempt), (&d.event.id, 2));
    let (_, entry) = h.complete_first("inbox", &*a.client, &again).await;
    assert_eq!(reasons(&entry), [REASON_DEADLINE]);
}

pub async fn competing_clients(h: &mut Harness) {
    h.create(ConsumerConfig { max_in_flight: 3, ..consumer("inbox", &["jobs"]) }).await;
    let options = ClientOptions { max_in_flight: 2, max_batch: 1 };
    let mut a = within(h.engine.attach("inbox", options, None)).await.expect("attach");
    let mut b = h.attach("inbox").await;
    for i in 0..10 {
        h.publish("jobs", &format!("{i}")).await;
    }
    // Each holds at most its max_in_flight (the client's 2, the consumer's 3).
    let (got_a, got_b) = (take(&mut a.deliveries, 2).await, take(&mut b.deliveries, 3).await);
    // (`take` reads batch by batch: with max_batch 1 it would have failed on a bigger one.)
    let info = h.wait_info("inbox", "five in flight", |i| i.in_flight == 5).await;
    assert_eq!((info.pending, info.clients), (5, 2));
    assert_nothing_delivered(&mut a.deliveries, "a client beyond its max_in_flight");
    assert_nothing_delivered(&mut b.deliveries, "a client beyond the consumer's max_in_flight");
    let mut seen: Vec<String> = got_a.iter().chain(&got_b).map(payload).collect();
    // Acks make room; every event reaches exactly one client once.
    a.client.ack(ids(&got_a)).await;
    b.client.ack(ids(&got_b)).await;
    while seen.len() < 10 {
        tokio::select! {
            Some(batch) = a.deliveries.recv() => {
                assert_eq!(batch.len(), 1, "max_batch");
                seen.extend(batch.iter().map(payload));
                a.client.ack(ids(&batch)).await;
            }
            Some(batch) = b.deliveries.recv() => {
                seen.extend(batch.iter().map(payload));
                b.client.ack(ids(&batch)).await;
            }
            () = tokio::time::sleep(DEADLINE) => panic!("only {} of 10 delivered", seen.len()),
        }
    }
    seen.sort_by_key(|p| p.parse::<u32>().unwrap());
    assert_eq!(seen, (0..10).map(|i| i.to_string()).collect::<Vec<_>>(), "each event once");
    let info = h.wait_info("inbox", "every ack", |i| i.acked == 10).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
}

pub async fn declare(h: &mut Harness) {
    let config = consumer("inbox", &["jobs"]);
    within(h.engine.declare_consumer(config.clone())).await.expect("declare");
    h.publish("jobs", "1").await;
    h.publish("jobs", "2").await;
    // Declared again with another definition: replaced, what it holds is kept.
    let changed = ConsumerConfig { max_attempts: 9, ..config.clone() };
    within(h.engine.declare_consumer(changed.clone())).await.expect("declare again");
    let info = h.info("inbox").await;
    assert_eq!((info.config.clone(), info.pending), (changed.clone(), 2));
    let refused = within(h.engine.create_consumer(config)).await;
    assert!(matches!(refused, Err(DurableError::AlreadyExists { .. })), "{refused:?}");
    within(h.engine.flush()).await.expect("flush");
    // The snapshot (no I/O) agrees with a listing once one was made (docs/durable.md "Mode
    // differences": the Redis engine refreshes its snapshot when listing).
    let listed = within(h.engine.list_consumers()).await.expect("list");
    assert_eq!(listed, [info]);
    assert_eq!(h.engine.consumers_snapshot(), listed);
}

pub async fn detach_all(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    let sent = h.publish("jobs", "x").await;
    one(&mut a.deliveries).await;
    // Shutdown: the client's stream ends and what it held is released.
    h.engine.detach_all();
    assert_ends(&mut a.deliveries, "after detach_all").await;
    let mut b = h.attach("inbox").await;
    let d = one(&mut b.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&sent.id, 2));
    let (_, entry) = h.complete_first("inbox", &*b.client, &d).await;
    assert_eq!(reasons(&entry), [REASON_DISCONNECT]);
}

pub async fn ack_by_another_client(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let options = ClientOptions { max_in_flight: 1, max_batch: 0 };
    let mut a = within(h.engine.attach("inbox", options, None)).await.expect("attach a");
    let sent = h.publish("jobs", "x").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, sent.id);
    let b = h.attach("inbox").await;
    // B acks what A holds, then A acks it too. The embedded engine completes it on
    // B's ack, the Redis engine on A's (docs/durable.md "Mode differences"): either way it
    // completes exactly once and A's slot is free again.
    b.client.ack(vec![sent.id.to_string()]).await;
    a.client.ack(vec![sent.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack", |i| i.acked == 1).await;
    assert_eq!((info.pending, info.in_flight, info.redelivered), (0, 0, 0));
    drop(b);
    h.wait_info("inbox", "B to leave", |i| i.clients == 1).await;
    let next = h.publish("jobs", "y").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, next.id, "A has room again");
    a.client.ack(vec![next.id.to_string()]).await;
    h.wait_info("inbox", "the second ack", |i| i.acked == 2).await;
    let log = h.log("inbox", None).await;
    assert_eq!(logged(&log), [sent.id.to_string(), next.id.to_string()]);
}

// ---- consumer operations (docs/consumer-operations.md) ----
