//! Who is calling: a name, compiled permissions and how they proved it.

use std::sync::{Arc, LazyLock};

use crate::permissions::CompiledPermissions;

/// How a principal authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CredentialKind {
    /// A static bearer token from the principals file.
    Token,
    /// A signed JWT.
    Jwt,
    /// A verified client certificate whose subject the principals file names.
    Certificate,
    /// A session token the broker minted (`POST /v1/tokens`).
    Session,
    /// Authentication is off.
    Anonymous,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The principal's name (JWT `sub`); `""` for [`Principal::anonymous`]. Recorded as
    /// the owner of its subscriptions and consumers.
    pub name: String,
    /// What it may do, parsed once when the principal was loaded or its JWT verified.
    pub permissions: Arc<CompiledPermissions>,
    /// How it authenticated.
    pub source: CredentialKind,
    /// When its credential stops being accepted (a JWT's `exp` plus the leeway): open
    /// streams end then. `None` for credentials that do not expire.
    pub expires_at: Option<std::time::SystemTime>,
}

static ANONYMOUS: LazyLock<Arc<Principal>> = LazyLock::new(|| {
    Arc::new(Principal {
        name: String::new(),
        permissions: Arc::new(CompiledPermissions::all()),
        source: CredentialKind::Anonymous,
        expires_at: None,
    })
});

impl Principal {
    /// Everyone when authentication is off: no name, every right, no limits.
    pub fn anonymous() -> Arc<Principal> {
        Arc::clone(&ANONYMOUS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_may_do_everything() {
        let anon = Principal::anonymous();
        assert_eq!(anon.name, "");
        assert_eq!(anon.source, CredentialKind::Anonymous);
        assert!(anon.permissions.is_admin() && anon.permissions.can_publish("x"));
        assert!(anon.permissions.max_publish_rate.is_none());
        assert!(Arc::ptr_eq(&anon, &Principal::anonymous()));
    }
}
