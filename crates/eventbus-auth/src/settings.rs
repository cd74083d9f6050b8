//! The `auth` section of the server configuration (docs/security.md).

use serde::{Deserialize, Serialize};

use crate::permissions::Permissions;

/// Leeway on `exp` and `nbf` when none is configured: clocks drift.
pub const DEFAULT_JWT_LEEWAY_SECS: u64 = 30;

/// `auth`: whether credentials are required, where principals and JWT keys live, and
/// what a principal without permissions of its own may do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Off by default so the quick start stays one command.
    pub enabled: bool,
    /// YAML file of principals (static tokens and certificate subjects); `""` = none.
    pub principals_file: String,
    /// JWT verification; off while no key file is set.
    pub jwt: JwtSettings,
    /// For JWT principals whose token has no `eventbus` claim. Nothing by default.
    pub default_permissions: Permissions,
    /// Require credentials on `/metrics`, `/healthz` and `/readyz` too.
    pub protect_metrics: bool,
    /// Accept a principals file that names nobody (at start or on reload); refused by
    /// default, since it refuses every client.
    pub allow_empty_principals: bool,
    /// Most durable consumers a principal owns when its permissions set no
    /// `max_consumers` (0 = no bound).
    pub default_max_consumers: u32,
    /// Most open subscriptions (gRPC Subscribe and Consume streams, Server-Sent Events
    /// streams) of a principal whose permissions set no `max_subscriptions` (0 = no bound).
    pub default_max_subscriptions: u32,
    /// Most bytes queued across the subscriptions of a principal whose permissions set no
    /// `max_queued_bytes` (0 = no bound but `eventbus.max_queued_bytes`).
    pub default_max_queued_bytes: u64,
    /// Short-lived tokens minted by `POST /v1/tokens` (docs/web.md).
    pub session_tokens: SessionSettings,
}

/// `auth.session_tokens`: the key that signs session tokens and how long they last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionSettings {
    /// File holding the signing key (32 bytes or more; trailing whitespace ignored),
    /// shared by every instance of a fleet; `""` = a random key per process, so a token
    /// is accepted only by the instance that minted it.
    pub secret_file: String,
    /// Lifetime of a token, also the longest one a caller may ask for.
    pub ttl_ms: u64,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self { secret_file: String::new(), ttl_ms: 300_000 }
    }
}

/// `auth.jwt`: keys and the claims a token must carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtSettings {
    /// File holding the HS256 shared secret (trailing newline ignored); `""` = none.
    pub hs256_secret_file: String,
    /// PEM public key for RS256 (RSA key) or ES256 (P-256 key); the type is detected.
    pub public_key_file: String,
    /// Required `iss` when set.
    pub issuer: String,
    /// Required `aud` when set.
    pub audience: String,
    /// Seconds of tolerance on `exp` and `nbf`.
    pub leeway_secs: u64,
}

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            hs256_secret_file: String::new(),
            public_key_file: String::new(),
            issuer: String::new(),
            audience: String::new(),
            leeway_secs: DEFAULT_JWT_LEEWAY_SECS,
        }
    }
}

impl JwtSettings {
    /// Whether any key is configured, i.e. bearer JWTs are accepted.
    pub fn configured(&self) -> bool {
        !self.hs256_secret_file.is_empty() || !self.public_key_file.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_off_and_empty() {
        let s: AuthSettings = serde_norway::from_str("{}").unwrap();
        assert_eq!(s, AuthSettings::default());
        assert!(!s.enabled && !s.protect_metrics && !s.jwt.configured());
        assert_eq!(s.jwt.leeway_secs, 30);
        assert_eq!(s.default_permissions, Permissions::default());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(serde_norway::from_str::<AuthSettings>("enable: true").is_err());
        assert!(serde_norway::from_str::<AuthSettings>("jwt: { secret: x }").is_err());
        let s: AuthSettings = serde_norway::from_str("jwt: { issuer: me }").unwrap();
        assert_eq!((s.jwt.issuer.as_str(), s.jwt.leeway_secs), ("me", 30));
    }
}
