//! Static bearer tokens, defined in `eventbus_core::token` (where clients that mint and
//! hash tokens find them without this crate's JWT code).

pub use eventbus_core::token::{TOKEN_PREFIX, digest, new_token, token_sha256};
