//! The processing layer's plain data: [`RetryPolicy`], [`QueueStats`], [`ItemState`] and what
//! browsing returns. The calls live on [`ReliableConcurrentQueue`](crate::ReliableConcurrentQueue)
//! and [`Lease`](crate::Lease).

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What happens to an item whose lease fails or expires: how long it waits before it is due
/// again, and after how many attempts it moves to the queue's dead letters.
///
/// The wait after attempt `n` is `initial_backoff * 2^(n-1)`, capped at `max_backoff`, then
/// spread by up to `jitter` (a fraction of it) either way, by a hash of the item's id and
/// attempt (so two items failing together do not come back together, and a test can set
/// `jitter` to 0 for exact times). Kept in the store: every handle and every process sees the
/// policy last set by [`set_retry_policy`](crate::ReliableConcurrentQueue::set_retry_policy).
///
/// Every engine stores the same range: at most [`MAX_ATTEMPTS`] attempts, and backoffs of at
/// most [`MAX_DELAY`] (PostgreSQL keeps the attempts in an `int4` and the times as
/// milliseconds in an `int8`). A larger value is clamped to its maximum by the setter (and by
/// [`set_retry_policy`](crate::ReliableConcurrentQueue::set_retry_policy), for a policy made
/// some other way, such as deserialized), so `max_backoff(Duration::MAX)` means "no cap
/// short of [`MAX_DELAY`]" and `max_attempts(u32::MAX)` "as many as can be counted". With the
/// widest jitter a wait is at most twice [`MAX_DELAY`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use reliable_queue::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .initial_backoff(Duration::from_millis(200))
///     .max_backoff(Duration::from_secs(30))
///     .jitter(0.0);
/// assert_eq!(policy.backoff(1, 7), Duration::from_millis(200));
/// assert_eq!(policy.backoff(3, 7), Duration::from_millis(800));
/// # Ok::<(), reliable_queue::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff_ms: u64,
    max_backoff_ms: u64,
    /// Per mille.
    jitter: u16,
}

impl Default for RetryPolicy {
    /// 5 attempts; backoff from 1 s doubling up to 10 min; 20 % jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 600_000,
            jitter: 200,
        }
    }
}

impl RetryPolicy {
    /// Attempts after which a failed or expired lease moves the item to the dead letters
    /// (at least 1, at most [`MAX_ATTEMPTS`]; 0 is taken as 1, more than the maximum as the
    /// maximum).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.clamp(1, MAX_ATTEMPTS);
        self
    }

    /// The wait after the first failed attempt (at most [`MAX_DELAY`]; a longer one is taken
    /// as [`MAX_DELAY`]).
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff_ms = crate::clock::millis(d.min(MAX_DELAY));
        self
    }

    /// The longest wait (at most [`MAX_DELAY`]; a longer one is taken as [`MAX_DELAY`]).
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff_ms = crate::clock::millis(d.min(MAX_DELAY));
        self
    }

    /// How far (a fraction of the wait, 0.0 to 1.0, clamped) the wait is spread either way.
    pub fn jitter(mut self, fraction: f64) -> Self {
        let per_mille = (fraction.clamp(0.0, 1.0) * 1000.0).round();
        // 0..=1000 (NaN clamps to NaN and fails every comparison: no jitter).
        self.jitter = (0..=1000u16)
            .find(|&n| f64::from(n) >= per_mille)
            .unwrap_or(0);
        self
    }

    /// The configured maximum attempts.
    pub fn attempts_allowed(&self) -> u32 {
        self.max_attempts
    }

    /// The wait before an item that failed attempt `attempt` is due again; `seed` (the
    /// item's id) chooses the jitter.
    pub fn backoff(&self, attempt: u32, seed: u64) -> Duration {
        Duration::from_millis(self.backoff_ms(attempt, seed))
    }

    /// The policy with every value in the range every engine stores (see the type's docs):
    /// what the setters make, for a policy that did not come from them (deserialized, or
    /// read from a store written before the range was enforced).
    pub(crate) fn clamped(self) -> Self {
        let max_ms = max_delay_ms();
        RetryPolicy {
            max_attempts: self.max_attempts.clamp(1, MAX_ATTEMPTS),
            initial_backoff_ms: self.initial_backoff_ms.min(max_ms),
            max_backoff_ms: self.max_backoff_ms.min(max_ms),
            jitter: self.jitter.min(1000),
        }
    }

    pub(crate) fn backoff_ms(&self, attempt: u32, seed: u64) -> u64 {
        let doublings = attempt.saturating_sub(1).min(63);
        let base = self
            .initial_backoff_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_backoff_ms)
            .min(max_delay_ms());
        if self.jitter == 0 || base == 0 {
            return base;
        }
        let spread = base.saturating_mul(u64::from(self.jitter.min(1000))) / 1000;
        // splitmix64 of the seed and attempt: cheap, well spread, reproducible.
        let mut z = seed
            .wrapping_add(u64::from(attempt).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let offset = z % (spread.saturating_mul(2).saturating_add(1));
        base.saturating_sub(spread).saturating_add(offset)
    }

    /// The policy as the server engines store it: maximum attempts, initial and maximum
    /// backoff in ms, jitter per mille (clamped first, so each fits its column).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn to_columns(self) -> (i32, i64, i64, i32) {
        let policy = self.clamped();
        (
            i32::try_from(policy.max_attempts).unwrap_or(i32::MAX),
            i64::try_from(policy.initial_backoff_ms).unwrap_or(i64::MAX),
            i64::try_from(policy.max_backoff_ms).unwrap_or(i64::MAX),
            i32::from(policy.jitter),
        )
    }

    /// [`to_columns`](Self::to_columns) read back; values out of range are clamped.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn from_columns(max_attempts: i32, initial: i64, max: i64, jitter: i32) -> Self {
        RetryPolicy {
            max_attempts: u32::try_from(max_attempts).unwrap_or(1),
            initial_backoff_ms: u64::try_from(initial).unwrap_or(0),
            max_backoff_ms: u64::try_from(max).unwrap_or(0),
            jitter: u16::try_from(jitter.clamp(0, 1000)).unwrap_or(0),
        }
        .clamped()
    }

    pub(crate) fn to_bytes(self) -> Vec<u8> {
        postcard::to_allocvec(&self).unwrap_or_default()
    }

    /// [`to_bytes`](Self::to_bytes) read back; values out of range are clamped.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<RetryPolicy> {
        postcard::from_bytes(bytes).ok().map(RetryPolicy::clamped)
    }
}

/// Counts of one queue's items, each a snapshot (see
/// [`stats`](crate::ReliableConcurrentQueue::stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueStats {
    /// Committed, due, not held, not leased: what [`count`](crate::ReliableConcurrentQueue::count) returns.
    pub visible: u64,
    /// Committed, not due yet (delayed items, and retries waiting out their backoff).
    pub delayed: u64,
    /// Leased now.
    pub leased: u64,
    /// Held by open transactions (dequeued, not committed or aborted yet).
    pub held: u64,
    /// In the queue's dead letters.
    pub dead: u64,
    /// When the item at the front of the queue (the next one out, usually the oldest
    /// visible) was first enqueued: how far behind the consumers are. `None` when nothing is
    /// visible, or for an item written before commit times were kept.
    pub front_enqueued_at: Option<SystemTime>,
}

/// Where an item is, as [`browse`](crate::ReliableConcurrentQueue::browse) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ItemState {
    /// Visible: the next dequeue or lease may take it.
    Ready,
    /// Not due before this time.
    Delayed {
        /// When it becomes due.
        until: SystemTime,
    },
    /// Leased.
    Leased {
        /// The lease's deadline.
        until: SystemTime,
        /// The lease's attempt number.
        attempt: u32,
    },
}

/// One item as [`browse`](crate::ReliableConcurrentQueue::browse) lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BrowsedItem<T> {
    /// The item's id: the id of its current version (it changes when the item is leased,
    /// retried or moved). Pages continue after it.
    pub id: u64,
    /// The item.
    pub item: T,
    /// Where it is.
    pub state: ItemState,
    /// Leases granted so far.
    pub attempts: u32,
    /// When its first enqueue committed; `None` for items written before commit times were
    /// kept.
    pub enqueued_at: Option<SystemTime>,
}

/// One dead letter, as [`dead_letters`](crate::ReliableConcurrentQueue::dead_letters) lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter<T> {
    /// Its id, for [`replay`](crate::ReliableConcurrentQueue::replay) and
    /// [`purge`](crate::ReliableConcurrentQueue::purge).
    pub id: u64,
    /// The item.
    pub item: T,
    /// Why it was moved here: the reason given to [`Lease::fail`](crate::Lease::fail), or
    /// `"lease expired"`.
    pub reason: String,
    /// Leases it was granted.
    pub attempts: u32,
    /// When its first and its latest lease were granted.
    pub first_attempt: Option<SystemTime>,
    /// When its latest lease was granted.
    pub last_attempt: Option<SystemTime>,
    /// When its first enqueue committed, if known.
    pub enqueued_at: Option<SystemTime>,
}

/// Which dead letters to [`replay`](crate::ReliableConcurrentQueue::replay).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replay {
    /// Every dead letter of the queue.
    All,
    /// The oldest `n`.
    First(usize),
    /// These ids.
    Ids(Vec<u64>),
}

/// A lease time as milliseconds: at least 1 ms, and no more than [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<u64> {
    let ms = crate::clock::millis(ttl);
    if ttl.is_zero() || ms == 0 || ttl > MAX_TTL {
        return Err(Error::InvalidArgument {
            argument: "ttl",
            expected: "a lease time from 1 ms to 365 days",
        });
    }
    Ok(ms)
}

/// The longest lease: a year. A longer one is almost certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest delay accepted: 100 years. Also the longest backoff of a [`RetryPolicy`].
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// [`MAX_DELAY`] in milliseconds.
pub(crate) const fn max_delay_ms() -> u64 {
    MAX_DELAY.as_secs() * 1000
}

/// The most attempts an item counts: 2^31 - 1, what every engine stores (PostgreSQL in an
/// `int4`). A lease of an item at the maximum is granted and counts no further (attempts
/// never go down); [`RetryPolicy::max_attempts`] and
/// [`import`](crate::ReliableConcurrentQueue::import) take no more than this.
pub const MAX_ATTEMPTS: u32 = i32::MAX.unsigned_abs();

/// A delay as milliseconds, at most [`MAX_DELAY`].
pub(crate) fn check_delay(delay: Duration) -> Result<u64> {
    if delay > MAX_DELAY {
        return Err(Error::InvalidArgument {
            argument: "delay",
            expected: "a delay of at most 100 years",
        });
    }
    Ok(crate::clock::millis(delay))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy that did not come from the setters (deserialized, or stored before the range
    /// was enforced) reads back clamped to what every engine stores, and its backoff never
    /// passes `MAX_DELAY`.
    #[test]
    fn a_stored_policy_past_the_maxima_reads_back_clamped() {
        let huge = RetryPolicy {
            max_attempts: u32::MAX,
            initial_backoff_ms: u64::MAX,
            max_backoff_ms: u64::MAX,
            jitter: u16::MAX,
        };
        for seed in 0..100 {
            assert!(
                huge.backoff(1, seed) <= MAX_DELAY * 2,
                "full jitter at most doubles it"
            );
        }
        let read = RetryPolicy::from_bytes(&huge.to_bytes()).unwrap();
        let expected = RetryPolicy::default()
            .max_attempts(u32::MAX)
            .initial_backoff(Duration::MAX)
            .max_backoff(Duration::MAX)
            .jitter(1.0);
        assert_eq!(read, expected);
        assert_eq!(
            (read.attempts_allowed(), read.jitter(0.0).backoff(1, 0)),
            (MAX_ATTEMPTS, MAX_DELAY)
        );
        let zero = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.clamped().attempts_allowed(), 1);
        #[cfg(feature = "postgres")]
        assert_eq!(
            RetryPolicy::from_columns(i32::MAX, i64::MAX, i64::MAX, 1000),
            expected
        );
    }
}
