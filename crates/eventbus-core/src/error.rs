//! Errors of the core, one variant per case a caller (the RPC layer) maps to a status.

use crate::durable::DurableError;
use crate::event::MetadataError;
use crate::name::NameError;
use crate::transport::TransportError;

/// Everything a publish, subscribe or admin call can be refused for.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed channel or pattern.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Payload over `max_payload_bytes`.
    #[error("payload is {size} bytes; the limit is max_payload_bytes = {limit}")]
    PayloadTooLarge { size: usize, limit: usize },
    /// Metadata over its limits.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// Subscribe with an empty channel list.
    #[error("subscribe needs at least one channel or pattern")]
    NoChannels,
    /// Subscribe with too many channels.
    #[error("subscribe takes at most {limit} channels and patterns; got {count}")]
    TooManyChannels { count: usize, limit: usize },
    /// Queue capacity over `max_queue_capacity`.
    #[error("queue_capacity {requested} is above max_queue_capacity = {limit}")]
    QueueTooLarge { requested: usize, limit: usize },
    /// A subscribe option out of range (group, name, max_batch).
    #[error("invalid {field}: {message}")]
    InvalidOption { field: &'static str, message: String },
    /// Unsubscribe of an id no subscription has.
    #[error("no subscription with id {}", quoted(.0))]
    UnknownSubscription(String),
    /// A history read of a channel no `eventbus.history` rule covers.
    #[error("channel {} keeps no history (no eventbus.history rule covers it)", quoted(.0))]
    NoHistory(String),
    /// New work refused because the broker is stopping.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The fan-out transport (Redis) could not take the event.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A durable-consumer call failed (unknown consumer, conflicting definition, store).
    #[error(transparent)]
    Durable(#[from] DurableError),
}

/// The broad class of an [`Error`], which the wire layers map to a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed input (gRPC `INVALID_ARGUMENT`, HTTP 400).
    InvalidArgument,
    /// Over a size limit (gRPC `RESOURCE_EXHAUSTED`, HTTP 413).
    TooLarge,
    /// Unknown id (gRPC `NOT_FOUND`, HTTP 404).
    NotFound,
    /// Cannot serve now: shutting down, or the transport is away (gRPC `UNAVAILABLE`, HTTP 503).
    Unavailable,
    /// A different resource with that name exists (gRPC `ALREADY_EXISTS`, HTTP 409).
    AlreadyExists,
    /// The durable store's disk is nearly full (gRPC `RESOURCE_EXHAUSTED`, HTTP 507).
    StorageFull,
    /// A failure retrying will not fix, such as a corrupt store (gRPC `INTERNAL`, HTTP
    /// 500); the wire layers log the cause and do not show it.
    Internal,
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Name(_)
            | Self::Metadata(_)
            | Self::NoChannels
            | Self::TooManyChannels { .. }
            | Self::QueueTooLarge { .. }
            | Self::InvalidOption { .. } => ErrorKind::InvalidArgument,
            Self::PayloadTooLarge { .. } => ErrorKind::TooLarge,
            Self::UnknownSubscription(_) | Self::NoHistory(_) => ErrorKind::NotFound,
            Self::ShuttingDown | Self::Transport(_) => ErrorKind::Unavailable,
            Self::Durable(DurableError::UnknownConsumer(_)) => ErrorKind::NotFound,
            Self::Durable(DurableError::AlreadyExists { .. }) => ErrorKind::AlreadyExists,
            Self::Durable(DurableError::InvalidConfig(_) | DurableError::InvalidArgument { .. }) => {
                ErrorKind::InvalidArgument
            }
            Self::Durable(DurableError::Unavailable { .. }) => ErrorKind::Unavailable,
            Self::Durable(DurableError::DiskFull { .. }) => ErrorKind::StorageFull,
            Self::Durable(DurableError::TooManyCaptures { .. }) => ErrorKind::TooLarge,
            Self::Durable(DurableError::Internal { .. }) => ErrorKind::Internal,
        }
    }
}

/// Longest part of a client-supplied name that an error message quotes (bytes).
pub const QUOTED_BYTES: usize = 128;

/// `name` quoted for an error message, cut to [`QUOTED_BYTES`] (at a character boundary)
/// and marked `…` when longer: a message must stay small whatever a client sent (a gRPC
/// status travels in a header).
pub fn quoted(name: &str) -> String {
    if name.len() <= QUOTED_BYTES {
        return format!("{name:?}");
    }
    let mut end = QUOTED_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}…", &name[..end])
}

/// An error and its causes, `: `-separated, for logs (and for errors whose causes a
/// client may read, such as an unreachable Redis).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_names_are_cut_at_a_character_boundary() {
        assert_eq!(quoted("orders"), "\"orders\"");
        let exact = "a".repeat(QUOTED_BYTES);
        assert_eq!(quoted(&exact), format!("{exact:?}"));
        // 'é' is two bytes: 128 bytes would split the 65th, so 63 fit (126 bytes) after 'x'.
        let huge = format!("x{}", "é".repeat(1 << 19));
        let shown = quoted(&huge);
        assert_eq!(shown, format!("\"x{}\"…", "é".repeat(63)));
        assert!(shown.len() <= QUOTED_BYTES + "\"\"…".len());
    }
}
