//! Per-principal publish rate limit: a token bucket.

use std::time::Instant;

use parking_lot::Mutex;

/// A token bucket refilled at `rate` tokens per second up to a burst of `max(rate, 1)`.
///
/// The state is two numbers behind a `parking_lot` mutex held for a few arithmetic
/// operations: cheaper than a CAS loop over a packed pair, and never held across I/O.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date (monotonic clock).
    at: Instant,
}

impl Bucket {
    fn burst(&self) -> f64 {
        self.rate.max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        // A `now` before `at` (callers racing) adds nothing rather than going negative.
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst());
        self.at = self.at.max(now);
    }
}

impl RateLimiter {
    /// A full bucket allowing `rate` events per second (`rate` > 0; see
    /// [`Permissions::validate`](crate::Permissions::validate)).
    pub fn new(rate: f64) -> Self {
        Self::new_at(rate, Instant::now())
    }

    fn new_at(rate: f64, now: Instant) -> Self {
        let rate = sanitize(rate);
        Self { state: Mutex::new(Bucket { rate, tokens: rate.max(1.0), at: now }) }
    }

    /// Takes `n` tokens if the bucket holds them. More than the burst never succeeds.
    pub fn try_acquire(&self, n: u32) -> bool {
        self.try_acquire_at(n, Instant::now())
    }

    fn try_acquire_at(&self, n: u32, now: Instant) -> bool {
        let mut bucket = self.state.lock();
        bucket.refill(now);
        let wanted = f64::from(n);
        if bucket.tokens >= wanted {
            bucket.tokens -= wanted;
            true
        } else {
            false
        }
    }

    /// The configured events per second.
    pub fn rate(&self) -> f64 {
        self.state.lock().rate
    }

    /// Changes the rate (on reload) keeping the tokens already earned, up to the new burst.
    pub fn set_rate(&self, rate: f64) {
        self.set_rate_at(rate, Instant::now());
    }

    fn set_rate_at(&self, rate: f64, now: Instant) {
        let mut bucket = self.state.lock();
        bucket.refill(now);
        bucket.rate = sanitize(rate);
        bucket.tokens = bucket.tokens.min(bucket.burst());
    }
}

/// Validation refuses non-positive rates; should one get here, it admits nothing after
/// the first burst instead of misbehaving on NaN arithmetic.
fn sanitize(rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 { rate } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bucket_starts_full_and_refills_at_the_rate() {
        let t0 = Instant::now();
        let limiter = RateLimiter::new_at(10.0, t0);
        assert!(limiter.try_acquire_at(10, t0));
        assert!(!limiter.try_acquire_at(1, t0));
        // 100 ms at 10/s earn one token.
        assert!(!limiter.try_acquire_at(1, t0 + ms(50)));
        assert!(limiter.try_acquire_at(1, t0 + ms(100)));
        assert!(!limiter.try_acquire_at(1, t0 + ms(100)));
        // A long pause fills the bucket only up to the burst.
        assert!(limiter.try_acquire_at(10, t0 + ms(60_000)));
        assert!(!limiter.try_acquire_at(1, t0 + ms(60_000)));
    }

    #[test]
    fn burst_is_at_least_one() {
        let t0 = Instant::now();
        let limiter = RateLimiter::new_at(0.5, t0);
        assert!(limiter.try_acquire_at(1, t0));
        assert!(!limiter.try_acquire_at(1, t0 + ms(1_000)));
        assert!(limiter.try_acquire_at(1, t0 + ms(2_000)));
        assert!(!limiter.try_acquire_at(2, t0 + ms(100_000)), "more than the burst never fits");
    }

    #[test]
    fn clock_going_backwards_adds_nothing() {
        let t0 = Instant::now() + ms(1_000);
        let limiter = RateLimiter::new_at(1.0, t0);
        assert!(limiter.try_acquire_at(1, t0));
        assert!(!limiter.try_acquire_at(1, t0 - ms(500)));
        assert!(limiter.try_acquire_at(1, t0 + ms(1_000)));
    }

    #[test]
    fn rate_change_keeps_earned_tokens_within_the_new_burst() {
        let t0 = Instant::now();
        let limiter = RateLimiter::new_at(100.0, t0);
        limiter.set_rate_at(2.0, t0);
        assert_eq!(limiter.rate(), 2.0);
        assert!(limiter.try_acquire_at(2, t0));
        assert!(!limiter.try_acquire_at(1, t0));
        assert!(limiter.try_acquire_at(1, t0 + ms(500)));
    }
}
