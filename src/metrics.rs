//! The store's metrics, through the [`metrics`](https://docs.rs/metrics) facade: whatever
//! recorder the service installs (Prometheus, StatsD, ...) before it opens the store receives
//! them (a store registers its per-commit metrics when it opens); with none installed each
//! costs a branch. ARCHITECTURE.md ("Metrics and tracing") has the table of names,
//! types, labels and where each is recorded; the constants below are those names.
//!
//! Names follow Prometheus's conventions: counters end in `_total`, durations are histograms
//! in seconds. Labels are static strings on the hot paths (no allocation per commit); the
//! per-queue ones are only where the call is per queue or per failure, not per commit.
//!
//! Queue depths are not tracked on every commit: [`Store::report_metrics`] reads every
//! queue's [`stats`](crate::ReliableConcurrentQueue::stats) and sets the gauges, as often as
//! the service wants (every scrape, every few seconds). [`describe`] gives the recorder each
//! metric's unit and help text.
//!
//! # Examples
//!
//! Read the counters back with a recorder of one's own (`metrics-util`'s debugging
//! recorder here; a service installs a Prometheus exporter, see `examples/prometheus.rs`):
//!
//! ```
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use reliable_queue::{metrics as m, Store};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! metrics::with_local_recorder(&recorder, || -> Result<(), reliable_queue::Error> {
//!     let store = Store::in_memory()?;
//!     let q = store.blocking_queue::<u32>("jobs")?;
//!     let mut tx = store.begin();
//!     q.enqueue(&mut tx, 1)?;
//!     q.enqueue(&mut tx, 2)?;
//!     tx.blocking_commit()?;
//!     store.blocking_report_metrics()?;
//!     Ok(())
//! })?;
//! let values = snapshotter.snapshot().into_vec();
//! let value = |name: &str| {
//!     values
//!         .iter()
//!         .filter(|(key, ..)| key.key().name() == name)
//!         .map(|(.., v)| v)
//!         .collect::<Vec<_>>()
//! };
//! assert_eq!(value(m::ENQUEUED), [&DebugValue::Counter(2)]);
//! // outcome="ok" counted one; outcome="error" is there at 0 from the store's open.
//! assert!(value(m::COMMITS).contains(&&DebugValue::Counter(1)));
//! assert!(value(m::DEPTH).contains(&&DebugValue::Gauge(2.0.into()))); // state="visible"
//! # Ok::<(), reliable_queue::Error>(())
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{Counter, Histogram, Unit};

#[cfg(doc)]
use crate::Store;

/// Counter: transactions committed, labelled `outcome` = `ok` | `error`. Every engine counts
/// [`Transaction::commit`](crate::Transaction::commit) and its `blocking_` form (an empty
/// transaction too) and [`Lease::complete`](crate::Lease::complete); a lease's own
/// settlements (`fail`, `release`) are counted by what they did instead.
pub const COMMITS: &str = "reliable_queue_commits_total";
/// Counter: items enqueued by committed transactions (delayed and keyed enqueues, and
/// imports, included).
pub const ENQUEUED: &str = "reliable_queue_items_enqueued_total";
/// Counter: items taken out for good by committed transactions: dequeued, or leased and
/// acknowledged ([`Lease::ack`](crate::Lease::ack), [`Lease::complete`](crate::Lease::complete)).
pub const DEQUEUED: &str = "reliable_queue_items_dequeued_total";
/// Histogram, seconds: from `commit` to its outcome, on the durable engines (sled and
/// PostgreSQL). A memory commit is not timed: it does no I/O, and reading the clock twice
/// would be a good part of its cost.
pub const COMMIT_SECONDS: &str = "reliable_queue_commit_seconds";
/// Histogram: transactions written together by one group commit (sled).
pub const GROUP_SIZE: &str = "reliable_queue_commit_group_transactions";
/// Histogram, bytes: the log records one group commit wrote (sled).
pub const GROUP_BYTES: &str = "reliable_queue_commit_group_bytes";
/// Histogram, seconds: one flush of sled and fsync of its files, which makes what was
/// written durable (after each group under `Durability::Sync`, at each periodic flush under
/// `Durability::Buffered`, and at close).
pub const FSYNC_SECONDS: &str = "reliable_queue_fsync_seconds";
/// Counter: leases that ran out before their holder settled them, labelled `queue` (the
/// embedded engines, whose timers end them). On PostgreSQL a lease ends when the database's
/// clock passes a column, seen by no one; an expired lease at the maximum attempts is counted
/// when it is moved, under [`DEAD_LETTER_MOVES`] with `cause="expired"`.
pub const LEASE_EXPIRIES: &str = "reliable_queue_lease_expiries_total";
/// Counter: failed leases ([`Lease::fail`](crate::Lease::fail)) scheduled for another
/// attempt, labelled `queue` (every engine).
pub const RETRIES: &str = "reliable_queue_retries_total";
/// Counter: items moved to the dead letters, labelled `queue` and `cause` = `failed` (failed
/// at the maximum attempts) | `expired` (the last lease ran out). Every engine.
pub const DEAD_LETTER_MOVES: &str = "reliable_queue_dead_letter_moves_total";
/// Gauge: records of the log set aside as damaged, at the last open or an earlier one (sled;
/// set at each open from what recovery reports; see
/// [`Store::set_aside_records`](crate::Store::set_aside_records)).
pub const QUARANTINED: &str = "reliable_queue_quarantined_records";
/// Gauge: items of a queue in a state, labelled `queue` and `state` = `visible` | `delayed`
/// | `leased` | `held` | `dead`: set by [`Store::report_metrics`].
pub const DEPTH: &str = "reliable_queue_queue_depth";
/// Gauge, seconds: how long ago the item at the front of a queue (the next one out) was
/// enqueued, 0 when nothing is visible; labelled `queue`, set by [`Store::report_metrics`].
pub const FRONT_AGE_SECONDS: &str = "reliable_queue_queue_front_age_seconds";

/// Gives the installed recorder every metric's unit and help text (Prometheus shows them as
/// `# HELP` lines). Call it once, after installing the recorder; the metrics are recorded
/// whether or not it is called.
///
/// # Examples
///
/// ```
/// let recorder = metrics_util::debugging::DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, reliable_queue::metrics::describe);
/// // The descriptions go with the metrics' values once they are recorded.
/// # drop(snapshotter);
/// ```
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(COMMITS, Unit::Count, "Transactions committed, by outcome.");
    describe_counter!(
        ENQUEUED,
        Unit::Count,
        "Items enqueued by committed transactions."
    );
    describe_counter!(
        DEQUEUED,
        Unit::Count,
        "Items dequeued or acknowledged by committed transactions."
    );
    describe_histogram!(
        COMMIT_SECONDS,
        Unit::Seconds,
        "Commit latency on the durable engines."
    );
    describe_histogram!(
        GROUP_SIZE,
        Unit::Count,
        "Transactions written by one group commit."
    );
    describe_histogram!(
        GROUP_BYTES,
        Unit::Bytes,
        "Log bytes written by one group commit."
    );
    describe_histogram!(
        FSYNC_SECONDS,
        Unit::Seconds,
        "Time to flush and fsync the log."
    );
    describe_counter!(
        LEASE_EXPIRIES,
        Unit::Count,
        "Leases that ran out before being settled, by queue."
    );
    describe_counter!(
        RETRIES,
        Unit::Count,
        "Failed leases scheduled for another attempt, by queue."
    );
    describe_counter!(
        DEAD_LETTER_MOVES,
        Unit::Count,
        "Items moved to the dead letters, by queue and cause."
    );
    describe_gauge!(
        QUARANTINED,
        Unit::Count,
        "Log records set aside as damaged."
    );
    describe_gauge!(
        DEPTH,
        Unit::Count,
        "Items per queue and state, as of the last report_metrics."
    );
    describe_gauge!(
        FRONT_AGE_SECONDS,
        Unit::Seconds,
        "Age of the item at the front of each queue, as of the last report_metrics."
    );
}

/// The metrics recorded on every commit, registered once when a store opens: the
/// `counter!` macros build and hash their key at every call, recorder or not (measured: about
/// 350 instructions per commit with no recorder, a third of an in-memory round trip), while
/// a registered handle is one call, or one branch for a no-op one. So the recorder a store
/// reports to is the one installed when it opened.
#[derive(Clone)]
pub(crate) struct Handles {
    /// What this store's handles did, counted once someone asks ([`Activity`]).
    pub(crate) activity: Arc<Counts>,
    commits_ok: Counter,
    commits_error: Counter,
    enqueued: Counter,
    dequeued: Counter,
    commit_seconds: Histogram,
    group_size: Histogram,
    group_bytes: Histogram,
    fsync_seconds: Histogram,
}

impl fmt::Debug for Handles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handles").finish_non_exhaustive()
    }
}

impl Handles {
    /// Registers the handles with the recorder in effect (the thread's local one, else the
    /// global one, else none).
    pub(crate) fn register() -> Handles {
        Handles {
            activity: Arc::new(Counts::default()),
            commits_ok: metrics::counter!(COMMITS, "outcome" => "ok"),
            commits_error: metrics::counter!(COMMITS, "outcome" => "error"),
            enqueued: metrics::counter!(ENQUEUED),
            dequeued: metrics::counter!(DEQUEUED),
            commit_seconds: metrics::histogram!(COMMIT_SECONDS),
            group_size: metrics::histogram!(GROUP_SIZE),
            group_bytes: metrics::histogram!(GROUP_BYTES),
            fsync_seconds: metrics::histogram!(FSYNC_SECONDS),
        }
    }

    /// A commit's outcome, with what it moved; `started` when it was timed (durable engines).
    #[inline]
    pub(crate) fn commit(
        &self,
        ok: bool,
        enqueued: usize,
        dequeued: usize,
        started: Option<std::time::Instant>,
    ) {
        if ok {
            self.commits_ok.increment(1);
            self.activity.commit(enqueued, dequeued);
            if enqueued > 0 {
                self.enqueued.increment(count(enqueued));
            }
            if dequeued > 0 {
                self.dequeued.increment(count(dequeued));
            }
        } else {
            self.commits_error.increment(1);
        }
        if let Some(started) = started {
            self.commit_seconds.record(started.elapsed().as_secs_f64());
        }
    }

    /// A sled commit group: `transactions` written as `bytes` of records.
    #[inline]
    pub(crate) fn group(&self, transactions: usize, bytes: usize) {
        self.group_size.record(transactions as f64);
        self.group_bytes.record(bytes as f64);
    }

    /// A flush and fsync of the sled store that began at `started`.
    #[inline]
    pub(crate) fn fsync(&self, started: std::time::Instant) {
        self.fsync_seconds.record(started.elapsed().as_secs_f64());
    }
}

/// What a store's handles in this process did since [`Store::activity`] was first called:
/// the figures behind a dashboard's throughput chart. Counts only what this process
/// committed (on PostgreSQL, other processes' work is in their own stores' counts); depths,
/// which every process sees, are in [`stats`](crate::ReliableConcurrentQueue::stats).
///
/// Nothing is counted until the first call, so a store no one watches pays one branch per
/// commit; after it, two relaxed atomic additions at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Activity {
    /// Items enqueued by committed transactions (delayed, keyed and imported ones too).
    pub enqueued: u64,
    /// Items taken out for good by committed transactions: dequeued, or leased and
    /// acknowledged.
    pub done: u64,
    /// [`Lease::fail`](crate::Lease::fail) calls that did something: a retry scheduled, or
    /// the item moved to the dead letters.
    pub failed: u64,
    /// Of those, the failures that moved their item to the dead letters.
    pub failed_dead: u64,
}

/// The counters behind [`Activity`].
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Set by the first [`Store::activity`]: counting is on.
    watched: AtomicBool,
    enqueued: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    failed_dead: AtomicU64,
}

impl Counts {
    #[inline]
    fn commit(&self, enqueued: usize, dequeued: usize) {
        if self.watched.load(Ordering::Relaxed) {
            if enqueued > 0 {
                self.enqueued.fetch_add(count(enqueued), Ordering::Relaxed);
            }
            if dequeued > 0 {
                self.done.fetch_add(count(dequeued), Ordering::Relaxed);
            }
        }
    }

    /// A lease's failure; `dead` when it buried the item.
    pub(crate) fn failed(&self, dead: bool) {
        if self.watched.load(Ordering::Relaxed) {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if dead {
                self.failed_dead.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The figures now; turns counting on.
    pub(crate) fn read(&self) -> Activity {
        self.watched.store(true, Ordering::Relaxed);
        Activity {
            enqueued: self.enqueued.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            failed_dead: self.failed_dead.load(Ordering::Relaxed),
        }
    }
}

/// A lease of `queue` ran out (embedded engines).
pub(crate) fn lease_expired(queue: &str) {
    metrics::counter!(LEASE_EXPIRIES, "queue" => queue.to_owned()).increment(1);
}

/// A failed lease of `queue` is due again after its backoff.
pub(crate) fn retried(queue: &str) {
    metrics::counter!(RETRIES, "queue" => queue.to_owned()).increment(1);
}

/// `n` items moved to `queue`'s dead letters; `expired` when their last lease ran out.
pub(crate) fn buried(queue: &str, expired: bool, n: u64) {
    let cause = if expired { "expired" } else { "failed" };
    metrics::counter!(DEAD_LETTER_MOVES, "queue" => queue.to_owned(), "cause" => cause)
        .increment(n);
}

/// The records set aside by this open or an earlier one.
pub(crate) fn quarantined(n: usize) {
    metrics::gauge!(QUARANTINED).set(n as f64);
}

/// A queue's depth per state, and its front item's age at `now_ms` (the store's clock).
pub(crate) fn depth(queue: &str, stats: &crate::QueueStats, now_ms: u64) {
    for (state, n) in [
        ("visible", stats.visible),
        ("delayed", stats.delayed),
        ("leased", stats.leased),
        ("held", stats.held),
        ("dead", stats.dead),
    ] {
        metrics::gauge!(DEPTH, "queue" => queue.to_owned(), "state" => state).set(n as f64);
    }
    let age = stats.front_enqueued_at.map_or(0.0, |front| {
        crate::clock::system_time(now_ms)
            .duration_since(front)
            .map_or(0.0, |age| age.as_secs_f64())
    });
    metrics::gauge!(FRONT_AGE_SECONDS, "queue" => queue.to_owned()).set(age);
}

/// A count as a counter's increment (saturating; a `usize` fits on every supported target).
#[inline]
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
