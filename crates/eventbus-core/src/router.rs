//! Which subscriptions an event goes to.
//!
//! The router owns the token trie, the open subscriptions and the groups. Publishers do
//! not walk the trie per event: each channel caches its [`Targets`] (see
//! `stats::ChannelEntry`), stamped with the router generation, which every subscribe
//! and unsubscribe bumps.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use crate::name::Pattern;
use crate::subscription::Subscription;
use crate::trie::Trie;

/// A subscription in the trie, compared by identity.
#[derive(Debug, Clone)]
struct SubRef(Arc<Subscription>);

/// The subscriptions one channel's events go to.
#[derive(Debug, Default)]
pub(crate) struct Targets {
    /// Router generation this was computed at.
    pub(crate) generation: u64,
    /// Ungrouped subscriptions: each gets a copy.
    pub(crate) solo: Vec<Arc<Subscription>>,
    /// Groups: each gets one copy, for one of its members.
    pub(crate) groups: Vec<GroupTargets>,
}

impl Targets {
    /// Distinct subscriptions matched.
    pub(crate) fn subscriber_count(&self) -> usize {
        self.solo.len() + self.groups.iter().map(|g| g.members.len()).sum::<usize>()
    }
}

/// Members of one group that match a channel.
#[derive(Debug)]
pub(crate) struct GroupTargets {
    /// Round-robin position, shared by every channel the group matches.
    pub(crate) cursor: Arc<AtomicUsize>,
    pub(crate) members: Vec<Arc<Subscription>>,
}

#[derive(Debug)]
struct Group {
    cursor: Arc<AtomicUsize>,
    members: usize,
}

/// Filters whose use count went from 0 to 1 (watch) or 1 to 0 (unwatch).
pub(crate) type InterestChanges = Vec<Pattern>;

#[derive(Debug, Default)]
pub(crate) struct Router {
    trie: Trie<SubRef>,
    subs: HashMap<Arc<str>, Arc<Subscription>>,
    groups: HashMap<Arc<str>, Group>,
    /// How many subscriptions use each filter, for the transport's watch/unwatch.
    interest: HashMap<Pattern, usize>,
}

impl Router {
    pub(crate) fn len(&self) -> usize {
        self.subs.len()
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Subscription>> {
        self.subs.values()
    }

    /// Adds a subscription; returns the filters that are newly needed.
    pub(crate) fn add(&mut self, sub: Arc<Subscription>) -> InterestChanges {
        let mut watch = Vec::new();
        for filter in &sub.spec.filters {
            self.trie.insert(filter, SubRef(Arc::clone(&sub)));
            let uses = self.interest.entry(filter.clone()).or_insert(0);
            *uses += 1;
            if *uses == 1 {
                watch.push(filter.clone());
            }
        }
        if let Some(group) = &sub.spec.group_key {
            self.groups
                .entry(Arc::clone(group))
                .or_insert_with(|| Group { cursor: Arc::default(), members: 0 })
                .members += 1;
        }
        self.subs.insert(Arc::clone(&sub.id), sub);
        watch
    }

    /// Removes a subscription; returns it and the filters no longer needed.
    pub(crate) fn remove(&mut self, id: &str) -> Option<(Arc<Subscription>, InterestChanges)> {
        let sub = self.subs.remove(id)?;
        let mut unwatch = Vec::new();
        for filter in &sub.spec.filters {
            self.trie.remove(filter, |s| Arc::ptr_eq(&s.0, &sub));
            if let Some(uses) = self.interest.get_mut(filter) {
                *uses -= 1;
                if *uses == 0 {
                    self.interest.remove(filter);
                    unwatch.push(filter.clone());
                }
            }
        }
        if let Some(group) = &sub.spec.group_key
            && let Some(g) = self.groups.get_mut(group)
        {
            g.members -= 1;
            if g.members == 0 {
                self.groups.remove(group);
            }
        }
        Some((sub, unwatch))
    }

    /// This instance's members of the group keyed `group`.
    pub(crate) fn group_members(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |g| g.members)
    }

    /// Every subscription matching `channel`, once each, split into solo and groups.
    pub(crate) fn targets(&self, channel: &str, generation: u64) -> Targets {
        let mut matched = Vec::new();
        self.trie.collect(channel, &mut matched);
        // A subscription matching through several of its filters gets the event once.
        matched.sort_unstable_by_key(|s| Arc::as_ptr(&s.0));
        matched.dedup_by_key(|s| Arc::as_ptr(&s.0));

        let mut targets = Targets { generation, ..Targets::default() };
        let mut grouped: Vec<Arc<Subscription>> = Vec::new();
        for SubRef(sub) in matched {
            if sub.spec.group_key.is_some() {
                grouped.push(sub);
            } else {
                targets.solo.push(sub);
            }
        }
        // Oldest first: a stable order for round-robin and for delivery.
        targets.solo.sort_by(|a, b| a.id.cmp(&b.id));
        grouped.sort_by(|a, b| (&a.spec.group_key, &a.id).cmp(&(&b.spec.group_key, &b.id)));
        for chunk in grouped.chunk_by(|a, b| a.spec.group_key == b.spec.group_key) {
            let Some(name) = chunk[0].spec.group_key.as_ref() else { continue };
            let Some(group) = self.groups.get(name) else { continue };
            targets.groups.push(GroupTargets { cursor: Arc::clone(&group.cursor), members: chunk.to_vec() });
        }
        targets
    }
}
