//! JWT bearer tokens (docs/security.md): HS256 with a shared secret, RS256 or ES256
//! with a PEM public key; `exp` and `sub` required, `nbf` honoured, issuer and audience
//! checked when configured. `sub` names the principal; the `eventbus` claim, when
//! present, holds its permissions.
//!
//! Verified tokens are cached until their `exp`, keyed by their SHA-256, so that an
//! authentication per call does not verify a signature per call.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::authenticator::AuthFailure;
use crate::error::AuthError;
use crate::permissions::{CompiledPermissions, Permissions};
use crate::principal::{CredentialKind, Principal};
use crate::settings::JwtSettings;

/// What the name of a JWT's principal starts with (then its `sub`); names in the
/// principals file cannot.
pub const JWT_PREFIX: &str = "jwt:";
/// Verified tokens kept at most; past it, expired entries go, then all of them.
const CACHE_CAPACITY: usize = 4096;
/// Largest accepted `leeway_secs`: a day of clock skew is already a misconfiguration.
const MAX_LEEWAY_SECS: u64 = 86_400;

/// The configured keys and the cache of tokens they verified.
pub(crate) struct JwtVerifier {
    keys: Vec<VerifyingKey>,
    /// SHA-256 of the keys and the claim rules (issuer, audience): a session token
    /// minted for a JWT subject is accepted while it is unchanged.
    fingerprint: [u8; 32],
    defaults: Arc<CompiledPermissions>,
    /// Read on every call, written on a miss: read-mostly.
    cache: RwLock<HashMap<[u8; 32], Verified>>,
}

struct VerifyingKey {
    algorithm: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

#[derive(Debug)]
struct Verified {
    principal: Arc<Principal>,
    /// The token's `exp`: the entry is good strictly before it.
    exp: u64,
}

/// The claims read from a verified token. Loose types, so that a claim of the wrong
/// type is reported as invalid claims rather than as a malformed token.
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    sub: Option<Value>,
    #[serde(default)]
    exp: Option<Value>,
    /// Kept as written, so that a key repeated inside it is refused rather than one of
    /// its values silently winning.
    #[serde(default)]
    eventbus: Option<Box<serde_json::value::RawValue>>,
}

impl fmt::Debug for JwtVerifier {
    /// Names the algorithms only: keys are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let algorithms: Vec<Algorithm> = self.keys.iter().map(|k| k.algorithm).collect();
        f.debug_struct("JwtVerifier")
            .field("algorithms", &algorithms)
            .field("cached", &self.cache.read().len())
            .finish()
    }
}

impl JwtVerifier {
    /// Reads the key files; `None` when no key is configured.
    pub(crate) fn load(settings: &JwtSettings, defaults: &Arc<CompiledPermissions>) -> Result<Option<Self>, AuthError> {
        if !settings.configured() {
            return Ok(None);
        }
        if settings.leeway_secs > MAX_LEEWAY_SECS {
            return Err(AuthError::InvalidSettings {
                key: "jwt.leeway_secs",
                problem: format!("{} is more than a day ({MAX_LEEWAY_SECS})", settings.leeway_secs),
            });
        }
        let mut keys = Vec::new();
        let mut fingerprint = Sha256::new();
        for rule in [&settings.issuer, &settings.audience] {
            fingerprint.update((rule.len() as u64).to_be_bytes());
            fingerprint.update(rule.as_bytes());
        }
        if !settings.hs256_secret_file.is_empty() {
            let path = &settings.hs256_secret_file;
            let secret = read_key(path)?;
            let secret = secret.trim_ascii_end();
            if secret.is_empty() {
                return Err(AuthError::EmptyKey { path: path.clone() });
            }
            if secret.len() < 32 {
                tracing::warn!(path = %path, "the HS256 secret is shorter than 32 bytes; use at least 256 random bits");
            }
            fingerprint.update(b"hs256");
            fingerprint.update((secret.len() as u64).to_be_bytes());
            fingerprint.update(secret);
            keys.push(VerifyingKey::new(Algorithm::HS256, DecodingKey::from_secret(secret), settings));
        }
        if !settings.public_key_file.is_empty() {
            let path = &settings.public_key_file;
            let pem = read_key(path)?;
            if pem.trim_ascii().is_empty() {
                return Err(AuthError::EmptyKey { path: path.clone() });
            }
            // The PEM says which kind of key it holds: an EC key means ES256, else RSA.
            let key = match DecodingKey::from_ec_pem(&pem) {
                Ok(key) => VerifyingKey::new(Algorithm::ES256, key, settings),
                Err(_) => {
                    let key = DecodingKey::from_rsa_pem(&pem)
                        .map_err(|source| AuthError::BadKey { path: path.clone(), source })?;
                    VerifyingKey::new(Algorithm::RS256, key, settings)
                }
            };
            fingerprint.update(b"pem");
            fingerprint.update(pem.trim_ascii());
            keys.push(key);
        }
        Ok(Some(Self {
            keys,
            fingerprint: fingerprint.finalize().into(),
            defaults: Arc::clone(defaults),
            cache: RwLock::new(HashMap::new()),
        }))
    }

    /// A digest of the keys and the claim rules.
    pub(crate) fn fingerprint(&self) -> &[u8; 32] {
        &self.fingerprint
    }

    /// The rights of a subject whose token has no `eventbus` claim.
    pub(crate) fn defaults(&self) -> &Arc<CompiledPermissions> {
        &self.defaults
    }

    /// Verifies `token` (whose SHA-256 is `digest`) or answers from the cache.
    pub(crate) fn verify(&self, token: &str, digest: &[u8; 32]) -> Result<Arc<Principal>, AuthFailure> {
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(hit) = self.cache.read().get(digest).filter(|hit| now < hit.exp) {
            return Ok(Arc::clone(&hit.principal));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| classify(e.kind()))?;
        // No extension is understood here, so a token that makes one critical cannot
        // be honoured (RFC 7515, section 4.1.11).
        if header.crit.is_some() {
            return Err(AuthFailure::InvalidClaims);
        }
        // A token signed with an algorithm no configured key serves cannot be verified.
        let key = self.keys.iter().find(|k| k.algorithm == header.alg).ok_or(AuthFailure::BadSignature)?;
        let claims =
            jsonwebtoken::decode::<Claims>(token, &key.key, &key.validation).map_err(|e| classify(e.kind()))?.claims;
        // JWT subjects live in a namespace of their own: a token whose `sub` equals a
        // static principal's name is another principal, with other owners and limits.
        let name = match claims.sub {
            Some(Value::String(sub)) if !sub.is_empty() => format!("{JWT_PREFIX}{sub}"),
            _ => return Err(AuthFailure::InvalidClaims),
        };
        let permissions = match claims.eventbus {
            None => Arc::clone(&self.defaults),
            Some(raw) => Arc::new(
                serde_json::from_str::<Permissions>(raw.get())
                    .ok()
                    .and_then(|p| p.compile().ok())
                    .ok_or(AuthFailure::InvalidClaims)?,
            ),
        };
        let exp = claims.exp.as_ref().and_then(Value::as_u64).ok_or(AuthFailure::InvalidClaims)?;
        let leeway = key.validation.leeway;
        let expires_at = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(exp.saturating_add(leeway)));
        let principal = Arc::new(Principal { name, permissions, source: CredentialKind::Jwt, expires_at });
        self.remember(*digest, Verified { principal: Arc::clone(&principal), exp }, now);
        Ok(principal)
    }

    fn remember(&self, digest: [u8; 32], verified: Verified, now: u64) {
        let mut cache = self.cache.write();
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, v| now < v.exp);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(digest, verified);
    }
}

impl VerifyingKey {
    fn new(algorithm: Algorithm, key: DecodingKey, settings: &JwtSettings) -> Self {
        let mut validation = Validation::new(algorithm);
        let mut required = vec!["exp", "sub"];
        validation.leeway = settings.leeway_secs;
        validation.validate_nbf = true;
        if settings.issuer.is_empty() {
            validation.iss = None;
        } else {
            validation.set_issuer(&[&settings.issuer]);
            required.push("iss");
        }
        if settings.audience.is_empty() {
            // No audience configured: `aud` is not ours to judge.
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[&settings.audience]);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Self { algorithm, key, validation }
    }
}

fn read_key(path: &str) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::Unreadable { path: path.to_owned(), source })
}

/// Which failure a verification error is, as the client and the metrics see it.
fn classify(kind: &ErrorKind) -> AuthFailure {
    match kind {
        ErrorKind::ExpiredSignature => AuthFailure::Expired,
        ErrorKind::ImmatureSignature
        | ErrorKind::InvalidIssuer
        | ErrorKind::InvalidAudience
        | ErrorKind::InvalidSubject
        | ErrorKind::MissingRequiredClaim(_)
        | ErrorKind::InvalidClaimFormat(_) => AuthFailure::InvalidClaims,
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            AuthFailure::Malformed
        }
        _ => AuthFailure::BadSignature,
    }
}
