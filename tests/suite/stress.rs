//! Concurrent producers and consumers with random aborts on both sides, checked in the manner
//! of Jepsen's total-queue: nothing acknowledged is lost, nothing is delivered twice, nothing
//! appears that was not enqueued, and nothing aborted is ever delivered.
//!
//! Seeds are fixed and printed; set `RQ_STRESS_SEED` to run with another base seed.
//!
//! Runs on every engine of the conformance suite (`tests/common/engines.rs`), sized per
//! engine for a few seconds on two cores; the compaction scenario is sled's alone.

use crate::common;
use crate::{engine_case, once_case};

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::engines::Engine;
use common::{drain, temp_dir, TotalQueue};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{ReliableConcurrentQueue, Store};

const PRODUCERS: u64 = 4;
const CONSUMERS: u64 = 4;
/// Probability that a producer or consumer transaction is aborted instead of committed.
const ABORT: f64 = 0.15;

fn base_seed() -> u64 {
    std::env::var("RQ_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_2026)
}

/// What the producers and consumers of a run recorded.
#[derive(Debug, Default)]
struct History {
    attempted: BTreeSet<u64>,
    acknowledged: BTreeSet<u64>,
    consumed: Vec<u64>,
    producer_aborts: usize,
    consumer_aborts: usize,
}

impl History {
    /// Checks the run against what is left in the queue.
    fn check(&self, remaining: &[u64]) {
        let verdict = TotalQueue::check(
            &self.attempted,
            &self.acknowledged,
            &self.consumed,
            remaining,
        );
        assert!(
            verdict.is_valid(),
            "lost {:?}, duplicated {:?}, unexpected {:?}",
            verdict.lost,
            verdict.duplicated,
            verdict.unexpected
        );
        assert_eq!(verdict.ok, self.acknowledged.len());
        let phantoms: Vec<u64> = self
            .consumed
            .iter()
            .chain(remaining)
            .filter(|id| !self.acknowledged.contains(id))
            .copied()
            .collect();
        assert!(
            phantoms.is_empty(),
            "items of aborted enqueues were delivered: {phantoms:?}"
        );
        assert!(
            !self.consumed.is_empty(),
            "the consumers consumed something"
        );
        assert!(
            self.producer_aborts > 0 && self.consumer_aborts > 0,
            "both sides aborted"
        );
    }
}

/// When the consumers of a round stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Once the producers are done and nothing is visible.
    WhenEmpty,
    /// As soon as the producers are done, leaving a backlog.
    WithProducers,
}

/// One round of producers and consumers on `queue`. Ids are `round << 48 | producer << 32 |
/// n`, unique across rounds.
fn run_round(
    store: &Store,
    queue: &ReliableConcurrentQueue<u64>,
    round: u64,
    items_per_producer: u64,
    stop: Stop,
    history: &mut History,
) {
    let seed = base_seed().wrapping_add(round * 1000);
    eprintln!("stress round {round}: base seed {seed} (thread seeds seed + index)");
    let producers_done = Arc::new(AtomicUsize::new(0));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (store, queue) = (store.clone(), queue.clone());
            let done = producers_done.clone();
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + p);
                let mut attempted: Vec<u64> = Vec::new();
                let mut acknowledged: Vec<u64> = Vec::new();
                let mut aborts = 0;
                let mut n = 0;
                while n < items_per_producer {
                    let batch = rng.gen_range(1..=4).min(items_per_producer - n);
                    let mut tx = store.begin();
                    let ids: Vec<u64> = (n..n + batch).map(|i| round << 48 | p << 32 | i).collect();
                    n += batch;
                    for &id in &ids {
                        queue.enqueue(&mut tx, id).unwrap();
                    }
                    attempted.extend(&ids);
                    if rng.gen_bool(ABORT) {
                        aborts += 1;
                        tx.blocking_abort().expect("abort");
                    } else if tx.blocking_commit().is_ok() {
                        acknowledged.extend(ids);
                    }
                }
                done.fetch_add(1, Ordering::Release);
                (attempted, acknowledged, aborts)
            })
        })
        .collect();

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let (store, queue) = (store.clone(), queue.clone());
            let done = producers_done.clone();
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + PRODUCERS + c);
                let mut consumed = Vec::new();
                let mut aborts = 0;
                loop {
                    let finished = done.load(Ordering::Acquire) == PRODUCERS as usize;
                    if finished && stop == Stop::WithProducers {
                        break;
                    }
                    let mut tx = store.begin();
                    // Wait (parked, not spinning) for the first item, then take what is there.
                    let Some(first) = queue
                        .blocking_dequeue_timeout(&mut tx, Duration::from_millis(20))
                        .unwrap()
                    else {
                        if finished {
                            break;
                        }
                        continue;
                    };
                    let mut taken = vec![first];
                    let want = rng.gen_range(1..=8);
                    while taken.len() < want {
                        match queue.blocking_try_dequeue(&mut tx).unwrap() {
                            Some(id) => taken.push(id),
                            None => break,
                        }
                    }
                    if rng.gen_bool(ABORT) {
                        aborts += 1;
                        if rng.gen_bool(0.5) {
                            tx.blocking_abort().expect("abort");
                        } else {
                            drop(tx);
                        }
                    } else if tx.blocking_commit().is_ok() {
                        consumed.extend(taken);
                    }
                }
                (consumed, aborts)
            })
        })
        .collect();

    for producer in producers {
        let (attempted, acknowledged, aborts) = producer.join().expect("producer");
        history.attempted.extend(attempted);
        history.acknowledged.extend(acknowledged);
        history.producer_aborts += aborts;
    }
    for consumer in consumers {
        let (consumed, aborts) = consumer.join().expect("consumer");
        history.consumed.extend(consumed);
        history.consumer_aborts += aborts;
    }
}

/// How many items each producer commits on `engine`: a few seconds of work on two cores.
fn sized(engine: &Engine, memory: u64, sled: u64, remote: u64) -> u64 {
    match engine.name {
        "memory" => memory,
        "sled" => sled,
        _ => remote,
    }
}

/// Waits until no transaction holds an item of `queue`: the ones the consumers dropped have
/// given theirs back (on PostgreSQL from a task, a round trip later).
fn settled(engine: &Engine, queue: &ReliableConcurrentQueue<u64>) {
    engine.after_drop("the dropped transactions' items are back", || {
        queue.blocking_stats().unwrap().held == 0
    });
}

/// Checks that the idle queue's count is exact, drains it, and checks the history.
fn finish(engine: &Engine, store: &Store, queue: &ReliableConcurrentQueue<u64>, history: &History) {
    settled(engine, queue);
    let idle_count = queue.blocking_count().unwrap();
    let remaining = drain(store, queue);
    assert_eq!(
        idle_count,
        remaining.len() as u64,
        "count() of an idle queue"
    );
    assert_eq!(
        queue.blocking_count().unwrap(),
        0,
        "count() after the drain"
    );
    history.check(&remaining);
}

fn stress(engine: &Engine, store: &Store, items_per_producer: u64) {
    let start = Instant::now();
    let queue = store.blocking_queue::<u64>("stress").unwrap();
    let mut history = History::default();
    run_round(
        store,
        &queue,
        0,
        items_per_producer,
        Stop::WhenEmpty,
        &mut history,
    );
    finish(engine, store, &queue, &history);
    eprintln!(
        "{} acknowledged, {} consumed in {:?}",
        history.acknowledged.len(),
        history.consumed.len(),
        start.elapsed()
    );
}

fn concurrent_producers_and_consumers(engine: &'static Engine) {
    let at = engine.store();
    stress(engine, &at.store, sized(engine, 100_000, 10_000, 1_000));
}

/// Runs rounds with a close and reopen between them; what was left in the queue at each
/// close is there after the reopen.
fn stress_with_restarts(engine: &Engine, open: impl Fn() -> Store, items_per_producer: u64) {
    let start = Instant::now();
    let mut history = History::default();
    let mut left_at_close = None;
    for round in 0..3 {
        let store = open();
        let queue = store.blocking_queue::<u64>("stress").unwrap();
        if let Some(left) = left_at_close {
            assert_eq!(
                queue.blocking_count().unwrap(),
                left,
                "round {round}: items after reopen"
            );
        }
        run_round(
            &store,
            &queue,
            round,
            items_per_producer,
            Stop::WithProducers,
            &mut history,
        );
        // A tail of items nobody consumes in this round makes sure a backlog crosses the
        // restart.
        let mut tx = store.begin();
        let tail: Vec<u64> = (0..50).map(|i| round << 48 | PRODUCERS << 32 | i).collect();
        for &id in &tail {
            queue.enqueue(&mut tx, id).unwrap();
        }
        history.attempted.extend(&tail);
        tx.blocking_commit().unwrap();
        history.acknowledged.extend(tail);
        settled(engine, &queue);
        let left = queue.blocking_count().unwrap();
        assert!(
            left >= 50,
            "round {round} leaves a backlog across the restart"
        );
        left_at_close = Some(left);
        store.blocking_close().unwrap();
    }
    let store = open();
    let queue = store.blocking_queue::<u64>("stress").unwrap();
    assert_eq!(Some(queue.blocking_count().unwrap()), left_at_close);
    finish(engine, &store, &queue, &history);
    eprintln!(
        "{} acknowledged, {} consumed in {:?} with restarts",
        history.acknowledged.len(),
        history.consumed.len(),
        start.elapsed()
    );
}

/// (In memory nothing outlives the store, S9: nothing to restart.)
fn concurrent_producers_and_consumers_across_restarts(engine: &'static Engine) {
    let at = engine.store();
    if !at.durable() {
        return;
    }
    at.store.clone().blocking_close().unwrap();
    stress_with_restarts(
        engine,
        || at.reopen().unwrap(),
        sized(engine, 4000, 4000, 500),
    );
}

fn concurrent_producers_and_consumers_across_restarts_with_compaction() {
    // A small floor makes compaction rewrite live items during the rounds; a small group
    // size splits concurrent commits over several records.
    let (_guard, path) = temp_dir();
    let open = || {
        Store::builder()
            .path(&path)
            .compaction_floor(4 * 1024)
            .group_size(512)
            .durability(reliable_queue::Durability::Buffered)
            .open()
            .unwrap()
    };
    let sled = common::engines::ENGINES
        .iter()
        .find(|e| e.is("sled"))
        .expect("sled");
    stress_with_restarts(sled, open, 5000);
}

fn concurrent_moves_between_queues_are_atomic(engine: &'static Engine) {
    let at = engine.store();
    let store = at.store.clone();
    let inbox = store.blocking_queue::<u64>("in").unwrap();
    let outbox = store.blocking_queue::<u64>("out").unwrap();
    let seed = base_seed().wrapping_add(7_000);
    eprintln!("moves: base seed {seed} (thread seeds seed + index)");
    let items = sized(engine, 5000, 5000, 1000);
    let producers_done = Arc::new(AtomicUsize::new(0));

    // Two producers into "in"; two movers from "in" to "out", each move one transaction.
    let producers: Vec<_> = (0..2u64)
        .map(|p| {
            let (store, inbox, done) = (store.clone(), inbox.clone(), producers_done.clone());
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + p);
                let (mut attempted, mut acknowledged) = (Vec::new(), Vec::new());
                for n in (0..items).step_by(2) {
                    let ids = [p << 32 | n, p << 32 | (n + 1)];
                    let mut tx = store.begin();
                    for id in ids {
                        inbox.enqueue(&mut tx, id).unwrap();
                    }
                    attempted.extend(ids);
                    if rng.gen_bool(ABORT) {
                        tx.blocking_abort().expect("abort");
                    } else if tx.blocking_commit().is_ok() {
                        acknowledged.extend(ids);
                    }
                }
                done.fetch_add(1, Ordering::Release);
                (attempted, acknowledged)
            })
        })
        .collect();
    let movers: Vec<_> = (0..2u64)
        .map(|m| {
            let (store, inbox, outbox) = (store.clone(), inbox.clone(), outbox.clone());
            let done = producers_done.clone();
            thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + 2 + m);
                let mut moved = 0;
                loop {
                    let finished = done.load(Ordering::Acquire) == 2;
                    let mut tx = store.begin();
                    let wait = Duration::from_millis(20);
                    let Some(first) = inbox.blocking_dequeue_timeout(&mut tx, wait).unwrap() else {
                        if finished {
                            return moved;
                        }
                        continue;
                    };
                    let mut batch = vec![first];
                    let want = rng.gen_range(1..=6);
                    while batch.len() < want {
                        match inbox.blocking_try_dequeue(&mut tx).unwrap() {
                            Some(id) => batch.push(id),
                            None => break,
                        }
                    }
                    for &id in &batch {
                        outbox.enqueue(&mut tx, id).unwrap();
                    }
                    if rng.gen_bool(ABORT) {
                        tx.blocking_abort().expect("abort");
                    } else if tx.blocking_commit().is_ok() {
                        moved += batch.len();
                    }
                }
            })
        })
        .collect();

    let mut history = History::default();
    for producer in producers {
        let (attempted, acknowledged) = producer.join().unwrap();
        history.attempted.extend(attempted);
        history.acknowledged.extend(acknowledged);
    }
    let moved: usize = movers.into_iter().map(|m| m.join().unwrap()).sum();
    assert!(moved > 0, "the movers moved something");
    settled(engine, &inbox);
    drop((inbox, outbox));

    // Everything acknowledged is in exactly one of the two queues, after a restart too
    // (where the data outlives the store).
    let store = if at.durable() {
        store.blocking_close().unwrap();
        at.reopen().unwrap()
    } else {
        store
    };
    let inbox = store.blocking_queue::<u64>("in").unwrap();
    let outbox = store.blocking_queue::<u64>("out").unwrap();
    let out_count = outbox.blocking_count().unwrap();
    let in_remaining = drain(&store, &inbox);
    let out_remaining = drain(&store, &outbox);
    assert_eq!(out_remaining.len(), moved, "every committed move, once");
    assert_eq!(out_count, moved as u64);
    let remaining: Vec<u64> = in_remaining.into_iter().chain(out_remaining).collect();
    let verdict = TotalQueue::check(&history.attempted, &history.acknowledged, &[], &remaining);
    assert!(verdict.is_valid(), "{verdict:?}");
    assert_eq!(remaining.len(), history.acknowledged.len());
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(concurrent_producers_and_consumers),
        engine_case!(concurrent_producers_and_consumers_across_restarts),
        once_case!(concurrent_producers_and_consumers_across_restarts_with_compaction),
        engine_case!(concurrent_moves_between_queues_are_atomic),
    ]
}
