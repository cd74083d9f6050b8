//! Static bearer tokens: minting a fresh one, and the SHA-256 digest the principals
//! file stores instead of the token itself.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Marks a string as an EventBus token, so secret scanners and people recognise it.
pub const TOKEN_PREFIX: &str = "ebt_";

/// A fresh token: [`TOKEN_PREFIX`] then 256 random bits from the OS, as lowercase hex.
pub fn new_token() -> String {
    let mut bits = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bits);
    format!("{TOKEN_PREFIX}{}", hex::encode(bits))
}

/// SHA-256 of `token`, lowercase hex: the `token_sha256` of a principals-file entry.
pub fn token_sha256(token: &str) -> String {
    hex::encode(digest(token))
}

/// SHA-256 of `token`, raw.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_hex() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        let body = a.strip_prefix(TOKEN_PREFIX).unwrap();
        assert_eq!(body.len(), 64);
        assert!(body.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn digest_is_lowercase_sha256_hex() {
        assert_eq!(token_sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
