//! Channel names and patterns (docs/concepts.md).
//!
//! A channel is 1 to [`MAX_TOKENS`] dot-separated tokens and at most [`MAX_NAME_BYTES`]
//! bytes; a token is one or more printable ASCII characters other than space, `.`, `*`
//! and `>`. A pattern may also hold the wildcards `*` (exactly one token) and `>` (one
//! or more tokens, last position only), each as a whole token.

use std::fmt;

/// Longest channel or pattern, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Most tokens in a channel or pattern.
pub const MAX_TOKENS: usize = 16;
/// How much of an offending name an error message repeats.
const SHOWN_BYTES: usize = 80;

/// Whether a name was checked as a published channel or as a subscription filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// An exact channel given to publish.
    Channel,
    /// A channel or pattern given to subscribe.
    Pattern,
}

/// What is wrong with a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameProblem {
    /// The name is the empty string.
    Empty,
    /// Longer than [`MAX_NAME_BYTES`].
    TooLong { len: usize },
    /// More than [`MAX_TOKENS`] tokens.
    TooManyTokens { count: usize },
    /// Two dots in a row, or a leading or trailing dot (1-based token position).
    EmptyToken { position: usize },
    /// A character outside printable ASCII, or a space (1-based token position).
    BadCharacter { ch: char, position: usize },
    /// A wildcard in a name given to publish.
    Wildcard,
    /// `*` or `>` sharing a token with other characters (`ord*`).
    PartialWildcard { position: usize },
    /// `>` anywhere but the last token (`a.>.b`).
    GtNotLast,
    /// Publishing on a `$` channel, which only the broker may do.
    Reserved,
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("it is empty"),
            Self::TooLong { len } => {
                write!(f, "it is {len} bytes long; the limit is {MAX_NAME_BYTES}")
            }
            Self::TooManyTokens { count } => {
                write!(f, "it has {count} tokens; the limit is {MAX_TOKENS}")
            }
            Self::EmptyToken { position } => write!(f, "token {position} is empty"),
            Self::BadCharacter { ch, position } => {
                write!(f, "token {position} contains {ch:?}; tokens are printable ASCII without space, '.', '*' or '>'")
            }
            Self::Wildcard => f.write_str("wildcards '*' and '>' are only allowed in subscriptions"),
            Self::PartialWildcard { position } => {
                write!(f, "token {position} mixes a wildcard with other characters; '*' and '>' must be whole tokens")
            }
            Self::GtNotLast => f.write_str("'>' may only be the last token"),
            Self::Reserved => f.write_str("channels starting with '$' are reserved for the broker"),
        }
    }
}

/// A rejected channel or pattern, with the name (shortened if huge) and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {} {name:?}: {problem}", match .kind { NameKind::Channel => "channel", NameKind::Pattern => "channel pattern" })]
pub struct NameError {
    /// The offending name, cut to a readable length.
    pub name: String,
    /// How it was being used.
    pub kind: NameKind,
    /// What is wrong with it.
    pub problem: NameProblem,
}

impl NameError {
    fn new(name: &str, kind: NameKind, problem: NameProblem) -> Self {
        let name = if name.len() <= SHOWN_BYTES {
            name.to_owned()
        } else {
            let mut cut = SHOWN_BYTES;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…", &name[..cut])
        };
        Self { name, kind, problem }
    }
}

/// One token of a parsed pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// Matches exactly this token.
    Literal(&'a str),
    /// `*`: any one token.
    Star,
    /// `>`: one or more tokens (always last).
    Rest,
}

/// Checks the shape shared by channels and patterns; returns the token count.
fn check_tokens(name: &str, kind: NameKind) -> Result<usize, NameError> {
    let err = |problem| NameError::new(name, kind, problem);
    if name.is_empty() {
        return Err(err(NameProblem::Empty));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(err(NameProblem::TooLong { len: name.len() }));
    }
    let mut count = 0;
    for (i, token) in name.split('.').enumerate() {
        let position = i + 1;
        count = position;
        if token.is_empty() {
            return Err(err(NameProblem::EmptyToken { position }));
        }
        if let Some(ch) = token.chars().find(|c| !matches!(c, '!'..='~')) {
            return Err(err(NameProblem::BadCharacter { ch, position }));
        }
        let wild = token.bytes().any(|b| b == b'*' || b == b'>');
        if wild {
            if kind == NameKind::Channel {
                return Err(err(NameProblem::Wildcard));
            }
            if token.len() != 1 {
                return Err(err(NameProblem::PartialWildcard { position }));
            }
        }
    }
    if count > MAX_TOKENS {
        return Err(err(NameProblem::TooManyTokens { count }));
    }
    Ok(count)
}

/// Whether `name` is a well-formed channel that may be published on, in one pass over
/// its bytes. Every publish checks its channel, and the general check (token by token,
/// able to say what is wrong) costs about ten times as much; this decides the common,
/// valid case and leaves errors to it.
fn is_plain_channel(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else { return false };
    if bytes.len() > MAX_NAME_BYTES || first == b'$' || first == b'.' || last == b'.' {
        return false;
    }
    // Branch-free passes the compiler can vectorise: printable ASCII but the wildcards
    // (`.` is printable), the dots counted, no two dots in a row.
    let mut bad = false;
    let mut dots: u32 = 0;
    for &b in bytes {
        bad |= (b.wrapping_sub(b'!') > b'~' - b'!') | (b == b'*') | (b == b'>');
        dots += u32::from(b == b'.');
    }
    let printable = !bad;
    let empty_token = bytes.iter().zip(&bytes[1..]).fold(false, |acc, (a, b)| acc | ((*a == b'.') & (*b == b'.')));
    printable && !empty_token && (dots as usize) < MAX_TOKENS
}

/// Checks a channel name given to publish: exact, well formed, not reserved.
pub fn validate_channel(name: &str) -> Result<(), NameError> {
    if is_plain_channel(name) {
        return Ok(());
    }
    check_tokens(name, NameKind::Channel)?;
    if name.starts_with('$') {
        return Err(NameError::new(name, NameKind::Channel, NameProblem::Reserved));
    }
    Ok(())
}

/// A validated subscription filter: an exact channel or a pattern with wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pattern(Box<str>);

impl Pattern {
    /// Parses a filter given to subscribe. `$` channels may be subscribed to.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        check_tokens(name, NameKind::Pattern)?;
        let gt_inside = name.split('.').rev().skip(1).any(|t| t == ">");
        if gt_inside {
            return Err(NameError::new(name, NameKind::Pattern, NameProblem::GtNotLast));
        }
        Ok(Self(name.into()))
    }

    /// The filter as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when the filter has no wildcard, i.e. names one channel.
    pub fn is_exact(&self) -> bool {
        self.tokens().all(|t| matches!(t, Token::Literal(_)))
    }

    /// The filter's tokens, in order.
    pub fn tokens(&self) -> impl Iterator<Item = Token<'_>> {
        self.0.split('.').map(|t| match t {
            "*" => Token::Star,
            ">" => Token::Rest,
            literal => Token::Literal(literal),
        })
    }

    /// True when every channel `other` matches, this filter matches too.
    pub fn covers(&self, other: &Pattern) -> bool {
        let mut theirs = other.tokens();
        for mine in self.tokens() {
            let Some(their) = theirs.next() else { return false };
            match (mine, their) {
                (Token::Rest, _) => return true,
                (_, Token::Rest) => return false,
                (Token::Star, _) => {}
                (Token::Literal(a), Token::Literal(b)) if a == b => {}
                (Token::Literal(_), _) => return false,
            }
        }
        theirs.next().is_none()
    }

    /// Token-by-token match of one channel, without the router. The router is the fast
    /// path; this is its reference (and what redis mode uses to re-check Redis globs).
    pub fn matches(&self, channel: &str) -> bool {
        let mut names = channel.split('.');
        for token in self.tokens() {
            match token {
                Token::Rest => return names.next().is_some(),
                Token::Star => {
                    if names.next().is_none() {
                        return false;
                    }
                }
                Token::Literal(lit) => {
                    if names.next() != Some(lit) {
                        return false;
                    }
                }
            }
        }
        names.next().is_none()
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel_problem(name: &str) -> NameProblem {
        match validate_channel(name) {
            Err(e) => e.problem,
            Ok(()) => panic!("{name:?} was accepted"),
        }
    }

    fn pattern_problem(name: &str) -> NameProblem {
        match Pattern::parse(name) {
            Err(e) => e.problem,
            Ok(_) => panic!("{name:?} was accepted"),
        }
    }

    #[test]
    fn a_filter_covers_the_filters_whose_channels_it_all_matches() {
        let covers = |a: &str, b: &str| Pattern::parse(a).unwrap().covers(&Pattern::parse(b).unwrap());
        for (a, b) in [
            (">", "a"),
            (">", "a.>"),
            ("a.>", "a.*.c"),
            ("a.>", "a.>"),
            ("a.*", "a.b"),
            ("a.*", "a.*"),
            ("a.b", "a.b"),
            ("*.*", "x.*"),
        ] {
            assert!(covers(a, b), "{a} covers {b}");
        }
        for (a, b) in [("a.*", "a.>"), ("a.*", "a"), ("a.b", "a.*"), ("a.>", "a"), ("a.*", "a.b.c"), ("a", "a.b")] {
            assert!(!covers(a, b), "{a} does not cover {b}");
        }
        // Exhaustive cross-check on small names: covering means matching all they match.
        let names = ["a", "b", "a.a", "a.b", "b.a", "a.a.a", "a.b.c"];
        let filters = ["a", "*", ">", "a.*", "a.>", "*.a", "*.>", "a.b", "*.*", "a.*.*"];
        for a in filters {
            for b in filters {
                let (pa, pb) = (Pattern::parse(a).unwrap(), Pattern::parse(b).unwrap());
                if pa.covers(&pb) {
                    assert!(names.iter().all(|n| !pb.matches(n) || pa.matches(n)), "{a} covers {b}");
                }
            }
        }
    }

    #[test]
    fn accepts_good_channels() {
        let sixteen = ["a"; 16].join(".");
        for name in ["orders", "orders.created", "a.b.c", "x-1_2.Y~!#", &sixteen] {
            assert_eq!(validate_channel(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_bad_channels_with_reason() {
        assert_eq!(channel_problem(""), NameProblem::Empty);
        assert_eq!(channel_problem("a..b"), NameProblem::EmptyToken { position: 2 });
        assert_eq!(channel_problem(".a"), NameProblem::EmptyToken { position: 1 });
        assert_eq!(channel_problem("a."), NameProblem::EmptyToken { position: 2 });
        assert_eq!(channel_problem("a b"), NameProblem::BadCharacter { ch: ' ', position: 1 });
        assert_eq!(channel_problem("a.é"), NameProblem::BadCharacter { ch: 'é', position: 2 });
        assert_eq!(channel_problem("a.\n"), NameProblem::BadCharacter { ch: '\n', position: 2 });
        assert_eq!(channel_problem("orders.*"), NameProblem::Wildcard);
        assert_eq!(channel_problem("orders.>"), NameProblem::Wildcard);
        assert_eq!(channel_problem("ord*"), NameProblem::Wildcard);
        assert_eq!(channel_problem("$sys.x"), NameProblem::Reserved);
        assert_eq!(channel_problem(&"a".repeat(257)), NameProblem::TooLong { len: 257 });
        assert_eq!(channel_problem(&["a"; 17].join(".")), NameProblem::TooManyTokens { count: 17 });
        assert_eq!(validate_channel(&"a".repeat(256)), Ok(()));
    }

    #[test]
    fn the_fast_check_agrees_with_the_full_one() {
        let sixteen = ["a"; 16].join(".");
        let seventeen = ["a"; 17].join(".");
        let long = "a".repeat(256);
        let too_long = "a".repeat(257);
        let names = [
            "",
            ".",
            "a",
            "a.",
            ".a",
            "a..b",
            "a.b",
            "orders.created",
            "x-1_2.Y~!#",
            "$sys.x",
            "a$",
            "a b",
            "a.é",
            "a.\n",
            "a\x7f",
            "orders.*",
            "orders.>",
            "ord*",
            "a.>b",
            &sixteen,
            &seventeen,
            &long,
            &too_long,
        ];
        for name in names {
            let full = check_tokens(name, NameKind::Channel).is_ok() && !name.starts_with('$');
            assert_eq!(is_plain_channel(name), full, "{name:?}");
            assert_eq!(validate_channel(name).is_ok(), full, "{name:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_fast_check_agrees_on_any_name(name in "[a-c.*>$ é~!]{0,20}") {
            let full = check_tokens(&name, NameKind::Channel).is_ok() && !name.starts_with('$');
            proptest::prop_assert_eq!(is_plain_channel(&name), full);
        }
    }

    #[test]
    fn patterns_follow_wildcard_rules() {
        for good in ["orders.*", "orders.>", "*.created", ">", "*", "$sys.>", "a.*.c.>"] {
            assert!(Pattern::parse(good).is_ok(), "{good}");
        }
        assert_eq!(pattern_problem("ord*.x"), NameProblem::PartialWildcard { position: 1 });
        assert_eq!(pattern_problem("a.b>"), NameProblem::PartialWildcard { position: 2 });
        assert_eq!(pattern_problem("a.>.b"), NameProblem::GtNotLast);
        assert_eq!(pattern_problem("a..*"), NameProblem::EmptyToken { position: 2 });
    }

    #[test]
    fn error_message_names_the_channel_and_reason() {
        let err = validate_channel("orders.*").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid channel \"orders.*\": wildcards '*' and '>' are only allowed in subscriptions"
        );
        let err = Pattern::parse("a.>.b").unwrap_err();
        assert_eq!(err.to_string(), "invalid channel pattern \"a.>.b\": '>' may only be the last token");
        let long = validate_channel(&"é".repeat(200)).unwrap_err();
        assert!(long.name.ends_with('…') && long.name.len() <= SHOWN_BYTES + 3);
    }

    #[test]
    fn matching_follows_token_rules() {
        let p = |s| Pattern::parse(s).unwrap();
        assert!(p("orders.*").matches("orders.created"));
        assert!(!p("orders.*").matches("orders.eu.created"));
        assert!(!p("orders.*").matches("orders"));
        assert!(p("orders.>").matches("orders.eu.created"));
        assert!(p("orders.>").matches("orders.created"));
        assert!(!p("orders.>").matches("orders"));
        assert!(p("*.created").matches("orders.created"));
        assert!(p("orders.created").matches("orders.created"));
        assert!(!p("orders.created").matches("orders.created.x"));
        assert!(p("orders.created").is_exact() && !p("orders.*").is_exact());
    }
}
