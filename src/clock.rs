//! Time as the processing layer sees it: the store's clock, real or driven by a test.
//!
//! Every time the processing layer uses (lease deadlines, backoff, delayed items, the commit
//! time written into each log record) is a count of milliseconds since the Unix epoch read
//! from one [`Clock`]. The real clock is monotonic: it is the wall clock read once when the
//! store opens plus the monotonic time elapsed since, so a wall-clock step never fires or
//! holds back a timer. Times written to disk are therefore wall-clock times as of the open,
//! carried forward on the monotonic clock.
//!
//! A [`ManualClock`] stands still until [`advance`](ManualClock::advance) moves it; `advance`
//! runs everything that fell due (lease expiries, delayed items becoming visible) in the
//! calling thread before it returns, so a test sees the effect of an expiry without waiting
//! for anything.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::sync::process::{AtomicU64, Mutex, Ordering};

/// Something that runs timers when a manual clock moves.
pub(crate) trait OnAdvance: Send + Sync {
    /// Runs everything due at `now` (milliseconds since the epoch).
    fn advanced(&self, now: u64);
}

/// A clock that moves only when told to, for tests: leases expire, backoffs end and delayed
/// items fall due when [`advance`](ManualClock::advance) says so.
///
/// Give it to [`Builder::clock`](crate::Builder::clock); clones are the same clock.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use reliable_queue::{ManualClock, Store};
///
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000))?;
/// let store = Store::builder().clock(clock.clone()).open()?;
/// let q = store.blocking_queue::<u32>("q")?;
/// let mut tx = store.begin();
/// q.enqueue_after(&mut tx, 7, Duration::from_secs(60))?;
/// tx.blocking_commit()?;
/// assert_eq!(q.blocking_count()?, 0); // delayed
/// clock.advance(Duration::from_secs(60));
/// assert_eq!(q.blocking_count()?, 1); // due
/// # Ok::<(), reliable_queue::Error>(())
/// ```
#[derive(Clone)]
pub struct ManualClock(Arc<Manual>);

struct Manual {
    /// Milliseconds since the epoch.
    now: AtomicU64,
    /// Stores using this clock; dead ones are dropped as they are found.
    listeners: Mutex<Vec<Weak<dyn OnAdvance>>>,
    /// Serialises `advance`, so timers fire in time order.
    advancing: Mutex<()>,
}

impl ManualClock {
    /// A clock standing at `start`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a time before the Unix epoch or past the year 584
    /// million (milliseconds must fit in a `u64`).
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = reliable_queue::ManualClock::new(std::time::SystemTime::now())?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn new(start: SystemTime) -> Result<ManualClock> {
        let now = wall_ms(start)?;
        Ok(ManualClock(Arc::new(Manual {
            now: AtomicU64::new(now),
            listeners: Mutex::new(Vec::new()),
            advancing: Mutex::new(()),
        })))
    }

    /// The time the clock shows.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// let clock = reliable_queue::ManualClock::new(UNIX_EPOCH)?;
    /// clock.advance(Duration::from_millis(1500));
    /// assert_eq!(clock.now(), UNIX_EPOCH + Duration::from_millis(1500));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0.now.load(Ordering::Acquire))
    }

    /// Moves the clock forward by `by` (whole milliseconds; saturating), then runs, in this
    /// thread and in time order, everything of every store on this clock that fell due:
    /// expired leases end, delayed and retried items become visible, waiting consumers are
    /// woken. An expiry that moves an item to its dead letters commits that move before this
    /// returns (on disk, a durable write).
    ///
    /// # Examples
    ///
    /// See [`ManualClock`].
    pub fn advance(&self, by: Duration) {
        let _one_at_a_time = self.0.advancing.lock();
        // Saturating, as documented: a clock moved past the year 584 million stops there.
        let now = self
            .0
            .now
            .load(Ordering::Acquire)
            .saturating_add(millis(by));
        self.0.now.store(now, Ordering::Release);
        let listeners: Vec<Arc<dyn OnAdvance>> = {
            let mut list = self.0.listeners.lock();
            list.retain(|l| l.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for listener in listeners {
            listener.advanced(now);
        }
    }

    fn listen(&self, listener: Weak<dyn OnAdvance>) {
        self.0.listeners.lock().push(listener);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now_ms", &self.0.now.load(Ordering::Relaxed))
            .finish()
    }
}

/// Milliseconds since the epoch of `time`.
pub(crate) fn wall_ms(time: SystemTime) -> Result<u64> {
    let since = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::InvalidArgument {
            argument: "time",
            expected: "a time after the Unix epoch",
        })?;
    u64::try_from(since.as_millis()).map_err(|_| Error::InvalidArgument {
        argument: "time",
        expected: "a time whose milliseconds since the Unix epoch fit in 64 bits",
    })
}

/// A time in milliseconds since the epoch, as a `SystemTime`.
pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A time the store keeps as milliseconds since the epoch, 0 for none.
pub(crate) fn known_time(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| system_time(ms))
}

/// Whole milliseconds of a duration, saturating: a duration past `u64::MAX` ms (584 million
/// years) is longer than any time the clock can reach, which `u64::MAX` still says (callers
/// check their own, far lower, limits on the result).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The clock of one store.
#[derive(Clone)]
pub(crate) enum Clock {
    /// Wall clock at `base`, moved on by the monotonic clock.
    System {
        base: Instant,
        /// `base` on the kernel's coarse monotonic clock (see [`Clock::now_coarse`]).
        coarse_base: coarsetime::Instant,
        base_ms: u64,
    },
    Manual(ManualClock),
}

impl Clock {
    pub(crate) fn system() -> Clock {
        Clock::System {
            base: Instant::now(),
            coarse_base: coarsetime::Instant::now_without_cache_update(),
            base_ms: wall_ms(SystemTime::now()).unwrap_or(0),
        }
    }

    /// Milliseconds since the epoch, never going back.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            Clock::System { base, base_ms, .. } => {
                // Whole milliseconds without `as_millis`'s 128-bit arithmetic.
                let elapsed = base.elapsed();
                // Saturating is meant: a clock running past the year 584 million stops there
                // instead of going back.
                let ms = elapsed
                    .as_secs()
                    .saturating_mul(1000)
                    .saturating_add(u64::from(elapsed.subsec_millis()));
                base_ms.saturating_add(ms)
            }
            Clock::Manual(m) => m.0.now.load(Ordering::Acquire),
        }
    }

    /// Milliseconds since the epoch from the kernel's coarse monotonic clock: a read of the
    /// time of the last scheduler tick, without the hardware clock read of [`now`](Self::now),
    /// so up to one tick (1-10 ms by the kernel's configuration) behind it and never ahead.
    /// For times that are only reported (an item's enqueue time), never for deadlines or due
    /// times. A manual clock gives [`now`](Self::now).
    #[inline]
    pub(crate) fn now_coarse(&self) -> u64 {
        match self {
            Clock::System {
                coarse_base,
                base_ms,
                ..
            } => {
                let elapsed = coarsetime::Instant::now_without_cache_update()
                    .duration_since(*coarse_base)
                    .as_millis();
                // Saturating, as in `now`.
                base_ms.saturating_add(elapsed)
            }
            Clock::Manual(m) => m.0.now.load(Ordering::Acquire),
        }
    }

    /// Is this a manual clock (timers run by `advance`, no timer thread)?
    pub(crate) fn is_manual(&self) -> bool {
        matches!(self, Clock::Manual(_))
    }

    /// Has `advance` of a manual clock call `listener`; nothing for the real clock.
    pub(crate) fn listen(&self, listener: Weak<dyn OnAdvance>) {
        if let Clock::Manual(m) = self {
            m.listen(listener);
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Clock::System { .. } => f.write_str("Clock::System"),
            Clock::Manual(m) => m.fmt(f),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}
