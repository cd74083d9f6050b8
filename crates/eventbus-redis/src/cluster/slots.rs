//! Buckets: a channel's shard key, its hash slot, and the shard channel of each
//! bucket of 128 slots (see the module above).

use eventbus_core::Pattern;
use eventbus_core::name::Token;

/// Shard channels per cluster: each covers 128 consecutive hash slots.
pub const BUCKETS: u16 = 128;
/// Hash slots per bucket.
const SLOTS_PER_BUCKET: u16 = (SLOTS / BUCKETS as u32) as u16;

/// Slots in a Redis Cluster.
pub(super) const SLOTS: u32 = 16_384;

/// A seed node as the cluster client takes it: `host:port` becomes `redis://host:port`;
/// `redis://` and `rediss://` URLs are kept. The error says what is wrong.
pub fn node_url(node: &str) -> Result<String, &'static str> {
    let (url, address) = match node.split_once("://") {
        Some(("redis" | "rediss", rest)) => (node.to_owned(), rest),
        Some(_) => return Err("must be host:port, or a redis:// or rediss:// URL"),
        None => (format!("redis://{node}"), node),
    };
    let address = address.rsplit_once('@').map_or(address, |(_, a)| a).trim_end_matches('/');
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(url),
        _ => Err("must name a host and a port (host:port)"),
    }
}

/// The shard key of a channel: its first `shard_tokens` tokens.
pub(crate) fn shard_key(channel: &str, shard_tokens: usize) -> &str {
    match channel.match_indices('.').nth(shard_tokens.saturating_sub(1)) {
        Some((end, _)) => &channel[..end],
        None => channel,
    }
}

/// A key's hash slot, as `CLUSTER KEYSLOT` computes it (a `{tag}` hashes alone).
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The bucket of a shard key: the slot range its hash slot falls in.
pub(crate) fn bucket_of(shard_key: &str) -> u16 {
    key_slot(shard_key.as_bytes()) / SLOTS_PER_BUCKET
}

/// The shard channels of every bucket, in bucket order: bucket `b`'s hash tag is the
/// smallest decimal number whose hash slot is in `b`'s range.
pub fn shard_channels(prefix: &str) -> Vec<String> {
    let mut tags: Vec<Option<u32>> = vec![None; usize::from(BUCKETS)];
    let mut missing = tags.len();
    let mut n = 0u32;
    while missing > 0 {
        let bucket = usize::from(key_slot(n.to_string().as_bytes()) / SLOTS_PER_BUCKET);
        if tags[bucket].is_none() {
            tags[bucket] = Some(n);
            missing -= 1;
        }
        n += 1;
    }
    tags.iter().enumerate().map(|(b, tag)| format!("{prefix}:shard:{b}:{{{}}}", tag.unwrap_or_default())).collect()
}

/// The hash tag (`{17}`) of each bucket's shard channel, in bucket order: a channel's
/// history keys carry its bucket's, so they live where the channel is published.
pub(super) fn shard_tags(prefix: &str) -> Vec<String> {
    shard_channels(prefix)
        .iter()
        .map(|c| c.rfind('{').map_or_else(String::new, |at| format!("{}:", &c[at..])))
        .collect()
}

/// The buckets a filter needs: one when its shard tokens are literal, all otherwise.
pub(super) fn buckets_of(filter: &Pattern, shard_tokens: usize) -> Option<u16> {
    if filter.is_exact() {
        return Some(bucket_of(shard_key(filter.as_str(), shard_tokens)));
    }
    let literal = filter.tokens().take(shard_tokens).all(|t| matches!(t, Token::Literal(_)));
    // A trailing `>` after the shard tokens (`orders.>` with 1) keeps them literal.
    literal.then(|| bucket_of(shard_key(filter.as_str(), shard_tokens)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_nodes_parse_or_say_what_is_wrong() {
        assert_eq!(node_url("10.0.0.1:7000"), Ok("redis://10.0.0.1:7000".to_owned()));
        assert_eq!(node_url("rediss://u:p@cache:7000"), Ok("rediss://u:p@cache:7000".to_owned()));
        assert!(node_url("cache").is_err());
        assert!(node_url("cache:0").is_err());
        assert!(node_url(":7000").is_err());
        assert!(node_url("http://cache:7000").is_err());
    }

    #[test]
    fn the_shard_key_is_the_leading_tokens() {
        assert_eq!(shard_key("orders.eu.created", 1), "orders");
        assert_eq!(shard_key("orders.eu.created", 2), "orders.eu");
        assert_eq!(shard_key("orders", 2), "orders");
    }

    #[test]
    fn literal_shard_tokens_need_one_bucket_and_wildcards_all() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        let orders = bucket_of("orders");
        assert_eq!(buckets_of(&p("orders.created"), 1), Some(orders));
        assert_eq!(buckets_of(&p("orders.*"), 1), Some(orders));
        assert_eq!(buckets_of(&p("orders.>"), 1), Some(orders));
        assert_eq!(buckets_of(&p("*.created"), 1), None);
        assert_eq!(buckets_of(&p(">"), 1), None);
        assert_eq!(buckets_of(&p("orders.*"), 2), None);
        assert_eq!(buckets_of(&p("orders.eu.*"), 2), Some(bucket_of("orders.eu")));
        // The bucket is the key's hash slot / 128, as `CLUSTER KEYSLOT` gives it.
        assert_eq!(key_slot(b"orders") / 128, orders);
    }

    #[test]
    fn each_shard_channel_hashes_into_its_buckets_slot_range() {
        let channels = shard_channels("socle:eventbus");
        assert_eq!(channels.len(), 128);
        for (b, channel) in channels.iter().enumerate() {
            assert!(channel.starts_with(&format!("socle:eventbus:shard:{b}:{{")), "{channel}");
            assert_eq!(usize::from(key_slot(channel.as_bytes()) / 128), b, "{channel}");
        }
        assert_eq!(channels[0], "socle:eventbus:shard:0:{14}", "as docs/redis.md gives it");
        // Known slots (redis-cli CLUSTER KEYSLOT): "foo" 12182, "{user1000}.following" 3443.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
    }
}
