//! Consumer-name globs: `*` matches any run of characters (the empty one too), every
//! other character is literal; `*` alone matches every name.

/// A compiled glob: the literal pieces between its `*`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    text: Box<str>,
    /// `text` split on `*`: one piece when there is no `*`.
    pieces: Box<[Box<str>]>,
}

impl Glob {
    /// Compiles `text`; `None` when it is empty (an empty glob is a configuration slip,
    /// not a rule that matches nothing).
    pub fn new(text: &str) -> Option<Self> {
        if text.is_empty() {
            return None;
        }
        Some(Self { text: text.into(), pieces: text.split('*').map(Into::into).collect() })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches the glob.
    pub fn matches(&self, name: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some(last) = rest.last() else {
            return name == &**first;
        };
        let Some(mut remaining) = name.strip_prefix(&**first) else {
            return false;
        };
        // The middle pieces, leftmost match first: taking the earliest place leaves
        // the most room for the pieces after it.
        for piece in &rest[..rest.len() - 1] {
            match remaining.find(&**piece) {
                Some(at) => remaining = &remaining[at + piece.len()..],
                None => return false,
            }
        }
        remaining.ends_with(&**last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> Glob {
        Glob::new(s).unwrap()
    }

    #[test]
    fn star_matches_any_run() {
        assert!(g("*").matches(""));
        assert!(g("*").matches("billing"));
        assert!(g("billing-*").matches("billing-"));
        assert!(g("billing-*").matches("billing-eu"));
        assert!(!g("billing-*").matches("billing"));
        assert!(g("*-eu").matches("orders-eu"));
        assert!(!g("*-eu").matches("orders-us"));
        assert!(g("a*b*c").matches("abc"));
        assert!(g("a*b*c").matches("axxbyyc"));
        assert!(!g("a*b*c").matches("acb"));
        assert!(!g("ab*ba").matches("aba"));
        assert!(g("ab*ba").matches("abba"));
        assert!(g("**").matches("x"));
    }

    #[test]
    fn everything_else_is_literal() {
        assert!(g("orders").matches("orders"));
        assert!(!g("orders").matches("orders2"));
        assert!(!g("o?ders").matches("orders"));
        assert!(g("a.b").matches("a.b") && !g("a.b").matches("axb"));
    }

    #[test]
    fn empty_glob_is_refused() {
        assert_eq!(Glob::new(""), None);
    }
}
