//! Idempotency keys seen within the dedup window (docs/durable.md).

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

/// Idempotency keys in the window. Expiry is kept both as wall time (what the store
/// persists) and as a monotonic instant (what the window is measured with).
#[derive(Debug, Default)]
pub(crate) struct Dedup {
    pub(crate) keys: HashMap<String, (String, Instant)>,
    by_expiry: BTreeMap<(Instant, String), ()>,
}

impl Dedup {
    pub(crate) fn prune(&mut self, now: Instant) {
        while let Some((expires, key)) = self.by_expiry.first_key_value().map(|(k, _)| k.clone()) {
            if expires > now {
                break;
            }
            self.by_expiry.remove(&(expires, key.clone()));
            if self.keys.get(&key).is_some_and(|(_, e)| *e == expires) {
                self.keys.remove(&key);
            }
        }
    }

    pub(crate) fn insert(&mut self, key: String, event_id: String, expires: Instant) {
        self.by_expiry.insert((expires, key.clone()), ());
        self.keys.insert(key, (event_id, expires));
    }
}
