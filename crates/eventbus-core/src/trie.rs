//! A token trie over subscription filters, in the manner of NATS's sublist.
//!
//! Matching a channel walks one path per literal token plus the `*` and `>` branches,
//! so its cost depends on the channel's depth and on the filters that share its
//! prefixes — never on the total number of patterns.

use std::collections::HashMap;

use crate::name::{Pattern, Token};

/// Filters mapped to values (subscriptions). A value may appear under several filters.
#[derive(Debug)]
pub struct Trie<V> {
    root: Node<V>,
}

#[derive(Debug)]
struct Node<V> {
    literal: HashMap<Box<str>, Node<V>>,
    star: Option<Box<Node<V>>>,
    /// Values whose filter ends with `>` right after this node's path.
    rest: Vec<V>,
    /// Values whose filter ends exactly at this node.
    here: Vec<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self { literal: HashMap::new(), star: None, rest: Vec::new(), here: Vec::new() }
    }
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.star.is_none() && self.rest.is_empty() && self.here.is_empty()
    }
}

impl<V> Default for Trie<V> {
    fn default() -> Self {
        Self { root: Node::default() }
    }
}

impl<V: Clone> Trie<V> {
    /// Adds `value` under `filter`.
    pub fn insert(&mut self, filter: &Pattern, value: V) {
        let mut node = &mut self.root;
        for token in filter.tokens() {
            match token {
                Token::Literal(lit) => node = node.literal.entry(lit.into()).or_default(),
                Token::Star => node = node.star.get_or_insert_with(Box::default),
                Token::Rest => {
                    node.rest.push(value);
                    return;
                }
            }
        }
        node.here.push(value);
    }

    /// Removes one occurrence of a value under `filter` (found with `is_it`), pruning
    /// nodes left empty. Returns whether it was there.
    pub fn remove(&mut self, filter: &Pattern, is_it: impl Fn(&V) -> bool) -> bool {
        let tokens: Vec<Token<'_>> = filter.tokens().collect();
        remove_in(&mut self.root, &tokens, &is_it)
    }

    /// Appends every value whose filter matches `channel` to `out` (a value under
    /// several matching filters appears once per filter).
    pub fn collect(&self, channel: &str, out: &mut Vec<V>) {
        // Channels have at most 16 tokens: a small stack buffer would do, but the
        // caller caches the result per channel, so this runs once per change.
        let tokens: Vec<&str> = channel.split('.').collect();
        collect_in(&self.root, &tokens, out);
    }
}

fn remove_in<V>(node: &mut Node<V>, tokens: &[Token<'_>], is_it: &impl Fn(&V) -> bool) -> bool {
    let Some((first, rest)) = tokens.split_first() else {
        return take_one(&mut node.here, is_it);
    };
    match first {
        Token::Rest => take_one(&mut node.rest, is_it),
        Token::Star => {
            let Some(child) = node.star.as_mut() else { return false };
            let found = remove_in(child, rest, is_it);
            if child.is_empty() {
                node.star = None;
            }
            found
        }
        Token::Literal(lit) => {
            let Some(child) = node.literal.get_mut(*lit) else { return false };
            let found = remove_in(child, rest, is_it);
            if child.is_empty() {
                node.literal.remove(*lit);
            }
            found
        }
    }
}

fn take_one<V>(values: &mut Vec<V>, is_it: &impl Fn(&V) -> bool) -> bool {
    match values.iter().position(is_it) {
        Some(i) => {
            values.swap_remove(i);
            true
        }
        None => false,
    }
}

fn collect_in<V: Clone>(node: &Node<V>, tokens: &[&str], out: &mut Vec<V>) {
    let Some((first, rest)) = tokens.split_first() else {
        out.extend(node.here.iter().cloned());
        return;
    };
    // `>` needs at least one token, which `first` is.
    out.extend(node.rest.iter().cloned());
    if let Some(child) = node.literal.get(*first) {
        collect_in(child, rest, out);
    }
    if let Some(child) = &node.star {
        collect_in(child, rest, out);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }

    fn matched(trie: &Trie<u32>, channel: &str) -> Vec<u32> {
        let mut out = Vec::new();
        trie.collect(channel, &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn exact_star_and_rest() {
        let mut t = Trie::default();
        t.insert(&p("orders.created"), 1);
        t.insert(&p("orders.*"), 2);
        t.insert(&p("orders.>"), 3);
        t.insert(&p("*.created"), 4);
        t.insert(&p(">"), 5);
        assert_eq!(matched(&t, "orders.created"), vec![1, 2, 3, 4, 5]);
        assert_eq!(matched(&t, "orders.eu.created"), vec![3, 5]);
        assert_eq!(matched(&t, "orders"), vec![5]);
        assert_eq!(matched(&t, "users.created"), vec![4, 5]);
    }

    #[test]
    fn remove_prunes_and_keeps_others() {
        let mut t = Trie::default();
        t.insert(&p("a.b.c"), 1);
        t.insert(&p("a.b.c"), 2);
        t.insert(&p("a.*.c"), 3);
        assert!(t.remove(&p("a.b.c"), |v| *v == 1));
        assert!(!t.remove(&p("a.b.c"), |v| *v == 1));
        assert_eq!(matched(&t, "a.b.c"), vec![2, 3]);
        assert!(t.remove(&p("a.b.c"), |v| *v == 2));
        assert!(t.remove(&p("a.*.c"), |v| *v == 3));
        assert!(t.root.is_empty(), "empty nodes are pruned");
    }

    fn token() -> impl Strategy<Value = String> {
        prop_oneof![Just("a".to_owned()), Just("b".to_owned()), Just("c".to_owned())]
    }

    fn channel() -> impl Strategy<Value = String> {
        prop::collection::vec(token(), 1..5).prop_map(|t| t.join("."))
    }

    fn pattern() -> impl Strategy<Value = String> {
        let tok = prop_oneof![3 => token(), 1 => Just("*".to_owned())];
        (prop::collection::vec(tok, 1..5), any::<bool>()).prop_map(|(mut t, rest)| {
            if rest {
                *t.last_mut().unwrap() = ">".to_owned();
            }
            t.join(".")
        })
    }

    proptest! {
        /// The trie agrees with the token-by-token reference matcher, including after
        /// removals.
        #[test]
        fn trie_agrees_with_naive_matcher(
            patterns in prop::collection::vec(pattern(), 0..40),
            removed in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
            channels in prop::collection::vec(channel(), 1..20),
        ) {
            let patterns: Vec<Pattern> = patterns.iter().map(|s| p(s)).collect();
            let mut live: Vec<bool> = vec![true; patterns.len()];
            let mut t = Trie::default();
            for (i, pat) in patterns.iter().enumerate() {
                t.insert(pat, i as u32);
            }
            if !patterns.is_empty() {
                for r in removed {
                    let i = r.index(patterns.len());
                    let was = t.remove(&patterns[i], |v| *v == i as u32);
                    prop_assert_eq!(was, live[i]);
                    live[i] = false;
                }
            }
            for ch in &channels {
                let want: Vec<u32> = patterns
                    .iter()
                    .enumerate()
                    .filter(|(i, pat)| live[*i] && pat.matches(ch))
                    .map(|(i, _)| i as u32)
                    .collect();
                prop_assert_eq!(matched(&t, ch), want, "channel {}", ch);
            }
        }
    }
}
