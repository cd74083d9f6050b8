//! The engine's operations ([`DurableBackend`]): consumer definitions written by one
//! script on the definitions (and on a cluster one more on the consumer's own slot),
//! then the change read back; operator actions; attaching clients.

use super::*;

impl Shared {
    /// Writes a definition; `replace` overwrites a different one.
    pub(super) async fn define(
        self: &Arc<Self>,
        config: &ConsumerConfig,
        replace: bool,
    ) -> Result<Option<String>, DurableError> {
        let json =
            serde_json::to_string(config).map_err(|e| DurableError::internal("encoding a consumer definition", e))?;
        let base = self.base(&config.name);
        let reply: Vec<String> = self
            .scripts
            .define
            .key(&self.keys.consumers)
            .key(&self.keys.version)
            .key(&self.keys.log_format)
            .arg(&config.name)
            .arg(&json)
            .arg(&base)
            .arg(GROUP)
            .arg(&self.keys.notify)
            .arg(u8::from(replace))
            .arg(u8::from(!self.is_cluster()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let exists = match reply.as_slice() {
            [kind, json] if kind == "exists" => Some(json.clone()),
            [_, _, new] if self.is_cluster() => {
                // The consumer's own keys are in its slot: made now (a new consumer
                // first loses whatever an earlier one of its name may have left
                // behind), before the creation is answered.
                if new == "1" {
                    self.purge(&base).await?;
                }
                let stream = format!("{base}:s");
                let _: i64 = self
                    .scripts
                    .init
                    .key(&stream)
                    .key(format!("{base}:f"))
                    .arg(GROUP)
                    .invoke_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
                None
            }
            _ => None,
        };
        self.reload().await?;
        Ok(exists)
    }

    /// Deletes every key of the consumer at `base` (on a cluster, where they are in a
    /// slot of their own).
    pub(super) async fn purge(&self, base: &str) -> Result<(), DurableError> {
        let _: i64 = self
            .scripts
            .purge
            .key(format!("{base}:s"))
            .arg(base)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

impl DurableBackend for RedisDurable {
    fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        let _ = self.shared.sink.set(sink);
    }

    fn capture_many<'a>(
        &'a self,
        batch: &'a [CaptureRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Captured, DurableError>>> {
        Box::pin(self.shared.capture_many(batch))
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            config.validate().map_err(DurableError::InvalidConfig)?;
            if let Some(existing) = self.shared.define(&config, false).await? {
                match serde_json::from_str::<ConsumerConfig>(&existing) {
                    Ok(existing) if existing == config => {}
                    Ok(existing) => return Err(DurableError::already_exists(&existing, config)),
                    Err(_) => {
                        let differences = "the existing definition is unreadable".to_owned();
                        return Err(DurableError::AlreadyExists { name: config.name, differences });
                    }
                }
            }
            let rt =
                self.shared.runtime(&config.name).ok_or_else(|| DurableError::UnknownConsumer(config.name.clone()))?;
            self.shared.info(&rt).await
        })
    }

    fn declare_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(async move {
            config.validate().map_err(DurableError::InvalidConfig)?;
            {
                let mut declared = self.shared.declared.lock();
                declared.retain(|c| c.name != config.name);
                declared.push(config.clone());
            }
            self.shared.define(&config, true).await.map(|_| ())
        })
    }

    fn get_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            self.shared.info(&rt).await
        })
    }

    fn list_consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, DurableError>> {
        Box::pin(async move {
            self.shared.reload().await?;
            let runtimes: Vec<Arc<Runtime>> = self.shared.registry.read().by_name.values().cloned().collect();
            let mut out = Vec::with_capacity(runtimes.len());
            for rt in runtimes {
                out.push(self.shared.info(&rt).await?);
            }
            out.sort_by(|a, b| a.config.name.cmp(&b.config.name));
            self.shared.snapshot.lock().clone_from(&out);
            Ok(out)
        })
    }

    fn consumers_snapshot(&self) -> Vec<ConsumerInfo> {
        self.shared.snapshot.lock().clone()
    }

    fn definitions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.definitions.subscribe()
    }

    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>> {
        Box::pin(async move {
            let base = self.shared.base(name);
            let deleted: i64 = self
                .shared
                .scripts
                .delete
                .key(&self.shared.keys.consumers)
                .key(&self.shared.keys.version)
                .key(&self.shared.keys.paused)
                .arg(name)
                .arg(&base)
                .arg(&self.shared.keys.notify)
                .arg(u8::from(!self.shared.is_cluster()))
                .invoke_async(&mut self.shared.conn())
                .await
                .map_err(unavailable)?;
            if deleted != 0 && self.shared.is_cluster() {
                // Gone from the definitions (every instance stops using it); its keys next.
                self.shared.purge(&base).await?;
            }
            self.shared.reload().await?;
            match deleted {
                0 => Err(DurableError::UnknownConsumer(name.to_owned())),
                _ => Ok(()),
            }
        })
    }

    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            self.shared.log(&rt, status, limit, page_token).await
        })
    }

    fn list_pending<'a>(
        &'a self,
        name: &'a str,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<PendingSlice, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            self.shared.pending(&rt, limit, page_token).await
        })
    }

    fn redrive<'a>(
        &'a self,
        name: &'a str,
        event_ids: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Redriven, DurableError>> {
        Box::pin(async move {
            let rt = self.shared.find_known(name).await?;
            let limit = if limit == 0 { MAX_REDRIVE } else { limit.min(MAX_REDRIVE) };
            let mut call = self.shared.scripts.redrive.prepare_invoke();
            call.key(&rt.log_key).arg(&rt.base).arg(now_ms()).arg(self.shared.retention.max_entries.max(1)).arg(limit);
            for id in event_ids.iter().take(MAX_REDRIVE) {
                call.arg(id);
            }
            let (redriven, remaining): (i64, u64) =
                call.invoke_async(&mut self.shared.conn()).await.map_err(unavailable)?;
            let Ok(redriven) = u64::try_from(redriven) else {
                self.shared.reload().await?;
                return Err(DurableError::UnknownConsumer(name.to_owned()));
            };
            tracing::info!(consumer = %rt.name, redriven, remaining, "dead letters redriven");
            Ok(Redriven { redriven, remaining })
        })
    }

    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(async move {
            let found: i64 = self
                .shared
                .scripts
                .pause
                .key(&self.shared.keys.consumers)
                .key(&self.shared.keys.paused)
                .key(&self.shared.keys.version)
                .arg(name)
                .arg(u8::from(paused))
                .arg(now_ms())
                .arg(&self.shared.keys.notify)
                .invoke_async(&mut self.shared.conn())
                .await
                .map_err(unavailable)?;
            // Every instance reloads on the notice; this one before it answers.
            self.shared.reload().await?;
            let rt = match (found, self.shared.runtime(name)) {
                (1, Some(rt)) => rt,
                _ => return Err(DurableError::UnknownConsumer(name.to_owned())),
            };
            rt.settled().await;
            tracing::info!(consumer = %rt.name, paused, "durable consumer {}", if paused { "paused" } else { "resumed" });
            self.shared.info(&rt).await
        })
    }

    fn attach<'a>(
        &'a self,
        name: &'a str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> BoxFuture<'a, Result<Attachment, DurableError>> {
        Box::pin(async move {
            match self.attach_once(name, options, create_if_missing.clone()).await {
                // Known here, gone from Redis: reloaded; try once more (it may be
                // created from `create_if_missing` now).
                Err(DurableError::UnknownConsumer(_)) => self.attach_once(name, options, create_if_missing).await,
                other => other,
            }
        })
    }

    fn detach_all(&self) {
        let runtimes: Vec<Arc<Runtime>> = self.shared.registry.read().by_name.values().cloned().collect();
        for rt in runtimes {
            rt.stop(runtime::StopReason::Shutdown);
        }
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>> {
        // Every change is applied by the time its script returns.
        Box::pin(std::future::ready(Ok(())))
    }
}

impl RedisDurable {
    async fn attach_once(
        &self,
        name: &str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> Result<Attachment, DurableError> {
        let rt = match (self.shared.find(name).await?, create_if_missing) {
            (Some(rt), _) => rt,
            (None, Some(config)) => {
                self.create_consumer(config.named_for_attach(name).map_err(DurableError::InvalidConfig)?).await?;
                self.shared.runtime(name).ok_or_else(|| DurableError::UnknownConsumer(name.to_owned()))?
            }
            (None, None) => return Err(DurableError::UnknownConsumer(name.to_owned())),
        };
        // Also proves Redis is reachable before the client is told it is attached.
        let info = self.shared.info(&rt).await?;
        let id = self.shared.next_client.fetch_add(1, Ordering::Relaxed);
        let (deliveries, client) = rt.attach(&self.shared, id, options).await?;
        let info = ConsumerInfo { clients: info.clients + 1, ..info };
        Ok(Attachment { info, deliveries, client: Box::new(client) })
    }
}
