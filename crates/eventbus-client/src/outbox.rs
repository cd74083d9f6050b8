//! The transactional outbox relay: publishes the rows applications write in
//! an outbox table (`clients/sql/outbox.sql`) in their own transactions.
//!
//! Each round claims the oldest unpublished rows (`for update skip locked`, so several
//! relays share a table, each row going to one), publishes them in id order on one
//! `PublishStream` with `idempotency_key = outbox:<source>:<table>:<id>`, and marks them published
//! in the claiming transaction. A crash anywhere leaves the rows unpublished and locked
//! by nobody: the next round publishes them again, and the broker drops the repeats
//! within its dedup window. A `LISTEN eventbus_outbox` connection wakes the relay when a
//! row is committed; a slow timer covers missed notifications.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, Opts, Registry};
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

use crate::{Backoff, Client, pb};

/// The channel the DDL's trigger notifies, with the table's name as payload.
pub const NOTIFY_CHANNEL: &str = "eventbus_outbox";

/// How often, at most, an idle relay deletes published rows past the retention (the
/// delete scans the published rows: not on every wake-up); a shorter retention prunes
/// as often as the retention itself.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Why the relay could not start, or why one round failed (logged, then retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The table name is not a plain SQL identifier.
    #[error("invalid table name {0:?}: use letters, digits and _ (at most 63), not starting with a digit")]
    InvalidTable(String),
    /// The database URL does not parse.
    #[error("database url: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The database refused or dropped a call: the relay reconnects, unless the error
    /// is one no retry fixes ([`RelayError::is_permanent`]).
    #[error("database: {}", describe(.0))]
    Database(#[from] tokio_postgres::Error),
    /// The listening connection was lost: the relay reconnects.
    #[error("database: the LISTEN connection was lost")]
    ListenerLost,
    /// The broker refused a publish or was away: the claimed rows stay unpublished.
    #[error("broker: {0}")]
    Broker(#[from] crate::Error),
    /// The broker did not answer every publish of a batch in time.
    #[error("broker: no answer to {0} publishes within the publish timeout")]
    BrokerTimeout(usize),
    /// At start: the database does not answer (a wrong address, or not up).
    #[error("cannot reach the database at {address}: {}", describe(.source))]
    Unreachable {
        address: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// At start: the database has no such outbox table (not migrated, or a typo).
    #[error("the outbox table {table:?} cannot be read (create it with clients/sql/outbox.sql): {source}")]
    MissingTable {
        table: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// Checks that `name` is a plain, unquoted SQL identifier, safe to put in a query.
pub(crate) fn check_identifier(name: &str) -> Result<(), RelayError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && name.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(RelayError::InvalidTable(name.to_owned()))
    }
}

/// What the relay reads and how it behaves. [`RelayOptions::new`] has the defaults.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// `postgres://user:password@host:port/database` (or the key=value form).
    pub database_url: String,
    /// The outbox table (a plain identifier; the connection's `search_path` finds it).
    pub table: String,
    /// Rows claimed and published per transaction: larger batches, fewer round trips.
    pub batch: usize,
    /// The safety poll: how long the relay waits for a notification before looking
    /// anyway (a notification lost while the listening connection was down).
    pub idle: Duration,
    /// Published rows older than this are deleted (when the relay is idle, at most once
    /// a minute or once per retention, if shorter); zero keeps them.
    pub retention: Duration,
    /// Delays between attempts while the database or the broker is away.
    pub backoff: Backoff,
    /// How long the broker may take to answer one batch before the round is abandoned
    /// (and the rows published again later).
    pub publish_timeout: Duration,
    /// Names this outbox in the idempotency keys, `outbox:<source>:<table>:<id>`, so
    /// that the outboxes of several databases on one broker never collide (row 1 of one
    /// is not a duplicate of row 1 of another). `None`: the database's own identity,
    /// `<system identifier>:<database>:<schema>`, read at the first connection.
    pub source: Option<String>,
}

impl RelayOptions {
    /// Table `eventbus_outbox`, batches of 500, a 5 s safety poll, published rows kept,
    /// the default [`Backoff`], 30 s to publish a batch.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            table: NOTIFY_CHANNEL.to_owned(),
            batch: 500,
            idle: Duration::from_secs(5),
            retention: Duration::ZERO,
            backoff: Backoff::default(),
            publish_timeout: Duration::from_secs(30),
            source: None,
        }
    }

    /// Checks the table name and parses the database URL (connecting nothing), so a
    /// typo is reported before anything is started.
    pub fn check(&self) -> Result<tokio_postgres::Config, RelayError> {
        check_identifier(&self.table)?;
        tokio_postgres::Config::from_str(&self.database_url).map_err(RelayError::InvalidUrl)
    }

    /// Checks once, at start, that the database answers and holds the table, so a relay
    /// pointed at the wrong address or started before the migration stops at once with
    /// an error naming it. A database lost later is [`Relay::run`]'s to retry.
    pub async fn preflight(&self) -> Result<(), RelayError> {
        let config = self.check()?;
        let address = describe_hosts(&config);
        let (client, connection) =
            config.connect(NoTls).await.map_err(|source| RelayError::Unreachable { address, source })?;
        let connection = tokio::spawn(connection);
        let read = client.simple_query(&format!("select 1 from {} limit 0", self.table)).await;
        drop(client);
        connection.abort();
        read.map(drop).map_err(|source| RelayError::MissingTable { table: self.table.clone(), source })
    }
}

/// What tells this outbox from any other on the same broker: the cluster's system
/// identifier (unique per PostgreSQL cluster), the database and the schema. Without the
/// right to read the identifier (`pg_control_system` may be restricted), the database
/// and schema alone.
async fn database_identity(client: &tokio_postgres::Client) -> Result<String, RelayError> {
    let full = "select (select system_identifier::text from pg_control_system()) || ':' || current_database() \
                || ':' || current_schema()";
    match client.query_one(full, &[]).await {
        Ok(row) => Ok(row.try_get(0)?),
        Err(err) => {
            tracing::warn!(error = %err, "outbox relay: cannot read the system identifier; naming the database and schema only");
            let row = client.query_one("select current_database() || ':' || current_schema()", &[]).await?;
            Ok(row.try_get(0)?)
        }
    }
}

/// The hosts and ports of a connection configuration, for messages.
fn describe_hosts(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    if hosts.is_empty() { "localhost:5432 (the default)".to_owned() } else { hosts.join(", ") }
}

/// `socle_eventbus_relay_*` metrics, labelled by table.
#[derive(Debug, Clone)]
pub struct RelayMetrics {
    published: IntCounterVec,
    lag: GaugeVec,
}

impl RelayMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            published: IntCounterVec::new(
                Opts::new("socle_eventbus_relay_published_total", "Outbox rows published and marked."),
                &["table"],
            )?,
            lag: GaugeVec::new(
                Opts::new(
                    "socle_eventbus_relay_lag_seconds",
                    "Age of the oldest unpublished outbox row at the relay's last claim (0 when none was waiting).",
                ),
                &["table"],
            )?,
        };
        registry.register(Box::new(metrics.published.clone()))?;
        registry.register(Box::new(metrics.lag.clone()))?;
        Ok(metrics)
    }
}

/// One table's series, resolved once.
#[derive(Debug, Clone)]
struct TableMetrics {
    published: IntCounter,
    lag: Gauge,
}

/// The outbox relay. Run several side by side for availability: rows are shared out
/// by the database's row locks (one relay keeps the id order on the wire; several
/// publish their batches side by side).
///
/// A row the broker refuses (say, an invalid channel) fails its whole batch, which is
/// retried with backoff and logged with the broker's reason until the row is fixed:
/// the relay never skips a row.
///
/// ```no_run
/// # async fn demo(client: eventbus_client::Client) -> Result<(), eventbus_client::outbox::RelayError> {
/// use eventbus_client::outbox::{Relay, RelayOptions};
///
/// let relay = Relay::new(client, RelayOptions::new("postgres://app@127.0.0.1/app"))?;
/// relay.run(tokio_util::sync::CancellationToken::new()).await?; // until cancelled
/// # Ok(()) }
/// ```
/// A database error in words: PostgreSQL's own message and SQLSTATE when it answered,
/// else the cause (`tokio_postgres` says only "db error" or "error connecting to
/// server" itself).
fn describe(err: &tokio_postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    match std::error::Error::source(err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

impl RelayError {
    /// An error the relay stops on rather than retry: the database answered that the
    /// table, the database or a column does not exist, or that the login or a privilege
    /// is refused. Fix the setting or the schema (`clients/sql/outbox.sql`) and restart.
    pub fn is_permanent(&self) -> bool {
        use tokio_postgres::error::SqlState;
        let (Self::Database(err) | Self::Unreachable { source: err, .. }) = self else { return false };
        let Some(code) = err.code() else { return false };
        [
            SqlState::UNDEFINED_TABLE,
            SqlState::UNDEFINED_COLUMN,
            SqlState::INVALID_CATALOG_NAME,
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INSUFFICIENT_PRIVILEGE,
        ]
        .contains(code)
    }
}

#[derive(Debug, Clone)]
pub struct Relay {
    client: Client,
    options: RelayOptions,
    /// The `source` of the idempotency keys: given, or read from the database once.
    source: Arc<std::sync::OnceLock<String>>,
    config: tokio_postgres::Config,
    metrics: Option<TableMetrics>,
    queries: Arc<Queries>,
}

/// The relay's SQL, with the checked table name in it.
#[derive(Debug)]
struct Queries {
    lock_keys: String,
    claim: String,
    prune: String,
}

/// One claimed row.
struct Row {
    id: i64,
    request: pb::PublishRequest,
}

impl Relay {
    /// Checks the options ([`RelayOptions::check`]); connects nothing yet.
    pub fn new(client: Client, options: RelayOptions) -> Result<Self, RelayError> {
        let config = options.check()?;
        let t = &options.table;
        let queries = Queries {
            // Keys first: of the keys among the oldest unpublished rows, the ones whose
            // advisory lock this transaction gets (held to its end). While one relay
            // holds a key, no other claims any row of it, so each key goes out in id
            // order however many relays run and whichever of them crashes (its lock
            // and its claim go together). The locks are taken in a statement of their
            // own: were they tried row by row in the claim, a lock freed mid-scan (a
            // relay rolling back) would let a later row of its key be claimed while the
            // earlier ones, already passed over, stay unpublished.
            lock_keys: format!(
                "select k from (select distinct ordering_key as k from (\
                 select ordering_key from {t} where published_at is null and ordering_key is not null \
                 order by id limit $1) oldest) keys \
                 where pg_try_advisory_xact_lock(hashtext('{t}'), hashtext(k))"
            ),
            // Claim and mark in one statement, in a snapshot taken after the locks: the
            // mark only counts once the transaction commits, which it does only after
            // the broker said OK to every row.
            claim: format!(
                "update {t} set published_at = now() where id = any(array(\
                 select id from {t} where published_at is null \
                 and (ordering_key is null or ordering_key = any($2)) \
                 order by id limit $1 for update skip locked)) \
                 returning id, channel, payload, metadata, content_type, ordering_key, \
                 extract(epoch from now() - created_at)::float8"
            ),
            prune: format!(
                "delete from {t} where published_at is not null \
                 and published_at < now() - make_interval(secs => $1)"
            ),
        };
        let source = Arc::new(std::sync::OnceLock::new());
        if let Some(given) = &options.source {
            let _ = source.set(given.clone());
        }
        Ok(Self { client, options, config, source, metrics: None, queries: Arc::new(queries) })
    }

    /// Counts published rows and the lag on `metrics` (registered once per registry).
    pub fn metrics(mut self, metrics: &RelayMetrics) -> Self {
        let t = [self.options.table.as_str()];
        self.metrics = Some(TableMetrics {
            published: metrics.published.with_label_values(&t),
            lag: metrics.lag.with_label_values(&t),
        });
        self
    }

    /// Publishes rows until `shutdown` is cancelled, then returns after the round in
    /// progress (a cancelled round rolls back: its rows go out again later). Errors are
    /// logged and retried with backoff, no row is ever dropped; an error no retry fixes
    /// (a missing table or database, a refused login, a missing privilege) is returned.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RelayError> {
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            let wake = Arc::new(Notify::new());
            let outcome = match self.connect(&wake, &shutdown).await {
                Ok(db) => self.serve(db, &wake, &shutdown).await,
                Err(err) => Err(err),
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(err) if err.is_permanent() => {
                    tracing::error!(table = %self.options.table, error = %err, "outbox relay: stopping, retrying cannot fix this");
                    return Err(err);
                }
                Err(err) => {
                    tracing::warn!(table = %self.options.table, error = %err, "outbox relay: database unavailable, reconnecting");
                }
            }
            pause(self.options.backoff.delay(failures), &shutdown).await;
            failures = failures.saturating_add(1);
        }
        Ok(())
    }

    /// Opens the working connection and the listening one; notifications for this
    /// table wake `wake`. Both connections end when the returned client is dropped.
    async fn connect(&self, wake: &Arc<Notify>, shutdown: &CancellationToken) -> Result<Database, RelayError> {
        let (client, connection) = self.config.connect(NoTls).await?;
        let worker = tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "outbox relay: connection closed");
            }
        });
        if self.source.get().is_none() {
            let source = database_identity(&client).await?;
            tracing::info!(table = %self.options.table, %source, "outbox relay: idempotency keys name this database");
            let _ = self.source.set(source);
        }
        let (listener, mut connection) = self.config.connect(NoTls).await?;
        let (table, notify, stop) = (self.options.table.clone(), wake.clone(), shutdown.clone());
        let lost = CancellationToken::new();
        let lost_guard = lost.clone();
        let listening = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    m = futures::StreamExt::next(&mut messages) => m,
                };
                match message {
                    Some(Ok(AsyncMessage::Notification(n))) if n.payload() == table => notify.notify_one(),
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
            lost_guard.cancel();
        });
        listener.batch_execute(&format!("listen {NOTIFY_CHANNEL}")).await?;
        // Rows committed before the LISTEN took effect: look once at start.
        wake.notify_one();
        Ok(Database { client, _listener: listener, lost, _tasks: TaskGuard(vec![worker, listening]) })
    }

    /// Rounds on one connection until shutdown (`Ok`) or a database error (`Err`).
    async fn serve(&self, mut db: Database, wake: &Notify, shutdown: &CancellationToken) -> Result<(), RelayError> {
        let mut broker_failures = 0;
        let mut last_prune: Option<tokio::time::Instant> = None;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let round = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = self.round(&mut db.client) => r,
            };
            match round {
                Ok(n) => {
                    broker_failures = 0;
                    if n == self.options.batch {
                        continue; // more are likely waiting
                    }
                }
                Err(RelayError::Database(err)) => return Err(err.into()),
                Err(err) => {
                    tracing::warn!(table = %self.options.table, error = %err, "outbox relay: publish failed, rows stay unpublished");
                    pause(self.options.backoff.delay(broker_failures), shutdown).await;
                    broker_failures = broker_failures.saturating_add(1);
                    continue;
                }
            }
            if !self.options.retention.is_zero()
                && last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY.min(self.options.retention))
            {
                let secs = self.options.retention.as_secs_f64();
                let deleted = db.client.execute(&self.queries.prune, &[&secs]).await?;
                tracing::debug!(table = %self.options.table, deleted, "outbox relay: pruned published rows");
                last_prune = Some(tokio::time::Instant::now());
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = db.lost.cancelled() => return Err(RelayError::ListenerLost),
                () = wake.notified() => {}
                () = tokio::time::sleep(self.options.idle) => {}
            }
        }
    }

    /// One transaction: claim (and mark), publish, commit. Returns how many rows went out.
    async fn round(&self, db: &mut tokio_postgres::Client) -> Result<usize, RelayError> {
        let tx = db.transaction().await?;
        let limit = i64::try_from(self.options.batch).unwrap_or(i64::MAX);
        let keys: Vec<String> = tx
            .query(&self.queries.lock_keys, &[&limit])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        let claimed = tx.query(&self.queries.claim, &[&limit, &keys]).await?;
        let Some(oldest) = claimed.iter().map(|row| row.try_get::<_, f64>(6)).max_by(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => a.total_cmp(b),
            _ => std::cmp::Ordering::Equal,
        }) else {
            if let Some(m) = &self.metrics {
                m.lag.set(0.0);
            }
            return Ok(0);
        };
        if let Some(m) = &self.metrics {
            m.lag.set(oldest?);
        }
        let mut rows = claimed.iter().map(|row| self.to_publish(row)).collect::<Result<Vec<_>, _>>()?;
        rows.sort_unstable_by_key(|r| r.id); // `returning` keeps no order
        let n = rows.len();
        let timeout = self.options.publish_timeout;
        tokio::time::timeout(timeout, self.publish(rows)).await.map_err(|_| RelayError::BrokerTimeout(n))??;
        tx.commit().await?;
        if let Some(m) = &self.metrics {
            m.published.inc_by(n as u64);
        }
        Ok(n)
    }

    /// Publishes `rows` in order on one stream; `Ok` once the broker answered OK to all.
    async fn publish(&self, rows: Vec<Row>) -> Result<(), RelayError> {
        let n = rows.len();
        let (sender, mut answers) = self.client.publish_stream(n).await?;
        // The window holds the whole batch: every send completes without waiting.
        for row in rows {
            sender.send(row.request).await?;
        }
        sender.close();
        for _ in 0..n {
            if answers.next().await?.is_none() {
                let status = tonic::Status::unavailable("the publish stream ended before every answer");
                return Err(crate::Error::from(status).into());
            }
        }
        Ok(())
    }

    fn to_publish(&self, row: &tokio_postgres::Row) -> Result<Row, RelayError> {
        let id: i64 = row.try_get(0)?;
        let metadata: serde_json::Value = row.try_get(3)?;
        let metadata = match metadata {
            serde_json::Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => (k, s),
                    other => (k, other.to_string()),
                })
                .collect(),
            _ => Default::default(),
        };
        let request = pb::PublishRequest {
            channel: row.try_get(1)?,
            payload: row.try_get::<_, Vec<u8>>(2)?.into(),
            metadata,
            content_type: row.try_get(4)?,
            ordering_key: row.try_get::<_, Option<String>>(5)?.unwrap_or_default(),
            idempotency_key: format!(
                "outbox:{}:{}:{id}",
                self.source.get().map_or("", String::as_str),
                self.options.table
            ),
            ..Default::default()
        };
        Ok(Row { id, request })
    }
}

/// The relay's two connections to the database.
struct Database {
    client: tokio_postgres::Client,
    /// Kept open for LISTEN; its notifications arrive through the listening task.
    _listener: tokio_postgres::Client,
    /// Cancelled when the listening connection is lost.
    lost: CancellationToken,
    _tasks: TaskGuard,
}

/// Aborts the connection tasks when the relay lets go of its connections.
struct TaskGuard(Vec<tokio::task::JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Waits `delay`, or less if `shutdown` comes first.
async fn pause(delay: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(delay) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_accepted_as_table_names() {
        for ok in ["eventbus_outbox", "_t", "Outbox2"] {
            assert!(check_identifier(ok).is_ok(), "{ok}");
        }
        let long = "t".repeat(64);
        for bad in ["", "2t", "a.b", "t; drop table x", "\"t\"", "é", long.as_str()] {
            assert!(matches!(check_identifier(bad), Err(RelayError::InvalidTable(_))), "{bad}");
        }
    }
}
