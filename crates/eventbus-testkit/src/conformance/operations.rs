//! The checks of the operations on a consumer: pending lists, redrive, pause, limits, release.

use super::*;

/// Every pending entry, walking pages of `limit`.
async fn pending(h: &Harness, name: &str, limit: usize) -> Vec<PendingEntry> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = within(h.engine.list_pending(name, limit, &token)).await.expect("pending page");
        assert!(page.entries.len() <= limit, "a page holds at most `limit`");
        out.extend(page.entries);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

/// Polls the pending list until `ok` holds.
async fn wait_pending(h: &Harness, name: &str, what: &str, ok: impl Fn(&[PendingEntry]) -> bool) -> Vec<PendingEntry> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let entries = pending(h, name, 1_000).await;
        if ok(&entries) {
            return entries;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {entries:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn states(entries: &[PendingEntry]) -> Vec<(String, PendingState)> {
    entries.iter().map(|e| (String::from_utf8_lossy(&e.event.payload).into_owned(), e.state)).collect()
}

pub async fn list_pending(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let a1 = h.publish_keyed("jobs", "a1", Some("a"), None).await.0;
    h.publish_keyed("jobs", "a2", Some("a"), None).await;
    h.publish("jobs", "x").await;
    let empty = within(h.engine.list_pending("nope", 10, "")).await;
    assert!(matches!(empty, Err(DurableError::UnknownConsumer(_))), "{empty:?}");
    let bad = within(h.engine.list_pending("inbox", 10, "not-a-token")).await;
    assert!(matches!(bad, Err(DurableError::InvalidArgument { field: "page_token", .. })), "{bad:?}");
    let before = pending(h, "inbox", 1_000).await;
    // The embedded engine lists in capture order; the Redis engine the live stream
    // first, then what waits off it (docs/durable.md "Mode differences"). Compared sorted.
    let sorted = |entries: &[PendingEntry]| {
        let mut s = states(entries);
        s.sort();
        s
    };
    assert_eq!(
        sorted(&before),
        [
            ("a1".into(), PendingState::Ready),
            ("a2".into(), PendingState::BlockedByOrderingKey),
            ("x".into(), PendingState::Ready)
        ],
    );
    assert!(before.iter().all(|e| e.attempt == 0 && e.next_delivery_ms.is_none() && e.failures.is_empty()));
    assert_eq!(
        pending(h, "inbox", 1).await.iter().map(|e| e.event.id.to_string()).collect::<Vec<_>>(),
        before.iter().map(|e| e.event.id.to_string()).collect::<Vec<_>>(),
        "pages of one add up to the list"
    );
    // One client with room for one: a1 goes out first.
    let options = ClientOptions { max_in_flight: 1, max_batch: 0 };
    let mut c = within(h.engine.attach("inbox", options, None)).await.expect("attach");
    let d = one(&mut c.deliveries).await;
    assert_eq!(d.event.id, a1.id);
    let attached = epoch_ms(SystemTime::now());
    let of_a1 = |entries: &[PendingEntry]| entries.iter().find(|e| e.event.id == a1.id).cloned();
    let now =
        wait_pending(h, "inbox", "a1 in flight", |e| of_a1(e).is_some_and(|e| e.state == PendingState::InFlight)).await;
    let now = of_a1(&now).expect("a1 listed");
    assert_eq!(now.attempt, 1);
    let deadline = now.next_delivery_ms.expect("an ack deadline");
    assert!(
        deadline + 5 >= attached + 30_000 - 2_000 && deadline <= epoch_ms(SystemTime::now()) + 30_000 + 5,
        "{deadline}"
    );
    // Nacked for a minute: a1 waits with its failure, x goes out, a2 stays behind a1.
    let nacked = epoch_ms(SystemTime::now());
    c.client.nack(a1.id.to_string(), "later".into(), Some(Duration::from_secs(60))).await;
    assert_eq!(payload(&one(&mut c.deliveries).await), "x");
    let after =
        wait_pending(h, "inbox", "a1 delayed", |e| of_a1(e).is_some_and(|e| e.state == PendingState::Delayed)).await;
    assert_eq!(
        sorted(&after),
        [
            ("a1".into(), PendingState::Delayed),
            ("a2".into(), PendingState::BlockedByOrderingKey),
            ("x".into(), PendingState::InFlight)
        ],
    );
    let delayed = of_a1(&after).expect("a1 listed");
    let due = delayed.next_delivery_ms.expect("a redelivery time");
    assert!(
        due + GRANULARITY.as_millis() as u64 >= nacked + 60_000 && due <= epoch_ms(SystemTime::now()) + 60_000,
        "{due}"
    );
    assert_eq!((delayed.attempt, delayed.failures.len()), (1, 1));
    assert_eq!(delayed.failures[0].reason, "later");
}

pub async fn linear_backoff(h: &mut Harness) {
    // Linear: 200 ms × attempt. Exponential with this multiplier would wait 200, 600.
    let backoff = Backoff { initial_ms: 200, multiplier: 3.0, max_ms: 10_000, kind: BackoffKind::Linear };
    h.create(ConsumerConfig { backoff, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    h.publish("jobs", "x").await;
    let mut d = one(&mut a.deliveries).await;
    for attempt in 1..=2u32 {
        assert_eq!(d.attempt, attempt);
        let nacked = epoch_ms(SystemTime::now());
        a.client.nack(d.event.id.to_string(), "boom".into(), None).await;
        // The scheduled redelivery is exactly the linear delay after the failure was
        // recorded, which happened between the nack and this observation.
        let seen = wait_pending(h, "inbox", "the retry", |e| {
            e.first().is_some_and(|e| e.state == PendingState::Delayed || e.attempt > attempt)
        })
        .await;
        let observed = epoch_ms(SystemTime::now());
        if seen[0].state == PendingState::Delayed {
            let failed_at = seen[0].next_delivery_ms.expect("due") - 200 * u64::from(attempt);
            assert!(
                failed_at + 1 >= nacked && failed_at <= observed,
                "attempt {attempt}: due {seen:?}, nacked {nacked}, seen {observed}"
            );
        }
        d = one(&mut a.deliveries).await;
    }
    assert_eq!(d.attempt, 3);
}

pub async fn redrive(h: &mut Harness) {
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    let e1 = h.publish_keyed("jobs", "e1", Some("k"), None).await.0;
    let e2 = h.publish_keyed("jobs", "e2", Some("k"), None).await.0;
    let e3 = h.publish("jobs", "e3").await;
    // e1 first, e3 beside it (in one batch or two), e2 once e1 is dead-lettered.
    let mut termed = 0;
    while termed < 3 {
        let batch = within(a.deliveries.recv()).await.expect("deliveries stream open");
        for d in batch {
            a.client.term(d.event.id.to_string(), "bug".into()).await;
            h.letter().await;
            termed += 1;
        }
    }
    let info = h.wait_info("inbox", "three dead letters", |i| i.dead_lettered == 3 && i.redrivable == 3).await;
    assert_eq!((info.pending, info.in_flight, info.redriven), (0, 0, 0));
    // A newer event of key k is in flight: the redriven ones queue behind it.
    let e4 = h.publish_keyed("jobs", "e4", Some("k"), None).await.0;
    assert_eq!(one(&mut a.deliveries).await.event.id, e4.id);
    let done = within(h.engine.redrive("inbox", &[e2.id.to_string(), e1.id.to_string(), "unknown".into()], 0))
        .await
        .expect("redrive");
    assert_eq!(done, Redriven { redriven: 2, remaining: 1 });
    let again =
        within(h.engine.redrive("inbox", &[e1.id.to_string(), e2.id.to_string()], 0)).await.expect("redrive again");
    assert_eq!(again, Redriven { redriven: 0, remaining: 1 }, "each dead letter is redriven once");
    let waiting = wait_pending(h, "inbox", "the redriven events", |e| e.len() == 3).await;
    assert_eq!(
        states(&waiting).into_iter().filter(|(p, _)| p != "e4").collect::<Vec<_>>(),
        [("e1".into(), PendingState::BlockedByOrderingKey), ("e2".into(), PendingState::BlockedByOrderingKey)],
        "behind e4, in their original order"
    );
    assert!(
        waiting.iter().filter(|e| e.event.id != e4.id).all(|e| e.attempt == 0 && e.failures.is_empty()),
        "attempts reset: {waiting:?}"
    );
    assert_nothing_delivered(&mut a.deliveries, "redriven events wait for their key");
    a.client.ack(vec![e4.id.to_string()]).await;
    for e in [&e1, &e2] {
        let d = one(&mut a.deliveries).await;
        assert_eq!(
            (&d.event.id, d.attempt, &d.event.payload),
            (&e.id, 1, &e.payload),
            "original order, attempts reset"
        );
        a.client.ack(vec![d.event.id.to_string()]).await;
    }
    // Everything else (with no ids): e3.
    let rest = within(h.engine.redrive("inbox", &[], 0)).await.expect("redrive all");
    assert_eq!(rest, Redriven { redriven: 1, remaining: 0 });
    let d = one(&mut a.deliveries).await;
    assert_eq!((&d.event.id, d.attempt), (&e3.id, 1));
    a.client.ack(vec![d.event.id.to_string()]).await;
    let info = h.wait_info("inbox", "all acked", |i| i.acked == 4).await;
    assert_eq!((info.redriven, info.redrivable, info.pending, info.in_flight), (3, 0, 0, 0));
    let redriven = h.log("inbox", Some(LogStatus::Redriven)).await;
    assert_eq!(
        logged(&redriven),
        [e1.id.to_string(), e2.id.to_string(), e3.id.to_string()],
        "logged as redriven, in order"
    );
    let missing = within(h.engine.redrive("nope", &[], 0)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

pub async fn pause_resume(h: &mut Harness) {
    h.create(consumer("inbox", &["jobs"])).await;
    let mut a = h.attach("inbox").await;
    let held = h.publish("jobs", "before").await;
    assert_eq!(one(&mut a.deliveries).await.event.id, held.id);
    let info = within(h.engine.set_paused("inbox", true)).await.expect("pause");
    assert!(info.paused);
    // Still captured, not delivered; what the client holds can still be acked.
    h.publish("jobs", "p1").await;
    h.publish("jobs", "p2").await;
    a.client.ack(vec![held.id.to_string()]).await;
    let info = h.wait_info("inbox", "the ack while paused", |i| i.acked == 1).await;
    assert_eq!((info.paused, info.pending, info.in_flight, info.clients), (true, 2, 0, 1));
    let entries = pending(h, "inbox", 100).await;
    assert!(entries.iter().all(|e| e.state == PendingState::Ready), "{entries:?}");
    assert_nothing_delivered(&mut a.deliveries, "nothing while paused");
    let again = within(h.engine.set_paused("inbox", true)).await.expect("pause twice");
    assert!(again.paused, "pausing a paused consumer is a no-op");
    let info = within(h.engine.set_paused("inbox", false)).await.expect("resume");
    assert!(!info.paused);
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["p1", "p2"]);
    let missing = within(h.engine.set_paused("nope", true)).await;
    assert!(matches!(missing, Err(DurableError::UnknownConsumer(_))), "{missing:?}");
}

pub async fn exclusive(h: &mut Harness) {
    h.create(ConsumerConfig { exclusive: true, ..consumer("runner", &["jobs"]) }).await;
    assert!(h.info("runner").await.config.exclusive);
    let mut first = h.attach("runner").await;
    let mut second = h.attach("runner").await;
    h.wait_info("runner", "two clients", |i| i.clients == 2).await;
    for i in 0..3 {
        h.publish("jobs", &format!("{i}")).await;
    }
    let got = take(&mut first.deliveries, 3).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["0", "1", "2"], "all to the first client");
    first.client.ack(vec![got[0].event.id.to_string()]).await;
    h.wait_info("runner", "the ack", |i| i.acked == 1).await;
    assert_nothing_delivered(&mut second.deliveries, "the second client waits while the first is attached");
    // The first leaves holding two: they are released, and the second takes over.
    drop(first);
    let mut taken: Vec<(String, u32)> =
        take(&mut second.deliveries, 2).await.iter().map(|d| (payload(d), d.attempt)).collect();
    taken.sort();
    assert_eq!(taken, [("1".into(), 2), ("2".into(), 2)]);
    h.publish("jobs", "3").await;
    assert_eq!(payload(&one(&mut second.deliveries).await), "3");
}

/// A consumer holding `max_pending` events takes no more; the
/// captures it misses are counted, and it takes them again once it has room.
pub async fn max_pending(h: &mut Harness) {
    h.create(ConsumerConfig { max_pending: 2, ..consumer("small", &["jobs"]) }).await;
    h.create(consumer("big", &["jobs"])).await;
    for i in 0..3 {
        h.publish("jobs", &format!("{i}")).await;
    }
    let small = h.info("small").await;
    assert_eq!((small.pending, small.dropped, small.config.max_pending), (2, 1, 2), "{small:?}");
    assert_eq!((h.info("big").await.pending, h.info("big").await.dropped), (3, 0), "other consumers unaffected");
    let mut a = h.attach("small").await;
    let got = take(&mut a.deliveries, 2).await;
    assert_eq!(got.iter().map(payload).collect::<Vec<_>>(), ["0", "1"]);
    a.client.ack(vec![got[0].event.id.to_string()]).await;
    h.wait_info("small", "room again", |i| i.acked == 1).await;
    h.publish("jobs", "3").await;
    assert_eq!(payload(&one(&mut a.deliveries).await), "3");
    assert_eq!(h.info("small").await.dropped, 1);
}

/// A publisher that goes away mid-capture (a killed client: its future is dropped at
/// whatever await it had reached) never strands an event: once a capture is stored,
/// it reaches its consumer, and a retry with the same idempotency key that is told
/// `duplicate` is told so about an event the consumer does get.
pub async fn dropped_capture_callers(h: &mut Harness) {
    h.create(consumer("inbox", &["orders.>"])).await;
    const ROUNDS: usize = 12;
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for round in 0..ROUNDS {
        let events: Vec<Arc<Event>> = (0..4).map(|i| new_event("orders.created", &format!("{round}-{i}"))).collect();
        let keys: Vec<String> = (0..4).map(|i| format!("key-{round}-{i}")).collect();
        let batch: Vec<CaptureRequest<'_>> = events
            .iter()
            .zip(&keys)
            .map(|(event, key)| CaptureRequest { event, ordering_key: None, idempotency_key: Some(key) })
            .collect();
        // Round n polls the capture n times, letting the engine run in between, then
        // drops it: every await point of the capture is a place where a caller can go.
        let mut capture = h.engine.capture_many(&batch);
        for _ in 0..round {
            if capture.as_mut().poll(&mut cx).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(capture);
    }
    // The producer retries everything with the same keys, as an outbox relay does.
    let mut expected = std::collections::BTreeSet::new();
    for round in 0..ROUNDS {
        for i in 0..4 {
            let key = format!("key-{round}-{i}");
            let (event, captured) = h.publish_keyed("orders.created", &format!("{round}-{i}"), None, Some(&key)).await;
            match captured {
                Captured::Duplicate(original) => expected.insert(original),
                other => {
                    assert_eq!(stored(&other), 1, "a retry stored anew is stored for the consumer");
                    expected.insert(event.id.to_string())
                }
            };
        }
    }
    assert_eq!(expected.len(), ROUNDS * 4, "one event per key");
    // Every event a producer was told about reaches the consumer.
    let mut a = h.attach("inbox").await;
    let mut received = std::collections::BTreeSet::new();
    while !expected.is_subset(&received) {
        let batch = within(a.deliveries.recv()).await.expect("deliveries stream open");
        for d in batch {
            a.client.ack(vec![d.event.id.to_string()]).await;
            received.insert(d.event.id.to_string());
        }
    }
    h.wait_info("inbox", "everything acked", |i| i.pending == 0 && i.in_flight == 0).await;
}

/// A publish matching more consumers than `max_captures_per_publish` (3 here) is
/// refused whole: stored for none, its idempotency key not kept.
pub async fn release(h: &mut Harness) {
    // With one attempt allowed, a failed attempt would dead-letter: a release must not
    // count one, must not wait for a backoff, and must take the event back whoever
    // holds the rest.
    h.create(ConsumerConfig { max_attempts: 1, ..consumer("inbox", &["jobs"]) }).await;
    let mut a = h.attach("inbox").await;
    for i in 0..3 {
        h.publish("jobs", &i.to_string()).await;
    }
    let held = take(&mut a.deliveries, 3).await;
    // Without drain: back at once, to the one client there is, with the same attempt.
    a.client.release(vec![held[0].event.id.to_string()], false).await;
    let again = one(&mut a.deliveries).await;
    assert_eq!((&again.event.id, again.attempt), (&held[0].event.id, 1), "released without drain");
    // With drain: the client hears `drained` (the empty batch) and gets nothing more;
    // what it released goes to another client, unattempted.
    let mut b = h.attach("inbox").await;
    a.client.release(vec![held[0].event.id.to_string(), held[1].event.id.to_string()], true).await;
    let marker = within(a.deliveries.recv()).await.expect("deliveries stream open");
    assert!(marker.is_empty(), "the drain's answer is an empty batch: {marker:?}");
    let mut moved = take(&mut b.deliveries, 2).await;
    moved.sort_by_key(payload);
    assert_eq!(moved.iter().map(|d| (payload(d), d.attempt)).collect::<Vec<_>>(), [("0".into(), 1), ("1".into(), 1)]);
    let later = h.publish("jobs", "3").await;
    assert_eq!(one(&mut b.deliveries).await.event.id, later.id, "new events go to the client not draining");
    assert_nothing_delivered(&mut a.deliveries, "a draining client");
    // The draining client still finishes what it started.
    a.client.ack(vec![held[2].event.id.to_string()]).await;
    b.client.ack(ids(&moved)).await;
    b.client.ack(vec![later.id.to_string()]).await;
    let info = h.wait_info("inbox", "every ack", |i| i.acked == 4).await;
    assert_eq!((info.pending, info.in_flight, info.dead_lettered, info.redelivered), (0, 0, 0, 0));
    let log = h.log("inbox", Some(LogStatus::Completed)).await;
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|e| e.attempts == 1 && e.failures.is_empty()), "no attempt counted: {log:?}");
}

pub async fn too_many_captures(h: &mut Harness) {
    for name in ["a", "b", "c"] {
        h.create(consumer(name, &["fan.>"])).await;
    }
    assert_eq!(stored(&h.publish_keyed("fan.out", "three", None, None).await.1), 3, "at the bound: captured");
    h.create(consumer("d", &["fan.*"])).await;
    let event = new_event("fan.out", "four");
    let refused = within(h.engine.capture(&event, None, Some("k"))).await;
    assert!(
        matches!(refused, Err(DurableError::TooManyCaptures { matched: 4, limit: 3, ref channel }) if channel == "fan.out"),
        "{refused:?}"
    );
    assert_eq!(h.info("d").await.pending, 0, "stored for none");
    assert_eq!(h.info("a").await.pending, 1);
    // Below the bound again, the key is free.
    within(h.engine.delete_consumer("d")).await.unwrap();
    assert_eq!(stored(&h.publish_keyed("fan.out", "retry", None, Some("k")).await.1), 3);
}
