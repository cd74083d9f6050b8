//! A session token (`ebs_…`, from `POST /v1/tokens`) is only as good as the credential
//! it was minted with, played against a real server: once its principal is removed,
//! loses a right, or its JWT key rotates, new calls and new SSE streams are refused and
//! the streams it opened end at the reload.

use crate::common;

use common::auth::*;
use common::sse::EventStream;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::Code;

const READER: &str = "ebt_reader_0123456789abcdef";

fn principals(reader_rights: Option<&str>) -> String {
    let reader = reader_rights.map(|rights| entry("reader", READER, rights)).unwrap_or_default();
    base_principals() + &reader
}

const ORDERS: &str = "{ publish: { allow: ['orders.>'] }, subscribe: { allow: ['orders.>'] } }";

/// A session token minted with `credential`.
async fn mint(server: &TestServer, credential: &str) -> String {
    let response = reqwest::Client::new().post(server.url("/v1/tokens")).bearer_auth(credential).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let minted: Value = response.json().await.unwrap();
    minted["token"].as_str().unwrap().to_owned()
}

/// An SSE stream of `channel` opened with the session token in the URL, started.
async fn sse(server: &TestServer, channel: &str, session: &str) -> Result<EventStream, (StatusCode, String)> {
    let mut stream =
        EventStream::open(&server.url(&format!("/v1/subscribe?channel={channel}&token={session}")), &[]).await?;
    assert_eq!(stream.next_event().await.event, "started");
    Ok(stream)
}

async fn publish(server: &TestServer, token: &str, channel: &str) -> StatusCode {
    let body = json!({ "channel": channel, "payload": "x" });
    let response =
        reqwest::Client::new().post(server.url("/v1/publish")).bearer_auth(token).json(&body).send().await.unwrap();
    response.status()
}

/// The stream's last event: `end`, with the status code that ended it; then nothing.
async fn ended(stream: &mut EventStream) -> String {
    let end = stream.next_event().await;
    assert_eq!(end.event, "end", "{end:?}");
    while let Some(sse) = stream.next().await {
        assert_eq!(sse.event, ":", "only heartbeats may follow the end: {sse:?}");
    }
    end.json()["code"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_ends_with_its_principal() {
    let files = Files::new(&principals(Some(ORDERS)));
    let server = files.start().await;
    let session = mint(&server, READER).await;
    let mut stream = sse(&server, "orders.>", &session).await.unwrap();
    assert_eq!(publish(&server, &session, "orders.a").await, StatusCode::OK);
    assert_eq!(stream.next_event().await.json()["channel"], "orders.a");

    files.write_principals(&principals(None));
    assert!(server.reloader.reload());
    assert_eq!(ended(&mut stream).await, "Unauthenticated");
    let (status, body) = sse(&server, "orders.>", &session).await.err().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("revoked"), "{body}");
    assert_eq!(publish(&server, &session, "orders.a").await, StatusCode::UNAUTHORIZED);
    let refused = bus_client_with(&server, &session).await.publish(event("orders.a", "x")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_loses_the_rights_its_principal_loses() {
    let files = Files::new(&principals(Some(ORDERS)));
    let server = files.start().await;
    let session = mint(&server, READER).await;
    let mut wide = sse(&server, "orders.>", &session).await.unwrap();
    let mut narrow = sse(&server, "orders.eu.>", &session).await.unwrap();

    files.write_principals(&principals(Some(
        "{ publish: { allow: ['orders.eu.>'] }, subscribe: { allow: ['orders.eu.>'] } }",
    )));
    assert!(server.reloader.reload());
    assert_eq!(ended(&mut wide).await, "PermissionDenied");
    let (status, _) = sse(&server, "orders.>", &session).await.err().unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(publish(&server, &session, "orders.us.a").await, StatusCode::FORBIDDEN);
    // What the principal still may do, the session still may.
    assert_eq!(publish(&server, &session, "orders.eu.a").await, StatusCode::OK);
    assert_eq!(narrow.next_event().await.json()["channel"], "orders.eu.a");
    // Rights given back after minting do not widen the session beyond what it carries.
    files.write_principals(&principals(Some("{ publish: { allow: ['>'] }, subscribe: { allow: ['>'] } }")));
    assert!(server.reloader.reload());
    assert_eq!(publish(&server, &session, "orders.us.a").await, StatusCode::OK);
    assert_eq!(publish(&server, &session, "billing.a").await, StatusCode::FORBIDDEN);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_of_a_jwt_ends_when_the_jwt_key_rotates() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let rights = json!({ "publish": { "allow": ["orders.>"] }, "subscribe": { "allow": ["orders.>"] } });
    let token = jwt(json!({ "sub": "browser", "aud": AUDIENCE, "exp": now() + 600, "eventbus": rights }));
    let session = mint(&server, &token).await;
    let mut stream = sse(&server, "orders.>", &session).await.unwrap();
    assert_eq!(publish(&server, &session, "orders.a").await, StatusCode::OK);
    assert_eq!(stream.next_event().await.json()["channel"], "orders.a");

    std::fs::write(files.dir.path().join("secret"), "a-rotated-hs256-secret-of-enough-length-too").unwrap();
    assert!(server.reloader.reload());
    assert_eq!(ended(&mut stream).await, "Unauthenticated");
    let (status, _) = sse(&server, "orders.>", &session).await.err().unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(publish(&server, &session, "orders.a").await, StatusCode::UNAUTHORIZED);
    server.stop().await;
}
