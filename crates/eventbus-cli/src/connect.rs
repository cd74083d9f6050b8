//! Reaching the broker, and errors people can read.

use std::time::Duration;

use anyhow::Context;
use eventbus_proto::pb::{admin_client::AdminClient, event_bus_client::EventBusClient};
use tonic::transport::{Channel, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Batches can carry large payloads; accept far more than gRPC's default 4 MiB.
const MAX_MESSAGE: usize = 256 << 20;

async fn channel(server: &str) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(server.to_owned())
        .with_context(|| format!("invalid server address {server:?} (expected e.g. http://127.0.0.1:50051)"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    endpoint.connect().await.map_err(|e| anyhow::anyhow!("cannot connect to {server}: {}", root_cause(&e)))
}

pub(crate) async fn event_bus(server: &str) -> anyhow::Result<EventBusClient<Channel>> {
    Ok(EventBusClient::new(channel(server).await?).max_decoding_message_size(MAX_MESSAGE))
}

pub(crate) async fn admin(server: &str) -> anyhow::Result<AdminClient<Channel>> {
    Ok(AdminClient::new(channel(server).await?).max_decoding_message_size(MAX_MESSAGE))
}

/// The innermost error: "Connection refused (os error 111)" rather than "transport error".
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// One line for a failed call: the broker's message and the status code.
pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    let message = if status.message().is_empty() { "no details" } else { status.message() };
    anyhow::anyhow!("{message} ({:?})", status.code())
}
