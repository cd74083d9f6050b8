//! The embedded engine behind the core's [`DurableBackend`] seam.

use eventbus_core::durable::{
    Attachment, BoxFuture, CaptureRequest, Captured, ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink,
    DurableBackend, DurableError, LogSlice, LogStatus, PendingSlice, Redriven,
};

use crate::engine::Durable;

/// A page token of this engine: the position after which the page starts.
fn parse_token(token: &str) -> Result<Option<u64>, DurableError> {
    match token {
        "" => Ok(None),
        token => token.parse::<u64>().map(Some).map_err(|_| DurableError::bad_page_token(token)),
    }
}

impl DurableBackend for Durable {
    fn set_dead_letter_sink(&self, sink: DeadLetterSink) {
        Durable::set_dead_letter_sink(self, sink);
    }

    fn capture_many<'a>(
        &'a self,
        batch: &'a [CaptureRequest<'a>],
    ) -> BoxFuture<'a, Vec<Result<Captured, DurableError>>> {
        Box::pin(Durable::capture_many(self, batch))
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<ConsumerInfo, DurableError>> {
        Box::pin(Durable::create_consumer(self, config))
    }

    fn declare_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(Durable::declare_consumer(self, config))
    }

    fn get_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(std::future::ready(Durable::get_consumer(self, name)))
    }

    fn list_consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, DurableError>> {
        Box::pin(std::future::ready(Ok(Durable::list_consumers(self))))
    }

    fn consumers_snapshot(&self) -> Vec<ConsumerInfo> {
        Durable::list_consumers(self)
    }

    fn delete_consumer<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DurableError>> {
        Box::pin(Durable::delete_consumer(self, name))
    }

    fn definitions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.definitions.subscribe()
    }

    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>> {
        Box::pin(async move {
            let after = parse_token(page_token)?;
            let page = Durable::log(self, name, status, limit, after).await?;
            Ok(LogSlice {
                entries: page.entries,
                next_page_token: page.next.map(|n| n.to_string()).unwrap_or_default(),
            })
        })
    }

    fn list_pending<'a>(
        &'a self,
        name: &'a str,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<PendingSlice, DurableError>> {
        let page = parse_token(page_token).and_then(|after| Durable::list_pending(self, name, limit, after));
        Box::pin(std::future::ready(page.map(|(entries, next)| PendingSlice {
            entries,
            next_page_token: next.map(|n| n.to_string()).unwrap_or_default(),
        })))
    }

    fn redrive<'a>(
        &'a self,
        name: &'a str,
        event_ids: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Redriven, DurableError>> {
        Box::pin(Durable::redrive(self, name, event_ids, limit))
    }

    fn set_paused<'a>(&'a self, name: &'a str, paused: bool) -> BoxFuture<'a, Result<ConsumerInfo, DurableError>> {
        Box::pin(Durable::set_paused(self, name, paused))
    }

    fn attach<'a>(
        &'a self,
        name: &'a str,
        options: ClientOptions,
        create_if_missing: Option<ConsumerConfig>,
    ) -> BoxFuture<'a, Result<Attachment, DurableError>> {
        Box::pin(async move {
            let attached = Durable::attach(self, name, options, create_if_missing).await?;
            Ok(Attachment { info: attached.info, deliveries: attached.deliveries, client: Box::new(attached.client) })
        })
    }

    fn detach_all(&self) {
        Durable::detach_all(self);
    }

    fn unready(&self) -> Option<String> {
        self.disk_full().map(|e| e.to_string())
    }

    fn failed(&self) -> Option<String> {
        self.inner.store.failed()
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(Durable::flush(self))
    }
}
