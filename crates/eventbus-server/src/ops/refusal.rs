//! Why an operation is refused, in the broker's terms. Neither protocol appears here:
//! `convert` holds the one table from a refusal to its gRPC status and HTTP code.

use eventbus_core::durable::DurableError;
use eventbus_core::{CloseReason, Error};

/// Why a request is refused, or an open stream ended: a core error, or a decision taken
/// before the bus is reached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// Refused by the core (names, limits, unknown ids, durable engine, shutdown).
    #[error(transparent)]
    Core(#[from] Error),
    /// A durable-consumer call on a broker without a durable engine.
    #[error("durable consumers are not enabled on this broker")]
    DurableDisabled,
    /// A publish request too large to be read at all (over the gRPC decode limit or the
    /// REST body limit), refused before its payload is buffered.
    #[error(
        "request is over {request_limit} bytes, too large to read; the payload limit is \
         max_payload_bytes = {max_payload_bytes}"
    )]
    RequestTooLarge { request_limit: usize, max_payload_bytes: usize },
    /// A request that cannot be turned into an operation (missing field, unknown enum
    /// value, malformed JSON).
    #[error("{0}")]
    BadRequest(String),
    /// An HTTP request body that is not JSON.
    #[error("request bodies must be application/json")]
    NotJson,
    /// Missing, malformed, unknown, expired or badly signed credentials (the text
    /// never holds the credential).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller lacks the right the operation needs; `what` names the refused
    /// channel or consumer.
    #[error("permission denied: principal {principal:?} may not {operation}: {what}")]
    PermissionDenied { principal: String, operation: &'static str, what: String },
    /// The credential cannot do this, whatever its rights (a session token minting
    /// another).
    #[error("{0}")]
    Forbidden(&'static str),
    /// A per-principal limit (`max_subscriptions`, `max_publish_rate`) is reached.
    #[error("principal {principal:?} is over its {limit}")]
    OverLimit { principal: String, limit: &'static str },
    /// A `PublishBatch` with more events than `eventbus.max_publish_batch`.
    #[error("a batch holds at most eventbus.max_publish_batch = {limit} events; this one has {count}")]
    BatchTooLarge { count: usize, limit: usize },
    /// An HTTP publish that came through more pushes than the hop limit: a loop of push
    /// consumers, most likely.
    #[error(
        "eventbus-hops {hops} is over the limit of {}: this event came through that many push consumers \
         (a loop of push consumers through publish routes?)",
        crate::convert::MAX_HOPS
    )]
    TooManyHops { hops: u32 },
    /// An open stream whose credential or right was withdrawn.
    #[error(transparent)]
    Withdrawn(#[from] Withdrawn),
    /// A subscription the broker ended (never [`CloseReason::Unsubscribed`], a normal
    /// end).
    #[error("{}", closed_text(*.0))]
    Closed(CloseReason),
}

impl From<DurableError> for Refusal {
    fn from(err: DurableError) -> Self {
        Self::Core(err.into())
    }
}

fn closed_text(reason: CloseReason) -> &'static str {
    match reason {
        CloseReason::SlowConsumer => "slow consumer: the subscription queue overflowed (overflow policy DISCONNECT)",
        CloseReason::ShuttingDown => "shutting down",
        CloseReason::Unsubscribed => "unsubscribed",
        CloseReason::Interrupted => {
            "interrupted: this instance's connection to Redis was lost or restored, so events published meanwhile \
             may be missing here; subscribe again from where you were (since) to recover them from history"
        }
    }
}

/// Why an open stream may not stay open: a reload or the clock took away what it
/// lives on.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Withdrawn {
    /// Its credential expired or is no longer accepted.
    #[error("{0}")]
    Credential(String),
    /// Its principal lost the right the stream uses.
    #[error("{0}")]
    Right(String),
}
