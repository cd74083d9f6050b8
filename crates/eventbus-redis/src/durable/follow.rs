//! Following consumer definitions: every instance reloads the consumer set on each
//! change notice and after every reconnection, and declares the configured consumers
//! again when Redis has lost its data.

use std::collections::HashMap;
use std::sync::Arc;

use eventbus_core::durable::{BoxFuture, ConsumerConfig, DurableError};
use futures::StreamExt;
use tracing::{debug, info, warn};

use super::*;

/// Reloads the consumer set on every change notice, and after every reconnection
/// (a notice may have been missed while away).
pub(super) async fn follow_changes(shared: std::sync::Weak<Shared>) {
    let mut backoff = INITIAL_BACKOFF;
    for attempt in 0.. {
        let Some(s) = shared.upgrade() else { return owner_gone().await };
        let (backend, channel, stop) = (s.backend.clone(), s.keys.notify.clone(), s.shutdown.clone());
        drop(s);
        let subscribed = async {
            let mut pubsub = backend.pubsub(attempt).await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(CONNECT_TIMEOUT, subscribed) => r,
        };
        match pubsub {
            Ok(Ok(pubsub)) => {
                let mut messages = pubsub.into_on_message();
                let Some(s) = shared.upgrade() else { return owner_gone().await };
                if let Err(err) = s.reload().await {
                    warn!(%err, "cannot load durable consumer definitions");
                }
                drop(s);
                backoff = INITIAL_BACKOFF;
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        msg = messages.next() => match msg {
                            Some(_) => {
                                let Some(s) = shared.upgrade() else { return owner_gone().await };
                                if let Err(err) = s.reload().await {
                                    warn!(%err, "cannot reload durable consumer definitions");
                                }
                            }
                            None => break,
                        },
                    }
                }
                warn!("lost the Redis connection that follows durable consumer changes; reconnecting");
            }
            Ok(Err(err)) => debug!(%err, retry_in = ?backoff, "cannot follow durable consumer changes yet"),
            Err(_) => debug!(retry_in = ?backoff, "timed out following durable consumer changes"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Writes the consumers declared in the configuration again (identical definitions are
/// a no-op, so every instance may do it).
/// (Boxed: `define` reloads, and a reload may start this.)
pub(super) fn redeclare(shared: std::sync::Weak<Shared>) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let Some(shared) = shared.upgrade() else { return };
        let declared = shared.declared.lock().clone();
        for config in declared {
            match shared.define(&config, true).await {
                Ok(_) => info!(consumer = %config.name, "durable consumer declared again"),
                Err(err) => warn!(consumer = %config.name, %err, "cannot declare the durable consumer again"),
            }
        }
    })
}

impl Shared {
    /// Reads every definition and the version in one transaction and brings the local
    /// registry in line: new consumers appear, changed ones take their new definition,
    /// deleted ones detach their local clients.
    pub(super) async fn reload(self: &Arc<Self>) -> Result<(), DurableError> {
        let _one_at_a_time = self.reloading.lock().await;
        type Loaded = (Option<String>, HashMap<String, String>, HashMap<String, String>);
        let (version, defs, paused): Loaded = redis::pipe()
            .atomic()
            .get(&self.keys.version)
            .hgetall(&self.keys.consumers)
            .hgetall(&self.keys.paused)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if version.is_none() && !matches!(&*self.registry.read().version, "" | "0") {
            // The definitions this instance knew are gone with the version counter
            // itself: not a delete (that bumps it) but a Redis that lost its data.
            warn!(
                "Redis has lost the durable consumer definitions (restarted without persistence?); declaring the configured consumers again"
            );
            tokio::spawn(redeclare(Arc::downgrade(self)));
        }
        let version = version.unwrap_or_else(|| "0".into());
        let mut fresh = Registry { version: version.as_str().into(), ..Registry::default() };
        let mut removed = Vec::new();
        {
            let mut registry = self.registry.write();
            for (name, json) in defs {
                let config: ConsumerConfig = match serde_json::from_str(&json) {
                    Ok(c) => c,
                    Err(err) => {
                        warn!(consumer = %name, %err, "ignoring an unreadable durable consumer definition in Redis");
                        continue;
                    }
                };
                let filters = match config.validate() {
                    Ok(f) => f,
                    Err(err) => {
                        warn!(consumer = %name, %err, "ignoring an invalid durable consumer definition in Redis");
                        continue;
                    }
                };
                let name: Arc<str> = name.into();
                let runtime = match registry.by_name.get(&name) {
                    Some(rt) => {
                        rt.set_config(config);
                        Arc::clone(rt)
                    }
                    None => Arc::new(self.new_runtime(Arc::clone(&name), self.base(&name), config)),
                };
                runtime.set_paused(paused.contains_key(&*name));
                for f in &filters {
                    fresh.trie.insert(f, Arc::clone(&name));
                }
                fresh.by_name.insert(name, runtime);
            }
            for (name, rt) in registry.by_name.drain() {
                if !fresh.by_name.contains_key(&name) {
                    removed.push(rt);
                }
            }
            *registry = fresh;
        }
        for rt in removed {
            info!(consumer = %rt.name, "durable consumer deleted; detaching its local clients");
            rt.stop(runtime::StopReason::Deleted);
        }
        self.definitions.send_modify(|v| *v = v.wrapping_add(1));
        debug!(%version, "durable consumer definitions loaded");
        Ok(())
    }
}
