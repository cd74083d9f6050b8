//! Credentials in, a [`Principal`] out (docs/security.md), with hot reload.
//!
//! The loaded state (principals by token digest and by certificate subject, the JWT
//! keys and their cache) sits behind an [`ArcSwap`]: every call reads it without a
//! lock, and a reload swaps in a fully validated replacement or leaves it alone.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::error::AuthError;
use crate::jwt::JWT_PREFIX;
use crate::jwt::JwtVerifier;
use crate::principal::{CredentialKind, Principal};
use crate::principals::{Binding, Directory, cert_binding, token_binding};
use crate::ratelimit::RateLimiter;
use crate::session::{Origin, SESSION_PREFIX, SessionTokens};
use crate::settings::AuthSettings;
use crate::token::digest;

/// Rate limiters kept at most; past it, those no caller holds are dropped.
const MAX_RATE_LIMITERS: usize = 65_536;

/// Why a request could not be authenticated. The display is safe to return to the
/// client: it never contains the credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AuthFailure {
    /// No bearer token and no client certificate.
    #[error("authentication required: send \"authorization: Bearer <token>\"")]
    Missing,
    /// The bearer value is empty, holds spaces or control characters, or is not a JWT.
    #[error("malformed bearer token")]
    Malformed,
    /// Neither a known static token nor (when JWT is configured) a JWT.
    #[error("unknown token")]
    UnknownToken,
    /// A JWT past its `exp` (plus leeway).
    #[error("token expired")]
    Expired,
    /// A JWT whose signature does not verify with the configured keys.
    #[error("token signature is invalid")]
    BadSignature,
    /// A JWT with a wrong or missing `iss`, `aud` or `sub`, an `nbf` in the future, or
    /// an invalid `eventbus` claim.
    #[error("token claims are invalid")]
    InvalidClaims,
    /// A client certificate whose subject no principal names.
    #[error("client certificate is not known")]
    UnknownCertificate,
    /// A session token whose credential is no longer accepted: its principal was
    /// removed, its token or certificate subject changed, or the JWT keys rotated.
    #[error("session token revoked: the credential it was minted with is no longer accepted")]
    Revoked,
}

impl AuthFailure {
    /// The `reason` label of `socle_eventbus_auth_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::UnknownToken => "unknown_token",
            Self::Expired => "expired",
            Self::BadSignature => "bad_signature",
            Self::InvalidClaims => "invalid_claims",
            Self::UnknownCertificate => "unknown_certificate",
            Self::Revoked => "revoked",
        }
    }
}

/// Authenticates requests. A cheap `Clone` handle: clones share state, reloads and
/// rate limiters.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` when authentication is off.
    settings: Option<AuthSettings>,
    state: ArcSwap<State>,
    generation: AtomicU64,
    /// Per principal name, kept across reloads so a reload does not refill buckets.
    limiters: Mutex<HashMap<String, Arc<RateLimiter>>>,
    /// `None` when authentication is off.
    sessions: Option<SessionTokens>,
}

/// Everything read from files, replaced whole on reload.
#[derive(Debug, Default)]
struct State {
    directory: Directory,
    jwt: Option<JwtVerifier>,
}

impl State {
    fn load(settings: &AuthSettings) -> Result<Self, AuthError> {
        let defaults = Arc::new(
            settings.default_permissions.compile().map_err(|source| AuthError::InvalidDefaultPermissions { source })?,
        );
        let directory = match settings.principals_file.as_str() {
            "" => Directory::default(),
            path => Directory::load(path, &defaults, settings.allow_empty_principals)?,
        };
        let jwt = JwtVerifier::load(&settings.jwt, &defaults)?;
        if directory.tokens.is_empty() && directory.certs.is_empty() && jwt.is_none() {
            tracing::warn!(
                "authentication is on but no principal and no JWT key is configured: every request will be refused"
            );
        }
        Ok(Self { directory, jwt })
    }
}

impl State {
    /// What a session token minted now for `principal` is bound to; an empty
    /// credential (never accepted) when it cannot be told.
    fn origin(
        &self,
        sessions: &SessionTokens,
        principal: &Principal,
        bearer: Option<&str>,
        subjects: &[String],
    ) -> Origin {
        let credential = match principal.source {
            CredentialKind::Token => bearer.map(|token| token_binding(&digest(token)).to_vec()),
            CredentialKind::Certificate => subjects
                .iter()
                .find(|s| self.directory.certs.get(*s).is_some_and(|p| p.name == principal.name))
                .map(|s| cert_binding(s).to_vec()),
            CredentialKind::Jwt => match &self.jwt {
                Some(jwt) => {
                    let default_rights = Arc::ptr_eq(&principal.permissions, jwt.defaults());
                    return Origin { credential: sessions.seal(jwt.fingerprint()), default_rights };
                }
                None => None,
            },
            CredentialKind::Session | CredentialKind::Anonymous => None,
        };
        Origin { credential: credential.unwrap_or_default(), default_rights: false }
    }

    /// The principal of a session token: refused once the credential it was minted
    /// with is no longer accepted; its rights are those of the token that its
    /// principal still has.
    fn session(&self, sessions: &SessionTokens, jwt: &str) -> Result<Arc<Principal>, AuthFailure> {
        let claimed = sessions.verify(jwt)?;
        let origin = &claimed.origin;
        if claimed.name.starts_with(JWT_PREFIX) {
            let verifier = self.jwt.as_ref().ok_or(AuthFailure::Revoked)?;
            if origin.credential != sessions.seal(verifier.fingerprint()) {
                return Err(AuthFailure::Revoked);
            }
            // A JWT's own rights cannot change before it expires, which the session does not outlive.
            let now = match origin.default_rights {
                true => Arc::clone(verifier.defaults()),
                false => Arc::new(claimed.rights.clone()),
            };
            return Ok(claimed.principal(&now));
        }
        let binding: Binding = origin.credential.as_slice().try_into().map_err(|_| AuthFailure::Revoked)?;
        match self.directory.bindings.get(&binding) {
            Some(principal) if principal.name == claimed.name => {
                let now = Arc::clone(&principal.permissions);
                Ok(claimed.principal(&now))
            }
            _ => Err(AuthFailure::Revoked),
        }
    }
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.load();
        f.debug_struct("Authenticator")
            .field("enabled", &self.enabled())
            .field("generation", &self.generation())
            .field("principals", &state.directory.len())
            .field("jwt", &state.jwt)
            .finish()
    }
}

impl Authenticator {
    /// Loads the principals file and JWT keys named by `settings`, validating every
    /// entry. With `settings.enabled` false nothing is read and this is [`Self::disabled`].
    pub fn load(settings: &AuthSettings) -> Result<Authenticator, AuthError> {
        if !settings.enabled {
            return Ok(Self::disabled());
        }
        let state = State::load(settings)?;
        let sessions = SessionTokens::load(&settings.session_tokens)?;
        tracing::info!(principals = state.directory.len(), jwt = state.jwt.is_some(), "authentication on");
        Ok(Self::new(Some(settings.clone()), state, Some(sessions)))
    }

    /// Authentication off: every request is [`Principal::anonymous`].
    pub fn disabled() -> Authenticator {
        Self::new(None, State::default(), None)
    }

    fn new(settings: Option<AuthSettings>, state: State, sessions: Option<SessionTokens>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                state: ArcSwap::from_pointee(state),
                generation: AtomicU64::new(0),
                limiters: Mutex::new(HashMap::new()),
                sessions,
            }),
        }
    }

    /// Whether credentials are required.
    pub fn enabled(&self) -> bool {
        self.inner.settings.is_some()
    }

    /// Whether `/metrics`, `/healthz` and `/readyz` require credentials too.
    pub fn protect_metrics(&self) -> bool {
        self.inner.settings.as_ref().is_some_and(|s| s.protect_metrics)
    }

    /// Re-reads the principals file and JWT keys. On error the previous state stays in
    /// force and the error is returned for the caller to log; on success the JWT cache
    /// starts empty and [`Self::generation`] goes up by one.
    pub fn reload(&self) -> Result<(), AuthError> {
        if let Some(settings) = &self.inner.settings {
            let state = State::load(settings)?;
            self.inner.state.store(Arc::new(state));
        }
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// How many successful reloads happened: a principal obtained before a change of
    /// generation may have lost rights.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Authenticates one request.
    ///
    /// `bearer`: the raw value after "Bearer " (None when absent); `cert_subjects`: CN
    /// and DNS SANs of a verified client certificate (empty when none). A bearer, when
    /// present, decides alone; otherwise a certificate subject some principal names.
    pub fn authenticate(&self, bearer: Option<&str>, cert_subjects: &[String]) -> Result<Arc<Principal>, AuthFailure> {
        if !self.enabled() {
            return Ok(Principal::anonymous());
        }
        let state = self.inner.state.load();
        match bearer {
            Some(token) => {
                if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(AuthFailure::Malformed);
                }
                if let Some(jwt) = token.strip_prefix(SESSION_PREFIX)
                    && let Some(sessions) = &self.inner.sessions
                {
                    return state.session(sessions, jwt);
                }
                let digest = digest(token);
                if let Some(principal) = state.directory.tokens.get(&digest) {
                    return Ok(Arc::clone(principal));
                }
                match &state.jwt {
                    Some(jwt) if token.bytes().filter(|&b| b == b'.').count() == 2 => jwt.verify(token, &digest),
                    _ => Err(AuthFailure::UnknownToken),
                }
            }
            None if cert_subjects.is_empty() => Err(AuthFailure::Missing),
            None => cert_subjects
                .iter()
                .find_map(|subject| state.directory.certs.get(subject))
                .map(Arc::clone)
                .ok_or(AuthFailure::UnknownCertificate),
        }
    }

    /// The principal of the principals file named `name`, as the last reload left it;
    /// `None` when no principal has that name (JWT subjects never do: they exist only
    /// while a call presents their token).
    pub fn principal_named(&self, name: &str) -> Option<Arc<Principal>> {
        let state = self.inner.state.load();
        let directory = &state.directory;
        directory.tokens.values().chain(directory.certs.values()).find(|p| p.name == name).map(Arc::clone)
    }

    /// A session token for `principal` (docs/web.md), valid for `ttl` or the configured
    /// lifetime, whichever is shorter, and when it expires; `None` with authentication
    /// off (no token is needed). `bearer` and `cert_subjects` are the credential
    /// `principal` was authenticated with, as given to [`Self::authenticate`]: the token
    /// is accepted only while that credential is.
    pub fn mint_session(
        &self,
        principal: &Principal,
        bearer: Option<&str>,
        cert_subjects: &[String],
        ttl: Option<std::time::Duration>,
    ) -> Option<(String, std::time::SystemTime)> {
        let sessions = self.inner.sessions.as_ref()?;
        let origin = self.inner.state.load().origin(sessions, principal, bearer, cert_subjects);
        Some(sessions.mint(principal, &origin, ttl))
    }

    /// The publish-rate bucket of `principal` (by name), or `None` without a
    /// `max_publish_rate`. The same bucket is returned across reloads, with its rate
    /// brought up to date.
    pub fn rate_limiter(&self, principal: &Principal) -> Option<Arc<RateLimiter>> {
        let rate = principal.permissions.max_publish_rate?;
        let mut limiters = self.inner.limiters.lock();
        if let Some(limiter) = limiters.get(&principal.name) {
            if limiter.rate() != rate {
                limiter.set_rate(rate);
            }
            return Some(Arc::clone(limiter));
        }
        if limiters.len() >= MAX_RATE_LIMITERS {
            limiters.retain(|_, l| Arc::strong_count(l) > 1);
        }
        let limiter = Arc::new(RateLimiter::new(rate));
        limiters.insert(principal.name.clone(), Arc::clone(&limiter));
        Some(limiter)
    }
}
