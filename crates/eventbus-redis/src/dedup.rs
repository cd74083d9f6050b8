//! One copy per instance.
//!
//! When a local subscription holds an exact channel and another a matching pattern,
//! this instance has several Redis subscriptions matching one channel, and Redis sends
//! one copy of a PUBLISH through each. Redis writes those copies back to back on our
//! connection, each through a different subscription; a second PUBLISH of the same
//! bytes comes through the same subscriptions again. So: a message identical to the
//! previous one (channel and payload) that arrived through a subscription not yet seen
//! in this run is a copy; anything else starts a new event.

use bytes::Bytes;

#[derive(Debug, Default)]
pub(crate) struct Dedup {
    channel: String,
    payload: Bytes,
    /// Subscriptions the current run arrived through (`None` = exact channel).
    sources: Vec<Option<String>>,
}

impl Dedup {
    /// True when the message is a new event, false for another copy of the last one.
    pub(crate) fn is_new(&mut self, channel: &str, payload: &Bytes, source: Option<&str>) -> bool {
        let same_message = self.channel == channel && self.payload == *payload;
        if same_message && !self.sources.iter().any(|s| s.as_deref() == source) {
            self.sources.push(source.map(str::to_owned));
            return false;
        }
        self.channel.clear();
        self.channel.push_str(channel);
        self.payload = payload.clone();
        self.sources.clear();
        self.sources.push(source.map(str::to_owned));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_through_other_subscriptions_are_dropped() {
        let mut d = Dedup::default();
        let p = Bytes::from_static(b"x");
        assert!(d.is_new("c", &p, None));
        assert!(!d.is_new("c", &p, Some("c*")), "same publish via a pattern");
        assert!(!d.is_new("c", &p, Some("*")), "and via another pattern");
        assert!(d.is_new("c", &p, None), "identical bytes again via the exact channel: a new publish");
        assert!(!d.is_new("c", &p, Some("c*")));
        assert!(d.is_new("c", &Bytes::from_static(b"y"), Some("c*")), "other payload");
        assert!(d.is_new("d", &Bytes::from_static(b"y"), Some("c*")), "other channel");
    }
}
