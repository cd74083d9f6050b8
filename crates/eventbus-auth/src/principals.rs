//! The principals file (docs/security.md): who may connect with a static token or a
//! client certificate, and with which permissions.
//!
//! ```yaml
//! principals:
//!   - name: orders-service
//!     token_sha256: "<hex SHA-256 of the token>"   # `eventbus auth new-token` prints it
//!     permissions: { publish: { allow: ["orders.>"] } }
//!   - name: billing
//!     cert_subject: billing.internal                # client certificate CN or DNS SAN
//! ```
//!
//! A principal without `permissions` gets `auth.default_permissions`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::AuthError;
use crate::permissions::{CompiledPermissions, Permissions};
use crate::principal::{CredentialKind, Principal};

/// The file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalsFile {
    #[serde(default)]
    pub principals: Vec<PrincipalEntry>,
}

/// One principal as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalEntry {
    pub name: String,
    /// Lowercase hex SHA-256 of its bearer token; the token itself is never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// Subject CN or DNS SAN of its client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_subject: Option<String>,
    /// Its own permissions; `auth.default_permissions` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<Permissions>,
}

/// The principals reachable by credential, built from a validated file.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    /// By SHA-256 of the token: the lookup hashes the presented token, so no plaintext
    /// token is ever kept, and no secret-dependent string comparison happens.
    pub(crate) tokens: HashMap<[u8; 32], Arc<Principal>>,
    pub(crate) certs: HashMap<String, Arc<Principal>>,
    /// By [`Binding`] of each token and certificate subject: what a session token
    /// minted with that credential finds its principal by.
    pub(crate) bindings: HashMap<Binding, Arc<Principal>>,
}

/// A fingerprint of one credential of the principals file, which a session token
/// carries: it names the credential without revealing it (a digest of the token's
/// digest, or of the certificate subject).
pub(crate) type Binding = [u8; 16];

/// The [`Binding`] of a static token whose SHA-256 is `digest`.
pub(crate) fn token_binding(digest: &[u8; 32]) -> Binding {
    binding(b"token", digest)
}

/// The [`Binding`] of a certificate subject.
pub(crate) fn cert_binding(subject: &str) -> Binding {
    binding(b"cert", subject.as_bytes())
}

fn binding(kind: &[u8], credential: &[u8]) -> Binding {
    use sha2::{Digest, Sha256};
    let full: [u8; 32] = Sha256::new().chain_update(kind).chain_update([0]).chain_update(credential).finalize().into();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

impl Directory {
    /// Reads, parses and validates `path`.
    /// Reads the principals file at `path`. A file naming nobody (empty, blank, or
    /// `principals: []`) is refused unless `allow_empty`: a truncated file written by
    /// mistake must not lock every client out on the next reload.
    pub(crate) fn load(path: &str, defaults: &Arc<CompiledPermissions>, allow_empty: bool) -> Result<Self, AuthError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| AuthError::Unreadable { path: path.to_owned(), source })?;
        if text.trim().is_empty() {
            return match allow_empty {
                true => Ok(Self::default()),
                false => Err(AuthError::NoPrincipals { path: path.to_owned() }),
            };
        }
        let file: PrincipalsFile =
            serde_norway::from_str(&text).map_err(|source| AuthError::Parse { path: path.to_owned(), source })?;
        if file.principals.is_empty() && !allow_empty {
            return Err(AuthError::NoPrincipals { path: path.to_owned() });
        }
        Self::build(path, file, defaults)
    }

    fn build(path: &str, file: PrincipalsFile, defaults: &Arc<CompiledPermissions>) -> Result<Self, AuthError> {
        let mut directory = Self::default();
        let mut names = HashSet::new();
        for entry in file.principals {
            let invalid = |problem: &str| AuthError::InvalidPrincipal {
                path: path.to_owned(),
                name: entry.name.clone(),
                problem: problem.to_owned(),
            };
            if entry.name.is_empty() {
                return Err(invalid("the name is empty"));
            }
            if entry.name.starts_with(crate::jwt::JWT_PREFIX) {
                return Err(invalid("names starting with `jwt:` are those of JWT subjects"));
            }
            if !names.insert(entry.name.clone()) {
                return Err(AuthError::DuplicatePrincipal { path: path.to_owned(), name: entry.name });
            }
            let digest = entry.token_sha256.as_deref().map(parse_digest).transpose().map_err(|()| {
                invalid("token_sha256 must be the 64 hex digits of a SHA-256 (see `eventbus auth new-token`)")
            })?;
            if entry.cert_subject.as_deref() == Some("") {
                return Err(invalid("cert_subject is empty"));
            }
            if digest.is_none() && entry.cert_subject.is_none() {
                return Err(invalid("it has neither token_sha256 nor cert_subject, so nobody can authenticate as it"));
            }
            let permissions = match &entry.permissions {
                Some(own) => Arc::new(own.compile().map_err(|source| AuthError::InvalidPermissions {
                    path: path.to_owned(),
                    name: entry.name.clone(),
                    source,
                })?),
                None => Arc::clone(defaults),
            };
            if let Some(digest) = digest {
                let principal = Arc::new(Principal {
                    name: entry.name.clone(),
                    permissions: Arc::clone(&permissions),
                    source: CredentialKind::Token,
                    expires_at: None,
                });
                directory.bindings.insert(token_binding(&digest), Arc::clone(&principal));
                if let Some(first) = directory.tokens.insert(digest, principal) {
                    return Err(AuthError::DuplicateToken {
                        path: path.to_owned(),
                        first: first.name.clone(),
                        second: entry.name,
                    });
                }
            }
            if let Some(subject) = entry.cert_subject {
                let principal = Arc::new(Principal {
                    name: entry.name.clone(),
                    permissions,
                    source: CredentialKind::Certificate,
                    expires_at: None,
                });
                directory.bindings.insert(cert_binding(&subject), Arc::clone(&principal));
                if let Some(first) = directory.certs.insert(subject.clone(), principal) {
                    return Err(AuthError::DuplicateCertSubject {
                        path: path.to_owned(),
                        subject,
                        first: first.name.clone(),
                        second: entry.name,
                    });
                }
            }
        }
        Ok(directory)
    }

    /// How many distinct principals the file named.
    pub(crate) fn len(&self) -> usize {
        let mut names: Vec<&str> = self.tokens.values().chain(self.certs.values()).map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }
}

/// 64 hex digits (either case) into the raw digest.
fn parse_digest(text: &str) -> Result<[u8; 32], ()> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(text, &mut digest).map_err(drop)?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::token_sha256;

    fn build(yaml: &str) -> Result<Directory, AuthError> {
        let file: PrincipalsFile =
            serde_norway::from_str(yaml).map_err(|source| AuthError::Parse { path: "p.yaml".into(), source })?;
        Directory::build("p.yaml", file, &Arc::new(Permissions::default().compile().unwrap()))
    }

    #[test]
    fn good_file() {
        let yaml = format!(
            "
principals:
  - name: orders
    token_sha256: {}
    permissions:
      publish: {{ allow: [\"orders.>\"] }}
      max_publish_rate: 100
  - name: billing
    cert_subject: billing.internal
  - name: both
    token_sha256: {}
    cert_subject: both.internal
",
            token_sha256("t1"),
            token_sha256("t2").to_uppercase()
        );
        let dir = build(&yaml).unwrap();
        assert_eq!(dir.len(), 3);
        let orders = &dir.tokens[&crate::token::digest("t1")];
        assert_eq!((orders.name.as_str(), orders.source), ("orders", CredentialKind::Token));
        assert!(orders.permissions.can_publish("orders.x"));
        assert_eq!(orders.permissions.max_publish_rate, Some(100.0));
        let billing = &dir.certs["billing.internal"];
        assert_eq!(billing.source, CredentialKind::Certificate);
        assert!(!billing.permissions.can_publish("orders.x"), "default permissions allow nothing");
        assert_eq!(dir.tokens[&crate::token::digest("t2")].name, "both");
        assert_eq!(dir.certs["both.internal"].name, "both");
    }

    #[test]
    fn unknown_field_is_rejected() {
        let err = build("principals:\n  - name: a\n    token: secret\n").unwrap_err();
        assert!(matches!(err, AuthError::Parse { .. }));
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("unknown field `token`"), "{cause}");
        assert!(matches!(build("users: []").unwrap_err(), AuthError::Parse { .. }));
    }

    #[test]
    fn names_of_jwt_subjects_are_refused() {
        let err = build("principals:\n  - name: 'jwt:alice'\n    cert_subject: a\n").unwrap_err();
        assert!(err.to_string().contains("jwt:"), "{err}");
    }

    #[test]
    fn bad_pattern_is_named() {
        let yaml =
            "principals:\n  - name: a\n    cert_subject: a\n    permissions: { subscribe: { allow: [\"x.>.y\"] } }\n";
        let err = build(yaml).unwrap_err();
        let chain = eventbus_core::error_chain(&err);
        assert!(chain.starts_with("p.yaml: permissions of \"a\" are invalid: subscribe.allow[0] \"x.>.y\""), "{chain}");
    }

    #[test]
    fn duplicates_are_rejected() {
        let err =
            build("principals:\n  - { name: a, cert_subject: x }\n  - { name: a, cert_subject: y }\n").unwrap_err();
        assert_eq!(err.to_string(), "p.yaml: principal \"a\" is defined twice");
        let digest = token_sha256("t");
        let yaml = format!(
            "principals:\n  - {{ name: a, token_sha256: {digest} }}\n  - {{ name: b, token_sha256: {digest} }}\n"
        );
        assert!(
            matches!(build(&yaml).unwrap_err(), AuthError::DuplicateToken { first, second, .. } if first == "a" && second == "b")
        );
        let err =
            build("principals:\n  - { name: a, cert_subject: x }\n  - { name: b, cert_subject: x }\n").unwrap_err();
        assert!(matches!(err, AuthError::DuplicateCertSubject { .. }));
    }

    #[test]
    fn entries_need_a_usable_credential() {
        for (yaml, problem) in [
            ("principals:\n  - { name: a }\n", "neither token_sha256 nor cert_subject"),
            ("principals:\n  - { name: a, token_sha256: abc }\n", "64 hex digits"),
            ("principals:\n  - { name: '', cert_subject: x }\n", "name is empty"),
            ("principals:\n  - { name: a, cert_subject: '' }\n", "cert_subject is empty"),
        ] {
            let err = build(yaml).unwrap_err();
            assert!(err.to_string().contains(problem), "{err}");
        }
    }
}
