//! The embedded engine behind the core's [`DurableBackend`] seam.

use eventbus_core::durable::{
    Attachment, BoxFuture, CaptureRequest, Captured, ClientOptions, ConsumerConfig, ConsumerInfo, DeadLetterSink,
    DurableBackend, DurableError, LogSlice, LogStatus,
};

use crate::engine::Durable;

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

    fn log<'a>(
        &'a self,
        name: &'a str,
        status: Option<LogStatus>,
        limit: usize,
        page_token: &'a str,
    ) -> BoxFuture<'a, Result<LogSlice, DurableError>> {
        Box::pin(async move {
            let after = match page_token {
                "" => None,
                token => Some(token.parse::<u64>().map_err(|_| DurableError::bad_page_token(token))?),
            };
            let page = Durable::log(self, name, status, limit, after).await?;
            Ok(LogSlice {
                entries: page.entries,
                next_page_token: page.next.map(|n| n.to_string()).unwrap_or_default(),
            })
        })
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

    fn flush(&self) -> BoxFuture<'_, Result<(), DurableError>> {
        Box::pin(Durable::flush(self))
    }
}
