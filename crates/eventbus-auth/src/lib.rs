//! # Socle EventBus authentication and authorization
//!
//! Who is calling and what they may do (docs/security.md), as a library: no network
//! code. The server hands in the bearer value and the client-certificate subjects,
//! gets a [`Principal`] back, and asks its permissions before each operation.
//!
//! - [`settings`]: the `auth` configuration section.
//! - [`authenticator`]: credentials in, a [`Principal`] out; hot reload; rate limiters.
//! - [`principals`]: the principals file (static tokens, certificate subjects).
//! - `jwt`: JWT verification (HS256, RS256, ES256) and the cache of verified tokens.
//! - [`principal`]: a principal: name, compiled permissions, how it authenticated.
//! - [`permissions`]: allow/deny channel patterns (deny wins), consumer globs, admin, limits.
//! - [`pattern`]: exact covering and overlap of channel patterns.
//! - [`glob`]: consumer-name globs.
//! - [`ratelimit`]: the per-principal publish token bucket.
//! - [`token`]: minting static tokens and their SHA-256.
//! - [`error`]: load errors, permission errors and subscription refusals.

pub mod authenticator;
pub mod error;
pub mod glob;
mod jwt;
pub mod pattern;
pub mod permissions;
pub mod principal;
pub mod principals;
pub mod ratelimit;
pub mod session;
pub mod settings;
pub mod token;

pub use authenticator::{AuthFailure, Authenticator};
pub use error::{AuthError, PermissionsError, Refusal, RefusalReason};
pub use jwt::JWT_PREFIX;
pub use pattern::{covers, overlaps};
pub use permissions::{AllowDeny, CompiledPermissions, ConsumerRights, Permissions};
pub use principal::{CredentialKind, Principal};
pub use ratelimit::RateLimiter;
pub use session::SESSION_PREFIX;
pub use settings::{AuthSettings, JwtSettings, SessionSettings};
pub use token::{new_token, token_sha256};
