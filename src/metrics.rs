//! The store's metrics, through the [`metrics`](https://docs.rs/metrics) facade: whatever
//! recorder the service installs (Prometheus, StatsD, ...) receives them; with none installed
//! each costs an atomic load. ARCHITECTURE.md ("Metrics and tracing") has the table.
//!
//! Names follow Prometheus's conventions: counters end in `_total`, durations are histograms
//! in seconds. Labels are static strings on the hot paths (no allocation per commit); the
//! per-queue ones are only where the call is per queue, not per item.

/// Transactions committed, labelled `outcome` = `ok` | `error` (every engine; an empty
/// transaction counts too).
pub const COMMITS: &str = "reliable_queue_commits_total";
/// Items enqueued by committed transactions (every engine; delayed and keyed enqueues, and
/// imports, included).
pub const ENQUEUED: &str = "reliable_queue_items_enqueued_total";
/// Items dequeued by committed transactions (every engine; acknowledged leases included).
pub const DEQUEUED: &str = "reliable_queue_items_dequeued_total";
/// Time from `commit` to its outcome, seconds (sled and PostgreSQL: the durable engines).
pub const COMMIT_SECONDS: &str = "reliable_queue_commit_seconds";
/// Transactions written together by one group commit (sled).
pub const GROUP_SIZE: &str = "reliable_queue_commit_group_transactions";
/// Time to write a commit group and make it durable (flush and fsync), seconds (sled).
pub const FSYNC_SECONDS: &str = "reliable_queue_fsync_seconds";
/// Leases that ran out before their holder settled them, labelled `queue` (embedded engines;
/// on PostgreSQL an expiry is the database clock passing a column and is counted when the
/// maintenance pass or a lease buries one at the maximum attempts, under dead-letter moves).
pub const LEASE_EXPIRIES: &str = "reliable_queue_lease_expiries_total";
/// Failed leases scheduled for another attempt, labelled `queue` (every engine).
pub const RETRIES: &str = "reliable_queue_retries_total";
/// Items moved to the dead letters, labelled `queue` and `cause` = `failed` | `expired`
/// (every engine).
pub const DEAD_LETTER_MOVES: &str = "reliable_queue_dead_letter_moves_total";
/// Records of the log set aside as damaged, at the last open or an earlier one (sled).
pub const QUARANTINED: &str = "reliable_queue_quarantined_records";
/// Items of a queue in a state, labelled `queue` and `state` = `visible` | `delayed` |
/// `leased` | `held` | `dead`: set by [`Store::report_metrics`](crate::Store::report_metrics).
pub const DEPTH: &str = "reliable_queue_queue_depth";

/// A commit's outcome, with what it moved; `started` when it was timed (durable engines).
#[inline]
pub(crate) fn commit(
    ok: bool,
    enqueued: usize,
    dequeued: usize,
    started: Option<std::time::Instant>,
) {
    if ok {
        metrics::counter!(COMMITS, "outcome" => "ok").increment(1);
        if enqueued > 0 {
            metrics::counter!(ENQUEUED).increment(enqueued as u64);
        }
        if dequeued > 0 {
            metrics::counter!(DEQUEUED).increment(dequeued as u64);
        }
    } else {
        metrics::counter!(COMMITS, "outcome" => "error").increment(1);
    }
    if let Some(started) = started {
        metrics::histogram!(COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
    }
}

/// A sled commit group of `transactions`, written and synced in `seconds`.
pub(crate) fn group(transactions: usize, seconds: f64) {
    metrics::histogram!(GROUP_SIZE).record(transactions as f64);
    metrics::histogram!(FSYNC_SECONDS).record(seconds);
}

pub(crate) fn lease_expired(queue: &str) {
    metrics::counter!(LEASE_EXPIRIES, "queue" => queue.to_owned()).increment(1);
}

pub(crate) fn retried(queue: &str) {
    metrics::counter!(RETRIES, "queue" => queue.to_owned()).increment(1);
}

/// An item moved to `queue`'s dead letters; `expired` when its last lease ran out.
pub(crate) fn buried(queue: &str, expired: bool, n: u64) {
    let cause = if expired { "expired" } else { "failed" };
    metrics::counter!(DEAD_LETTER_MOVES, "queue" => queue.to_owned(), "cause" => cause)
        .increment(n);
}

pub(crate) fn quarantined(n: usize) {
    metrics::gauge!(QUARANTINED).set(n as f64);
}

/// A queue's depth per state.
pub(crate) fn depth(queue: &str, stats: &crate::QueueStats) {
    for (state, n) in [
        ("visible", stats.visible),
        ("delayed", stats.delayed),
        ("leased", stats.leased),
        ("held", stats.held),
        ("dead", stats.dead),
    ] {
        metrics::gauge!(DEPTH, "queue" => queue.to_owned(), "state" => state).set(n as f64);
    }
}
