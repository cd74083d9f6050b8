//! `eventbus auth new-token NAME`: a fresh token, and the principals-file entry that
//! lets it in. The file holds only the token's SHA-256, so the token is shown once,
//! here, and nowhere else.

use eventbus_core::token::{new_token, token_sha256};
use serde_json::json;

use crate::cli::AuthCommand;

pub(crate) fn run(json: bool, command: &AuthCommand) -> anyhow::Result<()> {
    match command {
        AuthCommand::NewToken { name } => {
            let token = new_token();
            println!("{}", new_token_output(name, &token, json));
            Ok(())
        }
    }
}

/// A principal's name: not empty, printable, no whitespace.
pub(crate) fn parse_name(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("a principal's name cannot be empty".into());
    }
    if let Some(c) = name.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("a principal's name is printable without whitespace: {c:?} is not allowed"));
    }
    Ok(name.to_owned())
}

/// The token, then the entry: YAML to paste into the principals file, or one JSON
/// object with both.
fn new_token_output(name: &str, token: &str, json: bool) -> String {
    let sha256 = token_sha256(token);
    if json {
        let permissions = json!({
            "publish": { "allow": [], "deny": [] },
            "subscribe": { "allow": [], "deny": [] },
            "consumers": { "allow": [] },
            "manage_consumers": [],
            "admin": false,
        });
        let principal = json!({ "name": name, "token_sha256": sha256, "permissions": permissions });
        return json!({ "token": token, "principal": principal }).to_string();
    }
    // A JSON string is a YAML double-quoted scalar: any printable name stays one value.
    let quoted = serde_json::Value::from(name).to_string();
    format!(
        "{token}

# Principals-file entry (auth.principals_file) for the token above, which the file
# never holds: give the token to the client (eventbus --token, EVENTBUS_TOKEN, or the
# `authorization: Bearer` header). Fill in what it may do; deny wins over allow.
- name: {quoted}
  token_sha256: {sha256}
  permissions:
    publish:   {{ allow: [], deny: [] }}   # channel patterns, e.g. orders.>
    subscribe: {{ allow: [], deny: [] }}   # Subscribe and consumer channels
    consumers: {{ allow: [] }}             # consumers it may attach to (name globs)
    manage_consumers: []                 # consumers it may create and delete (name globs)
    admin: false                         # every other Admin RPC and /admin REST"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly on purpose.

    use super::*;

    #[test]
    fn a_token_is_256_random_bits_in_hex() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        let digits = a.strip_prefix("ebt_").unwrap();
        assert_eq!(digits.len(), 64);
        assert!(digits.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{a}");
    }

    #[test]
    fn the_hash_is_lowercase_hex_sha256() {
        // `printf %s abc | sha256sum`
        assert_eq!(token_sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn names_are_printable_without_whitespace() {
        assert_eq!(parse_name("billing-svc@eu"), Ok("billing-svc@eu".into()));
        for bad in ["", "two words", "tab\t", "nl\n", "bell\u{7}", "nbsp\u{a0}"] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_yaml_entry_holds_the_name_and_hash_never_the_token() {
        let out = new_token_output("svc:a#1", "ebt_x", false);
        let (token, entry) = out.split_once("\n\n").unwrap();
        assert_eq!(token, "ebt_x");
        assert!(!entry.contains("ebt_x"));
        assert!(entry.contains(r#"- name: "svc:a#1""#), "{entry}");
        assert!(entry.contains(&format!("  token_sha256: {}\n", token_sha256("ebt_x"))), "{entry}");
        assert!(entry.contains("    admin: false"), "{entry}");
    }
}
