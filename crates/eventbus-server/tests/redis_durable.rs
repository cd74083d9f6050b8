//! Durable consumers in redis mode (SPEC §9 on Redis Streams): several instances on one
//! real `redis-server` share each consumer. See `common::redis_server` for what happens
//! without `redis-server`.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

mod common;

use std::collections::{HashMap, HashSet};

use common::consume::*;
use common::redis_server::*;
use common::*;
use eventbus_proto::pb::{self, consume_request, consume_response};
use prost::Message;
use tonic::Code;

async fn create(server: &TestServer, config: pb::ConsumerConfig) -> pb::ConsumerInfo {
    let req = pb::CreateConsumerRequest { config: Some(config) };
    within(server.admin().await.create_consumer(req)).await.unwrap().into_inner()
}

async fn info(server: &TestServer, name: &str) -> pb::ConsumerInfo {
    let req = pb::GetConsumerRequest { name: name.into() };
    within(server.admin().await.get_consumer(req)).await.unwrap().into_inner()
}

async fn publish(server: &TestServer, req: pb::PublishRequest) -> pb::PublishResponse {
    within(server.client().await.publish(req)).await.unwrap().into_inner()
}

async fn log(server: &TestServer, name: &str, status: pb::EventStatus) -> Vec<pb::EventLogEntry> {
    let req =
        pb::ListEventLogRequest { consumer: name.into(), status: status.into(), limit: 1000, ..Default::default() };
    within(server.admin().await.list_event_log(req)).await.unwrap().into_inner().entries
}

fn payload(d: &pb::Delivery) -> String {
    String::from_utf8(d.event.as_ref().unwrap().payload.to_vec()).unwrap()
}

fn ack(ids: Vec<String>) -> consume_request::Kind {
    consume_request::Kind::Ack(pb::Ack { event_ids: ids })
}

fn nack(id: &str, delay_ms: u64) -> consume_request::Kind {
    consume_request::Kind::Nack(pb::Nack { event_id: id.into(), reason: "try later".into(), delay_ms })
}

#[tokio::test]
async fn clients_on_two_instances_share_one_consumer() {
    let Some(redis) = RedisProc::start().await else { return };
    let (a, b) = (broker(&redis).await, broker(&redis).await);
    create(&a, consumer("work", &["jobs.>"])).await;
    // Attached through different instances, each may hold at most 5.
    let mut on_a = attach(a.endpoint(), "work", 5).await.unwrap();
    let mut on_b = attach(b.endpoint(), "work", 5).await.unwrap();
    // Publishes through both instances, all captured for the one consumer.
    for i in 0..20 {
        let via = if i % 2 == 0 { &a } else { &b };
        publish(via, event("jobs.run", format!("job-{i}"))).await;
    }
    let mut seen = HashSet::new();
    let mut per_instance = [0usize; 2];
    while seen.len() < 20 {
        for (k, c) in [&mut on_a, &mut on_b].into_iter().enumerate() {
            // Each holds up to 5: take what is there, check none was seen before, ack.
            let got = match tokio::time::timeout(std::time::Duration::from_millis(300), c.responses.message()).await {
                Ok(Ok(Some(pb::ConsumeResponse { kind: Some(consume_response::Kind::Deliveries(d)) }))) => d.deliveries,
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => continue, // nothing for this one right now
            };
            assert!(got.len() <= 5, "a client never holds more than its max_in_flight (it acks all it gets)");
            for d in &got {
                assert!(seen.insert(payload(d)), "{} delivered twice", payload(d));
                assert_eq!(d.attempt, 1);
            }
            per_instance[k] += got.len();
            c.send(ack(ids(&got))).await;
        }
    }
    assert!(per_instance.iter().all(|n| *n > 0), "both instances took work: {per_instance:?}");
    eventually("every ack to be recorded", || async { info(&b, "work").await.acked == 20 }).await;
    let i = info(&b, "work").await;
    assert_eq!((i.pending, i.in_flight), (0, 0), "nothing left: {i:?}");
    assert_eq!(log(&a, "work", pb::EventStatus::Completed).await.len(), 20, "terminal log shared");
    // Acked entries are removed from the stream: memory holds only what is pending.
    let len: u64 =
        redis::cmd("XLEN").arg("socle:eventbus:durable:work:s").query_async(&mut redis.conn().await).await.unwrap();
    assert_eq!(len, 0);
}
