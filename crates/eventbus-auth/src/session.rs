//! Session tokens (docs/web.md): short-lived bearer tokens the broker mints for an
//! authenticated caller (`POST /v1/tokens`), carrying that caller's name and rights,
//! for where a long-lived credential must not go — a URL, since a browser's
//! `EventSource` sends no headers.
//!
//! A session token is `ebs_` and an HS256 JWT signed with the broker's session key:
//! `auth.session_tokens.secret_file` (shared by a fleet, so any instance accepts what
//! another minted), else a random key of this process.
//!
//! A session token is only as good as the credential it was minted with: it names that
//! credential ([`Origin`]), and each use checks it is still accepted and meets the
//! rights the token carries with those its principal has now (docs/security.md).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::authenticator::AuthFailure;
use crate::error::AuthError;
use crate::permissions::{CompiledPermissions, Permissions};
use crate::principal::{CredentialKind, Principal};
use crate::settings::SessionSettings;

/// What every session token starts with.
pub const SESSION_PREFIX: &str = "ebs_";
/// Shortest session key read from a file.
const MIN_KEY_BYTES: usize = 32;

/// Mints and verifies session tokens.
pub(crate) struct SessionTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    ttl: Duration,
    /// SHA-256 of the key: mixed into [`SessionTokens::seal`]ed fingerprints.
    seal_key: [u8; 32],
}

impl std::fmt::Debug for SessionTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTokens").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    iat: u64,
    /// The rights of the principal it was minted for.
    eventbus: Permissions,
    /// [`Origin::credential`], in hex.
    #[serde(default)]
    cred: String,
    /// [`Origin::default_rights`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dflt: bool,
}

/// The credential a session token was minted with, checked again on each use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// For a principal of the principals file, a fingerprint of its token or
    /// certificate subject; for a JWT subject, a fingerprint of the JWT keys and claim
    /// rules that verified it. Empty when none could be taken: the token is refused.
    pub(crate) credential: Vec<u8>,
    /// The rights were `auth.default_permissions` (a JWT without an `eventbus` claim),
    /// so they meet the defaults of the moment.
    pub(crate) default_rights: bool,
}

/// What a verified session token says; its rights are not yet met with the current ones.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) name: String,
    pub(crate) rights: CompiledPermissions,
    pub(crate) expires_at: SystemTime,
    pub(crate) origin: Origin,
}

impl SessionTokens {
    pub(crate) fn load(settings: &SessionSettings) -> Result<Self, AuthError> {
        if settings.ttl_ms == 0 {
            return Err(AuthError::InvalidSettings {
                key: "session_tokens.ttl_ms",
                problem: "must be positive".into(),
            });
        }
        let key = match settings.secret_file.as_str() {
            "" => {
                use rand::RngCore as _;
                let mut key = vec![0u8; 32];
                rand::thread_rng().fill_bytes(&mut key);
                key
            }
            path => {
                let mut key =
                    std::fs::read(path).map_err(|source| AuthError::Unreadable { path: path.into(), source })?;
                while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
                    key.pop();
                }
                if key.len() < MIN_KEY_BYTES {
                    return Err(AuthError::InvalidSettings {
                        key: "session_tokens.secret_file",
                        problem: format!(
                            "{path} holds {} bytes; a session key has at least {MIN_KEY_BYTES}",
                            key.len()
                        ),
                    });
                }
                key
            }
        };
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "sub"]);
        use sha2::Digest as _;
        Ok(Self {
            seal_key: sha2::Sha256::digest(&key).into(),
            encoding: EncodingKey::from_secret(&key),
            decoding: DecodingKey::from_secret(&key),
            validation,
            ttl: Duration::from_millis(settings.ttl_ms),
        })
    }

    /// `fingerprint` as a session token may carry it: a digest keyed with the session
    /// key, so that a token (which may sit in a URL, and so in a log) tells nothing of
    /// what it names, yet every instance sharing the key computes the same.
    pub(crate) fn seal(&self, fingerprint: &[u8]) -> Vec<u8> {
        use sha2::{Digest as _, Sha256};
        Sha256::new().chain_update(self.seal_key).chain_update(fingerprint).finalize()[..16].to_vec()
    }

    /// A token for `principal`, valid for `ttl` (at most the configured one, which is
    /// also the default), and when it expires. A principal whose own credential
    /// expires sooner gets a token that expires with it.
    pub(crate) fn mint(&self, principal: &Principal, origin: &Origin, ttl: Option<Duration>) -> (String, SystemTime) {
        let now = SystemTime::now();
        let mut expires = now + ttl.unwrap_or(self.ttl).min(self.ttl);
        if let Some(credential) = principal.expires_at {
            expires = expires.min(credential);
        }
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let claims = Claims {
            sub: principal.name.clone(),
            exp: secs(expires),
            iat: secs(now),
            eventbus: Permissions::clone(&principal.permissions),
            cred: hex::encode(&origin.credential),
            dflt: origin.default_rights,
        };
        // Encoding plain claims with an HMAC key cannot fail.
        let jwt = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding).unwrap_or_default();
        (format!("{SESSION_PREFIX}{jwt}"), UNIX_EPOCH + Duration::from_secs(secs(expires)))
    }

    /// What a session token (without its prefix) says, once its signature and expiry
    /// are checked.
    pub(crate) fn verify(&self, jwt: &str) -> Result<Claimed, AuthFailure> {
        let data =
            jsonwebtoken::decode::<Claims>(jwt, &self.decoding, &self.validation).map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthFailure::Expired,
                ErrorKind::InvalidSignature => AuthFailure::BadSignature,
                ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => AuthFailure::InvalidClaims,
                _ => AuthFailure::Malformed,
            })?;
        let Claims { sub, exp, eventbus, cred, dflt, .. } = data.claims;
        let rights = eventbus.compile().map_err(|_| AuthFailure::InvalidClaims)?;
        let credential = hex::decode(cred).map_err(|_| AuthFailure::InvalidClaims)?;
        Ok(Claimed {
            name: sub,
            rights,
            expires_at: UNIX_EPOCH + Duration::from_secs(exp),
            origin: Origin { credential, default_rights: dflt },
        })
    }
}

impl Claimed {
    /// The session's principal, with the rights both the token and `now` (its
    /// principal's current rights) grant.
    pub(crate) fn principal(self, now: &Arc<CompiledPermissions>) -> Arc<Principal> {
        Arc::new(Principal {
            name: self.name,
            permissions: Arc::new(self.rights.intersect(now)),
            source: CredentialKind::Session,
            expires_at: Some(self.expires_at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, permissions: Permissions) -> Principal {
        Principal {
            name: name.into(),
            permissions: Arc::new(permissions.compile().unwrap()),
            source: CredentialKind::Token,
            expires_at: None,
        }
    }

    fn origin() -> Origin {
        Origin { credential: vec![1, 2, 3], default_rights: false }
    }

    #[test]
    fn a_token_carries_the_name_and_the_rights_and_expires() {
        let tokens = SessionTokens::load(&SessionSettings::default()).unwrap();
        let mut rights = Permissions::default();
        rights.subscribe.allow = vec!["orders.>".into()];
        let (token, expires) =
            tokens.mint(&principal("alice", rights.clone()), &origin(), Some(Duration::from_secs(60)));
        assert!(token.starts_with(SESSION_PREFIX));
        let until = expires.duration_since(SystemTime::now()).unwrap();
        assert!(until <= Duration::from_secs(60) && until > Duration::from_secs(55), "{until:?}");
        let back = tokens.verify(&token[SESSION_PREFIX.len()..]).unwrap();
        assert_eq!(back.origin, origin());
        let back = back.principal(&Arc::new(CompiledPermissions::all()));
        assert_eq!(back.name, "alice");
        assert_eq!(back.source, CredentialKind::Session);
        assert_eq!(*Permissions::clone(&back.permissions).subscribe.allow, ["orders.>"]);
        assert!(!back.permissions.is_admin());
    }

    #[test]
    fn another_key_a_forgery_or_an_old_token_is_refused() {
        let ours = SessionTokens::load(&SessionSettings::default()).unwrap();
        let theirs = SessionTokens::load(&SessionSettings::default()).unwrap();
        let (token, _) = theirs.mint(&principal("mallory", Permissions::all()), &origin(), None);
        assert_eq!(ours.verify(&token[SESSION_PREFIX.len()..]).unwrap_err(), AuthFailure::BadSignature);
        assert_eq!(ours.verify("not.a.jwt").unwrap_err(), AuthFailure::Malformed);
        let expired = Principal {
            expires_at: Some(SystemTime::now() - Duration::from_secs(5)),
            ..principal("bob", Permissions::default())
        };
        let (token, _) = ours.mint(&expired, &origin(), None);
        assert_eq!(ours.verify(&token[SESSION_PREFIX.len()..]).unwrap_err(), AuthFailure::Expired);
    }

    #[test]
    fn a_shared_key_file_lets_any_instance_verify() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("session.key");
        std::fs::write(&file, "k".repeat(40) + "\n").unwrap();
        let settings = SessionSettings { secret_file: file.to_str().unwrap().into(), ..SessionSettings::default() };
        let (a, b) = (SessionTokens::load(&settings).unwrap(), SessionTokens::load(&settings).unwrap());
        let (token, _) = a.mint(&principal("carol", Permissions::default()), &origin(), None);
        assert_eq!(b.verify(&token[SESSION_PREFIX.len()..]).unwrap().name, "carol");
        std::fs::write(&file, "short").unwrap();
        let err = SessionTokens::load(&settings).unwrap_err().to_string();
        assert!(err.contains("session_tokens.secret_file") && err.contains("32"), "{err}");
    }
}
