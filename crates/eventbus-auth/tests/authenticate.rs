//! Authentication as the docs/security.md section describes it: static tokens, JWT
//! (HS256, RS256, ES256), client-certificate subjects, reload and rate limiters.

#![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

use std::path::Path;
use std::sync::Arc;

use eventbus_auth::{
    AuthError, AuthFailure, AuthSettings, Authenticator, CredentialKind, JwtSettings, Permissions, Principal,
    token_sha256,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tempfile::TempDir;

const SECRET: &str = "a-test-secret-of-at-least-32-bytes!";
const ORDERS_TOKEN: &str = "ebt_orders";

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_owned()
}

fn principals_yaml() -> String {
    format!(
        "
principals:
  - name: orders
    token_sha256: {}
    permissions:
      publish: {{ allow: [\"orders.>\"] }}
      max_publish_rate: 5
  - name: billing
    cert_subject: billing.internal
    permissions:
      subscribe: {{ allow: [\"billing.>\"] }}
",
        token_sha256(ORDERS_TOKEN)
    )
}

/// Auth on with the principals file above, an HS256 secret, issuer and audience set,
/// and default permissions that allow publishing to `public.>`.
fn setup() -> (TempDir, AuthSettings) {
    let dir = tempfile::tempdir().unwrap();
    let settings = AuthSettings {
        enabled: true,
        principals_file: write(dir.path(), "principals.yaml", &principals_yaml()),
        jwt: JwtSettings {
            hs256_secret_file: write(dir.path(), "secret", &format!("{SECRET}\n")),
            issuer: "socle".into(),
            audience: "eventbus".into(),
            ..JwtSettings::default()
        },
        default_permissions: Permissions {
            publish: eventbus_auth::AllowDeny { allow: vec!["public.>".into()], deny: vec![] },
            ..Permissions::default()
        },
        protect_metrics: true,
        default_max_consumers: 0,
        default_max_subscriptions: 0,
        allow_empty_principals: false,
        default_max_queued_bytes: 0,
        session_tokens: Default::default(),
    };
    (dir, settings)
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Claims that pass every check; tests change or remove one at a time.
fn good_claims() -> Value {
    json!({ "sub": "alice", "iss": "socle", "aud": "eventbus", "exp": now() + 600 })
}

fn hs256(claims: &Value) -> String {
    sign(Algorithm::HS256, &EncodingKey::from_secret(SECRET.as_bytes()), claims)
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().unwrap().remove(key);
    claims
}

fn bearer(auth: &Authenticator, token: &str) -> Result<Arc<Principal>, AuthFailure> {
    auth.authenticate(Some(token), &[])
}

#[test]
fn auth_off_makes_everyone_anonymous() {
    for auth in [Authenticator::disabled(), Authenticator::load(&AuthSettings::default()).unwrap()] {
        assert!(!auth.enabled() && !auth.protect_metrics());
        let p = auth.authenticate(None, &[]).unwrap();
        assert_eq!((p.name.as_str(), p.source), ("", CredentialKind::Anonymous));
        assert!(p.permissions.is_admin());
        assert!(auth.authenticate(Some("anything"), &[]).is_ok());
        assert!(auth.rate_limiter(&p).is_none());
    }
}

#[test]
fn static_tokens() {
    let (_dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    assert!(auth.enabled() && auth.protect_metrics());
    let orders = bearer(&auth, ORDERS_TOKEN).unwrap();
    assert_eq!((orders.name.as_str(), orders.source), ("orders", CredentialKind::Token));
    assert!(orders.permissions.can_publish("orders.created"));
    assert!(!orders.permissions.can_publish("billing.created"));

    assert_eq!(bearer(&auth, "ebt_someone_else").unwrap_err(), AuthFailure::UnknownToken);
    assert_eq!(auth.authenticate(None, &[]).unwrap_err(), AuthFailure::Missing);
    for malformed in ["", "two words", "tab\there", "é"] {
        assert_eq!(bearer(&auth, malformed).unwrap_err(), AuthFailure::Malformed, "{malformed:?}");
    }
}

#[test]
fn failures_have_metric_labels_and_never_echo_the_credential() {
    let failures = [
        (AuthFailure::Missing, "missing"),
        (AuthFailure::Malformed, "malformed"),
        (AuthFailure::UnknownToken, "unknown_token"),
        (AuthFailure::Expired, "expired"),
        (AuthFailure::BadSignature, "bad_signature"),
        (AuthFailure::InvalidClaims, "invalid_claims"),
        (AuthFailure::UnknownCertificate, "unknown_certificate"),
        (AuthFailure::Revoked, "revoked"),
    ];
    for (failure, label) in failures {
        assert_eq!(failure.reason(), label);
        assert!(!failure.to_string().contains("ebt_"), "{failure}");
    }
}

#[test]
fn a_static_token_with_two_dots_is_still_a_static_token() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!("principals:\n  - {{ name: dotted, token_sha256: {} }}\n", token_sha256("a.b.c"));
    let (_keep, mut settings) = setup();
    settings.principals_file = write(dir.path(), "p.yaml", &yaml);
    let auth = Authenticator::load(&settings).unwrap();
    assert_eq!(bearer(&auth, "a.b.c").unwrap().name, "dotted");
    assert_eq!(bearer(&auth, "x.y.z").unwrap_err(), AuthFailure::Malformed, "tried as a JWT");
    settings.jwt = JwtSettings::default();
    let no_jwt = Authenticator::load(&settings).unwrap();
    assert_eq!(bearer(&no_jwt, "x.y.z").unwrap_err(), AuthFailure::UnknownToken);
}

#[test]
fn hs256_jwt_without_eventbus_claim_gets_default_permissions() {
    let (_dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let token = hs256(&good_claims());
    let alice = bearer(&auth, &token).unwrap();
    assert_eq!((alice.name.as_str(), alice.source), ("jwt:alice", CredentialKind::Jwt));
    assert!(alice.permissions.can_publish("public.news"));
    assert!(!alice.permissions.can_publish("orders.created"));
    // Verified once, then answered from the cache.
    assert!(Arc::ptr_eq(&alice, &bearer(&auth, &token).unwrap()));
}

#[test]
fn hs256_jwt_with_eventbus_claim_gets_its_permissions() {
    let (_dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let claims = with(
        good_claims(),
        "eventbus",
        json!({ "subscribe": { "allow": ["orders.>"], "deny": ["orders.secret"] }, "max_subscriptions": 3 }),
    );
    let alice = bearer(&auth, &hs256(&claims)).unwrap();
    assert!(alice.permissions.check_subscribe("orders.eu.>").is_ok());
    assert!(alice.permissions.check_subscribe("orders.*").is_err());
    assert!(!alice.permissions.can_publish("public.news"), "the claim replaces the defaults");
    assert_eq!(alice.permissions.max_subscriptions, Some(3));

    for bad in [json!({ "publish": { "allow": ["a.>.b"] } }), json!({ "superuser": true }), json!("all")] {
        let token = hs256(&with(good_claims(), "eventbus", bad.clone()));
        assert_eq!(bearer(&auth, &token).unwrap_err(), AuthFailure::InvalidClaims, "{bad}");
    }
}

#[test]
fn hs256_jwt_refusals() {
    let (_dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let refused = |claims: Value| bearer(&auth, &hs256(&claims)).unwrap_err();

    // 30 s of leeway by default: a minute is too late, ten seconds is not.
    assert_eq!(refused(with(good_claims(), "exp", json!(now() - 60))), AuthFailure::Expired);
    assert!(bearer(&auth, &hs256(&with(good_claims(), "exp", json!(now() - 10)))).is_ok());
    assert_eq!(refused(without(good_claims(), "exp")), AuthFailure::InvalidClaims);
    assert_eq!(refused(with(good_claims(), "nbf", json!(now() + 300))), AuthFailure::InvalidClaims);
    assert!(bearer(&auth, &hs256(&with(good_claims(), "nbf", json!(now() - 5)))).is_ok());
    assert_eq!(refused(with(good_claims(), "aud", json!("someone-else"))), AuthFailure::InvalidClaims);
    assert_eq!(refused(without(good_claims(), "aud")), AuthFailure::InvalidClaims);
    assert_eq!(refused(with(good_claims(), "iss", json!("mallory"))), AuthFailure::InvalidClaims);
    assert_eq!(refused(without(good_claims(), "iss")), AuthFailure::InvalidClaims);
    assert_eq!(refused(without(good_claims(), "sub")), AuthFailure::InvalidClaims);
    assert_eq!(refused(with(good_claims(), "sub", json!(""))), AuthFailure::InvalidClaims);
    assert_eq!(refused(with(good_claims(), "sub", json!(42))), AuthFailure::InvalidClaims);

    let forged = sign(Algorithm::HS256, &EncodingKey::from_secret(b"another secret"), &good_claims());
    assert_eq!(bearer(&auth, &forged).unwrap_err(), AuthFailure::BadSignature);
    // Change the signature's first character: its last one also carries padding
    // bits, and a lenient decoder reads two such spellings as the same bytes.
    let token = hs256(&good_claims());
    let at = token.rfind('.').map_or(0, |dot| dot + 1);
    let flipped = if token[at..].starts_with('A') { "B" } else { "A" };
    let tampered = format!("{}{flipped}{}", &token[..at], &token[at + 1..]);
    assert!(matches!(bearer(&auth, &tampered).unwrap_err(), AuthFailure::BadSignature | AuthFailure::Malformed));
    assert_eq!(bearer(&auth, "abc.def.ghi").unwrap_err(), AuthFailure::Malformed);
}

#[test]
fn issuer_and_audience_are_optional() {
    let (_dir, mut settings) = setup();
    settings.jwt.issuer.clear();
    settings.jwt.audience.clear();
    let auth = Authenticator::load(&settings).unwrap();
    let claims = json!({ "sub": "bob", "exp": now() + 60, "iss": "anyone", "aud": "anything" });
    assert_eq!(bearer(&auth, &hs256(&claims)).unwrap().name, "jwt:bob");
}

#[test]
fn rs256_with_a_pem_public_key() {
    let (dir, mut settings) = setup();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    settings.jwt.hs256_secret_file.clear();
    settings.jwt.public_key_file = fixtures.join("rsa_public.pem").to_str().unwrap().to_owned();
    let auth = Authenticator::load(&settings).unwrap();
    let private = std::fs::read(fixtures.join("rsa_private.pem")).unwrap();
    let token = sign(Algorithm::RS256, &EncodingKey::from_rsa_pem(&private).unwrap(), &good_claims());
    assert_eq!(bearer(&auth, &token).unwrap().name, "jwt:alice");
    // An HS256 token means nothing to an RS256-only setup.
    assert_eq!(bearer(&auth, &hs256(&good_claims())).unwrap_err(), AuthFailure::BadSignature);
    drop(dir);
}

#[test]
fn es256_with_a_generated_key_pair() {
    let (dir, mut settings) = setup();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    settings.jwt.public_key_file = write(dir.path(), "ec.pem", &pair.public_key_pem());
    let auth = Authenticator::load(&settings).unwrap();
    let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    assert_eq!(bearer(&auth, &sign(Algorithm::ES256, &key, &good_claims())).unwrap().name, "jwt:alice");
    // HS256 stays configured beside it.
    assert_eq!(bearer(&auth, &hs256(&good_claims())).unwrap().name, "jwt:alice");

    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let other_key = EncodingKey::from_ec_pem(other.serialize_pem().as_bytes()).unwrap();
    let forged = sign(Algorithm::ES256, &other_key, &good_claims());
    assert_eq!(bearer(&auth, &forged).unwrap_err(), AuthFailure::BadSignature);
}

#[test]
fn client_certificate_subjects() {
    let (_dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let subjects = vec!["client-42".to_owned(), "billing.internal".to_owned()];
    let billing = auth.authenticate(None, &subjects).unwrap();
    assert_eq!((billing.name.as_str(), billing.source), ("billing", CredentialKind::Certificate));
    assert!(billing.permissions.check_subscribe("billing.invoices").is_ok());
    assert_eq!(auth.authenticate(None, &["stranger".to_owned()]).unwrap_err(), AuthFailure::UnknownCertificate);
    // A bearer decides alone, even beside a known certificate.
    assert_eq!(auth.authenticate(Some("ebt_wrong"), &subjects).unwrap_err(), AuthFailure::UnknownToken);
    assert_eq!(auth.authenticate(Some(ORDERS_TOKEN), &subjects).unwrap().name, "orders");
}

#[test]
fn reload_keeps_the_old_state_on_error_and_picks_up_changes() {
    let (dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    assert_eq!(auth.generation(), 0);
    let jwt = hs256(&good_claims());
    assert!(bearer(&auth, &jwt).is_ok());

    write(dir.path(), "principals.yaml", "principals:\n  - name: broken\n    tokn: x\n");
    let err = auth.reload().unwrap_err();
    assert!(matches!(&err, AuthError::Parse { path, .. } if path.ends_with("principals.yaml")), "{err}");
    assert_eq!(auth.generation(), 0);
    assert_eq!(bearer(&auth, ORDERS_TOKEN).unwrap().name, "orders", "old state kept");

    let renamed = principals_yaml().replace("name: orders", "name: orders-v2");
    write(dir.path(), "principals.yaml", &renamed);
    write(dir.path(), "secret", "a-rotated-secret-of-at-least-32-bytes");
    auth.reload().unwrap();
    assert_eq!(auth.generation(), 1);
    assert_eq!(bearer(&auth, ORDERS_TOKEN).unwrap().name, "orders-v2");
    assert_eq!(bearer(&auth, &jwt).unwrap_err(), AuthFailure::BadSignature, "the JWT cache was cleared");

    // Clones share the state.
    let clone = auth.clone();
    clone.reload().unwrap();
    assert_eq!(auth.generation(), 2);
}

/// A session token minted now for the credential `bearer` or `subjects`.
fn session(auth: &Authenticator, bearer: Option<&str>, subjects: &[String]) -> String {
    let principal = auth.authenticate(bearer, subjects).unwrap();
    auth.mint_session(&principal, bearer, subjects, None).unwrap().0
}

#[test]
fn a_session_token_is_only_as_good_as_its_credential_now() {
    let (dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let billing_cert = ["billing.internal".to_owned()];
    let orders = session(&auth, Some(ORDERS_TOKEN), &[]);
    let billing = session(&auth, None, &billing_cert);
    let claimed = hs256(&with(good_claims(), "eventbus", json!({ "subscribe": { "allow": ["a.>"] } })));
    let (alice, defaulted) = (session(&auth, Some(&claimed), &[]), session(&auth, Some(&hs256(&good_claims())), &[]));
    let orders_now = bearer(&auth, &orders).unwrap();
    assert_eq!((orders_now.name.as_str(), orders_now.source), ("orders", CredentialKind::Session));
    assert!(orders_now.permissions.can_publish("orders.us.x") && orders_now.permissions.max_publish_rate == Some(5.0));
    assert!(bearer(&auth, &billing).unwrap().permissions.check_subscribe("billing.x").is_ok());
    assert!(bearer(&auth, &alice).unwrap().permissions.check_subscribe("a.x").is_ok());
    assert!(bearer(&auth, &defaulted).unwrap().permissions.can_publish("public.x"));

    // orders loses a right and gets a lower rate; billing is removed.
    let narrowed = principals_yaml().replace(
        "allow: [\"orders.>\"] }\n      max_publish_rate: 5",
        "allow: [\"orders.eu.>\"] }\n      max_publish_rate: 2",
    );
    let yaml = narrowed.split("  - name: billing").next().unwrap().to_owned();
    write(dir.path(), "principals.yaml", &yaml);
    auth.reload().unwrap();
    let orders_now = bearer(&auth, &orders).unwrap();
    assert!(orders_now.permissions.can_publish("orders.eu.x"));
    assert!(!orders_now.permissions.can_publish("orders.us.x"), "the right withdrawn is gone from the session too");
    assert_eq!(orders_now.permissions.max_publish_rate, Some(2.0));
    assert_eq!(bearer(&auth, &billing).unwrap_err(), AuthFailure::Revoked);
    assert!(bearer(&auth, &alice).is_ok(), "JWT sessions live while the keys do");

    // The orders token is replaced: sessions minted with the old one end.
    write(dir.path(), "principals.yaml", &yaml.replace(&token_sha256(ORDERS_TOKEN), &token_sha256("ebt_new")));
    auth.reload().unwrap();
    assert_eq!(bearer(&auth, &orders).unwrap_err(), AuthFailure::Revoked);

    // The JWT key rotates: every session of a JWT subject ends.
    write(dir.path(), "secret", "a-rotated-secret-of-at-least-32-bytes");
    auth.reload().unwrap();
    assert_eq!(bearer(&auth, &alice).unwrap_err(), AuthFailure::Revoked);
    assert_eq!(bearer(&auth, &defaulted).unwrap_err(), AuthFailure::Revoked);
}

#[test]
fn the_sessions_of_jwts_without_rights_of_their_own_follow_the_defaults() {
    let (dir, mut settings) = setup();
    let key = write(dir.path(), "session.key", &"k".repeat(40));
    settings.session_tokens.secret_file = key;
    let auth = Authenticator::load(&settings).unwrap();
    let claimed = hs256(&with(good_claims(), "eventbus", json!({ "publish": { "allow": ["public.>"] } })));
    let (own, defaulted) = (session(&auth, Some(&claimed), &[]), session(&auth, Some(&hs256(&good_claims())), &[]));
    // New defaults (a restart with a shared session key) reach the sessions of JWTs
    // that had them, not those of JWTs with rights of their own.
    settings.default_permissions = Permissions::default();
    let restarted = Authenticator::load(&settings).unwrap();
    assert!(restarted.authenticate(Some(&own), &[]).unwrap().permissions.can_publish("public.x"));
    assert!(!restarted.authenticate(Some(&defaulted), &[]).unwrap().permissions.can_publish("public.x"));
}

#[test]
fn rate_limiters_are_per_principal_and_survive_reloads() {
    let (dir, settings) = setup();
    let auth = Authenticator::load(&settings).unwrap();
    let orders = bearer(&auth, ORDERS_TOKEN).unwrap();
    let limiter = auth.rate_limiter(&orders).unwrap();
    assert_eq!(limiter.rate(), 5.0);
    assert!(limiter.try_acquire(5));
    assert!(!limiter.try_acquire(5));
    assert!(auth.rate_limiter(&bearer(&auth, &hs256(&good_claims())).unwrap()).is_none(), "no limit, no bucket");

    write(dir.path(), "principals.yaml", &principals_yaml().replace("max_publish_rate: 5", "max_publish_rate: 2"));
    auth.reload().unwrap();
    let reloaded = auth.rate_limiter(&bearer(&auth, ORDERS_TOKEN).unwrap()).unwrap();
    assert!(Arc::ptr_eq(&limiter, &reloaded), "same bucket: a reload does not refill it");
    assert_eq!(reloaded.rate(), 2.0);
}

#[test]
fn load_errors_name_the_file_and_the_problem() {
    let (dir, mut settings) = setup();
    let missing = dir.path().join("nope.yaml").to_str().unwrap().to_owned();
    settings.principals_file = missing.clone();
    let err = Authenticator::load(&settings).unwrap_err();
    assert!(matches!(&err, AuthError::Unreadable { path, .. } if *path == missing));
    assert!(err.to_string().contains("nope.yaml"));

    let (dir, mut settings) = setup();
    settings.jwt.public_key_file =
        write(dir.path(), "key.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
    let err = Authenticator::load(&settings).unwrap_err();
    assert!(matches!(&err, AuthError::BadKey { path, .. } if path.ends_with("key.pem")), "{err:?}");

    let (dir, mut settings) = setup();
    settings.jwt.hs256_secret_file = write(dir.path(), "empty", "\n");
    assert!(matches!(Authenticator::load(&settings).unwrap_err(), AuthError::EmptyKey { .. }));

    let (_dir, mut settings) = setup();
    settings.default_permissions.consumers.allow = vec![String::new()];
    let err = Authenticator::load(&settings).unwrap_err();
    assert_eq!(
        eventbus_core::error_chain(&err),
        "auth.default_permissions is invalid: consumers.allow[0] is empty; use \"*\" for every consumer"
    );
}
