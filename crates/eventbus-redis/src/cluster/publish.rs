//! Publishing: each bucket's events as one pipeline, straight to its master or
//! through the cluster client.

use std::sync::Arc;

use eventbus_core::{Event, TransportError};
use redis::cluster_async::ClusterConnection;

use super::ClusterTransport;
use crate::envelope;
use crate::history::Sending;

/// MOVED or ASK: the node did not run the command (a pipeline of one bucket's
/// commands, all in one slot, is redirected as a whole).
fn is_redirect(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(err.kind(), ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask))
}

/// A pipeline's answer: an `SPUBLISH`'s or a `WAIT`'s count, or the counts of the
/// script that publishes a bucket's events and keeps their history.
#[derive(Debug)]
enum Answer {
    One(i64),
    Each(Vec<i64>),
}

impl redis::FromRedisValue for Answer {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        match v {
            redis::Value::Array(_) => Ok(Self::Each(Vec::from_redis_value(v)?)),
            v => Ok(Self::One(i64::from_redis_value(v)?)),
        }
    }
}

/// One count per event (and the `WAIT`'s last), in order.
fn flatten(answers: Vec<Answer>) -> Vec<i64> {
    let mut out = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            Answer::One(n) => out.push(n),
            Answer::Each(counts) => out.extend(counts),
        }
    }
    out
}

impl ClusterTransport {
    /// Sends one bucket's pipeline to its master, or through the cluster client when
    /// the map has no master for it or the master redirects (then nothing ran there).
    /// `build` makes the pipeline for the way it goes: scripts by hash to a master
    /// (after a `SCRIPT LOAD`, so a new master has it), with their text through the
    /// cluster client (which routes each command by its keys); and whether it ends with
    /// a `WAIT` for replicas, whose answer is checked here and not returned.
    pub(super) async fn send_pipeline(
        &self,
        bucket: usize,
        build: impl Fn(Sending) -> (redis::Pipeline, bool),
    ) -> Result<Vec<i64>, String> {
        let channel = &self.channels[bucket];
        let direct = self.routes.read().by_bucket.get(bucket).cloned().flatten();
        if let Some(mut node) = direct {
            let (pipe, waits) = build(Sending::Hash);
            match pipe.query_async::<Vec<Answer>>(&mut node).await {
                Ok(answers) => return self.replicated(flatten(answers), waits, channel),
                Err(err) if is_redirect(&err) => self.routes_stale.notify_one(),
                // Perhaps run, perhaps not: not sent again (at most once).
                Err(err) => {
                    self.routes_stale.notify_one();
                    return Err(format!("SPUBLISH to {channel} failed: {err}"));
                }
            }
        }
        let Some(mut conn) = self.connection.read().clone() else {
            return Err(format!("not connected to the Redis Cluster at {}", self.target));
        };
        let (pipe, waits) = build(Sending::Text);
        let answers = pipe.query_async::<Vec<Answer>>(&mut conn).await;
        self.replicated(flatten(answers.map_err(|e| format!("SPUBLISH to {channel} failed: {e}"))?), waits, channel)
    }

    /// The publishes' answers, once the `WAIT` that ends them (if it does) says enough
    /// replicas have the history they kept.
    fn replicated(&self, mut answers: Vec<i64>, waits: bool, channel: &str) -> Result<Vec<i64>, String> {
        if !waits {
            return Ok(answers);
        }
        let acked = answers.pop().unwrap_or(0);
        match u32::try_from(acked) {
            Ok(acked) if acked >= self.min_replicas_acked => Ok(answers),
            _ => Err(format!(
                "{acked} of the {} replicas eventbus.redis.min_replicas_acked asks for confirmed the history kept by \
                 the publishes to {channel} within {} ms (published, and kept on the master)",
                self.min_replicas_acked,
                self.replica_ack_timeout.as_millis()
            )),
        }
    }

    /// A bucket's pipeline for `events`, in order: when one of them keeps a history, one
    /// script that publishes them all and keeps those (loaded first, its answer
    /// ignored, when sent by hash) and, with `min_replicas_acked`, a `WAIT` for that
    /// many replicas last (then `true`), as a durable capture waits on one Redis; else
    /// one `SPUBLISH` each.
    pub(super) fn pipeline<'a>(
        &self,
        sending: Sending,
        bucket: usize,
        events: impl Iterator<Item = &'a Arc<Event>> + Clone,
    ) -> (redis::Pipeline, bool) {
        let mut pipe = redis::pipe();
        let channel = self.channels[bucket].as_str();
        let kept = events.clone().any(|e| self.history.limits(&e.channel).is_some());
        if !kept {
            for event in events {
                pipe.cmd("SPUBLISH").arg(channel).arg(envelope::encode_as(self.envelope, event));
            }
            return (pipe, false);
        }
        if sending == Sending::Hash {
            pipe.add_command(self.history.load()).ignore();
        }
        pipe.add_command(self.history.command(sending, "SPUBLISH", self.envelope, events.map(|e| (channel, &**e))));
        let waits = self.min_replicas_acked > 0;
        if waits {
            let timeout_ms = u64::try_from(self.replica_ack_timeout.as_millis()).unwrap_or(u64::MAX).max(1);
            pipe.cmd("WAIT").arg(self.min_replicas_acked).arg(timeout_ms);
        }
        (pipe, waits)
    }

    /// The cluster connection, for a history read (the cluster client routes by key).
    pub(super) fn reader(&self) -> Result<ClusterConnection, TransportError> {
        self.connection
            .read()
            .clone()
            .ok_or_else(|| self.unavailable(format!("not connected to the Redis Cluster at {}", self.target)))
    }
}
