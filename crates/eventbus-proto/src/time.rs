//! What `google.protobuf.Timestamp` calls a valid time.
//!
//! prost normalises an out-of-range `Timestamp` (nanos of a second or more, a date
//! before year 1 or after 9999) instead of refusing it; requests that carry a time are
//! checked here first, so a bad one is refused by name rather than read as another time.

use std::fmt;

use prost_types::Timestamp;

/// `0001-01-01T00:00:00Z` in seconds since the epoch: the earliest valid `Timestamp`.
pub const MIN_SECONDS: i64 = -62_135_596_800;
/// `9999-12-31T23:59:59Z` in seconds since the epoch: the latest valid `Timestamp`.
pub const MAX_SECONDS: i64 = 253_402_300_799;

/// Why a `Timestamp` is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidTimestamp {
    /// `nanos` outside `0..=999_999_999`.
    Nanos(i32),
    /// `seconds` outside years 1 to 9999.
    Seconds(i64),
}

impl fmt::Display for InvalidTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nanos(n) => write!(f, "nanos {n} is outside 0..=999999999"),
            Self::Seconds(s) => {
                write!(f, "seconds {s} is outside years 1 to 9999 ({MIN_SECONDS}..={MAX_SECONDS})")
            }
        }
    }
}

impl std::error::Error for InvalidTimestamp {}

/// `Ok` when `t` is a valid `google.protobuf.Timestamp`.
pub fn check_timestamp(t: &Timestamp) -> Result<(), InvalidTimestamp> {
    if !(0..=999_999_999).contains(&t.nanos) {
        return Err(InvalidTimestamp::Nanos(t.nanos));
    }
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&t.seconds) {
        return Err(InvalidTimestamp::Seconds(t.seconds));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64, nanos: i32) -> Result<(), InvalidTimestamp> {
        check_timestamp(&Timestamp { seconds, nanos })
    }

    #[test]
    fn the_edges_of_years_1_and_9999_are_valid_and_one_past_them_is_not() {
        assert_eq!(at(MIN_SECONDS, 0), Ok(()));
        assert_eq!(at(MAX_SECONDS, 999_999_999), Ok(()));
        assert_eq!(at(MIN_SECONDS - 1, 0), Err(InvalidTimestamp::Seconds(MIN_SECONDS - 1)));
        assert_eq!(at(MAX_SECONDS + 1, 0), Err(InvalidTimestamp::Seconds(MAX_SECONDS + 1)));
        // The bounds are the dates they claim to be.
        assert_eq!(Timestamp { seconds: MIN_SECONDS, nanos: 0 }.to_string(), "0001-01-01T00:00:00Z");
        assert_eq!(Timestamp { seconds: MAX_SECONDS, nanos: 0 }.to_string(), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn nanos_must_be_a_fraction_of_one_second() {
        assert_eq!(at(0, -1), Err(InvalidTimestamp::Nanos(-1)));
        assert_eq!(at(0, 1_000_000_000), Err(InvalidTimestamp::Nanos(1_000_000_000)));
        assert_eq!(at(1_700_000_000, 0), Ok(()));
    }
}
