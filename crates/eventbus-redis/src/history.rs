//! Channel history in Redis: a capped stream per channel, shared by every instance.
//!
//! A publish on a channel with a history rule runs one script that, atomically, gives
//! the event the channel's next offset, appends the envelope (with its position) to the
//! channel's stream, trims the stream to the rule's bounds, and PUBLISHes the same
//! envelope. Redis runs it alone, so the stream's order is the order every instance
//! receives the channel's events in, and a subscriber that subscribes first and then
//! reads the stream has every event exactly once (later ones arrive live; those it
//! read twice are recognised by their offset).
//!
//! Keys: `{prefix}:history:{channel}` (the stream; entry ids `<ms>-<offset>`, the
//! event's time kept increasing) and `{prefix}:history-meta:{channel}` (a hash: epoch,
//! last offset, bytes kept, last trimmed offset and time). On a Redis Cluster both
//! carry the hash tag of the channel's shard channel after `history:` /
//! `history-meta:` (`{prefix}:history:{17}:{channel}`), so they live on the master
//! that publishes the channel and the script runs there. The epoch is made when the
//! hash is (first publish, or after Redis lost the keys): it is the id of the event
//! that made it, so a flushed Redis is seen as a new epoch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use eventbus_core::history::{HistoryInfo, HistoryLimits, HistoryRules, Position, Recovery, Start, Take};
use eventbus_core::{Event, Pattern, TransportError};
use redis::aio::ConnectionLike;

use crate::envelope::{self, Envelope};

/// The script that publishes events and keeps those of channels with a history, in
/// order: `history/publish.lua` (its arguments: see there, and [`bounds`]) after
/// `history/retain.lua`, the functions that keep events in their channels' histories
/// (which the durable engine's publish script uses too).
const SCRIPT: &str = concat!(include_str!("history/retain.lua"), include_str!("history/publish.lua"));

/// The `kind` argument of the history's Lua (`history/retain.lua`) for an envelope.
pub(crate) fn kind(envelope: Envelope) -> &'static str {
    match envelope {
        Envelope::Binary => "b",
        Envelope::Json => "j",
    }
}

/// The per-event arguments of the history's Lua after the envelope: `size max_bytes ttl_ms
/// event_ms`, all 0 for a channel without history.
pub(crate) fn bounds(limits: Option<&HistoryLimits>, event: &Event) -> [u64; 4] {
    match limits {
        Some(l) => [l.size as u64, l.max_bytes as u64, l.ttl.map_or(0, |t| t.as_millis() as u64), ms(event.timestamp)],
        None => [0; 4],
    }
}

/// What the key of a channel's history stream starts with (the channel follows).
pub(crate) fn stream_prefix(prefix: &str) -> String {
    format!("{prefix}:history:")
}

/// What the key of a channel's history hash starts with (the channel follows).
pub(crate) fn meta_prefix(prefix: &str) -> String {
    format!("{prefix}:history-meta:")
}

/// The key of the set of channels with a history (single Redis).
pub(crate) fn index_key(prefix: &str) -> String {
    format!("{prefix}:history-channels")
}

/// Most entries one read asks Redis for at a time.
const PAGE: usize = 1000;

/// The history rules and keys of one redis-mode instance.
#[derive(Debug)]
pub(crate) struct RedisHistory {
    prefix: String,
    rules: HistoryRules,
    script: redis::Script,
    /// The script's text, for `EVAL` and `SCRIPT LOAD`.
    text: &'static str,
    /// On a Redis Cluster: how a channel's shard is found, and each shard's hash tag.
    shards: Option<Shards>,
}

/// A cluster's shards as the history keys see them.
#[derive(Debug)]
pub(crate) struct Shards {
    /// Leading tokens of a channel that choose its shard.
    pub(crate) shard_tokens: usize,
    /// The hash tag (`{17}`) of each bucket's shard channel.
    pub(crate) tags: Vec<String>,
}

/// How a script is sent: by its hash (loaded beforehand), or with its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    Hash,
    Text,
}

/// What a channel's history holds, read from its hash and stream.
#[derive(Debug, Default)]
struct Meta {
    epoch: Option<Arc<str>>,
    last: u64,
    /// Entries kept.
    len: u64,
    /// Offset of the newest event trimmed (0: none): events are trimmed oldest first.
    trimmed: u64,
    /// No trimmed event is newer than this (ms): the oldest kept entry's time.
    trimmed_ms: u64,
}

impl RedisHistory {
    pub(crate) fn new(prefix: &str, rules: HistoryRules, shards: Option<Shards>) -> Self {
        Self { prefix: prefix.to_owned(), rules, script: redis::Script::new(SCRIPT), text: SCRIPT, shards }
    }

    /// What `channel` keeps, if anything.
    pub(crate) fn limits(&self, channel: &str) -> Option<&HistoryLimits> {
        match self.rules.is_empty() {
            true => None,
            false => self.rules.limits(channel),
        }
    }

    /// The hash tag and ':' between the key prefix and the channel (cluster only).
    fn tag(&self, channel: &str) -> &str {
        match &self.shards {
            Some(shards) => {
                let bucket = crate::cluster::bucket_of(crate::cluster::shard_key(channel, shards.shard_tokens));
                shards.tags.get(usize::from(bucket)).map_or("", String::as_str)
            }
            None => "",
        }
    }

    fn stream_key(&self, channel: &str) -> String {
        format!("{}{}{channel}", stream_prefix(&self.prefix), self.tag(channel))
    }

    fn meta_key(&self, channel: &str) -> String {
        format!("{}{}{channel}", meta_prefix(&self.prefix), self.tag(channel))
    }

    /// The set of channels with a history: one, or on a cluster one per shard (with
    /// the shard's hash tag, `{prefix}:history-channels:{17}`).
    fn index_key(&self, channel: &str) -> String {
        match self.tag(channel).trim_end_matches(':') {
            "" => index_key(&self.prefix),
            tag => format!("{}:{tag}", index_key(&self.prefix)),
        }
    }

    /// Every set of channels with a history.
    fn index_keys(&self) -> Vec<String> {
        match &self.shards {
            Some(shards) => shards
                .tags
                .iter()
                .map(|tag| format!("{}:{}", index_key(&self.prefix), tag.trim_end_matches(':')))
                .collect(),
            None => vec![index_key(&self.prefix)],
        }
    }

    /// The command that publishes `events`, each on its pub/sub channel, with `publish`
    /// (`PUBLISH`, `SPUBLISH`) and keeps those of channels with a history in their
    /// histories, in order: one script for all of them. On a cluster every event must
    /// be of one shard (their keys share its hash tag). Answers one receiver count per
    /// event.
    pub(crate) fn command<'a>(
        &self,
        send: Sending,
        publish: &str,
        envelope: Envelope,
        events: impl Iterator<Item = (&'a str, &'a Event)>,
    ) -> redis::Cmd {
        let mut cmd = match send {
            Sending::Hash => redis::cmd("EVALSHA").arg(self.script.get_hash()).clone(),
            Sending::Text => redis::cmd("EVAL").arg(self.text).clone(),
        };
        let mut events = events.peekable();
        // The shard's tag: every event of the script is of the first one's shard.
        let tag = events.peek().map_or("", |(_, e)| self.tag(&e.channel));
        cmd.arg(1).arg(self.index_key(events.peek().map_or("", |(_, e)| &*e.channel)));
        cmd.arg(publish);
        cmd.arg(format!("{}{tag}", stream_prefix(&self.prefix))).arg(format!("{}{tag}", meta_prefix(&self.prefix)));
        cmd.arg(kind(envelope)).arg(ms(SystemTime::now()));
        for (pubsub, event) in events {
            cmd.arg(pubsub).arg(envelope::encode_as(envelope, event)).arg(&*event.id).arg(&*event.channel);
            cmd.arg(&bounds(self.limits(&event.channel), event)[..]);
        }
        cmd
    }

    /// `SCRIPT LOAD` of the publishing script, to precede [`Sending::Hash`] commands.
    pub(crate) fn load(&self) -> redis::Cmd {
        redis::cmd("SCRIPT").arg("LOAD").arg(self.text).clone()
    }

    /// Publishes `events` (each on its pub/sub channel) and keeps those of channels
    /// with a history, with their positions, in one script (one Redis). Returns the
    /// receivers of each PUBLISH.
    pub(crate) async fn publish<'a>(
        &self,
        conn: &mut impl ConnectionLike,
        envelope: Envelope,
        events: impl Iterator<Item = (&'a str, &'a Event)> + Clone,
    ) -> redis::RedisResult<Vec<i64>> {
        let answer = self.command(Sending::Hash, "PUBLISH", envelope, events.clone()).query_async(conn).await;
        match answer {
            Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.command(Sending::Text, "PUBLISH", envelope, events).query_async(conn).await
            }
            answer => answer,
        }
    }

    async fn meta(&self, conn: &mut impl ConnectionLike, channel: &str) -> redis::RedisResult<Meta> {
        let fields: HashMap<String, String> =
            redis::cmd("HGETALL").arg(self.meta_key(channel)).query_async(conn).await?;
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let last = num("offset");
        let stream = self.stream_key(channel);
        let len: u64 = redis::cmd("XLEN").arg(&stream).query_async(conn).await?;
        let trimmed = last.saturating_sub(len);
        let trimmed_ms = match (trimmed, len) {
            (0, _) => 0,
            (_, 0) => num("last_ms"),
            _ => {
                let first: Vec<StreamEntry> =
                    redis::cmd("XRANGE").arg(&stream).arg("-").arg("+").arg("COUNT").arg(1).query_async(conn).await?;
                first.first().and_then(|(id, _)| id_part(id, 0)).unwrap_or(u64::MAX)
            }
        };
        Ok(Meta { epoch: fields.get("epoch").map(|e| Arc::from(e.as_str())), last, len, trimmed, trimmed_ms })
    }

    /// Reads `channel`'s history from `start`, the events `take` says, on `conn` (the
    /// transport's, or why it has none); `None` when the channel keeps no history.
    pub(crate) async fn read(
        &self,
        conn: Result<impl ConnectionLike, TransportError>,
        channel: &str,
        start: &Start,
        take: Take,
    ) -> Result<Option<Recovery>, TransportError> {
        if self.limits(channel).is_none() {
            return Ok(None);
        }
        bounded(self.read_on(&mut conn?, channel, start, take)).await
    }

    /// Channels matching `filter` with a history, asked on `conn`.
    pub(crate) async fn channels(
        &self,
        conn: Result<impl ConnectionLike, TransportError>,
        filter: &Pattern,
    ) -> Result<Vec<String>, TransportError> {
        bounded(self.channels_on(&mut conn?, filter)).await
    }

    /// What `channel`'s history holds, asked on `conn`; `None` when it keeps none.
    pub(crate) async fn info(
        &self,
        conn: Result<impl ConnectionLike, TransportError>,
        channel: &str,
    ) -> Result<Option<HistoryInfo>, TransportError> {
        if self.limits(channel).is_none() {
            return Ok(None);
        }
        bounded(self.info_on(&mut conn?, channel)).await
    }

    async fn read_on(
        &self,
        conn: &mut impl ConnectionLike,
        channel: &str,
        start: &Start,
        take: Take,
    ) -> redis::RedisResult<Option<Recovery>> {
        let Some(limits) = self.limits(channel) else { return Ok(None) };
        let meta = self.meta(conn, channel).await?;
        let Some(epoch) = meta.epoch.clone() else {
            // Nothing kept: never published, or Redis lost it. A position says which.
            let complete = match start {
                Start::After(p) => p.offset == 0,
                Start::At(_) | Start::Oldest => true,
            };
            return Ok(Some(Recovery { complete, ..Recovery::default() }));
        };
        let last = (meta.last > 0).then(|| Position { epoch: Arc::clone(&epoch), offset: meta.last });
        let stream = self.stream_key(channel);
        // One more than taken, to know whether there were more.
        let wanted = take.count().saturating_add(1);
        let (mut events, complete) = match start {
            // A position past the last offset means Redis lost its latest writes (a
            // failover to a lagging replica): offsets are given again, so the history
            // cannot say what the subscriber has.
            Start::After(p) if (*p.epoch == *epoch && p.offset <= meta.last) || p.offset == 0 => {
                // Newest first, back to the position: publishes keep appending while
                // this reads, and the page boundaries follow them.
                let count = match take {
                    Take::First(_) => usize::MAX,
                    Take::Last(_) => wanted,
                };
                let mut newest = range(conn, "XREVRANGE", &stream, "+", "-", count, p.offset).await?;
                newest.reverse();
                // Trimmed while this read: the oldest read is not the one after the position.
                let joined = newest.len() == count
                    || newest.first().and_then(|e| e.position.as_ref()).is_none_or(|f| f.offset == p.offset + 1);
                (newest, meta.trimmed <= p.offset && joined)
            }
            Start::After(_) => (ends(conn, &stream, "-", take).await?, false),
            Start::At(t) => {
                let from = ms(*t).to_string();
                let mut events = ends(conn, &stream, &from, take).await?;
                // Entry ids never go back in time, so an event stamped earlier by a
                // slower clock may sit after `t`: its own time decides.
                events.retain(|e| e.timestamp >= *t);
                (events, meta.trimmed == 0 || meta.trimmed_ms < ms(*t))
            }
            Start::Oldest => (ends(conn, &stream, "-", take).await?, meta.trimmed == 0),
        };
        let mut complete = complete;
        if let Some(oldest) = limits.ttl.and_then(|ttl| SystemTime::now().checked_sub(ttl)) {
            // Past the ttl but not trimmed yet (no publish since): as good as trimmed.
            let expired = events.partition_point(|e| e.timestamp < oldest);
            complete &= expired == 0;
            events.drain(..expired);
        }
        let more = take.apply(&mut events);
        Ok(Some(Recovery { events, complete, last, more }))
    }

    /// Channels matching `filter` with a history (the sets where each history adds its
    /// channel when it is made; on a cluster, one per shard).
    async fn channels_on(&self, conn: &mut impl ConnectionLike, filter: &Pattern) -> redis::RedisResult<Vec<String>> {
        let mut out = Vec::new();
        for key in self.index_keys() {
            let members: Vec<String> = redis::cmd("SMEMBERS").arg(key).query_async(conn).await?;
            out.extend(members.into_iter().filter(|c| filter.matches(c) && self.limits(c).is_some()));
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// What `channel`'s history holds.
    async fn info_on(&self, conn: &mut impl ConnectionLike, channel: &str) -> redis::RedisResult<Option<HistoryInfo>> {
        if self.limits(channel).is_none() {
            return Ok(None);
        }
        let meta = self.meta(conn, channel).await?;
        // What Redis holds for the stream, as it reckons it.
        let bytes: Option<u64> =
            redis::cmd("MEMORY").arg("USAGE").arg(self.stream_key(channel)).query_async(conn).await?;
        Ok(Some(HistoryInfo {
            channel: channel.to_owned(),
            epoch: meta.epoch.unwrap_or_else(|| Arc::from("")),
            first_offset: meta.trimmed + 1,
            last_offset: meta.last,
            events: meta.len,
            bytes: bytes.unwrap_or(0),
        }))
    }
}

/// The entries of a stream from `from` (an id, or `-`) on, oldest first: the first or
/// the last ones as `take` says, and one more when there are (so the caller knows).
async fn ends(
    conn: &mut impl ConnectionLike,
    stream: &str,
    from: &str,
    take: Take,
) -> redis::RedisResult<Vec<Arc<Event>>> {
    // A few more than asked: entries stamped before a time may open a range from it.
    let wanted = take.count().saturating_add(65);
    match take {
        Take::First(_) => range(conn, "XRANGE", stream, from, "+", wanted, 0).await,
        Take::Last(_) => {
            let mut newest = range(conn, "XREVRANGE", stream, "+", from, wanted, 0).await?;
            newest.reverse();
            Ok(newest)
        }
    }
}

/// A stream entry as XRANGE answers it: its id and its field/value pairs.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

/// Entries of a stream between `from` and `to` (XRANGE or XREVRANGE), at most `count`,
/// and (XREVRANGE) none at or before offset `back_to`, fetched a page at a time, as
/// events.
async fn range(
    conn: &mut impl ConnectionLike,
    command: &str,
    stream: &str,
    from: &str,
    to: &str,
    count: usize,
    back_to: u64,
) -> redis::RedisResult<Vec<Arc<Event>>> {
    let mut out = Vec::new();
    let mut from = from.to_owned();
    while out.len() < count {
        let page = PAGE.min(count - out.len());
        let reply: Vec<StreamEntry> =
            redis::cmd(command).arg(stream).arg(&from).arg(to).arg("COUNT").arg(page).query_async(conn).await?;
        let Some((last_id, _)) = reply.last() else { break };
        // The next page starts after the last entry of this one.
        from = format!("({last_id}");
        let full = reply.len() == page;
        for (id, fields) in reply {
            let offset = id_part(&id, 1).unwrap_or(u64::MAX);
            if offset <= back_to {
                return Ok(out);
            }
            let Some((_, message)) = fields.into_iter().find(|(k, _)| k == "e") else { continue };
            if let Some(event) = envelope::decode_enveloped(Bytes::from(message)) {
                out.push(Arc::new(event));
            }
        }
        if !full {
            break;
        }
    }
    Ok(out)
}

/// Part `n` of a stream entry id `<ms>-<offset>`: 0 the time, 1 the offset.
fn id_part(id: &str, n: usize) -> Option<u64> {
    id.split('-').nth(n)?.parse().ok()
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long a history read may take before it fails (a hung Redis).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a history read within [`READ_TIMEOUT`].
async fn bounded<T>(read: impl Future<Output = redis::RedisResult<T>>) -> Result<T, TransportError> {
    let failed = |reason: String| TransportError { transport: "redis", reason };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(failed(format!("reading history failed: {err}"))),
        Err(_) => Err(failed("reading history timed out".to_owned())),
    }
}
