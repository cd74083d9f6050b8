//! The wire edge: every conversion between core types and what gRPC (`eventbus.v1`) and
//! the admin REST routes (JSON) carry, and the one table from a refusal to its gRPC
//! status and HTTP code.
//!
//! Each domain object has its protobuf form and its JSON form side by side, and both
//! take the domain struct apart field by field (no `..`): a field added to a core type
//! does not compile until both wire forms say what they do with it, so the two
//! protocols cannot drift apart again.

mod consumers;
mod events;
mod history;
mod log;
mod publish;
pub(crate) mod trace;

pub(crate) use consumers::*;
pub(crate) use events::*;
pub(crate) use history::*;
pub(crate) use log::*;
pub(crate) use publish::*;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use bytes::Bytes;
use eventbus_core::durable::from_epoch_ms;
use eventbus_core::durable::{
    Backoff, BackoffKind, ConsumerConfig, ConsumerInfo, DEFAULT_DEAD_LETTER_SHOWN, Delivery, Failure, LogEntry,
    LogSlice, LogStatus, PendingEntry, PendingSlice, PendingState, PublishedDeadLetter, PushConfig, PushEnvelope,
    Redriven,
};
use eventbus_core::{
    BusStats, ChannelStats, CloseReason, ErrorKind, Event, Overflow, PublishInput, Published, SubscribeOptions,
    SubscriptionInfo,
};
use eventbus_proto::pb;
use prost::Message;
use serde::Serialize;
use tonic::{Code, Status};

use crate::ops::{Refusal, Withdrawn};

// --- refusals ---

impl Refusal {
    /// The one table from a refusal to its wire codes, so a gRPC client and a REST
    /// client always get the same answer. `FAILED_PRECONDITION` (the broker is not set
    /// up for the call; retrying will not help) is 409 Conflict: the request conflicts
    /// with the broker's state, and 503 would invite retries.
    pub(crate) fn codes(&self) -> (Code, StatusCode) {
        match self {
            Self::Core(err) => match err.kind() {
                ErrorKind::InvalidArgument => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
                ErrorKind::TooLarge => (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
                ErrorKind::NotFound => (Code::NotFound, StatusCode::NOT_FOUND),
                ErrorKind::Unavailable => (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
                ErrorKind::AlreadyExists => (Code::AlreadyExists, StatusCode::CONFLICT),
                ErrorKind::StorageFull => (Code::ResourceExhausted, StatusCode::INSUFFICIENT_STORAGE),
                ErrorKind::Internal => (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
            },
            Self::DurableDisabled => (Code::FailedPrecondition, StatusCode::CONFLICT),
            Self::RequestTooLarge { .. } => (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
            Self::BadRequest(_) | Self::BatchTooLarge { .. } => (Code::InvalidArgument, StatusCode::BAD_REQUEST),
            Self::Unauthenticated(_) => (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            Self::PermissionDenied { .. } => (Code::PermissionDenied, StatusCode::FORBIDDEN),
            Self::OverLimit { .. } => (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
            Self::TooManyHops { .. } => (Code::FailedPrecondition, StatusCode::LOOP_DETECTED),
            Self::NotJson => (Code::InvalidArgument, StatusCode::UNSUPPORTED_MEDIA_TYPE),
            Self::Forbidden(_) => (Code::PermissionDenied, StatusCode::FORBIDDEN),
            Self::Withdrawn(Withdrawn::Credential(_)) => (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            Self::Withdrawn(Withdrawn::Right(_)) => (Code::PermissionDenied, StatusCode::FORBIDDEN),
            Self::Closed(CloseReason::SlowConsumer) => (Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
            Self::Closed(CloseReason::ShuttingDown | CloseReason::Unsubscribed | CloseReason::Interrupted) => {
                (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }

    /// Logs an internal error's causes as it goes on the wire: the client reads no
    /// internals, the log keeps them.
    pub(crate) fn log_internal(&self) {
        if let Self::Core(err) = self
            && err.kind() == ErrorKind::Internal
        {
            tracing::error!(error = %eventbus_core::error_chain(err), "internal error");
        }
    }
}

impl From<Refusal> for Status {
    fn from(err: Refusal) -> Self {
        err.log_internal();
        let (code, _) = err.codes();
        Status::new(code, err.to_string())
    }
}

impl From<Withdrawn> for Status {
    fn from(why: Withdrawn) -> Self {
        Refusal::from(why).into()
    }
}

/// The gRPC status of a refusal (docs/errors.md). Messages name the problem.
pub(crate) fn status(err: impl Into<Refusal>) -> Status {
    err.into().into()
}

// --- scalars ---

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    t.into()
}

/// A time from the wire, refused (naming `field`) when `google.protobuf.Timestamp`
/// calls it invalid: prost would read it as another time.
pub(crate) fn valid_time(field: &str, t: prost_types::Timestamp) -> Result<SystemTime, Refusal> {
    eventbus_proto::time::check_timestamp(&t).map_err(|e| Refusal::BadRequest(format!("invalid {field}: {e}")))?;
    SystemTime::try_from(t).map_err(|e| Refusal::BadRequest(format!("invalid {field}: {e}")))
}

/// A time in JSON: RFC 3339, UTC.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    timestamp(t).to_string()
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

#[cfg(test)]
mod tests {
    use eventbus_core::Error;
    use eventbus_core::durable::DurableError;

    use super::log::{DEFAULT_LOG_LIMIT, log_status_name};
    use super::*;

    #[test]
    fn both_protocols_take_their_codes_from_one_table() {
        let too_large = Refusal::RequestTooLarge { request_limit: 2 << 20, max_payload_bytes: 1 << 20 };
        let cases: [(Refusal, Code, StatusCode); 19] = [
            (Error::NoChannels.into(), Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (
                Error::PayloadTooLarge { size: 2, limit: 1 }.into(),
                Code::ResourceExhausted,
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (too_large, Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE),
            (Error::UnknownSubscription("s".into()).into(), Code::NotFound, StatusCode::NOT_FOUND),
            (Error::ShuttingDown.into(), Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (
                DurableError::AlreadyExists { name: "c".into(), differences: String::new() }.into(),
                Code::AlreadyExists,
                StatusCode::CONFLICT,
            ),
            (Refusal::DurableDisabled, Code::FailedPrecondition, StatusCode::CONFLICT),
            (Refusal::BadRequest("config is required".into()), Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (Refusal::Unauthenticated("missing".into()), Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            (
                Refusal::PermissionDenied { principal: "p".into(), operation: "publish", what: "channel a".into() },
                Code::PermissionDenied,
                StatusCode::FORBIDDEN,
            ),
            (
                Refusal::OverLimit { principal: "p".into(), limit: "max_subscriptions" },
                Code::ResourceExhausted,
                StatusCode::TOO_MANY_REQUESTS,
            ),
            (Refusal::TooManyHops { hops: 9 }, Code::FailedPrecondition, StatusCode::LOOP_DETECTED),
            (Refusal::NotJson, Code::InvalidArgument, StatusCode::UNSUPPORTED_MEDIA_TYPE),
            (Refusal::Forbidden("no"), Code::PermissionDenied, StatusCode::FORBIDDEN),
            (
                Withdrawn::Credential("the credential expired".into()).into(),
                Code::Unauthenticated,
                StatusCode::UNAUTHORIZED,
            ),
            (Withdrawn::Right("lost".into()).into(), Code::PermissionDenied, StatusCode::FORBIDDEN),
            (Refusal::Closed(CloseReason::SlowConsumer), Code::ResourceExhausted, StatusCode::TOO_MANY_REQUESTS),
            (Refusal::Closed(CloseReason::ShuttingDown), Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (Refusal::Closed(CloseReason::Interrupted), Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
        ];
        for (err, code, http) in cases {
            assert_eq!(err.codes(), (code, http), "{err}");
            let message = err.to_string();
            let status = status(err);
            assert_eq!((status.code(), status.message()), (code, message.as_str()));
        }
    }

    #[test]
    fn a_stream_ended_by_the_broker_says_why_in_the_words_clients_know() {
        let slow = status(Refusal::Closed(CloseReason::SlowConsumer));
        assert_eq!(slow.message(), "slow consumer: the subscription queue overflowed (overflow policy DISCONNECT)");
        assert_eq!(status(Refusal::Closed(CloseReason::ShuttingDown)).message(), "shutting down");
        let expired = Status::from(Withdrawn::Credential("the credential expired".into()));
        assert_eq!((expired.code(), expired.message()), (Code::Unauthenticated, "the credential expired"));
    }

    #[test]
    fn an_oversized_request_names_the_payload_limit() {
        let err = Refusal::RequestTooLarge { request_limit: 2 << 20, max_payload_bytes: 1 << 20 };
        assert!(err.to_string().contains("max_payload_bytes = 1048576"), "{err}");
    }

    #[test]
    fn log_status_names_round_trip_through_the_rest_filter() {
        for s in [LogStatus::Completed, LogStatus::DeadLettered, LogStatus::Redriven] {
            assert_eq!(log_status_filter_json(Some(log_status_name(s))).ok(), Some(Some(s)));
        }
        assert_eq!(log_status_filter_json(Some("all")).ok(), Some(None));
        assert!(log_status_filter_json(Some("lost")).is_err());
        assert_eq!((log_limit(0), log_limit(7)), (DEFAULT_LOG_LIMIT, 7));
    }
}
