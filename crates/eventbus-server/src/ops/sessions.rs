//! Session tokens: short-lived credentials a browser page carries where it cannot
//! send a header.

use std::time::{Duration, SystemTime};

use eventbus_auth::CredentialKind;

use super::{Ops, Refusal};
use crate::access::Caller;

impl Ops {
    /// A session token with the caller's name and rights, living `ttl` when that is
    /// shorter than the configured lifetime; `None` with authentication off (no token
    /// is needed).
    pub(crate) fn mint_session(
        &self,
        caller: &Caller,
        ttl: Option<Duration>,
    ) -> Result<Option<(String, SystemTime)>, Refusal> {
        if ttl == Some(Duration::ZERO) {
            return Err(Refusal::BadRequest("ttl_ms must be positive".into()));
        }
        if caller.principal().source == CredentialKind::Session {
            return Err(Refusal::Forbidden(
                "a session token cannot mint another: ask with the credential it was minted from",
            ));
        }
        Ok(self.access.mint_session(caller, ttl))
    }
}
