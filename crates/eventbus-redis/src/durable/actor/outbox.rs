//! Dead letters in redis mode: the failure script moves a dead-lettered event into the
//! consumer's outbox (a hash) in the same step as its final failure; the actor publishes
//! it and then takes it out. One whose publisher died or failed is handed out again by a
//! janitor after [`OUTBOX_GRACE`]: published at least once, never lost.

use std::sync::Arc;
use std::time::Duration;

use eventbus_core::ErrorKind;
use eventbus_core::durable::{Failure, PublishedDeadLetter};
use redis::{AsyncCommands, RedisResult};
use tracing::{error, warn};

use super::*;
use crate::envelope;

/// How long a dead letter may wait in the outbox for its publication before a janitor
/// hands it out again (its publisher died, or Redis failed under the publish).
pub(super) const OUTBOX_GRACE: Duration = Duration::from_secs(10);

impl Actor {
    /// Publishes a dead letter, then takes it out of the outbox. Should the publish
    /// fail for now (Redis away, shutting down), it stays there and a janitor hands it
    /// out again after [`OUTBOX_GRACE`]; a dead letter that can never be published is
    /// dropped from the outbox with an error.
    pub(super) fn publish_dead_letter(&self, dead: DeadLetter) {
        let outbox = format!("{}:o", self.rt.base);
        let Some(event) = envelope::decode_own(dead.envelope) else {
            error!(consumer = %self.rt.name, event = %dead.event_id, "dead letter with an unreadable event; dropped");
            tokio::spawn(leave_outbox(self.shared.conn(), outbox, dead.event_id));
            return;
        };
        let failures: Vec<Failure> = serde_json::from_str(&dead.failures).unwrap_or_else(|err| {
            warn!(consumer = %self.rt.name, %err, "unreadable failure list of a dead letter");
            Vec::new()
        });
        let dl = PublishedDeadLetter {
            channel: self.config.dead_letter_channel_for(&event.channel),
            event: Arc::new(event),
            consumer: self.rt.name.to_string(),
            owner: self.config.owner.clone(),
            attempts: dead.attempts,
            failures,
        };
        let (payload, content_type) = (self.shared.options.dead_letter_encoder)(&dl);
        let Some(sink) = self.shared.sink.get() else {
            warn!(consumer = %dl.consumer, event = %dl.event.id, "dead letter not published: no sink; kept in the outbox");
            return;
        };
        let published = sink(dl.channel.clone(), payload, content_type);
        let conn = self.shared.conn();
        tokio::spawn(async move {
            let (channel, consumer, event) = (&dl.channel, &dl.consumer, &dl.event.id);
            match published.await {
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::Unavailable => {
                    warn!(%channel, %consumer, %event, %err, "dead letter not published yet; a janitor retries it");
                    return;
                }
                Err(err) => error!(%channel, %consumer, %event, %err, "cannot publish a dead letter; dropped"),
            }
            leave_outbox(conn, outbox, dl.event.id.to_string()).await;
        });
    }
}

/// Takes a dead letter out of its consumer's outbox. Should that fail, a janitor will
/// publish it once more (at least once, as documented).
async fn leave_outbox(mut conn: super::super::conn::Conn, outbox: String, event_id: String) {
    let done: RedisResult<i64> = conn.hdel(&outbox, &event_id).await;
    if let Err(err) = done {
        warn!(%outbox, event = %event_id, %err, "a dead letter is done but still in the outbox: it may be published twice");
    }
}
