//! tokio's cooperative budget: the futures that are ready at once on the embedded engines
//! (`try_dequeue`, `count`, the in-memory `commit`, `abort`, a `Dequeue` with an item ready)
//! take part in it, so a consumer loop on a `current_thread` runtime cannot starve the other
//! tasks; outside a runtime they cost nothing and stay ready on the first poll.
//!
//! Every loop is bounded by an iteration count, never by time: without the budget the other
//! task never runs and the loop reaches its bound.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use reliable_queue::{ReliableConcurrentQueue, Store};

/// Items put in the queue before a draining loop.
const PREFILL: u64 = 200_000;

/// Bound on the endless loops: far more than the budget (128 units per poll) allows.
const ENDLESS_BOUND: u64 = 2_000_000;

fn prefilled() -> (Store, ReliableConcurrentQueue<u64>) {
    let store = Store::in_memory().expect("open");
    let q = store.blocking_queue::<u64>("q").expect("queue");
    for chunk in 0..PREFILL / 1000 {
        let mut tx = store.begin();
        for i in 0..1000 {
            q.enqueue(&mut tx, chunk * 1000 + i).expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
    }
    assert_eq!(q.blocking_count().unwrap(), PREFILL);
    (store, q)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

/// A task that sets the returned flag after yielding once.
fn yielder() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        set.store(true, Ordering::SeqCst);
    });
    flag
}

/// A task that waits for a wake-up sent from another thread once `progress` reaches 1,000,
/// then sets the returned flag. The wake-up arrives while the loop that counts `progress` is
/// running, so the task runs only if that loop gives the runtime back its turn.
fn woken_from_outside(progress: Arc<AtomicU64>) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let (wake, woken) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        if woken.await.is_ok() {
            set.store(true, Ordering::SeqCst);
        }
    });
    std::thread::spawn(move || {
        // Waits on the loop's own counter; `u64::MAX` means the loop ended.
        while progress.load(Ordering::SeqCst) < 1_000 {
            std::thread::yield_now();
        }
        // The receiving task may be gone (the loop ended); nothing to do then.
        let _ = wake.send(());
    });
    flag
}

#[test]
fn a_try_dequeue_commit_loop_lets_other_tasks_run() {
    let (store, q) = prefilled();
    runtime().block_on(async move {
        let flag = yielder();
        let consumer = tokio::spawn(async move {
            let mut seen_at = None;
            let mut taken = 0u64;
            loop {
                if seen_at.is_none() && flag.load(Ordering::SeqCst) {
                    seen_at = Some(taken);
                }
                let mut tx = store.begin();
                let item = q.try_dequeue(&mut tx).await.expect("try_dequeue");
                tx.commit().await.expect("commit");
                match item {
                    Some(_) => taken += 1,
                    None => break,
                }
            }
            (seen_at, taken)
        });
        let (seen_at, taken) = consumer.await.expect("consumer");
        assert_eq!(taken, PREFILL);
        let seen_at = seen_at.expect("the other task never ran while the loop drained the queue");
        assert!(seen_at < PREFILL, "{seen_at}");
    });
}

#[test]
fn a_dequeue_commit_loop_lets_other_tasks_run() {
    let (store, q) = prefilled();
    runtime().block_on(async move {
        let flag = yielder();
        let consumer = tokio::spawn(async move {
            for taken in 0..PREFILL {
                if flag.load(Ordering::SeqCst) {
                    return Some(taken);
                }
                let mut tx = store.begin();
                q.dequeue(&mut tx).await.expect("dequeue");
                tx.commit().await.expect("commit");
            }
            None
        });
        let seen_at = consumer.await.expect("consumer");
        assert!(
            seen_at.is_some(),
            "the other task never ran while the loop drained the queue"
        );
    });
}

/// Marks the loop ended (also when it panics), so the waking thread never waits forever.
struct Ended(Arc<AtomicU64>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(u64::MAX, Ordering::SeqCst);
    }
}

#[test]
fn an_endless_enqueue_dequeue_loop_lets_a_task_woken_from_outside_run() {
    let store = Store::in_memory().expect("open");
    runtime().block_on(async move {
        let q = store.queue::<u64>("q").await.expect("queue");
        let progress = Arc::new(AtomicU64::new(0));
        let flag = woken_from_outside(progress.clone());
        let consumer = tokio::spawn(async move {
            let _ended = Ended(progress.clone());
            for i in 0..ENDLESS_BOUND {
                progress.store(i, Ordering::SeqCst);
                if flag.load(Ordering::SeqCst) {
                    return Some(i);
                }
                let mut tx = store.begin();
                q.enqueue(&mut tx, i).expect("enqueue");
                tx.commit().await.expect("commit");
                let mut tx = store.begin();
                assert_eq!(q.try_dequeue(&mut tx).await.expect("try_dequeue"), Some(i));
                tx.commit().await.expect("commit");
            }
            None
        });
        let ran_at = consumer.await.expect("consumer");
        assert!(
            ran_at.is_some_and(|i| i >= 1_000),
            "the task woken from outside never ran in {ENDLESS_BOUND} iterations ({ran_at:?})"
        );
    });
}

#[test]
fn count_and_abort_loops_let_other_tasks_run() {
    let (store, q) = prefilled();
    runtime().block_on(async move {
        let flag = yielder();
        let counter = {
            let q = q.clone();
            tokio::spawn(async move {
                for i in 0..ENDLESS_BOUND {
                    if flag.load(Ordering::SeqCst) {
                        return Some(i);
                    }
                    assert_eq!(q.count().await.expect("count"), PREFILL);
                }
                None
            })
        };
        assert!(counter.await.expect("counter").is_some(), "count loop");

        let flag = yielder();
        let aborter = tokio::spawn(async move {
            for i in 0..ENDLESS_BOUND {
                if flag.load(Ordering::SeqCst) {
                    return Some(i);
                }
                let mut tx = store.begin();
                assert!(q.try_dequeue(&mut tx).await.expect("try_dequeue").is_some());
                tx.abort().await.expect("abort");
            }
            None
        });
        assert!(aborter.await.expect("aborter").is_some(), "abort loop");
    });
}

/// Spends the current task's whole budget, inside a poll.
fn spend_budget(cx: &mut Context<'_>) {
    while let Poll::Ready(restore) = tokio::task::coop::poll_proceed(cx) {
        restore.made_progress();
    }
}

#[test]
fn a_future_refused_by_the_budget_takes_nothing() {
    let (store, q) = prefilled();
    runtime().block_on(async {
        let mut tx = store.begin();
        let pending = std::future::poll_fn(|cx| {
            spend_budget(cx);
            let dequeue = pin!(q.dequeue(&mut tx)).poll(cx).is_pending();
            let try_dequeue = pin!(q.try_dequeue(&mut tx)).poll(cx).is_pending();
            let count = pin!(q.count()).poll(cx).is_pending();
            Poll::Ready((dequeue, try_dequeue, count))
        })
        .await;
        assert_eq!(pending, (true, true, true));
        // The futures were dropped while pending: nothing was taken, nothing is in line.
        assert_eq!(tx.dequeued(), 0);
        assert_eq!((q.count().await.unwrap(), q.waiters()), (PREFILL, 0));

        // With a fresh budget the same calls complete.
        assert_eq!(q.dequeue(&mut tx).await.unwrap(), 0);
        assert_eq!(q.try_dequeue(&mut tx).await.unwrap(), Some(1));
        tx.commit().await.unwrap();
        assert_eq!(q.count().await.unwrap(), PREFILL - 2);
    });
}

#[test]
fn a_commit_polled_once_is_applied_even_when_the_budget_makes_it_wait() {
    let store = Store::in_memory().expect("open");
    runtime().block_on(async {
        let q = store.queue::<u64>("q").await.unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 7).unwrap();
        let mut tx = Some(tx);
        let (pending, commit) = std::future::poll_fn(|cx| {
            spend_budget(cx);
            let mut commit = Box::pin(tx.take().expect("polled once").commit());
            let first = commit.as_mut().poll(cx);
            Poll::Ready((first.is_pending(), commit))
        })
        .await;
        assert!(pending, "a spent budget makes the commit yield once");
        // As documented: once polled, the commit is applied.
        assert_eq!(q.count().await.unwrap(), 1);
        commit.await.expect("commit");
    });
}

#[test]
fn outside_a_runtime_the_futures_are_ready_on_the_first_poll() {
    let (store, q) = prefilled();
    let mut cx = Context::from_waker(Waker::noop());
    for i in 0..1_000u64 {
        let mut tx = store.begin();
        let Poll::Ready(item) = pin!(q.try_dequeue(&mut tx)).poll(&mut cx) else {
            panic!("try_dequeue pending outside a runtime");
        };
        assert_eq!(item.unwrap(), Some(2 * i));
        let Poll::Ready(item) = pin!(q.dequeue(&mut tx)).poll(&mut cx) else {
            panic!("dequeue pending outside a runtime");
        };
        assert_eq!(item.unwrap(), 2 * i + 1);
        let Poll::Ready(count) = pin!(q.count()).poll(&mut cx) else {
            panic!("count pending outside a runtime");
        };
        assert_eq!(count.unwrap(), PREFILL - 2 * i - 2);
        let Poll::Ready(done) = pin!(tx.commit()).poll(&mut cx) else {
            panic!("commit pending outside a runtime");
        };
        done.unwrap();
    }
    let tx = store.begin();
    let Poll::Ready(done) = pin!(tx.abort()).poll(&mut cx) else {
        panic!("abort pending outside a runtime");
    };
    done.unwrap();
}
