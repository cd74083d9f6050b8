//! Smaller holes an attacker (or a slip of an operator) could use, each played against
//! a real server with authentication on.

use crate::common;

use common::auth::*;
use common::consume::{attach_as, consumer};
use common::*;
use eventbus_proto::pb;
use tonic::Code;

const LIMITED: &str = "ebt_limited_0123456789abcdef";

/// A principals file naming nobody (0 bytes, blanks, `principals: []`) is refused on
/// reload, and everyone keeps working; `auth.allow_empty_principals` accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_principals_file_is_refused_on_reload() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    for empty in ["", "  \n\t\n", "principals: []\n"] {
        files.write_principals(empty);
        assert!(!server.reloader.reload(), "{empty:?} accepted");
        let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
        admin.get_stats(pb::GetStatsRequest {}).await.expect("the previous principals stay");
    }
    server.stop().await;

    let server = files.start_with(|s| s.auth.allow_empty_principals = true).await;
    files.write_principals("principals: []\n");
    assert!(server.reloader.reload(), "allowed on purpose");
    let refused = admin_client_with(&server, ADMIN_TOKEN).await.get_stats(pb::GetStatsRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    server.stop().await;
}

/// `max_subscriptions` counts Consume streams too: both hold a queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_subscriptions_counts_consume_streams() {
    let rights = "{ subscribe: { allow: ['orders.>'] }, consumers: { allow: ['*'] }, max_subscriptions: 1 }";
    let files = Files::new(&format!("{}{}", base_principals(), entry("limited", LIMITED, rights)));
    let server = files.start().await;
    let mut admin = admin_client_with(&server, ADMIN_TOKEN).await;
    admin.create_consumer(pb::CreateConsumerRequest { config: Some(consumer("inbox", &["orders.>"])) }).await.unwrap();
    let attach = pb::Attach { consumer: "inbox".into(), ..Default::default() };
    let _consuming = attach_as(server.endpoint(), attach.clone(), Some(LIMITED)).await.unwrap();
    let refused = subscribe_on_authed(&mut bus_client_with(&server, LIMITED).await, sub(&["orders.>"])).await;
    assert_eq!(refused.map(|s| s.id).unwrap_err().code(), Code::ResourceExhausted);
    let refused = attach_as(server.endpoint(), attach, Some(LIMITED)).await.err().unwrap();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    server.stop().await;
}

/// A JWT that makes an extension critical (`crit`) is refused: none is understood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_with_a_critical_extension_is_refused() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let claims = serde_json::json!({ "sub": "svc", "aud": AUDIENCE, "exp": now() + 600, "bypass": true });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.crit = Some(vec!["bypass".into()]);
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    let token = jsonwebtoken::encode(&header, &claims, &key).unwrap();
    let refused = bus_client_with(&server, &token).await.publish(event("a", &b"x"[..])).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    server.stop().await;
}

/// A key repeated inside the `eventbus` claim is refused, not resolved last-wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_repeating_a_key_in_its_eventbus_claim_is_refused() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let raw = format!(
        r#"{{"sub":"svc","aud":"{AUDIENCE}","exp":{},"eventbus":{{"publish":{{"allow":["a"]}},"publish":{{"allow":[">"]}}}}}}"#,
        now() + 600
    );
    let claims: Box<serde_json::value::RawValue> = serde_json::value::RawValue::from_string(raw).unwrap();
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    let token =
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap();
    let refused = bus_client_with(&server, &token).await.publish(event("b", &b"x"[..])).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    server.stop().await;
}

/// Two `authorization` headers are refused on both protocols, whichever comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_authorization_headers_are_refused() {
    let files = Files::new(&base_principals());
    let server = files.start().await;
    let mut client = eventbus_proto::pb::admin_client::AdminClient::new(server.channel().await);
    let mut request = tonic::Request::new(pb::GetStatsRequest {});
    request.metadata_mut().append("authorization", format!("Bearer {ADMIN_TOKEN}").parse().unwrap());
    request.metadata_mut().append("authorization", format!("Bearer {NOBODY_TOKEN}").parse().unwrap());
    assert_eq!(client.get_stats(request).await.unwrap_err().code(), Code::Unauthenticated);
    let answer = reqwest::Client::new()
        .get(server.url("/admin/eventbus/stats"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("authorization", format!("Bearer {NOBODY_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::UNAUTHORIZED);
    server.stop().await;
}
