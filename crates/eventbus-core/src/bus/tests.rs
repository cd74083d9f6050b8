use parking_lot::Mutex;

use super::*;
use crate::subscription::Overflow;
use crate::transport::{PublishFuture, TransportError};

fn opts(channels: &[&str]) -> SubscribeOptions {
    SubscribeOptions { channels: channels.iter().map(|c| c.to_string()).collect(), ..Default::default() }
}

fn input(channel: &str, payload: &'static [u8]) -> PublishInput {
    PublishInput { channel: channel.into(), payload: payload.into(), ..Default::default() }
}

#[tokio::test]
async fn keys_and_source_are_capped_before_anything_is_kept() {
    let bus = Bus::new(BusConfig::default());
    let long = |n: usize| "k".repeat(n);
    let cases = [
        ("ordering_key", PublishInput { ordering_key: long(MAX_KEY_BYTES + 1), ..input("a", b"x") }),
        ("idempotency_key", PublishInput { idempotency_key: long(MAX_KEY_BYTES + 1), ..input("a", b"x") }),
        ("source", PublishInput { source: long(MAX_SOURCE_BYTES + 1), ..input("a", b"x") }),
    ];
    for (field, input) in cases {
        let err = bus.publish(input).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{field}");
        assert!(err.to_string().contains(field), "{err}");
    }
    let at_limit =
        PublishInput { ordering_key: long(MAX_KEY_BYTES), source: long(MAX_SOURCE_BYTES), ..input("a", b"x") };
    assert!(bus.publish(at_limit).await.is_ok());
}

/// A loopback "remote" transport: records watch/unwatch and feeds publishes back
/// through `LocalFanout`, as a Redis transport would on receipt.
#[derive(Debug)]
struct Loopback {
    local: LocalFanout,
    watched: Mutex<Vec<String>>,
    down: AtomicBool,
    state: tokio::sync::watch::Sender<TransportStatus>,
}

impl Loopback {
    fn new(local: LocalFanout) -> Self {
        let state = tokio::sync::watch::channel(TransportStatus { connected: true, ..TransportStatus::default() }).0;
        Self { local, watched: Mutex::default(), down: AtomicBool::new(false), state }
    }
}

impl Transport for Loopback {
    fn mode(&self) -> &'static str {
        "loopback"
    }
    fn publish(&self, event: Arc<Event>) -> PublishFuture<'_> {
        Box::pin(async move {
            if self.down.load(Ordering::Relaxed) {
                return Err(TransportError { transport: "loopback", reason: "down".into() });
            }
            let fanout = self.local.dispatch((*event).clone()).await;
            Ok(Fanout { delivered: 1, failed: fanout.failed })
        })
    }
    fn watch(&self, filter: &Pattern) {
        self.watched.lock().push(filter.to_string());
    }
    fn unwatch(&self, filter: &Pattern) {
        self.watched.lock().retain(|f| f != filter.as_str());
    }
    fn watched(&self) -> crate::transport::WatchedFuture<'_> {
        Box::pin(async {})
    }
    fn status(&self) -> tokio::sync::watch::Receiver<TransportStatus> {
        self.state.subscribe()
    }
}

#[tokio::test]
async fn transport_seam_carries_publishes_and_interest() {
    let mut transport = None;
    let bus = Bus::with_transport(BusConfig::default(), |local| {
        let t = Arc::new(Loopback::new(local));
        transport = Some(Arc::clone(&t));
        t
    });
    let transport = transport.unwrap();
    assert_eq!(bus.mode(), "loopback");

    let mut a = bus.subscribe(opts(&["orders.*", "orders.created"])).await.unwrap();
    let mut b = bus.subscribe(opts(&["orders.*"])).await.unwrap();
    assert_eq!(*transport.watched.lock(), vec!["orders.*", "orders.created"], "each filter watched once");

    let published = bus.publish(input("orders.created", b"x")).await.unwrap();
    assert_eq!(published.delivered, 1, "remote mode reports what the transport reports");
    for handle in [&mut a, &mut b] {
        let mut out = Vec::new();
        handle.next_batch(&mut out).await.unwrap();
        assert_eq!(out.len(), 1, "once, though two filters match");
        assert_eq!(out[0].id, published.event_id);
    }
    drop(a);
    assert_eq!(*transport.watched.lock(), vec!["orders.*"]);
    drop(b);
    assert!(transport.watched.lock().is_empty());

    transport.down.store(true, Ordering::Relaxed);
    assert!(matches!(bus.publish(input("orders.created", b"x")).await, Err(Error::Transport(_))));
    assert_eq!(bus.stats().total_published, 1, "a failed transport publish is not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_end_whenever_the_transport_may_have_lost_their_events() {
    let mut transport = None;
    let bus = Bus::with_transport(BusConfig::default(), |local| {
        let t = Arc::new(Loopback::new(local));
        transport = Some(Arc::clone(&t));
        t
    });
    let transport = transport.unwrap();
    let set = |change: fn(&mut TransportStatus)| transport.local.set_status(&transport.state, change);
    let ended = |mut handle: SubscriptionHandle| async move {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(reason) = handle.next_batch(&mut out).await {
                    return reason;
                }
            }
        })
        .await
        .expect("the subscription ends")
    };

    // A change that loses nothing (a cluster's slots degraded) leaves it open.
    let mut kept = bus.subscribe(opts(&["a"])).await.unwrap();
    set(|s| s.degraded_slots = 3);
    let published = bus.publish(input("a", b"1")).await.unwrap();
    let mut out = Vec::new();
    kept.next_batch(&mut out).await.unwrap();
    assert_eq!(out[0].id, published.event_id);

    // The connection lost: events published elsewhere meanwhile never arrive here.
    set(|s| s.connected = false);
    assert_eq!(ended(kept).await, CloseReason::Interrupted);
    // Subscribed while disconnected: ended when the connection is back.
    let during = bus.subscribe(opts(&["a"])).await.unwrap();
    set(|s| {
        s.connected = true;
        s.reconnects += 1;
    });
    assert_eq!(ended(during).await, CloseReason::Interrupted);
    // A subscription of the transport interrupted while connected (a failover).
    let after = bus.subscribe(opts(&["a"])).await.unwrap();
    set(|s| s.gaps += 1);
    assert_eq!(ended(after).await, CloseReason::Interrupted);
    // Ended before the new state shows: a subscription made once it does stays open.
    let mut later = bus.subscribe(opts(&["a"])).await.unwrap();
    let published = bus.publish(input("a", b"2")).await.unwrap();
    let mut out = Vec::new();
    later.next_batch(&mut out).await.unwrap();
    assert_eq!(out[0].id, published.event_id);
}

#[tokio::test]
async fn publishes_of_one_stream_stop_at_a_refused_event_through_a_transport() {
    let bus = Bus::with_transport(BusConfig::default(), |local| Arc::new(Loopback::new(local)));
    let mut sub = bus.subscribe(opts(&["s.>"])).await.unwrap();
    let answers = bus.publish_many(vec![input("s.a", b"1"), input("s..bad", b"2"), input("s.a", b"3")]).await;
    assert!(matches!(&answers[..], [Ok(_), Err(_)]), "{answers:?}");
    assert_eq!(bus.stats().total_published, 1, "nothing after the refused event is published");
    let mut out = Vec::new();
    sub.next_batch(&mut out).await.unwrap();
    assert_eq!(out.iter().map(|e| &e.payload[..]).collect::<Vec<_>>(), [b"1"]);
}

#[tokio::test]
async fn groups_split_and_ungrouped_get_copies() {
    let bus = Bus::new(BusConfig::default());
    let group = |g: &str| SubscribeOptions { group: g.into(), ..opts(&["jobs.>"]) };
    let members = [bus.subscribe(group("w")).await.unwrap(), bus.subscribe(group("w")).await.unwrap()];
    let other = bus.subscribe(group("audit")).await.unwrap();
    let solo = bus.subscribe(opts(&["jobs.*"])).await.unwrap();
    for _ in 0..10 {
        let p = bus.publish(input("jobs.run", b"j")).await.unwrap();
        assert_eq!(p.delivered, 3, "one per group plus the solo subscription");
    }
    let pending: Vec<u64> = bus.subscriptions().iter().map(|s| s.pending).collect();
    assert_eq!(pending.iter().sum::<u64>(), 30);
    let w: Vec<usize> = members.iter().map(|m| m.sub.pending()).collect();
    assert_eq!(w, vec![5, 5], "round-robin between members with room");
    assert_eq!(other.sub.pending(), 10);
    assert_eq!(solo.sub.pending(), 10);
}

#[tokio::test]
async fn group_prefers_members_with_room() {
    let bus = Bus::new(BusConfig::default());
    let member = |cap| SubscribeOptions {
        group: "g".into(),
        queue_capacity: cap,
        overflow: Some(Overflow::DropOldest),
        ..opts(&["a"])
    };
    let small = bus.subscribe(member(1)).await.unwrap();
    let big = bus.subscribe(member(100)).await.unwrap();
    for _ in 0..20 {
        bus.publish(input("a", b"")).await.unwrap();
    }
    assert_eq!(small.sub.pending() + big.sub.pending(), 20, "nothing dropped while one member has room");
    assert_eq!(bus.stats().total_dropped, 0);
}

#[tokio::test]
async fn unsubscribe_and_drop_free_everything() {
    let bus = Bus::new(BusConfig::default());
    for _ in 0..1000 {
        let handle = bus.subscribe(opts(&["a.>", "b"])).await.unwrap();
        bus.publish(input("a.x", b"1")).await.unwrap();
        drop(handle);
    }
    assert_eq!(bus.stats().active_subscriptions, 0);
    assert_eq!(bus.stats().total_dropped, 1000, "queued events of closed subscriptions are counted lost");
    assert_eq!(bus.channels()[0].subscriber_count, 0);
    assert!(matches!(bus.unsubscribe("nope"), Err(Error::UnknownSubscription(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_table_stays_bounded_under_a_catch_all_subscriber() {
    let bus = Bus::new(BusConfig { max_channels: 100, ..BusConfig::default() });
    let _all = bus.subscribe(SubscribeOptions { overflow: Some(Overflow::DropOldest), ..opts(&[">"]) }).await.unwrap();
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let bus = bus.clone();
            tokio::spawn(async move {
                for i in 0..500 {
                    bus.publish(input(&format!("p{p}.c{i}"), b"")).await.unwrap();
                    assert!(bus.stats().active_channels <= 100, "{} tracked", bus.stats().active_channels);
                }
            })
        })
        .collect();
    for p in publishers {
        p.await.unwrap();
    }
    assert!(bus.channels().len() <= 100, "{} tracked", bus.channels().len());
    assert!(bus.channels_evicted() >= 1900, "what is not tracked is counted: {}", bus.channels_evicted());
    assert_eq!(bus.stats().total_published, 2000);
}

#[tokio::test]
async fn channel_table_is_bounded() {
    let bus = Bus::new(BusConfig { max_channels: 100, ..BusConfig::default() });
    let _keep = bus.subscribe(opts(&["c.0"])).await.unwrap();
    for i in 0..1000 {
        bus.publish(input(&format!("c.{i}"), b"")).await.unwrap();
    }
    let channels = bus.channels();
    assert!(channels.len() <= 100, "{} tracked", channels.len());
    assert!(channels.iter().any(|c| c.channel == "c.0"), "a channel with a subscriber is kept");
}

#[tokio::test]
async fn shutdown_refuses_new_work_and_drains() {
    let bus = Bus::new(BusConfig::default());
    let mut handle = bus.subscribe(opts(&["a"])).await.unwrap();
    bus.publish(input("a", b"1")).await.unwrap();
    bus.begin_shutdown();
    assert!(matches!(bus.publish(input("a", b"2")).await, Err(Error::ShuttingDown)));
    assert!(matches!(bus.subscribe(opts(&["a"])).await, Err(Error::ShuttingDown)));
    let mut out = Vec::new();
    handle.next_batch(&mut out).await.unwrap();
    assert_eq!(out.len(), 1, "queued events are flushed");
    assert_eq!(handle.next_batch(&mut Vec::new()).await, Err(CloseReason::ShuttingDown));
    drop(handle);
    bus.drained().await;
}
