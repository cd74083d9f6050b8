//! Filters as Redis sees them: `{prefix}:{channel}` for exact channels, and a glob for
//! patterns. Redis's `*` also matches dots, so a glob can over-match (`orders.*` becomes
//! `prefix:orders.*`, which also matches `orders.eu.created`); the router re-checks
//! every received event with token rules, so such extras reach nobody.

use eventbus_core::Pattern;
use eventbus_core::name::Token;

/// The Redis channel events of `channel` are published on.
pub(crate) fn redis_channel(prefix: &str, channel: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + 1 + channel.len());
    key.push_str(prefix);
    key.push(':');
    key.push_str(channel);
    key
}

/// The event channel of a Redis channel, if it carries the prefix.
pub(crate) fn event_channel<'a>(prefix: &str, redis_channel: &'a str) -> Option<&'a str> {
    redis_channel.strip_prefix(prefix)?.strip_prefix(':')
}

/// What to SUBSCRIBE (exact) or PSUBSCRIBE (glob) for a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisFilter {
    Channel(String),
    Glob(String),
}

pub(crate) fn redis_filter(prefix: &str, filter: &Pattern) -> RedisFilter {
    if filter.is_exact() {
        return RedisFilter::Channel(redis_channel(prefix, filter.as_str()));
    }
    let mut glob = String::with_capacity(prefix.len() + filter.as_str().len() + 8);
    escape_into(&mut glob, prefix);
    glob.push(':');
    for (i, token) in filter.tokens().enumerate() {
        if i > 0 {
            glob.push('.');
        }
        match token {
            Token::Literal(lit) => escape_into(&mut glob, lit),
            Token::Star | Token::Rest => glob.push('*'),
        }
    }
    RedisFilter::Glob(glob)
}

/// Escapes Redis glob metacharacters so literal text matches only itself.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(p: &str) -> RedisFilter {
        redis_filter("socle:eventbus", &Pattern::parse(p).unwrap())
    }

    #[test]
    fn exact_channels_and_globs() {
        assert_eq!(glob("orders.created"), RedisFilter::Channel("socle:eventbus:orders.created".into()));
        assert_eq!(glob("orders.*"), RedisFilter::Glob("socle:eventbus:orders.*".into()));
        assert_eq!(glob("orders.>"), RedisFilter::Glob("socle:eventbus:orders.*".into()));
        assert_eq!(glob("*.created"), RedisFilter::Glob("socle:eventbus:*.created".into()));
        assert_eq!(glob("a?[x].*"), RedisFilter::Glob("socle:eventbus:a\\?\\[x\\].*".into()));
    }

    #[test]
    fn channel_round_trip() {
        let key = redis_channel("socle:eventbus", "orders.created");
        assert_eq!(event_channel("socle:eventbus", &key), Some("orders.created"));
        assert_eq!(event_channel("socle:eventbus", "other:orders"), None);
        assert_eq!(event_channel("socle:eventbus", "socle:eventbusX"), None);
    }
}
