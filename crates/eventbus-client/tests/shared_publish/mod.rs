//! `Client::publish` over the client's shared `PublishStream`: each of many concurrent
//! calls gets its own answer or its own error, in order per caller, through a refusal,
//! a deadline and a broker restart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use eventbus_client::{Client, ClientOptions, Error, SubscribeOptions, SubscriptionItem, pb};
use futures::future::join_all;

use crate::common::*;

/// Reads `n` events from `sub`: id → (channel, payload).
async fn received(sub: &mut eventbus_client::Subscription, n: usize) -> Vec<pb::Event> {
    let mut got = Vec::with_capacity(n);
    within(async {
        while got.len() < n {
            match sub.next().await.expect("subscription open").unwrap() {
                SubscriptionItem::Events(events) => got.extend(events),
                SubscriptionItem::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    got
}

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_each_get_the_answer_to_their_own_event() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    client.create_consumer(consumer("audit", "m.>")).await.unwrap();
    let mut sub = client.subscribe(SubscribeOptions::new(["m.>"])).await.unwrap();
    const N: usize = 1000;
    let calls = (0..N).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut request = event(&format!("m.{}", i % 7), i.to_string());
            if i % 100 == 1 {
                // Two calls with one key: one event, the other answered as its duplicate.
                request.idempotency_key = format!("key-{i}");
            }
            if i % 100 == 2 {
                // The same event as call i - 1's: whichever of the two is stored, it is
                // the one both answers name.
                request = event(&format!("m.{}", (i - 1) % 7), (i - 1).to_string());
                request.idempotency_key = format!("key-{}", i - 1);
            }
            (i, client.publish_request(request).await.unwrap())
        })
    });
    let answers: Vec<(usize, pb::PublishResponse)> =
        within(join_all(calls)).await.into_iter().map(Result::unwrap).collect();
    let duplicates: Vec<usize> = answers.iter().filter(|(_, a)| a.duplicate).map(|(i, _)| *i).collect();
    assert_eq!(duplicates.len(), N / 100, "one duplicate per shared key: {duplicates:?}");
    let events = received(&mut sub, N - N / 100).await;
    let by_id: HashMap<&str, &pb::Event> = events.iter().map(|e| (e.id.as_str(), e)).collect();
    assert_eq!(by_id.len(), N - N / 100, "one event per accepted call");
    for (i, answer) in &answers {
        let event = by_id.get(answer.event_id.as_str()).unwrap_or_else(|| panic!("call {i}: unknown id"));
        let expected = if i % 100 == 2 { i - 1 } else { *i };
        assert_eq!(text(&event.payload), expected.to_string(), "call {i} answered with another call's id");
        assert_eq!(event.channel, format!("m.{}", expected % 7));
        assert_eq!(answer.captured_count, u32::from(!answer.duplicate), "call {i}: captured by the consumer");
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_fails_its_own_call_and_the_others_are_published() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["r.>"])).await.unwrap();
    const N: usize = 300;
    let calls = (0..N).map(|i| {
        let channel = if i == N / 2 { "r..bad".to_owned() } else { format!("r.{i}") };
        let client = client.clone();
        tokio::spawn(async move { client.publish_request(event(&channel, i.to_string())).await })
    });
    let answers: Vec<_> = within(join_all(calls)).await.into_iter().map(Result::unwrap).collect();
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            Err(Error::InvalidArgument(status)) if i == N / 2 => {
                assert!(status.message().contains("r..bad"), "{status:?}");
            }
            Ok(_) if i != N / 2 => {}
            other => panic!("call {i}: {other:?}"),
        }
    }
    let events = received(&mut sub, N - 1).await;
    let by_id: HashMap<&str, &pb::Event> = events.iter().map(|e| (e.id.as_str(), e)).collect();
    for (i, answer) in answers.iter().enumerate().filter(|(i, _)| *i != N / 2) {
        let id = &answer.as_ref().unwrap().event_id;
        assert_eq!(by_id.get(id.as_str()).map(|e| text(&e.payload)), Some(i.to_string()), "call {i}");
    }
    assert_eq!(by_id.len(), N - 1, "each accepted event published once");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_s_events_keep_their_order() {
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["o.>"])).await.unwrap();
    const CALLERS: usize = 16;
    const EACH: usize = 50;
    let mut tasks: Vec<_> = (0..CALLERS)
        .map(|c| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    client.publish_request(event(&format!("o.{c}"), i.to_string())).await.unwrap();
                }
            })
        })
        .collect();
    // One caller that does not wait for one call before the next: its calls are
    // queued in the order they were made.
    let pipelined = client.clone();
    tasks.push(tokio::spawn(async move {
        let calls = (0..EACH).map(|i| pipelined.publish_request(event("o.pipelined", i.to_string())));
        for answer in join_all(calls).await {
            answer.unwrap();
        }
    }));
    for task in within(join_all(tasks)).await {
        task.unwrap();
    }
    let events = received(&mut sub, (CALLERS + 1) * EACH).await;
    let mut per_caller: HashMap<&str, Vec<String>> = HashMap::new();
    for e in &events {
        per_caller.entry(e.channel.as_str()).or_default().push(text(&e.payload));
    }
    let in_order: Vec<String> = (0..EACH).map(|i| i.to_string()).collect();
    assert_eq!(per_caller.len(), CALLERS + 1);
    for (caller, payloads) in per_caller {
        assert_eq!(payloads, in_order, "{caller}");
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_s_deadline_holds_and_the_other_calls_keep_their_answers() {
    // A "broker" that takes connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            connections.push(connection);
        }
    });
    let client = Client::connect(ClientOptions::new(format!("http://{addr}"))).await.unwrap();
    let start = tokio::time::Instant::now();
    let late = tokio::time::timeout(Duration::from_millis(200), client.publish_request(event("d.x", "x"))).await;
    assert!(late.is_err(), "no answer from a silent broker: {late:?}");
    assert!(start.elapsed() < Duration::from_secs(2), "the deadline held: {:?}", start.elapsed());
    held.abort();

    // On a real broker, callers that give up at once leave the others' answers intact.
    let broker = Broker::start().await;
    let client = broker.client().await;
    let mut sub = client.subscribe(SubscribeOptions::new(["d.>"])).await.unwrap();
    let calls = (0..400).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            let call = client.publish_request(event("d.x", i.to_string()));
            if i % 2 == 0 { tokio::time::timeout(Duration::ZERO, call).await.ok() } else { Some(call.await) }
        })
    });
    let answers: Vec<_> = within(join_all(calls)).await.into_iter().map(Result::unwrap).collect();
    let kept: Vec<(usize, String)> =
        answers.into_iter().enumerate().filter_map(|(i, a)| a.map(|a| (i, a.unwrap().event_id))).collect();
    assert!(kept.len() >= 200, "every caller that waited was answered");
    // A marker published last: every event before it was received first.
    let marker = client.publish_request(event("d.end", "end")).await.unwrap().event_id;
    let mut payloads = HashMap::new();
    within(async {
        loop {
            if let SubscriptionItem::Events(events) = sub.next().await.unwrap().unwrap() {
                for e in events {
                    if e.id == marker {
                        return;
                    }
                    payloads.insert(e.id, text(&e.payload));
                }
            }
        }
    })
    .await;
    for (i, id) in kept {
        assert_eq!(payloads.get(&id), Some(&i.to_string()), "call {i}");
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_flight_answers_no_false_ok_and_loses_no_keyed_event() {
    let data = tempfile::tempdir().unwrap();
    let mut s = settings();
    s.durable.data_dir = data.path().to_string_lossy().into_owned();
    let broker = Broker::start_with(s.clone()).await;
    let client = broker.client().await;
    client.create_consumer(consumer("audit", "x.>")).await.unwrap();
    const TASKS: usize = 8;
    const EACH: usize = 60;
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS * 2)
        .map(|t| {
            let (client, answered) = (client.clone(), answered.clone());
            tokio::spawn(async move {
                let keyed = t < TASKS;
                let mut ok = Vec::new();
                let mut failed = 0;
                for i in 0..EACH {
                    let mut request = event(&format!("x.{t}"), format!("{t}-{i}"));
                    if keyed {
                        request.idempotency_key = format!("{t}-{i}");
                    }
                    match client.publish_request(request).await {
                        Ok(answer) => ok.push((format!("{t}-{i}"), answer.event_id)),
                        Err(err) => {
                            assert!(!keyed, "a keyed call failed: {err}");
                            assert!(err.is_transient(), "a retryable error: {err}");
                            failed += 1;
                        }
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                (ok, failed)
            })
        })
        .collect();
    eventually("calls in flight", || async { answered.load(std::sync::atomic::Ordering::Relaxed) >= 200 }).await;
    let addr = broker.addr;
    broker.stop().await;
    let (broker, _store) = Broker::restart(addr, s, data.path()).await;
    let mut answered_ok = Vec::new();
    for task in within(join_all(tasks)).await {
        answered_ok.extend(task.unwrap().0);
    }
    // What the consumer holds: every event answered OK, and every keyed event.
    let mut stored: HashMap<String, String> = HashMap::new();
    let mut token = String::new();
    loop {
        let page = client.pending("audit", 1000, token.clone()).await.unwrap();
        for entry in page.entries {
            let event = entry.event.unwrap();
            stored.insert(event.id, text(&event.payload));
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    for (payload, id) in &answered_ok {
        assert_eq!(stored.get(id), Some(payload), "answered OK but not stored: {payload} ({id})");
    }
    let payloads: HashSet<&String> = stored.values().collect();
    for t in 0..TASKS {
        for i in 0..EACH {
            assert!(payloads.contains(&format!("{t}-{i}")), "keyed event {t}-{i} lost");
        }
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_publish_stays_an_option() {
    let broker = Broker::start().await;
    let client = Client::connect(ClientOptions::new(broker.url()).unary_publish(true)).await.unwrap();
    let mut sub = client.subscribe(SubscribeOptions::new(["u.>"])).await.unwrap();
    let first = client.publish_request(event("u.x", "1")).await.unwrap();
    assert!(matches!(client.publish_request(event("u..x", "2")).await, Err(Error::InvalidArgument(_))));
    let third = client.publish_unary(event("u.x", "3")).await.unwrap();
    let ids: Vec<String> = received(&mut sub, 2).await.into_iter().map(|e| e.id).collect();
    assert_eq!(ids, [first.event_id, third.event_id]);
    broker.stop().await;
}
