//! The one error type of the library: a variant per case a caller branches on.

use tonic::{Code, Status};

/// What went wrong talking to the broker.
///
/// The variants carrying a [`Status`] are the broker's answer; their
/// message is the broker's, which always names the problem. Every variant displays as
/// one readable line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The [`ClientOptions`](crate::ClientOptions) cannot work: a bad address, token or
    /// TLS file. Nothing was sent.
    #[error("{0}")]
    Options(String),
    /// No connection could be made (refused, unreachable, timed out, TLS handshake).
    #[error("cannot connect to {server}: {reason}")]
    Connect {
        /// The address tried.
        server: String,
        /// The innermost cause, e.g. "Connection refused (os error 111)".
        reason: String,
    },
    /// Missing, unknown, expired or badly signed credentials.
    #[error("{}", line(.0))]
    Unauthenticated(Status),
    /// The credentials do not grant this operation on this channel or consumer.
    #[error("{}", line(.0))]
    PermissionDenied(Status),
    /// A bad channel, pattern, metadata, option or consumer definition.
    #[error("{}", line(.0))]
    InvalidArgument(Status),
    /// Unknown subscription id or consumer.
    #[error("{}", line(.0))]
    NotFound(Status),
    /// A consumer of that name exists with another definition.
    #[error("{}", line(.0))]
    AlreadyExists(Status),
    /// The broker is shutting down, restarting or cannot reach its backend: try again.
    #[error("{}", line(.0))]
    Unavailable(Status),
    /// A limit: payload size, subscription or rate limit, or a slow consumer disconnected.
    #[error("{}", line(.0))]
    ResourceExhausted(Status),
    /// Any other status.
    #[error("{}", line(.0))]
    Other(Status),
    /// The broker ended a stream in a way the protocol does not allow (e.g. no
    /// `attached` after `attach`).
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// `message (Code)`, as the CLI has always printed a refused call.
fn line(status: &Status) -> String {
    let message = if status.message().is_empty() { "no details" } else { status.message() };
    format!("{message} ({:?})", status.code())
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        match status.code() {
            Code::Unauthenticated => Self::Unauthenticated(status),
            Code::PermissionDenied => Self::PermissionDenied(status),
            Code::InvalidArgument => Self::InvalidArgument(status),
            Code::NotFound => Self::NotFound(status),
            Code::AlreadyExists => Self::AlreadyExists(status),
            Code::Unavailable => Self::Unavailable(status),
            Code::ResourceExhausted => Self::ResourceExhausted(status),
            _ => Self::Other(status),
        }
    }
}

impl Error {
    /// The broker's status, when the error is its answer.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Self::Unauthenticated(s)
            | Self::PermissionDenied(s)
            | Self::InvalidArgument(s)
            | Self::NotFound(s)
            | Self::AlreadyExists(s)
            | Self::Unavailable(s)
            | Self::ResourceExhausted(s)
            | Self::Other(s) => Some(s),
            Self::Options(_) | Self::Connect { .. } | Self::Protocol(_) => None,
        }
    }

    /// Whether trying again later can help: the connection or the broker was away, as
    /// opposed to a request the broker refuses (credentials, rights, arguments, unknown
    /// names), which fails the same way every time.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Options(_)
            | Self::Unauthenticated(_)
            | Self::PermissionDenied(_)
            | Self::InvalidArgument(_)
            | Self::NotFound(_)
            | Self::AlreadyExists(_) => false,
            Self::Other(s) => !matches!(s.code(), Code::Unimplemented | Code::FailedPrecondition),
            Self::Connect { .. } | Self::Unavailable(_) | Self::ResourceExhausted(_) | Self::Protocol(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_become_their_variant_and_read_as_one_line() {
        let err = Error::from(Status::not_found("no consumer named billing"));
        assert!(matches!(err, Error::NotFound(_)) && !err.is_transient());
        assert_eq!(err.to_string(), "no consumer named billing (NotFound)");
        assert!(Error::from(Status::unavailable("shutting down")).is_transient());
        assert!(!Error::from(Status::permission_denied("x")).is_transient());
        assert_eq!(Error::from(Status::internal("")).to_string(), "no details (Internal)");
    }
}
