//! The inbox handler wrapper: the handler's side effect and the "already
//! processed" mark (`clients/sql/inbox.sql`) commit in one transaction, so a
//! redelivered event is skipped and acked instead of being handled twice.

use std::sync::Arc;

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use tokio_postgres::Transaction;

use crate::{Delivery, Handler, Outcome};

/// The user's handler inside the inbox: `Fn(Delivery, &Transaction) -> BoxFuture<Outcome>`.
/// Write the side effect with the transaction; the wrapper commits it with the mark.
pub type InboxHandler = dyn for<'a> Fn(Delivery, &'a Transaction<'a>) -> BoxFuture<'a, Outcome> + Send + Sync + 'static;

/// A [`Handler`] for the [`Worker`](crate::Worker) that runs the user's handler in a
/// database transaction which also records the event in the inbox table:
///
/// - the event's id is already recorded for this consumer → ack, handler not run;
/// - the handler answers [`Outcome::Ack`] → commit (mark and side effect), then ack; a
///   failed commit becomes a retry;
/// - [`Outcome::Retry`] or [`Outcome::Term`] → roll back (mark and side effect).
///
/// ```no_run
/// # async fn demo(client: eventbus_client::Client, pool: deadpool_postgres::Pool) -> Result<(), eventbus_client::Error> {
/// use eventbus_client::{Outcome, Worker, inbox::Inbox};
///
/// let inbox = Inbox::new(pool, "billing", |d, tx| Box::pin(async move {
///     let done = tx.execute("insert into invoices(event_id) values ($1)", &[&d.event.id]).await;
///     done.map_or_else(|e| Outcome::retry(e.to_string()), |_| Outcome::Ack)
/// }));
/// Worker::new(client, "billing").run(inbox, tokio_util::sync::CancellationToken::new()).await
/// # }
/// ```
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    consumer: String,
    handler: Box<InboxHandler>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("consumer", &self.inner.consumer).finish()
    }
}

impl Inbox {
    /// Wraps `handler` for `consumer` (the durable consumer's name), recording events in
    /// `eventbus_inbox`; each delivery takes a connection from `pool`.
    pub fn new<H>(pool: Pool, consumer: impl Into<String>, handler: H) -> Self
    where
        H: for<'a> Fn(Delivery, &'a Transaction<'a>) -> BoxFuture<'a, Outcome> + Send + Sync + 'static,
    {
        let inner = Inner { pool, consumer: consumer.into(), handler: Box::new(handler) };
        Self { inner: Arc::new(inner) }
    }

    async fn process(&self, delivery: Delivery) -> Result<Outcome, String> {
        let inner = &self.inner;
        let mut conn = inner.pool.get().await.map_err(|e| format!("inbox: no database connection: {e}"))?;
        let tx = conn.transaction().await.map_err(|e| format!("inbox: cannot begin: {e}"))?;
        let fresh = tx
            .execute(MARK, &[&inner.consumer, &delivery.event.id])
            .await
            .map_err(|e| format!("inbox: cannot record the event: {e}"))?;
        if fresh == 0 {
            // Processed by an earlier delivery whose ack was lost: ack it again.
            return Ok(Outcome::Ack);
        }
        match (inner.handler)(delivery, &tx).await {
            Outcome::Ack => {
                tx.commit().await.map_err(|e| format!("inbox: commit failed: {e}"))?;
                Ok(Outcome::Ack)
            }
            // Dropping the transaction rolls it back; say so to the server now.
            other => {
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "inbox: rollback failed (the transaction ends with its connection)");
                }
                Ok(other)
            }
        }
    }
}

/// Records the event; 0 rows = recorded before.
const MARK: &str = "insert into eventbus_inbox (consumer, event_id) values ($1, $2) on conflict do nothing";

impl Handler for Inbox {
    fn handle(&self, delivery: Delivery) -> BoxFuture<'static, Outcome> {
        let inbox = self.clone();
        Box::pin(async move { inbox.process(delivery).await.unwrap_or_else(Outcome::retry) })
    }
}
