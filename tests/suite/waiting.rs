//! Waiting consumers: `dequeue`, `blocking_dequeue` and `blocking_dequeue_timeout` under
//! commits, timeouts and cancellation, on every engine of the conformance suite
//! (`tests/common/engines.rs`).
//!
//! Registration is awaited through `waiters()`, never through sleeps.
//!
//! Where the engines differ, by the contract: on the embedded engines a committed item is
//! handed straight to the first registered waiter (DESIGN.md section 3, staging: neither
//! visible nor waiting any more) and a `dequeue` with an item visible is ready on its first
//! poll (DESIGN.md, "Calls that may wait"); on PostgreSQL a commit wakes a waiter, which then
//! looks for the item like anyone else (ARCHITECTURE.md, "Waiting dequeue": the item stays
//! visible until taken, and every call is a round trip).

use crate::common;
use crate::engine_case;

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use common::{drain, drain_async, TotalQueue};
use rand::Rng;

use common::engines::Engine;
use common::scenarios::{
    spawn_blocking_waiter, spawn_waiter, until_waiters, until_waiters_blocking, Fixture,
    SCENARIO_LIMIT,
};
use reliable_queue::Error;

async fn waiter_is_woken_by_commit(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let waiter = spawn_waiter(&f);
    until_waiters(&f.q, 1).await;
    assert_eq!(f.q.count().await.unwrap(), 0);
    f.commit_async(&[7]).await;
    assert_eq!(waiter.await.expect("waiter task"), 7);
    assert_eq!((f.q.count().await.unwrap(), f.q.waiters()), (0, 0));

    // With an item visible, `dequeue` does not wait at all: on the embedded engines it is
    // ready on its first poll; on PostgreSQL, where that is not promised (DESIGN.md, "Calls
    // that may wait"), it takes the item in a round trip, without waiting for a commit.
    f.commit_async(&[8]).await;
    let mut tx = f.store.begin();
    {
        let mut dequeue = pin!(f.q.dequeue(&mut tx));
        match (engine.name, poll_once(dequeue.as_mut())) {
            ("postgres" | "redis", Poll::Pending) => assert_eq!(dequeue.await.expect("dequeue"), 8),
            (_, first) => assert!(matches!(first, Poll::Ready(Ok(8))), "{first:?}"),
        }
    }
    tx.commit().await.expect("commit");
    assert_eq!(f.q.waiters(), 0);
}

async fn each_of_64_waiters_is_served_once(engine: &'static Engine) {
    const N: u64 = 64;
    let f = Arc::new(Fixture::new(engine));
    let waiters: Vec<_> = (0..N).map(|_| spawn_waiter(&f)).collect();
    until_waiters(&f.q, N as usize).await;
    let producers: Vec<_> = (0..N)
        .map(|item| {
            let f = f.clone();
            tokio::spawn(async move { f.commit_async(&[item]).await })
        })
        .collect();
    for producer in producers {
        producer.await.expect("producer task");
    }
    let mut served = Vec::new();
    for waiter in waiters {
        served.push(waiter.await.expect("waiter task"));
    }
    served.sort_unstable();
    assert_eq!(
        served,
        (0..N).collect::<Vec<_>>(),
        "each item to exactly one waiter"
    );
    assert_eq!((f.q.count().await.unwrap(), f.q.waiters()), (0, 0));
    assert!(drain_async(&f.store, &f.q).await.is_empty());
}

/// Registered waiters are handed items in the order they registered: the queue documents
/// first come, first served among waiters (`dequeue`'s documentation). Eight of them, fewer
/// than PostgreSQL's pool of 16 connections (`each_of_64_waiters_is_served_once` takes more).
async fn waiters_are_served_first_come_first_served(engine: &'static Engine) {
    const N: u64 = 8;
    let f = Fixture::new(engine);
    let (served_tx, mut served) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for place in 0..N {
        let (store, q, served_tx) = (f.store.clone(), f.q.clone(), served_tx.clone());
        waiters.push(tokio::spawn(async move {
            let mut tx = store.begin();
            let item = q.dequeue(&mut tx).await.expect("dequeue");
            tx.commit().await.expect("commit the dequeue");
            served_tx.send((place, item)).expect("report");
        }));
        until_waiters(&f.q, place as usize + 1).await;
    }
    for item in 0..N {
        f.commit_async(&[100 + item]).await;
        let (place, got) = served.recv().await.expect("a waiter was served");
        assert_eq!(
            (place, got),
            (item, 100 + item),
            "item {item} went to the waiter in place {place}"
        );
    }
    for waiter in waiters {
        waiter.await.expect("waiter task");
    }
    assert_eq!((f.q.count().await.unwrap(), f.q.waiters()), (0, 0));
}

/// Consumers that give up at random moments (a timeout around `dequeue`), and sometimes
/// abort what they got, while producers commit: a total-queue check finds nothing lost,
/// duplicated or unexpected, and the queue ends idle with its count exact.
async fn consumers_timing_out_lose_nothing(engine: &'static Engine) {
    const PRODUCERS: u64 = 4;
    const PER_PRODUCER: u64 = 100;
    const CONSUMERS: usize = 8;
    let f = Arc::new(Fixture::new(engine));
    let attempted: BTreeSet<u64> = (0..PRODUCERS)
        .flat_map(|p| (0..PER_PRODUCER).map(move |i| p * 1_000 + i))
        .collect();
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let consumed = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (f, consumed, done) = (f.clone(), consumed.clone(), done.clone());
            tokio::spawn(async move {
                let (mut timeouts, mut aborts) = (0_u32, 0_u32);
                while !done.load(Ordering::Acquire) {
                    // A quarter of the consumers give up at once if nothing is visible
                    // (registered, then withdrawn); the rest wait up to 3 ms.
                    let (patience, abort) = {
                        let mut rng = rand::thread_rng();
                        let patience = if rng.gen_ratio(1, 4) {
                            0
                        } else {
                            rng.gen_range(0..3_000)
                        };
                        (patience, rng.gen_ratio(1, 4))
                    };
                    let mut tx = f.store.begin();
                    let dequeue = f.q.dequeue(&mut tx);
                    match tokio::time::timeout(Duration::from_micros(patience), dequeue).await {
                        Err(_elapsed) => timeouts += 1,
                        Ok(item) if abort => {
                            item.expect("dequeue");
                            aborts += 1;
                            tx.abort().await.expect("abort");
                        }
                        Ok(item) => {
                            let item = item.expect("dequeue");
                            tx.commit().await.expect("commit the dequeue");
                            consumed.lock().unwrap().push(item);
                        }
                    }
                }
                (timeouts, aborts)
            })
        })
        .collect();

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (f, acknowledged) = (f.clone(), acknowledged.clone());
            tokio::spawn(async move {
                for i in 0..PER_PRODUCER {
                    let item = p * 1_000 + i;
                    f.commit_async(&[item]).await;
                    acknowledged.lock().unwrap().insert(item);
                    // Let the consumers run between commits, so that they wait and give up.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.expect("producer task");
    }
    done.store(true, Ordering::Release);
    let (mut timeouts, mut aborts) = (0, 0);
    for consumer in consumers {
        let (t, a) = consumer.await.expect("consumer task");
        timeouts += t;
        aborts += a;
    }
    assert!(
        timeouts > 0,
        "no consumer ever timed out; the scenario proves nothing"
    );

    assert_eq!(
        f.q.waiters(),
        0,
        "a consumer that gave up is still registered"
    );
    // Every transaction has ended; the items of the dropped ones (and of calls cancelled
    // mid-flight) are back at once on the embedded engines, a round trip later on PostgreSQL,
    // where they are given back from a task (ARCHITECTURE.md, "Where this engine differs"
    // and "Cancelled calls"): wait for nothing to be held before counting.
    let deadline = Instant::now() + common::engines::DROP_LIMIT;
    loop {
        let held = f.q.stats().await.unwrap().held;
        if held == 0 {
            break;
        }
        assert!(
            engine.on_server() && Instant::now() < deadline,
            "{}: {held} items still held after every transaction ended",
            engine.name
        );
        tokio::task::yield_now().await;
    }
    let count = f.q.count().await.unwrap();
    let remaining = drain_async(&f.store, &f.q).await;
    assert_eq!(count, remaining.len() as u64, "count() is what is left");
    let acknowledged = acknowledged.lock().unwrap();
    let consumed = consumed.lock().unwrap();
    let verdict = TotalQueue::check(&attempted, &acknowledged, &consumed, &remaining);
    assert!(
        verdict.is_valid(),
        "{verdict:?} ({timeouts} timeouts, {aborts} aborts)"
    );
    assert_eq!(verdict.ok, attempted.len());
}

/// A dequeue future that was handed an item but is dropped before it is polled again gives
/// the item back: visible, and found by the next `try_dequeue`. (On PostgreSQL nothing is
/// handed over: the item stays visible, and the dropped future only leaves the line.)
async fn dropping_a_served_future_puts_the_item_back(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut tx = f.store.begin();
    {
        let mut dequeue = pin!(f.q.dequeue(&mut tx));
        assert!(poll_once(dequeue.as_mut()).is_pending());
        // On PostgreSQL its first look runs in a task of the store; it is counted once that
        // found nothing.
        until_waiters(&f.q, 1).await;
        assert_eq!(f.q.waiters(), 1);
        f.commit_async(&[42]).await;
        let state = (f.q.count().await.unwrap(), f.q.waiters());
        match engine.name {
            // ARCHITECTURE.md, "Waiting dequeue": a commit hands the waiter its turn, and it
            // has not been polled again: the item is still visible, the waiter in line but
            // not counted as waiting (it has the turn, as a request handed an item has).
            "postgres" | "redis" => assert_eq!(state, (1, 0)),
            // Handed to the registered request: neither visible nor waiting.
            _ => assert_eq!(state, (0, 0)),
        }
    }
    assert_eq!(
        tx.dequeued(),
        0,
        "the dropped future left the transaction untouched"
    );
    assert_eq!((f.q.count().await.unwrap(), f.q.waiters()), (1, 0));
    let mut other = f.store.begin();
    assert_eq!(
        f.q.try_dequeue(&mut other).await.expect("try_dequeue"),
        Some(42)
    );
    other.commit().await.expect("commit");
    tx.commit().await.expect("commit the empty transaction");
    assert_eq!(f.q.count().await.unwrap(), 0);
}

/// While a consumer waits, a committed item goes to it, not to a `try_dequeue` that comes
/// later. (That `try_dequeue` is one miss; a second miss before the waiter collects would take
/// the item: `tests/suite/leak.rs`.) `dequeue`'s documentation: "While anyone waits, try_dequeue
/// finds nothing, so it cannot jump the line".
async fn try_dequeue_does_not_jump_the_line(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let waiter = spawn_waiter(&f);
    until_waiters(&f.q, 1).await;
    f.commit_async(&[5]).await;
    let mut tx = f.store.begin();
    assert_eq!(f.q.try_dequeue(&mut tx).await.expect("try_dequeue"), None);
    tx.abort().await.expect("abort");
    assert_eq!(waiter.await.expect("waiter task"), 5);
    // With nobody waiting, `try_dequeue` takes the next item at once.
    f.commit_async(&[6]).await;
    let mut tx = f.store.begin();
    assert_eq!(
        f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
        Some(6)
    );
    tx.commit().await.expect("commit");
    assert_eq!((f.q.count().await.unwrap(), f.q.waiters()), (0, 0));
}

fn blocking_dequeue_is_woken_by_commit(engine: &'static Engine) {
    const THREADS: u64 = 4;
    let f = Fixture::new(engine);
    let (served_tx, served_rx) = std::sync::mpsc::channel();
    for _ in 0..THREADS {
        let (store, q, served_tx) = (f.store.clone(), f.q.clone(), served_tx.clone());
        std::thread::spawn(move || {
            let mut tx = store.begin();
            let item = q.blocking_dequeue(&mut tx).expect("blocking_dequeue");
            tx.blocking_commit().expect("commit the dequeue");
            served_tx.send(item).expect("report");
        });
    }
    until_waiters_blocking(&f.q, THREADS as usize);
    for item in 0..THREADS {
        f.commit(&[item]);
    }
    let mut served: Vec<u64> = (0..THREADS)
        .map(|_| {
            served_rx
                .recv_timeout(SCENARIO_LIMIT)
                .expect("a blocked consumer was never woken")
        })
        .collect();
    served.sort_unstable();
    assert_eq!(served, (0..THREADS).collect::<Vec<_>>());
    assert_eq!((f.q.blocking_count().unwrap(), f.q.waiters()), (0, 0));
}

fn blocking_dequeue_timeout_gives_up(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let patience = Duration::from_millis(50);
    let mut tx = f.store.begin();
    let start = Instant::now();
    let got =
        f.q.blocking_dequeue_timeout(&mut tx, patience)
            .expect("blocking_dequeue_timeout");
    assert_eq!(got, None);
    assert!(
        start.elapsed() >= patience,
        "gave up after {:?}",
        start.elapsed()
    );
    assert_eq!((f.q.waiters(), tx.dequeued()), (0, 0));
    tx.blocking_abort().expect("abort");

    // An item committed afterwards is visible to everyone, not held for the one that left.
    f.commit(&[3]);
    assert_eq!(f.q.blocking_count().unwrap(), 1);
}

fn blocking_dequeue_timeout_is_woken_by_commit(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let patience = Duration::from_secs(60);
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    {
        let (store, q) = (f.store.clone(), f.q.clone());
        std::thread::spawn(move || {
            let mut tx = store.begin();
            let start = Instant::now();
            let got = q
                .blocking_dequeue_timeout(&mut tx, patience)
                .expect("blocking_dequeue_timeout");
            let waited = start.elapsed();
            tx.blocking_commit().expect("commit the dequeue");
            result_tx.send((got, waited)).expect("report");
        });
    }
    until_waiters_blocking(&f.q, 1);
    f.commit(&[11]);
    let (got, waited) = result_rx
        .recv_timeout(patience + Duration::from_secs(10))
        .expect("the consumer never returned");
    assert_eq!(got, Some(11));
    assert!(waited < patience, "woken by the commit, not by the timeout");
    assert_eq!((f.q.blocking_count().unwrap(), f.q.waiters()), (0, 0));
}

/// Many tasks committing with `commit().await` on a multi-thread runtime: every commit is
/// durable, and all of them are there after the store is closed and reopened (S9; in memory
/// nothing outlives the store, so there the queue is drained before the close).
async fn async_commit_from_many_tasks_is_durable(engine: &'static Engine) {
    const TASKS: u64 = 64;
    const COMMITS: u64 = 8;
    let f = Fixture::new(engine);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, q) = (f.store.clone(), f.q.clone());
            tokio::spawn(async move {
                for c in 0..COMMITS {
                    let mut tx = store.begin();
                    q.enqueue(&mut tx, t * 100 + c).expect("enqueue");
                    tx.commit().await.expect("commit");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer task");
    }
    assert_eq!(f.q.count().await.unwrap(), TASKS * COMMITS);
    let expected: Vec<u64> = (0..TASKS)
        .flat_map(|t| (0..COMMITS).map(move |c| t * 100 + c))
        .collect();
    let Some(builder) = f.at.builder() else {
        let mut found = drain_async(&f.store, &f.q).await;
        found.sort_unstable();
        assert_eq!(found, expected);
        return;
    };
    f.store.clone().close().await.expect("close");
    let store = builder.open().expect("reopen the store");
    let q = store.queue::<u64>("jobs").await.expect("open the queue");
    let mut found = drain_async(&store, &q).await;
    found.sort_unstable();
    assert_eq!(found, expected);
}

/// A `dequeue` dropped after its first poll, while it waits behind another consumer. On the
/// embedded engines it is cancel-safe: the transaction is left as it was and commits its
/// other work (`dequeue`'s documentation, "Cancel safety"). On PostgreSQL its first poll has
/// sent a look to the database, and a call dropped while the database works on it aborts its
/// transaction: the commit fails with `TransactionAborted` and applies nothing; dropped after
/// the look came back with nothing, the transaction is left as it was (ARCHITECTURE.md,
/// "Cancelled calls").
fn a_dequeue_dropped_mid_wait_leaves_its_transaction_as_documented(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let waiter = spawn_blocking_waiter(&f);
    until_waiters_blocking(&f.q, 1);
    let mut tx = f.store.begin();
    f.q.enqueue(&mut tx, 5).expect("enqueue");
    {
        let mut dequeue = pin!(f.q.dequeue(&mut tx));
        assert!(poll_once(dequeue.as_mut()).is_pending(), "nothing to take");
    }
    assert_eq!((tx.enqueued(), tx.dequeued()), (1, 0));
    match engine.name {
        // Dropped while its look was in flight, the transaction is aborted; dropped once the
        // look had come back with nothing (the look runs in a task of the store, so either
        // can happen here), it is left as it was.
        "postgres" | "redis" => match tx.blocking_commit() {
            Err(Error::TransactionAborted { .. }) => {
                f.commit(&[6]);
                assert_eq!(waiter.join().expect("the waiter"), 6);
            }
            Ok(()) => assert_eq!(waiter.join().expect("the waiter"), 5),
            Err(e) => panic!("the commit after a dropped dequeue: {e}"),
        },
        _ => {
            tx.blocking_commit().expect("commit the enqueue");
            assert_eq!(waiter.join().expect("the waiter"), 5);
        }
    }
    assert_eq!(f.state(), (0, 0));
}

/// A `commit` future dropped after its first poll still commits, only its outcome is lost;
/// one dropped before it is ever polled aborts its transaction (on PostgreSQL too: "a dropped
/// future does not cancel the task", ARCHITECTURE.md, "Where the work runs").
fn a_commit_dropped_after_its_first_poll_still_commits(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut tx = f.store.begin();
    f.q.enqueue(&mut tx, 1).expect("enqueue");
    {
        let commit = pin!(tx.commit());
        let _ = poll_once(commit);
    }
    let mut never_polled = f.store.begin();
    f.q.enqueue(&mut never_polled, 2).expect("enqueue");
    drop(never_polled.commit());
    f.commit(&[3]);
    common::engines::wait_until("the dropped commit to be applied", SCENARIO_LIMIT, || {
        f.q.blocking_count().unwrap() == 2
    });
    let mut items = drain(&f.store, &f.q);
    items.sort_unstable();
    assert_eq!(items, [1, 3]);
}

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(async waiter_is_woken_by_commit),
        engine_case!(async each_of_64_waiters_is_served_once),
        engine_case!(async waiters_are_served_first_come_first_served),
        engine_case!(async consumers_timing_out_lose_nothing),
        engine_case!(async dropping_a_served_future_puts_the_item_back),
        engine_case!(async try_dequeue_does_not_jump_the_line),
        engine_case!(blocking_dequeue_is_woken_by_commit),
        engine_case!(blocking_dequeue_timeout_gives_up),
        engine_case!(blocking_dequeue_timeout_is_woken_by_commit),
        engine_case!(async async_commit_from_many_tasks_is_durable),
        engine_case!(a_dequeue_dropped_mid_wait_leaves_its_transaction_as_documented),
        engine_case!(a_commit_dropped_after_its_first_poll_still_commits),
    ]
}
