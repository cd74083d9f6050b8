//! Capped exponential backoff between reconnection attempts.

use std::time::Duration;

/// Delays between reconnection attempts: `initial`, then × `multiplier` after each
/// failure, never more than `max`. A successful (re)connection starts over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Growth per failed attempt (at least 1).
    pub multiplier: f64,
    /// Ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    /// 50 ms, doubling, at most 5 s: a restarted broker is found within 5 s.
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), multiplier: 2.0, max: Duration::from_secs(5) }
    }
}

impl Backoff {
    /// The delay before attempt `failures + 1`, after `failures` failed attempts in a row
    /// (0 = the first retry: `initial`).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = self.multiplier.max(1.0).powi(i32::try_from(failures).unwrap_or(i32::MAX));
        let secs = self.initial.as_secs_f64() * factor;
        if secs.is_finite() && secs < self.max.as_secs_f64() { Duration::from_secs_f64(secs) } else { self.max }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let b = Backoff { initial: Duration::from_millis(100), multiplier: 2.0, max: Duration::from_secs(1) };
        let ms: Vec<u128> = (0..6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1), "no overflow");
        let flat = Backoff { multiplier: 0.5, ..b };
        assert_eq!(flat.delay(3), Duration::from_millis(100), "a multiplier below 1 is 1");
    }
}
