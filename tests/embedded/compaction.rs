//! Compaction keeps the log proportional to the live backlog, not to history, and what it
//! rewrites survives restarts exactly once and in order.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{drain, peek_all, temp_dir};
use reliable_queue::{ReliableConcurrentQueue, Store, Transaction};
use serde::{Deserialize, Serialize};

/// The log size below which compaction leaves live items where they are.
const FLOOR: u64 = 64 * 1024;
/// Items waiting in the churned queue at any time.
const BACKLOG: u64 = 100;
/// Items moved through the churned queue.
const CHURN: u64 = 50_000;
/// Items per churn transaction (dequeued and enqueued).
const PER_TX: u64 = 5;
/// Padding per item, so that item bytes dominate the records.
const PAD: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Item {
    seq: u64,
    pad: Vec<u8>,
}

impl Item {
    fn new(seq: u64) -> Self {
        Item {
            seq,
            pad: vec![(seq % 251) as u8; PAD],
        }
    }

    /// Upper bound on the bytes one item takes in a record: its enqueue op (envelope,
    /// postcard varints, padding) and later its acknowledgement, each op at most 50 bytes of
    /// fields around the item (see the record format in `src/log/record.rs`).
    fn log_bytes_max() -> u64 {
        PAD as u64 + 10 + 50 + 50
    }
}

fn open(path: &Path) -> Store {
    Store::builder()
        .path(path)
        .compaction_floor(FLOOR)
        .open()
        .expect("open the store")
}

/// The log tree of a closed store: its keys and the total of its value bytes.
fn raw_log(path: &Path) -> (Vec<u64>, u64, sled::Db) {
    let db = sled::open(path).expect("open the store's sled directory");
    let log = db.open_tree("log").unwrap();
    let mut keys = Vec::new();
    let mut bytes = 0;
    for kv in log.iter() {
        let (k, v) = kv.unwrap();
        keys.push(u64::from_be_bytes(k.as_ref().try_into().unwrap()));
        bytes += v.len() as u64;
    }
    (keys, bytes, db)
}

/// The largest log compaction may leave for `live` items: under the floor, or within twice
/// the live bytes, plus the newest group (never compacted) and a group being filled.
fn log_bound(live: u64) -> u64 {
    let group = 32 + PER_TX * Item::log_bytes_max();
    FLOOR + 2 * live * Item::log_bytes_max() + 2 * group
}

fn enqueue_seqs(store: &Store, queue: &ReliableConcurrentQueue<Item>, seqs: std::ops::Range<u64>) {
    let mut tx = store.begin();
    for seq in seqs {
        queue.enqueue(&mut tx, Item::new(seq)).unwrap();
    }
    tx.blocking_commit().unwrap();
}

/// Moves `rounds` transactions' worth of items through `queue`: each transaction dequeues
/// `PER_TX` items and enqueues `PER_TX` new ones, so the backlog stays the same. Records the
/// dequeued sequence numbers in `consumed`.
fn churn(
    store: &Store,
    queue: &ReliableConcurrentQueue<Item>,
    next: &mut u64,
    rounds: u64,
    consumed: &mut Vec<u64>,
) {
    for _ in 0..rounds {
        let mut tx = store.begin();
        let mut taken = Vec::new();
        for _ in 0..PER_TX {
            let item = queue
                .blocking_try_dequeue(&mut tx)
                .unwrap()
                .expect("the backlog");
            assert_eq!(item, Item::new(item.seq), "item intact");
            taken.push(item.seq);
        }
        for _ in 0..PER_TX {
            queue.enqueue(&mut tx, Item::new(*next)).unwrap();
            *next += 1;
        }
        tx.blocking_commit().unwrap();
        consumed.extend(taken);
    }
}

/// Checks that every sequence number below `next` is consumed or remaining, exactly once,
/// and that the remaining ones are in commit (sequence) order.
fn assert_exactly_once(next: u64, consumed: &[u64], remaining: &[u64]) {
    let consumed_set: BTreeSet<u64> = consumed.iter().copied().collect();
    assert_eq!(
        consumed_set.len(),
        consumed.len(),
        "an item was consumed twice"
    );
    let expected: Vec<u64> = (0..next).filter(|s| !consumed_set.contains(s)).collect();
    assert_eq!(remaining, expected, "remaining items, in order");
}

fn seqs(items: Vec<Item>) -> Vec<u64> {
    items
        .into_iter()
        .map(|item| {
            assert_eq!(item, Item::new(item.seq), "item intact");
            item.seq
        })
        .collect()
}

#[test]
fn log_stays_proportional_to_the_backlog() {
    let (_guard, path) = temp_dir();
    let mut consumed = Vec::new();
    let mut next;
    {
        let store = open(&path);
        let queue = store.blocking_queue::<Item>("churn").unwrap();
        enqueue_seqs(&store, &queue, 0..BACKLOG);
        next = BACKLOG;
        churn(&store, &queue, &mut next, CHURN / PER_TX, &mut consumed);
        assert_eq!(queue.blocking_count().unwrap(), BACKLOG);
    }
    let (_, log_bytes, db) = raw_log(&path);
    drop(db);
    let written = CHURN * PAD as u64;
    let bound = log_bound(BACKLOG + PER_TX);
    assert!(
        bound * 10 < written,
        "the bound is meaningful: {bound} vs {written}"
    );
    assert!(
        log_bytes <= bound,
        "log holds {log_bytes} bytes for a backlog of {BACKLOG} (bound {bound})"
    );

    let store = open(&path);
    let queue = store.blocking_queue::<Item>("churn").unwrap();
    assert_exactly_once(next, &consumed, &seqs(drain(&store, &queue)));
}

#[test]
fn long_lived_items_are_rewritten_and_survive_restart_once() {
    const KEPT: u64 = 3;
    const HELD: u64 = 2;
    let (_guard, path) = temp_dir();
    let mut consumed = Vec::new();
    let mut next;
    let setup_groups;
    {
        let store = open(&path);
        // Items nobody dequeues, in a queue of their own...
        let keep = store.blocking_queue::<String>("keep").unwrap();
        let mut tx = store.begin();
        for i in 0..KEPT {
            keep.enqueue(&mut tx, format!("kept-{i}")).unwrap();
        }
        tx.blocking_commit().unwrap();
        // ...and items held by a transaction open for the whole churn.
        let queue = store.blocking_queue::<Item>("churn").unwrap();
        enqueue_seqs(&store, &queue, 0..BACKLOG + HELD);
        setup_groups = 2;
        next = BACKLOG + HELD;
        let mut holder: Transaction = store.begin();
        let held: Vec<u64> = (0..HELD)
            .map(|_| {
                queue
                    .blocking_try_dequeue(&mut holder)
                    .unwrap()
                    .unwrap()
                    .seq
            })
            .collect();

        churn(&store, &queue, &mut next, CHURN / PER_TX, &mut consumed);
        assert_eq!(queue.blocking_count().unwrap(), BACKLOG);
        holder.blocking_abort().expect("abort");
        assert_eq!(queue.blocking_count().unwrap(), BACKLOG + HELD);
        let visible = seqs(peek_all(&store, &queue));
        assert_eq!(
            &visible[..HELD as usize],
            &held[..],
            "given back at the head"
        );
    }

    let (keys, log_bytes, db) = raw_log(&path);
    let bound = log_bound(BACKLOG + HELD + KEPT + PER_TX);
    assert!(
        log_bytes <= bound,
        "log holds {log_bytes} bytes for {} live items (bound {bound})",
        BACKLOG + HELD + KEPT
    );
    // The groups that first held the long-lived items are gone: they were rewritten.
    assert!(
        keys.iter().all(|&k| k >= setup_groups),
        "the setup groups are still in the log: {:?}",
        &keys[..keys.len().min(5)]
    );
    let log = db.open_tree("log").unwrap();
    let holding_kept = log
        .iter()
        .filter(|kv| {
            let (_, v) = kv.as_ref().unwrap();
            v.windows(6).any(|w| w == b"kept-0")
        })
        .count();
    assert_eq!(holding_kept, 1, "one record holds the rewritten item");
    drop((log, db));

    for _ in 0..2 {
        let store = open(&path);
        let keep = store.blocking_queue::<String>("keep").unwrap();
        let queue = store.blocking_queue::<Item>("churn").unwrap();
        assert_eq!(peek_all(&store, &keep), ["kept-0", "kept-1", "kept-2"]);
        assert_exactly_once(next, &consumed, &seqs(peek_all(&store, &queue)));
    }
}

#[test]
fn compacted_log_recovers_across_repeated_restarts() {
    const KEPT: u64 = 4;
    let (_guard, path) = temp_dir();
    let mut consumed = Vec::new();
    let mut next;
    {
        let store = open(&path);
        let keep = store.blocking_queue::<String>("keep").unwrap();
        let mut tx = store.begin();
        for i in 0..KEPT {
            keep.enqueue(&mut tx, format!("kept-{i}")).unwrap();
        }
        tx.blocking_commit().unwrap();
        let queue = store.blocking_queue::<Item>("churn").unwrap();
        enqueue_seqs(&store, &queue, 0..BACKLOG);
        next = BACKLOG;
    }
    // Each leg churns past the floor, so every restart replays rewritten groups.
    for leg in 0..4 {
        let store = open(&path);
        let keep = store.blocking_queue::<String>("keep").unwrap();
        assert_eq!(keep.blocking_count().unwrap(), KEPT, "leg {leg}");
        let queue = store.blocking_queue::<Item>("churn").unwrap();
        assert_eq!(queue.blocking_count().unwrap(), BACKLOG, "leg {leg}");
        churn(&store, &queue, &mut next, CHURN / PER_TX / 4, &mut consumed);
        assert_exactly_once(next, &consumed, &seqs(peek_all(&store, &queue)));
        drop((keep, queue, store));
        let (_, log_bytes, db) = raw_log(&path);
        drop(db);
        let bound = log_bound(BACKLOG + KEPT + PER_TX);
        assert!(log_bytes <= bound, "leg {leg}: {log_bytes} > {bound}");
    }
    let store = open(&path);
    let keep = store.blocking_queue::<String>("keep").unwrap();
    assert_eq!(
        drain(&store, &keep),
        (0..KEPT).map(|i| format!("kept-{i}")).collect::<Vec<_>>()
    );
    let queue = store.blocking_queue::<Item>("churn").unwrap();
    assert_exactly_once(next, &consumed, &seqs(drain(&store, &queue)));
}

/// Leased, retried, delayed, keyed and dead items pinned in old records are copied forward
/// by compaction with everything the queue keeps of them (attempts, due times, keys, reasons,
/// enqueue times), and read back the same after a restart.
#[test]
fn processing_layer_items_survive_compaction_and_restart() {
    use reliable_queue::{Enqueued, ManualClock, RetryPolicy};
    let clock =
        ManualClock::new(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)).unwrap();
    let (_dir, path) = common::temp_dir();
    let open_at = |path: &Path| {
        Store::builder()
            .path(path)
            .compaction_floor(FLOOR)
            .clock(clock.clone())
            .open()
            .expect("open the store")
    };
    let ttl = Duration::from_secs(60);
    let store = open_at(&path);
    let q = store.blocking_queue::<Item>("q").unwrap();
    let side = store.blocking_queue::<Item>("side").unwrap();
    q.blocking_set_retry_policy(
        RetryPolicy::default()
            .max_attempts(2)
            .initial_backoff(Duration::from_secs(3600))
            .jitter(0.0),
    )
    .unwrap();
    // Old records: a retry waiting out a long backoff (seq 0), a dead letter after two
    // attempts (seq 1), an item never leased (seq 2), and a delayed keyed item (seq 9).
    enqueue_seqs(&store, &q, 0..3);
    let lease = q.blocking_lease(ttl).unwrap();
    assert_eq!(lease.item().seq, 0);
    lease.blocking_fail("first").unwrap();
    let lease = q.blocking_lease(ttl).unwrap();
    assert_eq!(lease.item().seq, 1);
    lease.blocking_release(Duration::ZERO).unwrap();
    let lease = q.blocking_lease(ttl).unwrap();
    assert_eq!((lease.item().seq, lease.attempt()), (1, 2));
    lease.blocking_fail("second").unwrap();
    let mut tx = store.begin();
    assert_eq!(
        q.enqueue_unique(&mut tx, Item::new(9), b"nine", Duration::from_secs(7200))
            .unwrap(),
        Enqueued::Enqueued
    );
    tx.blocking_commit().unwrap();
    let before = q.blocking_stats().unwrap();
    // Churn another queue long enough for compaction to reach and rewrite the old records.
    let mut next = 1000;
    enqueue_seqs(&store, &side, 1000..1000 + 4 * PER_TX);
    next += 4 * PER_TX;
    let mut consumed = Vec::new();
    churn(
        &store,
        &side,
        &mut next,
        3 * FLOOR / (PER_TX * Item::log_bytes_max()),
        &mut consumed,
    );
    let browse = |store: &Store| {
        let q = store.blocking_queue::<Item>("q").unwrap();
        let mut items: Vec<(u64, u32, bool)> = q
            .blocking_browse(None, 100)
            .unwrap()
            .into_iter()
            .map(|b| (b.item.seq, b.attempts, b.enqueued_at.is_some()))
            .collect();
        items.sort_unstable();
        let dead: Vec<(u64, u32, String)> = q
            .blocking_dead_letters(None, 100)
            .unwrap()
            .into_iter()
            .map(|d| (d.item.seq, d.attempts, d.reason))
            .collect();
        (q.blocking_stats().unwrap(), items, dead)
    };
    let live = browse(&store);
    store.blocking_close().unwrap();
    let (keys, _, db) = raw_log(&path);
    drop(db);
    assert!(
        keys[0] > 3,
        "compaction rewrote the old records (first key {})",
        keys[0]
    );
    let store = open_at(&path);
    let reopened = browse(&store);
    assert_eq!(reopened.0.delayed, before.delayed);
    assert_eq!(reopened.0.dead, 1);
    assert_eq!((reopened.1.clone(), reopened.2.clone()), (live.1, live.2));
    assert!(
        reopened.1.iter().all(|(_, _, timed)| *timed),
        "enqueue times kept"
    );
    let q = store.blocking_queue::<Item>("q").unwrap();
    let mut tx = store.begin();
    assert_eq!(
        q.enqueue_unique(&mut tx, Item::new(10), b"nine", Duration::ZERO)
            .unwrap(),
        Enqueued::Duplicate,
        "the key was kept"
    );
}
