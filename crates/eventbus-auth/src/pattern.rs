//! Covering and overlap of channel patterns, computed exactly on tokens.
//!
//! A pattern stands for a set of channels: `*` is exactly one token, `>` (last only) one
//! or more tokens, and a channel has 1 to [`MAX_TOKENS`] tokens. Authorization asks two
//! questions of these sets:
//!
//! - [`covers`]: is every channel the requested filter can match also matched by the
//!   allow pattern? (`a.*` covers `a.b` but not `a.>`.)
//! - [`overlaps`]: is there a channel matched by both? (`a.>` overlaps `*.b`.)
//!
//! Both reduce to two independent questions because a pattern's channels of one length
//! are a product of per-position sets (one literal, or "any token"): do the sets of
//! possible lengths fit, and do the positions fit one by one.

use eventbus_core::Pattern;
use eventbus_core::name::{MAX_TOKENS, Token};

/// Every channel `requested` can match is matched by `allow`.
pub fn covers(allow: &Pattern, requested: &Pattern) -> bool {
    covers_within(&Shape::of(allow), &Shape::of(requested), MAX_TOKENS)
}

/// Some channel is matched by both `a` and `b`.
pub fn overlaps(a: &Pattern, b: &Pattern) -> bool {
    overlaps_within(&Shape::of(a), &Shape::of(b), MAX_TOKENS)
}

/// A pattern's tokens laid out for position-by-position comparison.
#[derive(Debug)]
struct Shape<'a> {
    /// The tokens before a trailing `>` (all of them when there is none).
    fixed: Vec<Token<'a>>,
    /// Ends with `>`: the channel goes on for one or more tokens after `fixed`.
    rest: bool,
}

impl<'a> Shape<'a> {
    fn of(pattern: &'a Pattern) -> Self {
        let mut fixed: Vec<Token<'a>> = pattern.tokens().collect();
        let rest = fixed.last() == Some(&Token::Rest);
        if rest {
            fixed.pop();
        }
        Self { fixed, rest }
    }

    /// Fewest tokens in a matching channel.
    fn min_len(&self) -> usize {
        self.fixed.len() + usize::from(self.rest)
    }

    /// Most tokens in a matching channel, when channels have at most `max` tokens.
    fn max_len(&self, max: usize) -> usize {
        if self.rest { max } else { self.fixed.len() }
    }

    /// The literal this pattern demands at `position`, or `None` for "any token".
    fn literal_at(&self, position: usize) -> Option<&'a str> {
        match self.fixed.get(position) {
            Some(Token::Literal(lit)) => Some(lit),
            _ => None,
        }
    }
}

/// [`covers`] when channels have at most `max` tokens (patterns have at most `max` too).
fn covers_within(allow: &Shape<'_>, requested: &Shape<'_>, max: usize) -> bool {
    // The requested lengths [min, max] must sit inside the allowed ones.
    let lengths_fit = requested.min_len() >= allow.min_len() && requested.max_len(max) <= allow.max_len(max);
    // Where the allow demands a literal, the request must demand the same one: a
    // wildcard there would let through channels the allow does not match.
    lengths_fit
        && (0..allow.fixed.len()).all(|i| allow.literal_at(i).is_none_or(|lit| requested.literal_at(i) == Some(lit)))
}

/// [`overlaps`] when channels have at most `max` tokens (patterns have at most `max` too).
fn overlaps_within(a: &Shape<'_>, b: &Shape<'_>, max: usize) -> bool {
    let lengths_meet = a.min_len().max(b.min_len()) <= a.max_len(max).min(b.max_len(max));
    // Positions past either pattern's fixed part are "any" on that side, so only
    // two different literals at the same position can keep them apart.
    lengths_meet
        && (0..a.fixed.len().min(b.fixed.len())).all(|i| match (a.literal_at(i), b.literal_at(i)) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }

    #[test]
    fn covering_examples() {
        assert!(covers(&p("a.*"), &p("a.b")));
        assert!(!covers(&p("a.*"), &p("a.>")));
        assert!(covers(&p("a.>"), &p("a.*")));
        assert!(covers(&p("a.>"), &p("a.b.>")));
        assert!(covers(&p(">"), &p("x.*.y.>")));
        assert!(covers(&p("a.b"), &p("a.b")));
        assert!(!covers(&p("a.b"), &p("a.*")));
        assert!(!covers(&p("a.>"), &p("a")));
        assert!(!covers(&p("a.>"), &p("*.b")));
        assert!(covers(&p("*.*"), &p("a.b")));
        assert!(!covers(&p("*"), &p(">")));
    }

    #[test]
    fn overlap_examples() {
        assert!(overlaps(&p("a.>"), &p("*.b")));
        assert!(!overlaps(&p("a.*"), &p("a.b.c")));
        assert!(overlaps(&p("a.*"), &p("*.b")));
        assert!(!overlaps(&p("a.b"), &p("a.c")));
        assert!(!overlaps(&p("a"), &p("a.>")));
        assert!(overlaps(&p(">"), &p("x")));
        assert!(overlaps(&p("a.>"), &p("*.*.c.>")));
        assert!(!overlaps(&p("a.b.>"), &p("*.c.>")));
    }

    #[test]
    fn the_sixteen_token_limit_counts() {
        // Fifteen literals then `>` can only be a 16-token channel, which `*` at the
        // sixteenth position covers exactly.
        let prefix = ["a"; 15].join(".");
        let rest = p(&format!("{prefix}.>"));
        let star = p(&format!("{prefix}.*"));
        assert!(covers(&star, &rest));
        assert!(covers(&rest, &star));
        let shorter = p(&format!("{}.*", ["a"; 14].join(".")));
        assert!(!covers(&shorter, &rest));
        assert!(!overlaps(&shorter, &rest));
    }

    /// A pattern over the tiny alphabet: tokens from {a, b, *, >}, `>` only last.
    fn small_pattern(max_len: usize) -> impl Strategy<Value = String> {
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "*"]), 0..max_len), any::<bool>(), any::<bool>())
            .prop_map(|(mut tokens, gt, extra)| {
                // `extra` picks a last token from the full set when there is room.
                if tokens.is_empty() || extra {
                    tokens.push(if gt { ">" } else { "a" });
                }
                tokens.join(".")
            })
            .prop_filter("within the length bound", move |s| s.split('.').count() <= max_len)
    }

    /// Every channel over {a, b, c} with 1..=`max` tokens: `c` stands for every token
    /// the patterns do not name, so these channels witness every case.
    fn all_channels(max: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut layer = vec![String::new()];
        for _ in 0..max {
            let mut next = Vec::new();
            for prefix in &layer {
                for t in ["a", "b", "c"] {
                    next.push(if prefix.is_empty() { t.to_owned() } else { format!("{prefix}.{t}") });
                }
            }
            all.extend(next.iter().cloned());
            layer = next;
        }
        all
    }

    fn brute_covers(allow: &Pattern, requested: &Pattern, channels: &[String]) -> bool {
        channels.iter().filter(|c| requested.matches(c)).all(|c| allow.matches(c))
    }

    fn brute_overlaps(a: &Pattern, b: &Pattern, channels: &[String]) -> bool {
        channels.iter().any(|c| a.matches(c) && b.matches(c))
    }

    proptest! {
        /// Channels of up to 5 tokens with the limit set to 5: exact, and a pattern can
        /// reach the limit, so the `>`-at-the-limit case is exercised too.
        #[test]
        fn agrees_with_brute_force_at_the_limit(a in small_pattern(5), b in small_pattern(5)) {
            let channels = all_channels(5);
            let (pa, pb) = (p(&a), p(&b));
            let (sa, sb) = (Shape::of(&pa), Shape::of(&pb));
            prop_assert_eq!(covers_within(&sa, &sb, 5), brute_covers(&pa, &pb, &channels), "covers({}, {})", a, b);
            prop_assert_eq!(overlaps_within(&sa, &sb, 5), brute_overlaps(&pa, &pb, &channels), "overlaps({}, {})", a, b);
        }

        /// Patterns of up to 4 tokens never reach a limit of 5 or 16, so channels of up
        /// to 5 tokens decide the real 16-token answer.
        #[test]
        fn agrees_with_brute_force_under_the_real_limit(a in small_pattern(4), b in small_pattern(4)) {
            let channels = all_channels(5);
            let (pa, pb) = (p(&a), p(&b));
            prop_assert_eq!(covers(&pa, &pb), brute_covers(&pa, &pb, &channels), "covers({}, {})", a, b);
            prop_assert_eq!(overlaps(&pa, &pb), brute_overlaps(&pa, &pb, &channels), "overlaps({}, {})", a, b);
        }
    }
}
