//! Open streams are judged by the rights of the moment, played by a low-privilege
//! principal against a real server: a PublishStream whose principal is removed, whose
//! publish right is withdrawn, or whose JWT expires, and Subscribe and Consume streams
//! at JWT expiry.

use crate::common;

use common::auth::*;
use common::consume::{attach_as, consumer};
use common::*;
use eventbus_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

const PUB: &str = "ebt_publisher_0123456789abcdef";

fn with_publisher(rights: &str) -> String {
    format!("{}{}", base_principals(), entry("pub", PUB, rights))
}

/// An open PublishStream: requests in, answers out.
struct Publishing {
    requests: mpsc::Sender<pb::PublishRequest>,
    answers: Streaming<pb::PublishResponse>,
}

impl Publishing {
    async fn open(server: &TestServer, token: &str) -> Self {
        let mut client = bus_client_with(server, token).await;
        let (requests, rx) = mpsc::channel(16);
        let answers = within(client.publish_stream(ReceiverStream::new(rx))).await.unwrap().into_inner();
        Self { requests, answers }
    }

    /// Publishes one event and reads its answer (or the status the stream ends with).
    async fn publish(&mut self, channel: &str) -> Result<pb::PublishResponse, tonic::Status> {
        if self.requests.send(event(channel, &b"x"[..])).await.is_err() {
            return Err(tonic::Status::cancelled("the stream is closed"));
        }
        match within(self.answers.message()).await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(tonic::Status::cancelled("the stream ended without a status")),
            Err(status) => Err(status),
        }
    }

    /// The status the stream ends with, without sending anything more.
    async fn end(&mut self) -> tonic::Status {
        match within(self.answers.message()).await {
            Ok(other) => panic!("expected the stream to end with a status, got {other:?}"),
            Err(status) => status,
        }
    }
}

const PUBLISHER: &str = "{ publish: { allow: ['orders.>'] }, subscribe: { allow: ['orders.>'] }, \
                         consumers: { allow: ['*'] } }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_ends_unauthenticated_when_its_principal_is_removed() {
    let files = Files::new(&with_publisher(PUBLISHER));
    let server = files.start().await;
    let mut stream = Publishing::open(&server, PUB).await;
    stream.publish("orders.a").await.unwrap();
    files.write_principals(&base_principals());
    assert!(server.reloader.reload());
    let ended = stream.end().await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_is_refused_a_publish_whose_right_was_withdrawn() {
    let files = Files::new(&with_publisher(PUBLISHER));
    let server = files.start().await;
    let mut stream = Publishing::open(&server, PUB).await;
    stream.publish("orders.a").await.unwrap();
    files.write_principals(&with_publisher("{ publish: { allow: ['billing.>'] } }"));
    assert!(server.reloader.reload());
    let refused = stream.publish("orders.b").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("orders.b"), "{}", refused.message());
    // A new stream has the new rights.
    let mut again = Publishing::open(&server, PUB).await;
    again.publish("billing.x").await.unwrap();
    server.stop().await;
}

/// A JWT valid for a couple of seconds more (no leeway).
fn short_jwt(rights: serde_json::Value) -> String {
    jwt(serde_json::json!({ "sub": "short", "aud": AUDIENCE, "exp": now() + 3, "eventbus": rights }))
}

async fn start_without_leeway(files: &Files) -> TestServer {
    files.start_with(|s| s.auth.jwt.leeway_secs = 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_ends_when_its_jwt_expires() {
    let files = Files::new(&base_principals());
    let server = start_without_leeway(&files).await;
    let token = short_jwt(serde_json::json!({ "publish": { "allow": ["orders.>"] } }));
    let mut stream = Publishing::open(&server, &token).await;
    stream.publish("orders.a").await.unwrap();
    let ended = stream.end().await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("expired"), "{}", ended.message());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_consume_streams_end_when_their_jwt_expires() {
    let files = Files::new(&base_principals());
    let server = start_without_leeway(&files).await;
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("inbox", &["orders.>"])) }).await.unwrap();
    let token = short_jwt(serde_json::json!({
        "subscribe": { "allow": ["orders.>"] }, "consumers": { "allow": ["inbox"] },
    }));
    let mut subscriber =
        subscribe_on_authed(&mut bus_client_with(&server, &token).await, sub(&["orders.>"])).await.unwrap();
    let attach = pb::Attach { consumer: "inbox".into(), ..Default::default() };
    let mut consuming = attach_as(server.endpoint(), attach, Some(&token)).await.unwrap();
    let (_, ended) = subscriber.until_end().await;
    assert_eq!(ended.map(|s| s.code()), Some(Code::Unauthenticated));
    let ended = within(consuming.responses.message()).await.unwrap_err();
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    server.stop().await;
}
