//! Groups that span the fleet: each event published to a group's channels goes to
//! exactly one member of the group across all instances, as a NATS queue group does.
//!
//! Every instance receives the event (Redis Pub/Sub reaches them all); each knows how
//! many members every instance has, and all pick the same one: the event id's CRC16
//! modulo the group's total members picks a member, the instances owning consecutive
//! ranges of members in instance-id order. No message is exchanged per event.
//!
//! Membership lives in Redis, one hash per group, `{prefix}:group:<group key>`:
//! field = instance id, value = `<members>:<beat>`. Each instance rewrites its fields
//! every [`REFRESH`] (the beat counts up) and reads the hashes of the groups it has
//! members in. An entry whose value has not changed for [`DEAD_AFTER`] of the reader's
//! own clock belongs to an instance that is gone, and is ignored (no clocks compared
//! between machines). A member that leaves is removed at once (`HDEL` when the
//! instance's last member goes); the others see it within one [`REFRESH`].
//!
//! While views differ (for up to one refresh after a join or a leave, up to
//! [`DEAD_AFTER`] + [`REFRESH`] after an instance dies), an event can reach two members
//! or none: core pub/sub stays at-most-once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use eventbus_core::Event;
use eventbus_core::event::new_id;
use parking_lot::{Mutex, RwLock};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, RedisResult};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::envelope::FOREIGN_SOURCE;

/// How often an instance rewrites its membership and reads the others'.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// An entry unchanged this long belongs to an instance that stopped.
pub(crate) const DEAD_AFTER: Duration = Duration::from_secs(5);
/// Lifetime of a group's hash once nobody rewrites it.
const KEY_TTL_MS: u64 = 60_000;

/// Another instance's members of one group, as last read.
#[derive(Debug, Clone)]
struct Remote {
    members: u32,
    value: String,
    changed: Instant,
}

/// Other live instances with members in one group, sorted by instance id: (instance,
/// members).
type Others = Vec<(String, u32)>;

/// What every instance hashes the same way for `event`: its id, except for a foreign
/// producer's message, whose id each instance makes up on receipt; its channel and
/// payload stand in for it.
fn pick_key(event: &Event) -> u16 {
    let mut crc = crc16::State::<crc16::XMODEM>::new();
    if &*event.source == FOREIGN_SOURCE {
        crc.update(event.channel.as_bytes());
        crc.update(&event.payload);
    } else {
        crc.update(event.id.as_bytes());
    }
    crc.get()
}

/// This instance's share of the fleet's groups.
#[derive(Debug)]
pub(crate) struct FleetGroups {
    prefix: String,
    instance: String,
    /// Members here, per group key; 0 = left (the entry is deleted, then dropped).
    local: Mutex<HashMap<Arc<str>, usize>>,
    /// Other live instances with members, per group key, sorted by instance id.
    others: RwLock<HashMap<Arc<str>, Others>>,
    changed: Notify,
}

impl FleetGroups {
    pub(crate) fn new(prefix: &str) -> Arc<Self> {
        Arc::new(Self {
            prefix: prefix.to_owned(),
            instance: new_id().to_string(),
            local: Mutex::default(),
            others: RwLock::default(),
            changed: Notify::new(),
        })
    }

    fn key(&self, group: &str) -> String {
        format!("{}:group:{group}", self.prefix)
    }

    pub(crate) fn set_members(&self, group: &str, members: usize) {
        self.local.lock().insert(Arc::from(group), members);
        self.changed.notify_one();
    }

    /// Whether this instance delivers `event` to its members of `group`.
    pub(crate) fn delivers(&self, group: &str, event: &Event) -> bool {
        let others = self.others.read();
        let Some(others) = others.get(group).filter(|o| !o.is_empty()) else { return true };
        let mine = self.local.lock().get(group).copied().unwrap_or(0);
        let mine = u32::try_from(mine).unwrap_or(u32::MAX);
        let total: u64 = others.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() + u64::from(mine);
        if total == 0 {
            return true;
        }
        let mut pick = u64::from(pick_key(event)) % total;
        // Instances in id order, this one at its place among them.
        let mut placed = false;
        for (instance, n) in others {
            if !placed && self.instance.as_str() < instance.as_str() {
                placed = true;
                if pick < u64::from(mine) {
                    return true;
                }
                pick -= u64::from(mine);
            }
            if pick < u64::from(*n) {
                return false;
            }
            pick -= u64::from(*n);
        }
        !placed && pick < u64::from(mine)
    }

    /// Keeps the membership in Redis and the view of the others current, until
    /// `shutdown`. `conn` gives a connection when the transport has one.
    pub(crate) async fn run<C, F>(self: Arc<Self>, conn: F, shutdown: CancellationToken)
    where
        C: ConnectionLike + Send + Sync,
        F: Fn() -> Option<C>,
    {
        let mut beat: u64 = 0;
        let mut seen: HashMap<(Arc<str>, String), Remote> = HashMap::new();
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(REFRESH) => {}
                () = self.changed.notified() => {}
            }
            let Some(mut conn) = conn() else { continue };
            beat += 1;
            match self.sync(&mut conn, beat, &mut seen).await {
                Ok(()) => failing = false,
                Err(err) => {
                    if !failing {
                        warn!(error = %err, "cannot update the fleet's group membership in Redis; retrying");
                    }
                    failing = true;
                }
            }
        }
        // Leaving: the others stop counting this instance's members at once.
        if let Some(mut conn) = conn() {
            let groups: Vec<Arc<str>> = self.local.lock().keys().cloned().collect();
            for group in groups {
                let _: RedisResult<()> = conn.hdel(self.key(&group), &self.instance).await;
            }
        }
    }

    async fn sync<C: ConnectionLike + Send + Sync>(
        &self,
        conn: &mut C,
        beat: u64,
        seen: &mut HashMap<(Arc<str>, String), Remote>,
    ) -> RedisResult<()> {
        let local: Vec<(Arc<str>, usize)> = self.local.lock().iter().map(|(g, n)| (Arc::clone(g), *n)).collect();
        let now = Instant::now();
        let mut view = HashMap::new();
        for (group, members) in &local {
            let key = self.key(group);
            if *members == 0 {
                let () = conn.hdel(&key, &self.instance).await?;
                continue;
            }
            let () = conn.hset(&key, &self.instance, format!("{members}:{beat}")).await?;
            let () = conn.pexpire(&key, KEY_TTL_MS as i64).await?;
            let entries: HashMap<String, String> = conn.hgetall(&key).await?;
            let mut others: Others = Vec::new();
            for (instance, value) in entries {
                if instance == self.instance {
                    continue;
                }
                let members = value.split(':').next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
                let remote = seen.entry((Arc::clone(group), instance.clone())).or_insert_with(|| Remote {
                    members,
                    value: value.clone(),
                    changed: now,
                });
                if remote.value != value {
                    *remote = Remote { members, value, changed: now };
                }
                if now.duration_since(remote.changed) < DEAD_AFTER && remote.members > 0 {
                    others.push((instance, remote.members));
                }
            }
            others.sort();
            view.insert(Arc::clone(group), others);
        }
        seen.retain(|(group, _), remote| {
            view.contains_key(group) && now.duration_since(remote.changed) < DEAD_AFTER * 4
        });
        *self.others.write() = view;
        let mut mine = self.local.lock();
        mine.retain(|_, n| *n > 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(instance: &str, mine: usize, others: &[(&str, u32)]) -> FleetGroups {
        let g = FleetGroups {
            prefix: "p".into(),
            instance: instance.into(),
            local: Mutex::default(),
            others: RwLock::default(),
            changed: Notify::new(),
        };
        g.local.lock().insert("g".into(), mine);
        g.others.write().insert("g".into(), others.iter().map(|(i, n)| ((*i).to_owned(), *n)).collect());
        g
    }

    #[test]
    fn exactly_one_instance_delivers_each_event_in_proportion_to_its_members() {
        // Three instances with 1, 2 and 1 members, each with the same view.
        let a = fleet("a", 1, &[("b", 2), ("c", 1)]);
        let b = fleet("b", 2, &[("a", 1), ("c", 1)]);
        let c = fleet("c", 1, &[("a", 1), ("b", 2)]);
        let mut counts = [0usize; 3];
        for i in 0..4000 {
            let id = format!("evt-{i}");
            let e = event(&id, "orders.created", "own", b"x");
            let who: Vec<bool> = [&a, &b, &c].iter().map(|g| g.delivers("g", &e)).collect();
            assert_eq!(who.iter().filter(|d| **d).count(), 1, "{id}: {who:?}");
            counts[who.iter().position(|d| *d).unwrap_or(0)] += 1;
        }
        // Shares 1/4, 1/2, 1/4 within a few percent.
        for (count, share) in counts.iter().zip([0.25, 0.5, 0.25]) {
            let got = *count as f64 / 4000.0;
            assert!((got - share).abs() < 0.05, "{counts:?}");
        }
    }

    #[test]
    fn alone_or_without_a_view_an_instance_delivers_everything() {
        let alone = fleet("a", 2, &[]);
        assert!((0..100).all(|i| alone.delivers("g", &event(&format!("e{i}"), "c", "own", b"x"))));
        assert!(alone.delivers("unknown", &event("e1", "c", "own", b"x")));
    }

    #[test]
    fn a_foreign_message_is_picked_by_its_content_since_each_instance_names_it_anew() {
        let a = fleet("a", 1, &[("b", 1)]);
        let b = fleet("b", 1, &[("a", 1)]);
        for i in 0..200 {
            let payload = format!("{{\"n\":{i}}}");
            // The same message, received by each instance under an id of its own.
            let on_a = event(&format!("a-{i}"), "orders.created", FOREIGN_SOURCE, payload.as_bytes());
            let on_b = event(&format!("b-{i}"), "orders.created", FOREIGN_SOURCE, payload.as_bytes());
            assert_ne!(a.delivers("g", &on_a), b.delivers("g", &on_b), "exactly one delivers message {i}");
        }
    }

    fn event(id: &str, channel: &str, source: &str, payload: &[u8]) -> Event {
        Event::from_parts(
            id.to_owned(),
            channel.to_owned(),
            std::time::SystemTime::now(),
            source.to_owned(),
            bytes::Bytes::copy_from_slice(payload),
            HashMap::new(),
            String::new(),
        )
    }
}
