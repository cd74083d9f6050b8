//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use eventbus_client::ClientOptions;
use eventbus_client::pb::OverflowPolicy;

/// Command-line client for Socle EventBus.
#[derive(Debug, Parser)]
#[command(name = "eventbus", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    /// Print JSON for scripts instead of text for people.
    #[arg(long, global = true, help_heading = "Global options")]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How to reach the broker (global options), turned into [`ClientOptions`].
#[derive(Clone, Default, clap::Args)]
pub(crate) struct ConnectArgs {
    /// Broker gRPC address; `https://` turns TLS on.
    #[arg(long, global = true, help_heading = "Global options", env = "EVENTBUS_SERVER", default_value = eventbus_client::options::DEFAULT_SERVER)]
    pub(crate) server: String,
    /// Bearer token sent with every call.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "EVENTBUS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) token: Option<String>,
    /// PEM file of the CA that signed the broker's certificate (instead of the system's roots).
    #[arg(long, global = true, help_heading = "Global options", value_name = "FILE")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a broker that requires one (mTLS); needs --tls-key.
    #[arg(long, global = true, help_heading = "Global options", value_name = "FILE")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, help_heading = "Global options", value_name = "FILE")]
    pub(crate) tls_key: Option<PathBuf>,
}

/// Everything but the token.
impl std::fmt::Debug for ConnectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectArgs").field("options", &self.options()).finish()
    }
}

impl ConnectArgs {
    pub(crate) fn options(&self) -> ClientOptions {
        ClientOptions {
            token: self.token.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            ..ClientOptions::new(self.server.clone())
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Publish an event (or, with `- --lines`, one event per line of stdin).
    Publish(PublishArgs),
    /// Print events as they arrive on channels or patterns (`orders.*`, `orders.>`).
    Subscribe(SubscribeArgs),
    /// Broker totals.
    Stats,
    /// Channels with their counters.
    Channels,
    /// What a channel's history holds (channels with an `eventbus.history` rule), and a
    /// page of its events.
    History(HistoryArgs),
    /// Open subscriptions.
    Subscriptions,
    /// Close a subscription by id (its stream ends normally).
    Unsubscribe {
        /// Subscription id, as `subscriptions` shows it.
        id: String,
    },
    /// Durable consumers: create, list, info, delete; pending, redrive, pause, resume.
    Consumer {
        #[command(subcommand)]
        command: ConsumerCommand,
    },
    /// Attach to a durable consumer and print its deliveries (acked automatically, or
    /// by typing `ack|nack|term|release EVENT_ID [reason]` lines with `--ack manual`).
    Consume(ConsumeArgs),
    /// A durable consumer's terminal log.
    Log(LogArgs),
    /// Load generator: throughput, loss and latency of a running broker.
    Bench {
        #[command(subcommand)]
        workload: BenchWorkload,
    },
    /// Publish the rows of a PostgreSQL outbox table (`clients/sql/outbox.sql`), serving
    /// /metrics, until SIGINT or SIGTERM.
    Relay(RelayArgs),
    /// Credentials for the broker's principals file (no connection is made).
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// `postgres://user:password@host:port/database` (or `host=… dbname=…`).
    #[arg(long, env = "EVENTBUS_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: String,
    /// The outbox table (a plain identifier, found by the connection's search_path).
    #[arg(long, default_value = "eventbus_outbox")]
    pub(crate) table: String,
    /// Rows claimed and published per transaction.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch: u32,
    /// Where to serve /metrics (`socle_eventbus_relay_*`). Default 127.0.0.1:9473, or,
    /// when that is taken (a second relay on the host), a free port named in the log.
    #[arg(long)]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    /// Names this outbox in the idempotency keys (`outbox:<source>:<table>:<id>`);
    /// default: the database's `<system identifier>:<database>:<schema>`.
    #[arg(long)]
    pub(crate) source: Option<String>,
    /// Delete published rows older than this many seconds (0 keeps them).
    #[arg(long, default_value_t = 0)]
    pub(crate) retention_secs: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuthCommand {
    /// Print a fresh random token and its principals-file entry (which holds only the
    /// token's SHA-256).
    NewToken {
        /// The principal's name.
        #[arg(value_parser = crate::auth::parse_name)]
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConsumerCommand {
    /// Create a consumer (identical re-creation is a no-op).
    Create(CreateArgs),
    /// Every consumer with its counts.
    List,
    /// One consumer's definition and counts.
    Info {
        /// The durable consumer.
        name: String,
    },
    /// Delete a consumer, the events it holds and its log.
    Delete {
        /// The durable consumer.
        name: String,
    },
    /// A consumer's unfinished events, oldest first: state, attempt, next delivery, last failure.
    Pending(PendingArgs),
    /// Put dead-lettered events back to the consumer with their attempts reset.
    Redrive(RedriveArgs),
    /// Stop delivering (events are still captured and kept; clients stay attached).
    Pause {
        /// The durable consumer.
        name: String,
    },
    /// Deliver again after `pause`.
    Resume {
        /// The durable consumer.
        name: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct PendingArgs {
    /// The durable consumer.
    pub(crate) name: String,
    /// Entries per page (at most 1000).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
    /// Follow every page.
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RedriveArgs {
    /// The durable consumer.
    pub(crate) name: String,
    /// Dead-lettered events to put back (default: the oldest --limit).
    #[arg(value_name = "EVENT_ID")]
    pub(crate) event_ids: Vec<String>,
    /// Without event ids: how many, oldest first (0: the broker's maximum, 10000).
    #[arg(long, default_value_t = 0)]
    pub(crate) limit: u32,
    /// Without event ids: repeat until none is left (or none moves).
    #[arg(long, conflicts_with = "event_ids")]
    pub(crate) all: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// The durable consumer.
    pub(crate) name: String,
    /// Channel or pattern whose events it keeps (repeatable).
    #[arg(long = "channel", short = 'c', required = true)]
    pub(crate) channels: Vec<String>,
    /// Ack deadline (0: 30000).
    #[arg(long, default_value_t = 0)]
    pub(crate) ack_deadline_ms: u64,
    /// Failed attempts before dead-lettering (default 5; 0 = unlimited).
    #[arg(long)]
    pub(crate) max_attempts: Option<u32>,
    /// Delay before the first redelivery after a failed attempt (0: 1000 ms).
    #[arg(long, default_value_t = 0)]
    pub(crate) backoff_initial_ms: u64,
    /// Growth of the delay per attempt with the exponential backoff (0: 2.0).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) backoff_multiplier: f64,
    /// Longest delay between attempts (0: 60000 ms).
    #[arg(long, default_value_t = 0)]
    pub(crate) backoff_max_ms: u64,
    /// How retry delays grow: initial × multiplier^(attempt−1), or initial × attempt;
    /// both capped at --backoff-max-ms.
    #[arg(long, value_enum, default_value_t = BackoffKind::Exponential)]
    pub(crate) backoff_kind: BackoffKind,
    /// One attached client receives at a time; the next takes over when it leaves.
    #[arg(long)]
    pub(crate) exclusive: bool,
    /// Most unfinished events kept; beyond it publishes are not captured for this
    /// consumer (default 1,000,000; 0 = unlimited).
    #[arg(long)]
    pub(crate) max_pending: Option<u64>,
    /// Unacknowledged events per client (0: 1000).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_in_flight: u32,
    /// Where dead letters go (default: dlq.<channel>).
    #[arg(long)]
    pub(crate) dead_letter_channel: Option<String>,
    /// Make it a push consumer: the broker POSTs its events to this http:// or https://
    /// URL itself and takes a 2xx answer as the ack.
    #[arg(long, value_name = "URL", help_heading = "Push consumer")]
    pub(crate) push_url: Option<String>,
    /// Extra request header, e.g. 'Authorization: Bearer …' (repeatable); its value is
    /// shown back as "(redacted)".
    #[arg(
        long = "push-header",
        value_name = "NAME: VALUE",
        requires = "push_url",
        value_parser = PushHeaderParser,
        help_heading = "Push consumer"
    )]
    pub(crate) push_headers: Vec<(String, String)>,
    /// A request not answered within this long fails and is retried (default 10000; at
    /// most the ack deadline).
    #[arg(long, value_name = "MS", requires = "push_url", help_heading = "Push consumer")]
    pub(crate) push_timeout_ms: Option<u64>,
    /// Requests each broker instance keeps open to the endpoint (default 16).
    #[arg(long, value_name = "N", requires = "push_url", help_heading = "Push consumer")]
    pub(crate) push_max_concurrency: Option<u32>,
    /// Events per request (default 1; above 1 needs --push-envelope json).
    #[arg(long, value_name = "N", requires = "push_url", help_heading = "Push consumer")]
    pub(crate) push_batch: Option<u32>,
    /// How a request carries its events: `raw` (the payload is the body, the event's
    /// fields `eventbus-*` headers; one event per request) or `json` (default raw).
    #[arg(long, value_enum, requires = "push_url", help_heading = "Push consumer")]
    pub(crate) push_envelope: Option<PushEnvelope>,
    /// Key of the HMAC-SHA256 `eventbus-signature` header of every request; shown back
    /// as "(redacted)".
    #[arg(
        long,
        value_name = "SECRET",
        requires = "push_url",
        value_parser = parse_secret,
        help_heading = "Push consumer"
    )]
    pub(crate) push_secret: Option<Secret>,
}

/// A credential given on the command line, never shown by `Debug`.
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn parse_secret(s: &str) -> Result<Secret, String> {
    Ok(Secret(s.to_owned()))
}

/// `--push-header`: `Name: value`, split at the first `:`, both sides trimmed.
pub(crate) fn parse_push_header(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_owned(), value.trim().to_owned())),
        Some(_) => Err("--push-header: the header name before ':' is empty (expected 'Name: value')".to_owned()),
        None => Err("--push-header: expected 'Name: value', with a ':' after the header name".to_owned()),
    }
}

/// [`parse_push_header`] as a clap parser whose error does not repeat the value (it
/// may hold a credential).
#[derive(Clone)]
struct PushHeaderParser;

impl clap::builder::TypedValueParser for PushHeaderParser {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        let invalid = |message: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{message}\n")).with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| invalid("--push-header: not valid UTF-8".to_owned()))?;
        parse_push_header(text).map_err(invalid)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PushEnvelope {
    Raw,
    Json,
}

impl From<PushEnvelope> for eventbus_client::pb::PushEnvelope {
    fn from(e: PushEnvelope) -> Self {
        match e {
            PushEnvelope::Raw => Self::Raw,
            PushEnvelope::Json => Self::Json,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackoffKind {
    Exponential,
    Linear,
}

impl From<BackoffKind> for eventbus_client::pb::BackoffKind {
    fn from(k: BackoffKind) -> Self {
        match k {
            BackoffKind::Exponential => Self::Exponential,
            BackoffKind::Linear => Self::Linear,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AckMode {
    /// Ack each batch once printed.
    Auto,
    /// Read `ack|nack|term|release EVENT_ID [reason]` lines from stdin.
    Manual,
}

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The durable consumer.
    pub(crate) name: String,
    /// How deliveries are acknowledged.
    #[arg(long, value_enum, default_value_t = AckMode::Auto)]
    pub(crate) ack: AckMode,
    /// Exit after this many deliveries.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Unacknowledged events this client may hold (0: the consumer's).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_in_flight: u32,
}

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// An exact channel.
    pub(crate) channel: String,
    /// The events after this offset (of the channel's current epoch); default: from
    /// the oldest kept.
    #[arg(long, conflicts_with = "since")]
    pub(crate) after: Option<u64>,
    /// The events published since: an age (90s, 5m, 2h, 1d) or a time (RFC 3339).
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// Events per page (at most 1000).
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// The durable consumer.
    pub(crate) name: String,
    /// completed, dead_lettered, redriven or all.
    #[arg(long)]
    pub(crate) status: Option<String>,
    /// Entries per page.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: u32,
    /// Follow every page.
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchWorkload {
    #[command(flatten)]
    Traffic(eventbus_bench::BenchCommand),
    /// Idle subscriptions held open: the daemon's CPU and memory (local daemon, by PID).
    Idle(crate::idle::IdleArgs),
    /// Durable publish (each answered once committed) from concurrent publishers, then
    /// consume with batched acks.
    Durable(eventbus_bench::durable::DurableArgs),
    /// Like `durable`, but consumed by an `eventbus-client` Worker with a no-op handler
    /// (its overhead over the raw consume loop of `durable`).
    Worker(crate::durable_bench::WorkerArgs),
    /// Like `worker`, but the broker is the worker: a push consumer POSTs the events to
    /// a no-op HTTP endpoint this command serves on 127.0.0.1 (so the broker must run on
    /// this host), timed from its resume until every event is received and acked.
    Push(crate::push_bench::PushArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// Exact channel name, e.g. orders.created.
    pub(crate) channel: String,
    /// Payload text; `-` reads standard input. Empty when omitted.
    pub(crate) payload: Option<String>,
    /// Metadata entry, repeatable.
    #[arg(short = 'm', long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub(crate) metadata: Vec<(String, String)>,
    /// MIME type of the payload. Default: application/json when the payload parses as
    /// JSON, text/plain when it is other UTF-8 text, none for other bytes.
    #[arg(long)]
    pub(crate) content_type: Option<String>,
    /// Who is publishing (default: the broker records your address).
    #[arg(long)]
    pub(crate) source: Option<String>,
    /// Durable consumers deliver events of one ordering key one at a time, in order.
    #[arg(long)]
    pub(crate) ordering_key: Option<String>,
    /// Repeats of this key within the dedup window are no-ops (answered `duplicate`).
    #[arg(long)]
    pub(crate) idempotency_key: Option<String>,
    /// With `-`: one event per line, sent over one PublishStream.
    #[arg(long, requires = "payload")]
    pub(crate) lines: bool,
    /// With `--lines`: send the lines in PublishBatch calls of up to N events (at most
    /// the broker's `eventbus.max_publish_batch`) instead of one PublishStream. A
    /// refused line is reported and the others are published.
    #[arg(long, value_name = "N", requires = "lines", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch: Option<u32>,
    /// With `--lines`: what to wait for, `each` (an answer per line; a refused line
    /// stops the stream), `cumulative` (running totals) or `none` (only refusals). With
    /// the last two a refused line is reported and the others are published.
    #[arg(long, value_name = "MODE", default_value = "each", requires = "lines", conflicts_with = "batch",
          value_parser = parse_ack)]
    pub(crate) ack: eventbus_client::AckMode,
}

/// `--ack`: `each`, `cumulative` or `none`.
pub(crate) fn parse_ack(s: &str) -> Result<eventbus_client::AckMode, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub(crate) struct SubscribeArgs {
    /// Channels and/or patterns.
    #[arg(required = true)]
    pub(crate) patterns: Vec<String>,
    /// Join a group: members share the events.
    #[arg(long)]
    pub(crate) group: Option<String>,
    /// Exit after this many events.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Queue capacity (0: the server default).
    #[arg(long, default_value_t = 0)]
    pub(crate) queue_capacity: u32,
    /// Queue bound in bytes (0: the server default).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_queue_bytes: u64,
    /// What to do when the queue is full (default: the server's).
    #[arg(long, value_enum)]
    pub(crate) overflow: Option<Overflow>,
    /// Most events per stream message (0: the server default).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_batch: u32,
    /// Label shown in `subscriptions`.
    #[arg(long, default_value = "eventbus-cli")]
    pub(crate) name: String,
    /// Start from the past, on channels that keep a history: an age (`90s`, `5m`, `2h`,
    /// `1d`), a time (`2026-11-27T10:00:00Z`), or `EPOCH:OFFSET`, the position of the
    /// last event you have (printed `@EPOCH:OFFSET`; one exact channel only). The
    /// events kept from there come first, then live ones; stderr says whether
    /// everything asked for was recovered.
    #[arg(long, value_name = "WHEN", value_parser = crate::subscribe::parse_since, conflicts_with = "group")]
    pub(crate) since: Option<crate::subscribe::Since>,
    /// End on the first loss of the subscription instead of subscribing again (by
    /// default a loss, such as a broker restart, is followed by a new subscription,
    /// with backoff, that recovers what it missed from channels that keep a history;
    /// what it could not recover is reported as a gap on stderr).
    #[arg(long)]
    pub(crate) no_reconnect: bool,
}

/// Spelled as in the configuration and the JSON output (`drop_newest`); the dashed
/// spelling is accepted too.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Overflow {
    #[value(name = "drop_newest", alias = "drop-newest")]
    DropNewest,
    #[value(name = "drop_oldest", alias = "drop-oldest")]
    DropOldest,
    Disconnect,
    #[value(name = "dead_letter", alias = "dead-letter")]
    DeadLetter,
}

impl From<Overflow> for OverflowPolicy {
    fn from(o: Overflow) -> Self {
        match o {
            Overflow::DropNewest => OverflowPolicy::DropNewest,
            Overflow::DropOldest => OverflowPolicy::DropOldest,
            Overflow::Disconnect => OverflowPolicy::Disconnect,
            Overflow::DeadLetter => OverflowPolicy::DeadLetter,
        }
    }
}

fn parse_meta(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn metadata_needs_key_and_equals() {
        assert_eq!(parse_meta("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_meta("a="), Ok(("a".into(), String::new())));
        assert!(parse_meta("novalue").is_err());
        assert!(parse_meta("=v").is_err());
    }

    #[test]
    fn parses_a_subscribe_line() {
        let cli =
            Cli::try_parse_from(["eventbus", "subscribe", "a.*", "b.>", "--group", "g", "--count", "3", "--json"])
                .unwrap();
        assert!(cli.json);
        let Command::Subscribe(args) = cli.command else { panic!() };
        assert_eq!(args.patterns, ["a.*", "b.>"]);
        assert_eq!((args.group.as_deref(), args.count), (Some("g"), Some(3)));
    }

    #[test]
    fn connection_options_are_global() {
        let cli = Cli::try_parse_from([
            "eventbus",
            "stats",
            "--server",
            "https://broker:50051",
            "--token",
            "t",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ])
        .unwrap();
        let c = &cli.connect;
        assert_eq!((c.server.as_str(), c.token.as_deref()), ("https://broker:50051", Some("t")));
        assert_eq!((c.tls_ca.is_some(), c.tls_cert.is_some(), c.tls_key.is_some()), (true, true, true));
    }

    #[test]
    fn push_headers_split_at_the_first_colon() {
        assert_eq!(parse_push_header("Authorization: Bearer a:b "), Ok(("Authorization".into(), "Bearer a:b".into())));
        assert_eq!(parse_push_header(" X-Empty :"), Ok(("X-Empty".into(), String::new())));
        assert!(parse_push_header("Bearer x").is_err_and(|e| e.contains("--push-header")));
        assert!(parse_push_header(" : x").is_err());
    }

    #[test]
    fn push_options_need_a_push_url() {
        let create = |extra: &[&str]| {
            let mut args = vec!["eventbus", "consumer", "create", "c", "-c", "a.>"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        let cli = create(&["--push-url", "http://h/", "--push-header", "A: 1", "--push-envelope", "json"]).unwrap();
        let Command::Consumer { command: ConsumerCommand::Create(a) } = cli.command else { panic!() };
        assert_eq!((a.push_url.as_deref(), a.push_envelope), (Some("http://h/"), Some(PushEnvelope::Json)));
        assert_eq!(a.push_headers, [("A".to_owned(), "1".to_owned())]);
        for flag in
            [["--push-batch", "4"], ["--push-header", "A: 1"], ["--push-envelope", "json"], ["--push-secret", "s"]]
        {
            let err = create(&flag).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument, "{flag:?}");
        }
        let err = create(&["--push-url", "http://h/", "--push-header", "Bearer secret"]).unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn a_push_secret_is_not_in_debug_output() {
        let cli = Cli::try_parse_from([
            "eventbus",
            "consumer",
            "create",
            "c",
            "-c",
            "a",
            "--push-url",
            "http://h/",
            "--push-secret",
            "hunter2",
        ])
        .unwrap();
        assert!(!format!("{cli:?}").contains("hunter2"));
    }

    /// Every option and argument of every command says what it is for in `--help`.
    #[test]
    fn every_argument_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "eventbus", &mut missing);
        assert!(missing.is_empty(), "arguments without a description: {missing:?}");
    }
}
