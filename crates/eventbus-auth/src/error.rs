//! What loading the authentication setup, validating permissions or authorizing a
//! request can fail with. Displays never contain a credential; causes are `#[source]`s
//! (print them with `eventbus_core::error_chain`).

use std::fmt;

use eventbus_core::{NameError, quoted};

/// Loading or reloading the principals file, the JWT keys or the settings failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A configured file could not be read.
    #[error("cannot read {path}")]
    Unreadable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The principals file is not valid YAML of the expected shape.
    #[error("cannot parse the principals file {path}")]
    Parse {
        path: String,
        #[source]
        source: serde_norway::Error,
    },
    /// A principal is malformed (no credential, a digest that is not SHA-256 hex, …).
    #[error("{path}: principal {name:?}: {problem}")]
    InvalidPrincipal { path: String, name: String, problem: String },
    /// The principals file names no principal: loading it would lock every client out.
    #[error(
        "{path} names no principal, which would refuse every client; fill it in, or set auth.allow_empty_principals: true"
    )]
    NoPrincipals { path: String },
    /// A principal's permissions break a rule.
    #[error("{path}: permissions of {name:?} are invalid")]
    InvalidPermissions {
        path: String,
        name: String,
        #[source]
        source: PermissionsError,
    },
    /// `auth.default_permissions` breaks a rule.
    #[error("auth.default_permissions is invalid")]
    InvalidDefaultPermissions {
        #[source]
        source: PermissionsError,
    },
    /// Two principals share a name.
    #[error("{path}: principal {name:?} is defined twice")]
    DuplicatePrincipal { path: String, name: String },
    /// Two principals share a `token_sha256` (so one token would mean two principals).
    #[error("{path}: principals {first:?} and {second:?} have the same token_sha256")]
    DuplicateToken { path: String, first: String, second: String },
    /// Two principals share a `cert_subject`.
    #[error("{path}: principals {first:?} and {second:?} have the same cert_subject {subject:?}")]
    DuplicateCertSubject { path: String, subject: String, first: String, second: String },
    /// A JWT key file holds no usable key.
    #[error("bad JWT key in {path}")]
    BadKey {
        path: String,
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// A JWT key file is empty.
    #[error("the JWT key file {path} is empty")]
    EmptyKey { path: String },
    /// The `auth` settings contradict themselves.
    #[error("auth.{key}: {problem}")]
    InvalidSettings { key: &'static str, problem: String },
}

/// A permissions block breaks a rule; the message names the offending entry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PermissionsError {
    /// A channel pattern does not parse (`field` is e.g. `publish.allow`).
    #[error("{field}[{index}] {:?}", source.name)]
    BadPattern {
        field: &'static str,
        index: usize,
        #[source]
        source: NameError,
    },
    /// An empty consumer-name glob (`field` is `consumers.allow` or `manage_consumers`).
    #[error("{field}[{index}] is empty; use \"*\" for every consumer")]
    EmptyGlob { field: &'static str, index: usize },
    /// `max_publish_rate` is not a positive finite number.
    #[error("max_publish_rate is {value}; it must be a positive number of events per second")]
    BadRate { value: f64 },
}

/// Why a subscription filter is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusalReason {
    /// No allow pattern covers every channel the filter can match (or the filter does
    /// not parse, which nothing covers).
    NotCovered,
    /// The filter can match a channel that this deny pattern matches.
    Denied { deny: String },
}

/// A subscription filter the principal may not use. Safe to show the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// The refused channel or pattern, as requested.
    pub filter: String,
    pub reason: RefusalReason,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            RefusalReason::NotCovered => write!(f, "not allowed to subscribe to {}", quoted(&self.filter)),
            RefusalReason::Denied { deny } => {
                write!(f, "not allowed to subscribe to {}: it overlaps the denied {deny:?}", quoted(&self.filter))
            }
        }
    }
}
