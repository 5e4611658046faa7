//! Exponential backoff with full jitter, for retrying failed API calls and failed passes.
//!
//! The API server is shared by thousands of agents (docs/design.md#scale): a controller that retries at a
//! fixed short interval adds load exactly when the server is struggling, and replicas that failed
//! together retry together. So every retry here waits a random time in `[0, min(max, base·2ⁿ)]`
//! after the n-th consecutive failure ("full jitter", AWS Architecture Blog, "Exponential Backoff
//! And Jitter", 2015): the ceiling doubles per failure, and the randomness spreads the retries of
//! many clients over the whole window. Call [`Backoff::reset`] after a success.

use std::time::Duration;

/// Exponential backoff with full jitter: the n-th consecutive [`next`](Backoff::next) (from 0)
/// returns a uniformly random duration in `[0, min(max, base·2ⁿ)]`.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    /// Consecutive failures since the last reset.
    attempt: u32,
    /// xorshift64* state; never zero.
    rng: u64,
}

impl Backoff {
    /// A backoff whose first ceiling is `base` and whose ceiling never passes `max`.
    /// A `max` below `base` is raised to `base`.
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff::with_seed(base, max, random_seed())
    }

    /// The same, with a fixed random seed: the same seed gives the same sequence (tests).
    pub fn with_seed(base: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            base,
            max: max.max(base),
            attempt: 0,
            rng: splitmix64(seed),
        }
    }

    /// For failed Kubernetes API calls and failed passes: ceilings 1 s, 2 s, 4 s, … up to 60 s.
    ///
    /// 60 s keeps a controller whose API server came back from waiting long, while a lasting
    /// outage costs each replica about one request every 30 s on average.
    pub fn for_api_errors() -> Backoff {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// The wait before the next retry; each call counts one more failure.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends and `reset` rewinds it
    pub fn next(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        // Uniform in [0, nanos]; the modulo bias is below 2⁻³⁰ for any ceiling under a century.
        Duration::from_nanos(self.next_u64() % nanos.saturating_add(1))
    }

    /// The upper bound of the next [`next`](Backoff::next): `min(max, base·2ⁿ)`.
    pub fn ceiling(&self) -> Duration {
        match 1u32.checked_shl(self.attempt) {
            Some(factor) => self.base.checked_mul(factor).map_or(self.max, |d| d.min(self.max)),
            // 2³² doublings of anything but zero are past any sensible max.
            None if self.base.is_zero() => Duration::ZERO,
            None => self.max,
        }
    }

    /// Consecutive failures counted since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Forgets the failures: the next wait is at most `base` again. Call it after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators"):
    /// plenty for spreading retries, and no dependency.
    fn next_u64(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// SplitMix64's finaliser (Steele, Lea, Flood 2014): turns any seed, including 0 and small
/// neighbours like 1, 2, 3, into a well-mixed, non-zero xorshift state.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let z = z ^ (z >> 31);
    if z == 0 { 0x9E37_79B9_7F4A_7C15 } else { z }
}

/// A seed that differs between processes and between calls: std's per-map random hash keys, mixed
/// with the clock, so two replicas started together do not share a retry schedule.
fn random_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn every_wait_lies_within_the_doubling_ceiling() {
        let mut b = Backoff::with_seed(100 * MS, 10_000 * MS, 42);
        for attempt in 0..40u32 {
            let ceiling = (100 * MS).saturating_mul(1 << attempt.min(20)).min(10_000 * MS);
            assert_eq!(b.ceiling(), ceiling, "attempt {attempt}");
            let d = b.next();
            assert!(d <= ceiling, "attempt {attempt}: {d:?} > {ceiling:?}");
        }
        assert_eq!(b.attempt(), 40);
        assert_eq!(b.ceiling(), 10_000 * MS, "capped at max");
    }

    #[test]
    fn waits_grow_with_failures_and_spread_over_the_window() {
        // Mean of full jitter is half the ceiling: check it per attempt over many sequences.
        let attempts = 8;
        let runs = 2_000u32;
        let mut sums = vec![Duration::ZERO; attempts];
        let mut mins = vec![Duration::MAX; attempts];
        for seed in 1..=u64::from(runs) {
            let mut b = Backoff::with_seed(100 * MS, 60_000 * MS, seed);
            for (i, sum) in sums.iter_mut().enumerate() {
                let d = b.next();
                *sum += d;
                mins[i] = mins[i].min(d);
            }
        }
        let means: Vec<f64> = sums.iter().map(|s| s.as_secs_f64() / f64::from(runs)).collect();
        for (i, mean) in means.iter().enumerate() {
            let half_ceiling = 0.1 * f64::from(1u32 << i) / 2.0;
            assert!(
                (mean - half_ceiling).abs() < half_ceiling * 0.1,
                "attempt {i}: mean {mean} s, expected about {half_ceiling} s"
            );
            // Jitter reaches down to (near) zero: retries of many clients spread, not line up.
            assert!(
                mins[i].as_secs_f64() < half_ceiling * 0.05,
                "attempt {i}: min {:?}",
                mins[i]
            );
        }
        assert!(means.windows(2).all(|w| w[1] > w[0] * 1.5), "means grow: {means:?}");
    }

    #[test]
    fn no_fixed_interval_two_waits_in_a_row_differ() {
        let mut b = Backoff::for_api_errors();
        b.next();
        let waits: Vec<Duration> = (0..5).map(|_| b.next()).collect();
        assert!(waits.windows(2).any(|w| w[0] != w[1]), "{waits:?}");
    }

    #[test]
    fn reset_starts_over_from_base() {
        let mut b = Backoff::with_seed(100 * MS, 10_000 * MS, 7);
        for _ in 0..10 {
            b.next();
        }
        assert_eq!(b.ceiling(), 10_000 * MS);
        b.reset();
        assert_eq!(b.attempt(), 0);
        assert_eq!(b.ceiling(), 100 * MS);
        assert!(b.next() <= 100 * MS);
        assert_eq!(b.ceiling(), 200 * MS);
    }

    #[test]
    fn same_seed_same_sequence_and_degenerate_inputs_are_safe() {
        let seq = |seed| {
            let mut b = Backoff::with_seed(MS, 1_000 * MS, seed);
            (0..20).map(|_| b.next()).collect::<Vec<_>>()
        };
        assert_eq!(seq(3), seq(3));
        assert_ne!(seq(3), seq(4));
        // Zero base: never waits, never panics. Max below base: base is the cap.
        let mut zero = Backoff::with_seed(Duration::ZERO, Duration::ZERO, 0);
        assert_eq!(zero.next(), Duration::ZERO);
        let mut low_max = Backoff::with_seed(10 * MS, MS, 1);
        for _ in 0..100 {
            assert!(low_max.next() <= 10 * MS);
        }
        // Huge values saturate instead of overflowing.
        let mut huge = Backoff::with_seed(Duration::from_secs(u64::MAX / 4), Duration::MAX, 5);
        for _ in 0..70 {
            huge.next();
        }
        assert_eq!(huge.ceiling(), Duration::MAX);
    }
}
