//! Authentication harness: a principals file and JWT secret in a temporary directory,
//! and clients that send a bearer credential on every call.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use eventbus_auth::token_sha256;
use eventbus_proto::pb::{self, admin_client::AdminClient, event_bus_client::EventBusClient};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::*;

pub const ADMIN_TOKEN: &str = "ebt_admin_0123456789abcdef";
pub const NOBODY_TOKEN: &str = "ebt_nobody_0123456789abcdef";
pub const SECRET: &str = "test-hs256-secret-of-enough-length-for-hs256";
pub const AUDIENCE: &str = "eventbus-tests";

/// The principals file and JWT secret of a test, in a temporary directory.
pub struct Files {
    pub dir: tempfile::TempDir,
}

impl Files {
    pub fn new(principals: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let files = Self { dir };
        files.write_principals(principals);
        files
    }

    pub fn principals(&self) -> PathBuf {
        self.dir.path().join("principals.yaml")
    }

    pub fn write_principals(&self, yaml: &str) {
        // Written beside, then renamed: a reload never reads half a file.
        let tmp = self.dir.path().join("principals.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(tmp, self.principals()).unwrap();
    }

    pub async fn start(&self) -> TestServer {
        self.start_with(|_| {}).await
    }

    /// [`Files::start`] with more settings changed by `tweak`.
    pub async fn start_with(&self, tweak: impl FnOnce(&mut eventbus_server::Settings)) -> TestServer {
        let principals = self.principals().to_string_lossy().into_owned();
        let secret = self.dir.path().join("secret").to_string_lossy().into_owned();
        start_with(move |s| {
            s.auth.enabled = true;
            s.auth.principals_file = principals;
            s.auth.jwt.hs256_secret_file = secret;
            s.auth.jwt.audience = AUDIENCE.into();
            tweak(s);
        })
        .await
    }
}

pub fn entry(name: &str, token: &str, permissions: &str) -> String {
    format!("  - name: {name}\n    token_sha256: {}\n    permissions: {permissions}\n", token_sha256(token))
}

pub fn base_principals() -> String {
    let all = "{ publish: { allow: ['>'] }, subscribe: { allow: ['>'] }, consumers: { allow: ['*'] }, \
               manage_consumers: ['*'], admin: true }";
    format!("principals:\n{}{}", entry("admin", ADMIN_TOKEN, all), entry("nobody", NOBODY_TOKEN, "{}"))
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

pub fn jwt(claims: serde_json::Value) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap()
}

pub type Authed = InterceptedService<Channel, Authorization>;

/// Sends an `authorization` header on every call (none when `None`).
#[derive(Clone)]
pub struct Authorization(pub Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

pub fn with_header(header: Option<String>) -> Authorization {
    Authorization(header.map(|h| h.parse().unwrap()))
}

/// A bus client sending `Authorization: Bearer <token>`.
pub async fn bus_client_with(server: &TestServer, token: &str) -> EventBusClient<Authed> {
    EventBusClient::with_interceptor(server.channel().await, with_header(Some(format!("Bearer {token}"))))
}

/// An admin client sending `Authorization: Bearer <token>`.
pub async fn admin_client_with(server: &TestServer, token: &str) -> AdminClient<Authed> {
    AdminClient::with_interceptor(server.channel().await, with_header(Some(format!("Bearer {token}"))))
}

pub async fn subscribe_on_authed(
    client: &mut EventBusClient<Authed>,
    req: pb::SubscribeRequest,
) -> Result<Subscriber, tonic::Status> {
    let mut stream = within(client.subscribe(req)).await?.into_inner();
    match within(stream.message()).await? {
        Some(pb::SubscribeResponse { kind: Some(pb::subscribe_response::Kind::Started(s)) }) => {
            Ok(Subscriber { id: s.subscription_id, stream })
        }
        other => panic!("first message must be started, got {other:?}"),
    }
}
