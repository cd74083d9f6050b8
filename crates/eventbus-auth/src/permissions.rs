//! What a principal may do (docs/security.md): publish and subscribe allow/deny
//! patterns (deny wins), consumer-name globs, the admin flag and per-principal limits.
//!
//! [`Permissions`] is the configuration shape (principals file, `auth.default_permissions`,
//! the JWT `eventbus` claim). [`CompiledPermissions`] is the same rules parsed once, which
//! every [`Principal`](crate::Principal) carries so that a check parses nothing.

use std::ops::Deref;
use std::sync::Arc;

use eventbus_core::Pattern;
use serde::{Deserialize, Serialize};

use crate::error::{PermissionsError, Refusal, RefusalReason};
use crate::glob::Glob;
use crate::pattern::{covers, overlaps};

/// The permissions block, exactly as written in configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Permissions {
    /// Channels this principal may publish to.
    pub publish: AllowDeny,
    /// Channels and patterns this principal may subscribe to (also a consumer's channels).
    pub subscribe: AllowDeny,
    /// Durable consumers this principal may attach to (`Consume`).
    pub consumers: ConsumerRights,
    /// Durable consumers this principal may create and delete (name globs).
    pub manage_consumers: Vec<String>,
    /// Every other admin RPC and `/admin` REST route.
    pub admin: bool,
    /// Most subscriptions open at once (Subscribe, Consume and Server-Sent Events
    /// streams together); `auth.default_max_subscriptions` when absent.
    pub max_subscriptions: Option<u32>,
    /// Most events published per second (token bucket); none when absent.
    pub max_publish_rate: Option<f64>,
    /// Most durable consumers it owns at once; `auth.default_max_consumers` when absent.
    pub max_consumers: Option<u32>,
    /// Most bytes queued across its subscriptions; `auth.default_max_queued_bytes` when
    /// absent.
    pub max_queued_bytes: Option<u64>,
}

/// Allow and deny channel patterns; deny wins.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AllowDeny {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

/// Consumer-name globs a principal may attach to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerRights {
    pub allow: Vec<String>,
}

impl Permissions {
    /// Every right and no limit: what everyone has with authentication off.
    pub fn all() -> Self {
        let everything = || AllowDeny { allow: vec![">".to_owned()], deny: Vec::new() };
        Self {
            publish: everything(),
            subscribe: everything(),
            consumers: ConsumerRights { allow: vec!["*".to_owned()] },
            manage_consumers: vec!["*".to_owned()],
            admin: true,
            max_subscriptions: None,
            max_publish_rate: None,
            max_consumers: None,
            max_queued_bytes: None,
        }
    }

    /// Checks every rule; the error names the first bad entry.
    pub fn validate(&self) -> Result<(), PermissionsError> {
        self.compile().map(drop)
    }

    /// Parses the rules once, for a [`Principal`](crate::Principal) to carry.
    pub fn compile(&self) -> Result<CompiledPermissions, PermissionsError> {
        if let Some(value) = self.max_publish_rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return Err(PermissionsError::BadRate { value });
        }
        Ok(CompiledPermissions {
            publish: CompiledAllowDeny::new(&self.publish, "publish.allow", "publish.deny")?,
            subscribe: CompiledAllowDeny::new(&self.subscribe, "subscribe.allow", "subscribe.deny")?,
            consumers: globs(&self.consumers.allow, "consumers.allow")?,
            manage: globs(&self.manage_consumers, "manage_consumers")?,
            source: self.clone(),
            also: None,
        })
    }

    /// Whether `channel` may be published to. Parses the rules on every call (and
    /// refuses everything when they are invalid): hot paths use [`CompiledPermissions`].
    pub fn can_publish(&self, channel: &str) -> bool {
        self.compile().is_ok_and(|c| c.can_publish(channel))
    }

    /// Whether `filter` may be subscribed to; see [`CompiledPermissions::check_subscribe`].
    /// Parses the rules on every call.
    pub fn check_subscribe(&self, filter: &str) -> Result<(), Refusal> {
        match self.compile() {
            Ok(c) => c.check_subscribe(filter),
            Err(_) => Err(Refusal { filter: filter.to_owned(), reason: RefusalReason::NotCovered }),
        }
    }

    /// Whether the consumer `consumer` may be attached to. Parses the rules on every call.
    pub fn can_attach(&self, consumer: &str) -> bool {
        self.compile().is_ok_and(|c| c.can_attach(consumer))
    }

    /// Whether the consumer `consumer` may be created or deleted. Parses the rules on every call.
    pub fn can_manage(&self, consumer: &str) -> bool {
        self.compile().is_ok_and(|c| c.can_manage(consumer))
    }

    /// Whether every other admin operation is allowed.
    pub fn is_admin(&self) -> bool {
        self.admin
    }
}

fn patterns(list: &[String], field: &'static str) -> Result<Box<[Pattern]>, PermissionsError> {
    list.iter()
        .enumerate()
        .map(|(index, text)| {
            Pattern::parse(text).map_err(|source| PermissionsError::BadPattern { field, index, source })
        })
        .collect()
}

fn globs(list: &[String], field: &'static str) -> Result<Box<[Glob]>, PermissionsError> {
    list.iter()
        .enumerate()
        .map(|(index, text)| Glob::new(text).ok_or(PermissionsError::EmptyGlob { field, index }))
        .collect()
}

#[derive(Debug, Clone)]
struct CompiledAllowDeny {
    allow: Box<[Pattern]>,
    deny: Box<[Pattern]>,
}

impl CompiledAllowDeny {
    fn new(rules: &AllowDeny, allow: &'static str, deny: &'static str) -> Result<Self, PermissionsError> {
        Ok(Self { allow: patterns(&rules.allow, allow)?, deny: patterns(&rules.deny, deny)? })
    }
}

/// [`Permissions`] with every pattern and glob parsed: the form checks run on.
/// Dereferences to the [`Permissions`] it was built from (limits, `admin`).
#[derive(Debug, Clone)]
pub struct CompiledPermissions {
    source: Permissions,
    publish: CompiledAllowDeny,
    subscribe: CompiledAllowDeny,
    consumers: Box<[Glob]>,
    manage: Box<[Glob]>,
    /// Rules that must allow too ([`CompiledPermissions::intersect`]): a session
    /// token's rights meet those its principal has now.
    also: Option<Arc<CompiledPermissions>>,
}

impl CompiledPermissions {
    /// Every right and no limit.
    pub fn all() -> Self {
        match Permissions::all().compile() {
            Ok(all) => all,
            // The rules above are literals that parse; this arm is never taken.
            Err(_) => unreachable!("Permissions::all() is valid"),
        }
    }

    /// What both `self` and `other` allow: each check must pass both; the admin flag
    /// needs both; each limit is the lower one. [`Self::permissions`] keeps `self`'s
    /// rules, with those limits and that admin flag.
    pub fn intersect(&self, other: &Arc<CompiledPermissions>) -> CompiledPermissions {
        if self.also.is_none() && self.source == other.source {
            return self.clone();
        }
        let also = match &self.also {
            Some(first) => Arc::new(first.intersect(other)),
            None => Arc::clone(other),
        };
        let mut source = self.source.clone();
        source.admin &= other.admin;
        source.max_subscriptions = lower(source.max_subscriptions, other.max_subscriptions, u32::min);
        source.max_publish_rate = lower(source.max_publish_rate, other.max_publish_rate, f64::min);
        source.max_consumers = lower(source.max_consumers, other.max_consumers, u32::min);
        source.max_queued_bytes = lower(source.max_queued_bytes, other.max_queued_bytes, u64::min);
        CompiledPermissions { source, also: Some(also), ..self.clone() }
    }

    /// The rules as written.
    pub fn permissions(&self) -> &Permissions {
        &self.source
    }

    /// Some publish allow matches `channel` and no publish deny does.
    pub fn can_publish(&self, channel: &str) -> bool {
        let rules = &self.publish;
        rules.allow.iter().any(|p| p.matches(channel))
            && !rules.deny.iter().any(|p| p.matches(channel))
            && self.also.as_ref().is_none_or(|also| also.can_publish(channel))
    }

    /// `filter` (a channel or pattern) is covered by some subscribe allow pattern and
    /// overlaps no subscribe deny pattern.
    pub fn check_subscribe(&self, filter: &str) -> Result<(), Refusal> {
        let refuse = |reason| Err(Refusal { filter: filter.to_owned(), reason });
        let Ok(requested) = Pattern::parse(filter) else {
            return refuse(RefusalReason::NotCovered);
        };
        let rules = &self.subscribe;
        if let Some(deny) = rules.deny.iter().find(|d| overlaps(d, &requested)) {
            return refuse(RefusalReason::Denied { deny: deny.to_string() });
        }
        if !rules.allow.iter().any(|a| covers(a, &requested)) {
            return refuse(RefusalReason::NotCovered);
        }
        match &self.also {
            Some(also) => also.check_subscribe(filter),
            None => Ok(()),
        }
    }

    /// Some `consumers.allow` glob matches `consumer`.
    pub fn can_attach(&self, consumer: &str) -> bool {
        self.consumers.iter().any(|g| g.matches(consumer)) && self.also.as_ref().is_none_or(|a| a.can_attach(consumer))
    }

    /// Some `manage_consumers` glob matches `consumer`.
    pub fn can_manage(&self, consumer: &str) -> bool {
        self.manage.iter().any(|g| g.matches(consumer)) && self.also.as_ref().is_none_or(|a| a.can_manage(consumer))
    }

    /// Whether every other admin operation is allowed.
    pub fn is_admin(&self) -> bool {
        self.source.admin
    }
}

/// The lower of two optional limits; a missing one is no limit.
fn lower<T>(a: Option<T>, b: Option<T>, min: fn(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(min(a, b)),
        (a, b) => a.or(b),
    }
}

impl Deref for CompiledPermissions {
    type Target = Permissions;

    fn deref(&self) -> &Permissions {
        &self.source
    }
}

impl TryFrom<Permissions> for CompiledPermissions {
    type Error = PermissionsError;

    fn try_from(permissions: Permissions) -> Result<Self, PermissionsError> {
        permissions.compile()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(publish: (&[&str], &[&str]), subscribe: (&[&str], &[&str])) -> Permissions {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Permissions {
            publish: AllowDeny { allow: list(publish.0), deny: list(publish.1) },
            subscribe: AllowDeny { allow: list(subscribe.0), deny: list(subscribe.1) },
            ..Permissions::default()
        }
    }

    #[test]
    fn default_allows_nothing() {
        let none = Permissions::default().compile().unwrap();
        assert!(!none.can_publish("a"));
        assert!(none.check_subscribe("a").is_err());
        assert!(!none.can_attach("c") && !none.can_manage("c") && !none.is_admin());
    }

    #[test]
    fn all_allows_everything() {
        let all = CompiledPermissions::all();
        assert!(all.can_publish("a.b.c") && all.check_subscribe(">").is_ok());
        assert!(all.can_attach("x") && all.can_manage("y") && all.is_admin());
        assert_eq!(all.max_subscriptions, None);
        assert_eq!(all.max_publish_rate, None);
    }

    #[test]
    fn publish_deny_wins_over_allow() {
        let p = rules((&["orders.>"], &["orders.secret.>"]), (&[], &[])).compile().unwrap();
        assert!(p.can_publish("orders.created"));
        assert!(p.can_publish("orders.secret"));
        assert!(!p.can_publish("orders.secret.x"));
        assert!(!p.can_publish("billing.created"));
    }

    #[test]
    fn subscribe_needs_covering_allow_and_no_overlapping_deny() {
        let p = rules((&[], &[]), (&["orders.>"], &["orders.secret"])).compile().unwrap();
        assert_eq!(p.check_subscribe("orders.created"), Ok(()));
        assert_eq!(p.check_subscribe("orders.eu.>"), Ok(()));
        let denied = p.check_subscribe("orders.*").unwrap_err();
        assert_eq!(denied.reason, RefusalReason::Denied { deny: "orders.secret".into() });
        assert_eq!(
            denied.to_string(),
            "not allowed to subscribe to \"orders.*\": it overlaps the denied \"orders.secret\""
        );
        let uncovered = p.check_subscribe("billing.*").unwrap_err();
        assert_eq!(uncovered, Refusal { filter: "billing.*".into(), reason: RefusalReason::NotCovered });
        assert_eq!(uncovered.to_string(), "not allowed to subscribe to \"billing.*\"");
        assert!(matches!(p.check_subscribe(">").unwrap_err().reason, RefusalReason::Denied { .. }));
        assert!(p.check_subscribe("orders.>.x").is_err());
    }

    #[test]
    fn consumer_globs() {
        let p = Permissions {
            consumers: ConsumerRights { allow: vec!["billing-*".into()] },
            manage_consumers: vec!["billing-eu".into()],
            ..Permissions::default()
        };
        assert!(p.can_attach("billing-eu") && p.can_attach("billing-us") && !p.can_attach("orders"));
        assert!(p.can_manage("billing-eu") && !p.can_manage("billing-us"));
    }

    #[test]
    fn uncompiled_checks_agree() {
        let p = rules((&["a.>"], &["a.b"]), (&["a.*"], &[]));
        assert!(p.can_publish("a.c") && !p.can_publish("a.b"));
        assert!(p.check_subscribe("a.x").is_ok() && p.check_subscribe("a.>").is_err());
        let broken = rules((&["a.>.b"], &[]), (&[], &[]));
        assert!(!broken.can_publish("a.x.b"));
    }

    #[test]
    fn validation_names_the_bad_entry() {
        let err = rules((&["a", "a.>.b"], &[]), (&[], &[])).validate().unwrap_err();
        assert!(matches!(err, PermissionsError::BadPattern { field: "publish.allow", index: 1, .. }));
        assert!(err.to_string().contains("publish.allow[1] \"a.>.b\""), "{err}");
        let err = rules((&[], &[]), (&[], &["ord*"])).validate().unwrap_err();
        assert!(err.to_string().starts_with("subscribe.deny[0] \"ord*\""), "{err}");
        let glob = Permissions { manage_consumers: vec!["x".into(), String::new()], ..Permissions::default() };
        assert_eq!(glob.validate(), Err(PermissionsError::EmptyGlob { field: "manage_consumers", index: 1 }));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let rate = Permissions { max_publish_rate: Some(bad), ..Permissions::default() };
            assert!(matches!(rate.validate(), Err(PermissionsError::BadRate { .. })), "{bad}");
        }
    }

    #[test]
    fn an_intersection_allows_what_both_allow() {
        let token = Permissions {
            consumers: ConsumerRights { allow: vec!["a-*".into()] },
            manage_consumers: vec!["a-*".into()],
            admin: true,
            max_subscriptions: Some(5),
            ..rules((&["a.>"], &[]), (&["a.>"], &[]))
        };
        let now = Arc::new(
            Permissions {
                consumers: ConsumerRights { allow: vec!["a-1".into()] },
                max_subscriptions: Some(9),
                max_publish_rate: Some(3.0),
                ..rules((&["a.x"], &[]), (&["a.>"], &["a.secret"]))
            }
            .compile()
            .unwrap(),
        );
        let both = token.compile().unwrap().intersect(&now);
        assert!(both.can_publish("a.x") && !both.can_publish("a.y"));
        assert!(both.check_subscribe("a.y").is_ok());
        assert!(matches!(both.check_subscribe("a.*").unwrap_err().reason, RefusalReason::Denied { .. }));
        assert!(both.can_attach("a-1") && !both.can_attach("a-2"));
        assert!(!both.can_manage("a-1") && !both.is_admin());
        assert_eq!((both.max_subscriptions, both.max_publish_rate), (Some(5), Some(3.0)));
        let unchanged = token.compile().unwrap().intersect(&Arc::new(token.compile().unwrap()));
        assert!(unchanged.also.is_none() && unchanged.is_admin());
        let nothing = Arc::new(Permissions::default().compile().unwrap());
        let twice = both.intersect(&nothing);
        assert!(!twice.can_publish("a.x") && twice.check_subscribe("a.y").is_err());
    }

    #[test]
    fn serde_shape_matches_the_contract() {
        let yaml = "
publish:   { allow: [\"orders.>\"], deny: [\"orders.secret\"] }
subscribe: { allow: [\">\"] }
consumers: { allow: [\"billing-*\"] }
manage_consumers: [\"billing-*\"]
admin: false
max_subscriptions: 10
max_publish_rate: 2.5
";
        let p: Permissions = serde_norway::from_str(yaml).unwrap();
        assert_eq!(p.publish.deny, vec!["orders.secret".to_string()]);
        assert_eq!(p.subscribe.deny, Vec::<String>::new());
        assert_eq!((p.max_subscriptions, p.max_publish_rate), (Some(10), Some(2.5)));
        assert!(serde_norway::from_str::<Permissions>("publish: { allow: [], denied: [] }").is_err());
        assert!(serde_norway::from_str::<Permissions>("superuser: true").is_err());
    }
}
