//! `Store::close` and the contract that came with it: a close on one clone closes every
//! clone, wakes waiting consumers with `Closed`, lets submitted commits finish and releases
//! the directory at once; the blocking forms work inside a tokio runtime; `enqueue` leaves a
//! refused item with the caller; queue names are checked.
//!
//! Every scenario runs on every engine of the conformance suite (`tests/common/engines.rs`);
//! where the data outlives the store (sled, PostgreSQL) the next open is checked too.
//! Consumers are awaited through `waiters()` polled against a deadline, never through sleeps.

use crate::common;
use crate::engine_case;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::engines::Engine;
use common::{drain, peek_all, TotalQueue};
use reliable_queue::{Durability, Error, ReliableConcurrentQueue, Result, Store, Transaction};

/// How long a consumer may take to register, or a woken one to return.
const LIMIT: Duration = Duration::from_secs(10);

fn assert_closed<T: Debug>(result: Result<T>, what: &str) {
    match result {
        Err(Error::Closed) => {}
        other => panic!("{what} after close: expected Err(Closed), got {other:?}"),
    }
}

/// Waits, without sleeping, until `done` holds; fails the test after [`LIMIT`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::yield_now();
    }
}

/// Runs `call` on a thread of its own and returns its outcome; fails the test if it has not
/// returned within [`LIMIT`] (for calls that must fail at once rather than wait).
fn within_limit<R: Send + 'static>(call: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(call());
    });
    rx.recv_timeout(LIMIT)
        .expect("the call returned instead of waiting")
}

fn commit_items(store: &Store, q: &ReliableConcurrentQueue<u32>, items: &[u32]) {
    let mut tx = store.begin();
    for item in items {
        q.enqueue(&mut tx, item).expect("enqueue");
    }
    tx.blocking_commit().expect("commit");
}

/// Checks that `q`, in a store opened after a close, counts `n` items: at once on the
/// embedded engines; on PostgreSQL the rows the closed store's open transactions held come
/// back when the server sees their connections end ("close: closes the pool; held rows
/// return when their connections end", ARCHITECTURE.md), a moment later.
fn held_items_back(engine: &Engine, q: &ReliableConcurrentQueue<u32>, n: u64) {
    match engine.name {
        "postgres" | "redis" => common::engines::wait_until(
            "the items held at the close to be back",
            common::engines::DROP_LIMIT,
            || q.blocking_count().unwrap() == n,
        ),
        _ => assert_eq!(q.blocking_count().unwrap(), n, "{}", engine.name),
    }
}

/// sled's lock on the directory is free right now (no waiting).
fn assert_directory_released(path: &Path) {
    let db = std::fs::File::open(path.join("db")).expect("open sled's db file");
    match db.try_lock() {
        Ok(()) => db.unlock().expect("unlock"),
        Err(e) => panic!("the directory is still locked after close returned: {e:?}"),
    }
}

// ---- a close closes every clone ----

fn close_on_one_clone_makes_every_call_on_the_others_fail_with_closed(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = at.store.clone();
        let q = store.blocking_queue::<u32>("q").unwrap();
        commit_items(&store, &q, &[1, 2]);
        let other = store.clone();
        // Open at close: a transaction with an enqueue, and one holding a dequeued item.
        let mut pending = store.begin();
        q.enqueue(&mut pending, 3).unwrap();
        let mut holding = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut holding).unwrap(), Some(1));

        store.blocking_close().expect("close");

        assert_closed(
            other.blocking_queue::<u32>("q"),
            "blocking_queue (existing)",
        );
        assert_closed(other.blocking_queue::<u32>("new"), "blocking_queue (new)");
        let mut tx = other.begin();
        assert_closed(q.enqueue(&mut tx, 4), "enqueue");
        assert_eq!(
            tx.enqueued(),
            0,
            "a refused enqueue leaves the transaction unchanged"
        );
        assert_closed(q.blocking_try_dequeue(&mut tx), "blocking_try_dequeue");
        // Waiting forms fail at once too, rather than waiting for an item.
        let (s, qq) = (other.clone(), q.clone());
        assert_closed(
            within_limit(move || {
                qq.blocking_dequeue_timeout(&mut s.begin(), Duration::from_secs(600))
            }),
            "blocking_dequeue_timeout",
        );
        let (s, qq) = (other.clone(), q.clone());
        assert_closed(
            within_limit(move || qq.blocking_dequeue(&mut s.begin())),
            "blocking_dequeue",
        );
        assert_eq!(tx.dequeued(), 0);
        assert_closed(
            tx.blocking_commit(),
            "blocking_commit of an empty transaction",
        );
        assert_closed(pending.blocking_commit(), "blocking_commit of an enqueue");
        assert_closed(holding.blocking_commit(), "blocking_commit of a dequeue");
        assert_closed(q.blocking_count(), "blocking_count");
        assert_closed(other.blocking_flush(), "blocking_flush");
        assert_closed(other.blocking_unfence("q"), "blocking_unfence");
        assert_eq!(q.waiters(), 0);
        assert_closed(other.clone().blocking_close(), "a second blocking_close");

        if let Some(store) = at.reopen() {
            // Neither the refused commits nor the refused enqueues reached the log.
            let q = store.blocking_queue::<u32>("q").unwrap();
            assert_eq!(store.queue_names(), ["q"]);
            held_items_back(engine, &q, 2);
            assert_eq!(drain(&store, &q), [1, 2], "{}", engine.name);
        }
    }
}

async fn async_forms_fail_with_closed(engine: &'static Engine) {
    let at = engine.store();
    let store = at.store.clone();
    let q = store.queue::<u32>("q").await.unwrap();
    let mut tx = store.begin();
    q.enqueue(&mut tx, 1).unwrap();
    tx.commit().await.unwrap();
    let other = store.clone();
    let mut holding = store.begin();
    assert_eq!(q.try_dequeue(&mut holding).await.unwrap(), Some(1));

    store.close().await.expect("close");

    assert_closed(other.queue::<u32>("q").await, "queue");
    assert_closed(other.queue::<u32>("new").await, "queue (new)");
    let mut tx = other.begin();
    assert_closed(q.enqueue(&mut tx, 2), "enqueue");
    assert_closed(q.try_dequeue(&mut tx).await, "try_dequeue");
    let dequeued = tokio::time::timeout(LIMIT, q.dequeue(&mut tx)).await;
    assert_closed(dequeued.expect("dequeue fails at once"), "dequeue");
    assert_closed(tx.commit().await, "commit");
    assert_closed(holding.commit().await, "commit of a dequeue");
    // Aborting cannot fail on the embedded engines, closed or not.
    other.begin().abort().await.expect("abort after close");
    assert_closed(q.count().await, "count");
    assert_closed(other.flush().await, "flush");
    assert_closed(other.unfence("q").await, "unfence");
    assert_closed(other.clone().close().await, "a second close");
    assert_closed(other.close().await, "close of the last store handle");

    // Opened again at once (from a thread of the blocking pool: blocking calls are for
    // threads).
    tokio::task::spawn_blocking(move || {
        if let Some(store) = at.reopen() {
            let q = store.blocking_queue::<u32>("q").unwrap();
            held_items_back(engine, &q, 1);
            assert_eq!(drain(&store, &q), [1]);
        }
    })
    .await
    .expect("the check after reopening");
}

fn a_second_close_returns_closed(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = at.store.clone();
        let clones = [store.clone(), store.clone(), store.clone()];
        store.blocking_close().expect("the first close");
        let [a, b, c] = clones;
        assert_closed(a.blocking_close(), "a second blocking_close");
        assert_closed(b.blocking_close(), "a third blocking_close");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_closed(runtime.block_on(c.close()), "close after close");
    }
}

// ---- waiting consumers ----

/// A consumer in `blocking_dequeue` (thread), one in `blocking_dequeue_timeout` (thread) and
/// one in `dequeue().await` (tokio task) all wake with `Closed` when another thread closes.
fn waiting_consumers_are_woken_with_closed_by_a_close_from_another_thread(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = at.store.clone();
        let q = store.blocking_queue::<u32>("q").unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let task = {
            let (store, q) = (store.clone(), q.clone());
            runtime.spawn(async move {
                let mut tx = store.begin();
                let got = q.dequeue(&mut tx).await;
                (got, tx.dequeued())
            })
        };
        let (done_tx, done) = mpsc::channel();
        {
            let (store, q, done_tx) = (store.clone(), q.clone(), done_tx.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let got = q.blocking_dequeue(&mut tx).map(Some);
                let _ = done_tx.send(("blocking_dequeue", got, tx.dequeued()));
            });
        }
        {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let got = q.blocking_dequeue_timeout(&mut tx, Duration::from_secs(600));
                let _ = done_tx.send(("blocking_dequeue_timeout", got, tx.dequeued()));
            });
        }
        wait_until("three consumers to wait", || q.waiters() == 3);

        let closer = {
            let store = store.clone();
            thread::spawn(move || store.blocking_close())
        };
        closer
            .join()
            .expect("the closing thread")
            .expect("close from another thread");

        for _ in 0..2 {
            let (what, got, dequeued) = done
                .recv_timeout(LIMIT)
                .expect("a blocked consumer was not woken by the close");
            assert_closed(got, what);
            assert_eq!(dequeued, 0, "{what}");
        }
        let (got, dequeued) = runtime
            .block_on(async { tokio::time::timeout(LIMIT, task).await })
            .expect("the waiting task was not woken by the close")
            .expect("the waiting task");
        assert_closed(got, "dequeue().await");
        assert_eq!(dequeued, 0);
        assert_eq!(q.waiters(), 0, "{}", engine.name);

        if let Some(store) = at.reopen() {
            let q = store.blocking_queue::<u32>("q").unwrap();
            assert_eq!(q.blocking_count().unwrap(), 0);
        }
    }
}

// ---- the directory after a close ----

/// (In memory nothing outlives the store, S9: nothing to reopen.)
fn reopen_right_after_close_finds_every_acknowledged_commit(
    engine: &'static Engine,
    durability: Durability,
) {
    // An interval no test run reaches: under `Buffered` only the close can flush.
    let at = engine.store_with(move |b| {
        b.durability(durability)
            .flush_interval(Duration::from_secs(3600))
    });
    if !at.durable() {
        return;
    }
    let store = at.store.clone();
    let a = store.blocking_queue::<u32>("a").unwrap();
    let b = store.blocking_queue::<String>("b").unwrap();
    for chunk in (0..50u32).collect::<Vec<_>>().chunks(10) {
        commit_items(&store, &a, chunk);
    }
    // Moves: 0..5 from `a` to `b`.
    for _ in 0..5 {
        let mut tx = store.begin();
        let item = a.blocking_try_dequeue(&mut tx).unwrap().expect("an item");
        b.enqueue(&mut tx, format!("moved {item}")).unwrap();
        tx.blocking_commit().unwrap();
    }
    // Consumed: 5..8.
    let mut tx = store.begin();
    for expected in 5..8 {
        assert_eq!(a.blocking_try_dequeue(&mut tx).unwrap(), Some(expected));
    }
    tx.blocking_commit().unwrap();
    // Open at close, never committed: 8 held, 99 enqueued.
    let mut open_tx = store.begin();
    assert_eq!(a.blocking_try_dequeue(&mut open_tx).unwrap(), Some(8));
    a.enqueue(&mut open_tx, 99).unwrap();
    // Other handles stay alive across the close: it does not wait for them.
    let (other, a_old) = (store.clone(), a.clone());

    store.blocking_close().expect("close");
    if let Some(path) = at.path() {
        assert_directory_released(path);
    }
    let reopened = at.reopen().expect("reopen right after close");

    let a = reopened.blocking_queue::<u32>("a").unwrap();
    let b = reopened.blocking_queue::<String>("b").unwrap();
    assert_eq!(reopened.queue_names(), ["a", "b"]);
    held_items_back(engine, &a, 42);
    assert_eq!(peek_all(&reopened, &a), (8..50).collect::<Vec<_>>());
    assert_eq!(
        peek_all(&reopened, &b),
        (0..5).map(|i| format!("moved {i}")).collect::<Vec<_>>()
    );

    // The old handles are closed; dropping them leaves the new store alone.
    assert_closed(a_old.blocking_count(), "count on an old handle");
    assert_closed(open_tx.blocking_commit(), "commit of an old transaction");
    drop((other, a_old));
    let again = at.builder().expect("a durable store").open();
    match engine.name {
        // Many processes share a schema (DESIGN.md, "Engines"): a second store opens.
        "postgres" | "redis" => drop(again.expect("a second store on the schema")),
        _ => assert!(
            matches!(again, Err(Error::AlreadyOpen { .. })),
            "the reopened store still holds the directory"
        ),
    }
    commit_items(&reopened, &a, &[100]);
    assert_eq!(a.blocking_count().unwrap(), 43);
    reopened.blocking_close().expect("close the reopened store");

    let store = at.reopen().expect("open a third time");
    let a = store.blocking_queue::<u32>("a").unwrap();
    let mut expected: Vec<u32> = (8..50).collect();
    expected.push(100);
    assert_eq!(drain(&store, &a), expected, "{durability:?}");
}

fn reopen_right_after_close_finds_every_acknowledged_commit_sync(engine: &'static Engine) {
    reopen_right_after_close_finds_every_acknowledged_commit(engine, Durability::Sync);
}

fn reopen_right_after_close_finds_every_acknowledged_commit_buffered(engine: &'static Engine) {
    reopen_right_after_close_finds_every_acknowledged_commit(engine, Durability::Buffered);
}

// ---- commits racing a close ----

/// What the racing threads saw.
#[derive(Default)]
struct Outcomes {
    /// Enqueues whose commit returned `Ok`.
    acknowledged: BTreeSet<u64>,
    /// Enqueues refused (`enqueue` or `commit` returned `Closed`).
    refused: BTreeSet<u64>,
    /// Items of dequeues whose commit returned `Ok`.
    consumed: Vec<u64>,
    /// Items of dequeues whose commit returned `Closed`.
    given_back: Vec<u64>,
    /// Prepared transactions (committed as the close starts) acknowledged and refused.
    prepared: [usize; 2],
}

fn expect_closed_or_ok<T: Debug>(result: &Result<T>, what: &str) {
    if let Err(e) = result {
        assert!(matches!(e, Error::Closed), "{what}: {e:?}");
    }
}

/// Producers and consumers commit in a loop while another thread closes the store: each
/// commit either succeeds and is there after a reopen (sled, PostgreSQL), or fails with
/// `Closed` and is absent (its dequeued items are still there).
fn commits_racing_a_close(engine: &'static Engine, durability: Durability) {
    const PRODUCERS: u64 = 6;
    const CONSUMERS: usize = 2;
    const PREFILL: u64 = 2_000;
    // Fewer than PostgreSQL's pool of 16 connections: there each open transaction that
    // dequeued holds one until it ends (ARCHITECTURE.md, "A transaction's connection"), and
    // the producers and consumers need some.
    const PREPARED: usize = 8;
    let at = engine.store_with(move |b| {
        b.durability(durability)
            .flush_interval(Duration::from_secs(3600))
    });
    let store = at.store.clone();
    let q = store.blocking_queue::<u64>("q").unwrap();
    let mut tx = store.begin();
    for id in 0..PREFILL {
        q.enqueue(&mut tx, id).unwrap();
    }
    tx.blocking_commit().unwrap();

    // Transactions ready to commit (one enqueue, one dequeue of a prefilled item), made
    // before the consumers start, so that the consumers cannot have drained the prefilled
    // items first.
    let prepared: Vec<(Transaction, u64, u64)> = (0..PREPARED)
        .map(|c| {
            let id = 9_000_000 + c as u64;
            let mut tx = store.begin();
            q.enqueue(&mut tx, id).expect("enqueue before the close");
            let taken = q
                .blocking_try_dequeue(&mut tx)
                .expect("dequeue before the close")
                .expect("a prefilled item");
            (tx, id, taken)
        })
        .collect();

    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    // Acknowledged commits of the producers and of the consumers.
    let commits = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut threads = Vec::new();
    for p in 1..=PRODUCERS {
        let (store, q, outcomes, commits) =
            (store.clone(), q.clone(), outcomes.clone(), commits.clone());
        threads.push(thread::spawn(move || {
            for i in 0.. {
                let id = p * 1_000_000 + i;
                let mut tx = store.begin();
                let enqueued = q.enqueue(&mut tx, id);
                expect_closed_or_ok(&enqueued, "enqueue");
                let committed = enqueued.and_then(|()| tx.blocking_commit());
                expect_closed_or_ok(&committed, "commit of an enqueue");
                let mut outcomes = outcomes.lock().unwrap();
                if committed.is_ok() {
                    outcomes.acknowledged.insert(id);
                    commits[0].fetch_add(1, Ordering::Relaxed);
                } else {
                    outcomes.refused.insert(id);
                    return;
                }
            }
        }));
    }
    for _ in 0..CONSUMERS {
        let (store, q, outcomes, commits) =
            (store.clone(), q.clone(), outcomes.clone(), commits.clone());
        threads.push(thread::spawn(move || loop {
            let mut tx = store.begin();
            let mut taken = Vec::new();
            for _ in 0..3 {
                let got = q.blocking_try_dequeue(&mut tx);
                expect_closed_or_ok(&got, "try_dequeue");
                match got {
                    Ok(Some(id)) => taken.push(id),
                    Ok(None) => break,
                    // Closed: the transaction is dropped, which gives its items back.
                    Err(_) => return,
                }
            }
            let committed = tx.blocking_commit();
            expect_closed_or_ok(&committed, "commit of a dequeue");
            let mut outcomes = outcomes.lock().unwrap();
            if committed.is_ok() {
                if !taken.is_empty() {
                    commits[1].fetch_add(1, Ordering::Relaxed);
                }
                outcomes.consumed.extend(taken);
            } else {
                outcomes.given_back.extend(taken);
                return;
            }
        }));
    }
    // Committers with a transaction ready (one enqueue, one dequeue) commit at the moment
    // the close starts, so that some commits are submitted just before it and some just after.
    let start = Arc::new(Barrier::new(PREPARED + 1));
    for (tx, id, taken) in prepared {
        let (outcomes, start) = (outcomes.clone(), start.clone());
        threads.push(thread::spawn(move || {
            start.wait();
            let committed = tx.blocking_commit();
            expect_closed_or_ok(&committed, "commit of a prepared transaction");
            let mut outcomes = outcomes.lock().unwrap();
            if committed.is_ok() {
                outcomes.acknowledged.insert(id);
                outcomes.consumed.push(taken);
                outcomes.prepared[0] += 1;
            } else {
                outcomes.refused.insert(id);
                outcomes.given_back.push(taken);
                outcomes.prepared[1] += 1;
            }
        }));
    }
    // Close while the commits are in full flow.
    wait_until("commits to flow", || {
        commits[0].load(Ordering::Relaxed) >= 200 && commits[1].load(Ordering::Relaxed) >= 20
    });
    let closer = {
        let store = store.clone();
        thread::spawn(move || {
            start.wait();
            store.blocking_close()
        })
    };
    closer.join().unwrap().expect("close");
    for thread in threads {
        if let Err(panic) = thread.join() {
            std::panic::resume_unwind(panic);
        }
    }
    let outcomes = outcomes.lock().unwrap();
    assert!(!outcomes.acknowledged.is_empty() && !outcomes.consumed.is_empty());
    assert_eq!(
        outcomes.refused.len(),
        PRODUCERS as usize + outcomes.prepared[1],
        "each producer stops at its first refusal"
    );
    println!(
        "{} {durability:?}: {} enqueues and {} dequeues acknowledged, {} enqueues and \
         {} dequeued items refused; prepared commits: {} acknowledged, {} refused",
        engine.name,
        outcomes.acknowledged.len(),
        outcomes.consumed.len(),
        outcomes.refused.len(),
        outcomes.given_back.len(),
        outcomes.prepared[0],
        outcomes.prepared[1],
    );
    assert_closed(q.blocking_count(), "count");
    drop((q, store));
    let Some(store) = at.reopen() else {
        return;
    };

    let q = store.blocking_queue::<u64>("q").unwrap();
    let remaining = drain(&store, &q);
    let mut acknowledged = outcomes.acknowledged.clone();
    acknowledged.extend(0..PREFILL);
    let mut attempted = acknowledged.clone();
    attempted.extend(&outcomes.refused);
    let verdict = TotalQueue::check(&attempted, &acknowledged, &outcomes.consumed, &remaining);
    assert!(
        verdict.is_valid(),
        "{} {durability:?}: {verdict:?}",
        engine.name
    );
    assert_eq!(verdict.ok, acknowledged.len());
    let remaining: BTreeSet<u64> = remaining.into_iter().collect();
    let consumed: BTreeSet<u64> = outcomes.consumed.iter().copied().collect();
    let present: Vec<&u64> = outcomes
        .refused
        .iter()
        .filter(|id| remaining.contains(id) || consumed.contains(id))
        .collect();
    assert!(present.is_empty(), "refused enqueues on disk: {present:?}");
    let lost: Vec<&u64> = outcomes
        .given_back
        .iter()
        .filter(|id| !remaining.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "items of refused dequeues missing: {lost:?}"
    );
}

fn commits_racing_a_close_are_kept_iff_acknowledged_sync(engine: &'static Engine) {
    commits_racing_a_close(engine, Durability::Sync);
}

fn commits_racing_a_close_are_kept_iff_acknowledged_buffered(engine: &'static Engine) {
    commits_racing_a_close(engine, Durability::Buffered);
}

// ---- blocking forms inside a runtime ----

/// Every blocking form, called on a runtime's thread: none panics, each does its work, and
/// the store closes; where the data outlives the store the work is there after a reopen.
fn blocking_forms_work(engine: &'static Engine) {
    let at = engine.store();
    let store = at.store.clone();
    let q = store.blocking_queue::<u32>("q").expect("blocking_queue");
    commit_items(&store, &q, &[1, 2, 3]);
    assert_eq!(q.blocking_count().expect("blocking_count"), 3);
    let mut tx = store.begin();
    assert_eq!(
        q.blocking_try_dequeue(&mut tx)
            .expect("blocking_try_dequeue"),
        Some(1)
    );
    assert_eq!(
        q.blocking_dequeue_timeout(&mut tx, Duration::from_millis(1))
            .expect("blocking_dequeue_timeout"),
        Some(2)
    );
    tx.blocking_commit().expect("blocking_commit");
    let mut tx = store.begin();
    assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(3));
    tx.blocking_abort().expect("blocking_abort");
    store.blocking_unfence("q").expect("blocking_unfence");
    store.blocking_flush().expect("blocking_flush");
    assert_eq!(q.blocking_count().unwrap(), 1);
    store.clone().blocking_close().expect("blocking_close");
    assert_closed(q.blocking_count(), "blocking_count");
    if let Some(store) = at.reopen() {
        let q = store.blocking_queue::<u32>("q").unwrap();
        assert_eq!(drain(&store, &q), [3]);
    }
}

/// In the body of a `#[tokio::test]` (a current-thread runtime's `block_on`).
fn blocking_forms_work_inside_a_tokio_test_body(engine: &'static Engine) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { blocking_forms_work(engine) });
}

/// In a task on a worker of a multi-thread runtime.
fn blocking_forms_work_on_a_multi_thread_runtime_worker(engine: &'static Engine) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let task = runtime.spawn(async move { blocking_forms_work(engine) });
    runtime.block_on(task).expect("the task");
}

/// In a task of a current-thread runtime.
fn blocking_forms_work_on_a_current_thread_runtime(engine: &'static Engine) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let task = runtime.spawn(async move { blocking_forms_work(engine) });
    runtime.block_on(task).expect("the task");
}

/// How many blocking calls one poll of a task makes below: past tokio's cooperative budget
/// (128 units a poll), which comes back only when the task yields.
const CALLS_IN_ONE_POLL: u32 = 300;

/// The blocking forms keep working in a runtime's task however many of them one poll makes:
/// one whose future takes part in tokio's cooperative budget must not wait for a budget that
/// only comes back when the task yields, which it cannot while blocked. Each call reports, so
/// that a call that never returns fails the test after [`LIMIT`] (its thread is left behind).
fn blocking_forms_work_after_the_tasks_budget_is_spent(engine: &'static Engine) {
    let at = engine.store();
    let q = at.store.blocking_queue::<u32>("q").unwrap();
    commit_items(&at.store, &q, &[1]);
    let (done_tx, done) = mpsc::channel();
    {
        let q = q.clone();
        thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                for call in 0..CALLS_IN_ONE_POLL {
                    let count = q.blocking_count();
                    if done_tx.send((call, count)).is_err() {
                        return;
                    }
                }
            });
        });
    }
    for call in 0..CALLS_IN_ONE_POLL {
        let (reported, count) = done.recv_timeout(LIMIT).unwrap_or_else(|_| {
            panic!(
                "{}: blocking_count call {call} of one poll of a task did not return in \
                 {LIMIT:?} (its future waits for the task's cooperative budget)",
                engine.name
            )
        });
        assert_eq!((reported, count.expect("count")), (call, 1));
    }
}

// ---- timeouts ----

fn blocking_dequeue_timeout_of_duration_max_waits_for_an_item(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = at.store.clone();
        let q = store.blocking_queue::<u32>("q").unwrap();
        let (done_tx, done) = mpsc::channel();
        {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let got = q.blocking_dequeue_timeout(&mut tx, Duration::MAX);
                let committed = tx.blocking_commit();
                let _ = done_tx.send((got, committed));
            });
        }
        wait_until("the consumer to wait", || q.waiters() == 1);
        commit_items(&store, &q, &[42]);
        let (got, committed) = done
            .recv_timeout(LIMIT)
            .expect("the consumer returned (and did not panic)");
        assert_eq!(
            got.expect("blocking_dequeue_timeout"),
            Some(42),
            "{}",
            engine.name
        );
        committed.expect("commit the dequeue");
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
    }
}

// ---- enqueue by reference ----

fn an_item_refused_by_the_transaction_limit_stays_with_the_caller(engine: &'static Engine) {
    {
        // Three items of 42 encoded bytes fit (each counts its bookkeeping too), four do not.
        let at = engine.store_with(|b| b.max_item_size(60).max_transaction_size(300));
        let store = at.store.clone();
        let q = store.blocking_queue::<String>("q").unwrap();
        let items: Vec<String> = ["a", "b", "c", "d"].map(|c| c.repeat(40)).to_vec();
        let mut tx = store.begin();
        for item in &items[..3] {
            q.enqueue(&mut tx, item).expect("fits the transaction");
        }
        let refused = items[3].clone();
        match q.enqueue(&mut tx, &refused) {
            Err(Error::TransactionTooLarge { size, limit }) => {
                assert_eq!(limit, 300);
                assert!(size > limit, "{size}");
            }
            other => panic!("expected TransactionTooLarge, got {other:?}"),
        }
        // The caller still has the item, unchanged; the transaction kept the rest.
        assert_eq!(refused, items[3]);
        assert_eq!(tx.enqueued(), 3);
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, &refused)
            .expect("the item fits a new transaction");
        tx.blocking_commit().unwrap();
        assert_eq!(refused, items[3]);
        assert_eq!(drain(&store, &q), items, "{}", engine.name);
    }
}

// ---- queue names ----

fn empty_and_over_long_queue_names_are_invalid(engine: &'static Engine) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    {
        let at = engine.store();
        let store = at.store.clone();
        let longest = "n".repeat(1024);
        let too_long = "n".repeat(1025);
        // 513 two-byte characters: 1026 bytes, though only 513 characters.
        let wide = "é".repeat(513);
        for (name, reported) in [
            ("", String::new()),
            (too_long.as_str(), "n".repeat(64)),
            (wide.as_str(), "é".repeat(64)),
        ] {
            for result in [
                store.blocking_queue::<u32>(name).map(drop),
                runtime.block_on(store.queue::<u32>(name)).map(drop),
            ] {
                match result {
                    Err(Error::InvalidQueueName { name: got, .. }) => {
                        assert_eq!(got, reported, "a name of {} bytes", name.len());
                    }
                    other => panic!(
                        "a name of {} bytes: expected InvalidQueueName, got {other:?}",
                        name.len()
                    ),
                }
            }
        }
        let q = store
            .blocking_queue::<u32>(&longest)
            .expect("a name of exactly 1024 bytes");
        commit_items(&store, &q, &[7]);
        assert_eq!(store.queue_names(), [longest.as_str()], "{}", engine.name);
        drop(q);
        store.blocking_close().unwrap();
        if let Some(store) = at.reopen() {
            match engine.name {
                // `queue_names` on PostgreSQL: the queues opened through this handle, none
                // yet (its documentation); the database lists them.
                "postgres" | "redis" => {
                    assert!(store.queue_names().is_empty());
                    assert_eq!(store.blocking_list_queues().unwrap(), [longest.as_str()]);
                }
                _ => assert_eq!(store.queue_names(), [longest.as_str()]),
            }
            let q = store.blocking_queue::<u32>(&longest).unwrap();
            assert_eq!(drain(&store, &q), [7]);
        }
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(close_on_one_clone_makes_every_call_on_the_others_fail_with_closed),
        engine_case!(async async_forms_fail_with_closed),
        engine_case!(a_second_close_returns_closed),
        engine_case!(waiting_consumers_are_woken_with_closed_by_a_close_from_another_thread),
        engine_case!(reopen_right_after_close_finds_every_acknowledged_commit_sync),
        engine_case!(reopen_right_after_close_finds_every_acknowledged_commit_buffered),
        engine_case!(commits_racing_a_close_are_kept_iff_acknowledged_sync),
        engine_case!(commits_racing_a_close_are_kept_iff_acknowledged_buffered),
        engine_case!(blocking_forms_work_inside_a_tokio_test_body),
        engine_case!(blocking_forms_work_on_a_multi_thread_runtime_worker),
        engine_case!(blocking_forms_work_on_a_current_thread_runtime),
        engine_case!(blocking_forms_work_after_the_tasks_budget_is_spent),
        engine_case!(blocking_dequeue_timeout_of_duration_max_waits_for_an_item),
        engine_case!(an_item_refused_by_the_transaction_limit_stays_with_the_caller),
        engine_case!(empty_and_over_long_queue_names_are_invalid),
    ]
}
