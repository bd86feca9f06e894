//! A `Dequeue` future that is never polled again (leaked with `std::mem::forget`, or kept and
//! not polled) cannot keep a committed item from every other consumer: the item handed to it
//! is taken by the second *miss* after the hand-over (a dequeue attempt on the queue that
//! finds nothing to take), and the request loses its place in line; and whatever happens, the
//! item goes back when the leaked future's transaction is used again or ends. Nothing is lost or given
//! twice. Each scenario runs on an in-memory and an on-disk store.
//!
//! Every step is ordered by events (commits returning, `waiters()` counts, tasks and threads
//! finishing), never by time.

mod common;

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use common::drain;
use reliable_queue::{Store, Transaction};

use common::scenarios::{
    spawn_blocking_waiter, spawn_waiter, until_waiters, until_waiters_blocking, Fixture, Kind,
    Queue, SCENARIO_LIMIT,
};

on_both_stores_async!(
    leaked_dequeue_loses_its_item_to_the_second_miss,
    leaked_dequeue_does_not_hold_up_later_waiters,
    unpolled_dequeue_waits_again_at_its_place,
);

on_both_stores!(
    blocking_consumer_takes_the_item_of_a_leaked_dequeue,
    every_leaked_dequeue_is_reclaimed_within_n_plus_one_misses,
    leaked_dequeue_handed_an_item_later_loses_it_too,
    leaked_dequeue_gives_its_item_back_when_its_transaction_ends,
    leaked_dequeue_gives_its_item_back_when_its_transaction_is_used_again,
);

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Starts a `dequeue` on `tx` (it finds nothing and joins the line), then leaks the future
/// with `std::mem::forget`: its request is never polled nor dropped again.
fn leak_waiting_dequeue(q: &Queue, tx: &mut Transaction) {
    let mut dequeue = q.dequeue(tx);
    assert!(
        poll_once(&mut dequeue).is_pending(),
        "the queue is empty: the dequeue waits"
    );
    std::mem::forget(dequeue);
}

/// [`leak_waiting_dequeue`] polled from a task, with the task's waker.
async fn leak_waiting_dequeue_in_task(q: &Queue, tx: &mut Transaction) {
    let mut dequeue = q.dequeue(tx);
    let first = poll_fn(|cx| Poll::Ready(Pin::new(&mut dequeue).poll(cx))).await;
    assert!(first.is_pending(), "the queue is empty: the dequeue waits");
    std::mem::forget(dequeue);
}

/// Asserts that `seen` holds each of `expected` exactly once, and nothing else.
fn assert_exactly_once(expected: &[u64], seen: impl IntoIterator<Item = u64>) {
    let mut seen: Vec<u64> = seen.into_iter().collect();
    seen.sort_unstable();
    let mut expected = expected.to_vec();
    expected.sort_unstable();
    assert_eq!(seen, expected, "every item exactly once, nothing else");
}

/// On disk: the item left with a leaked request was never consumed, so a reopened store has
/// it (in memory there is nothing to reopen). Closes the fixture's store.
fn check_after_reopen(f: Fixture, expected: &[u64]) {
    let Fixture {
        store,
        q,
        path,
        _dir,
        ..
    } = f;
    drop(q);
    store.blocking_close().expect("close");
    let Some(path) = path else { return };
    let store = Store::open(&path).expect("reopen the store");
    let q = store.blocking_queue::<u64>("jobs").expect("open the queue");
    assert_exactly_once(expected, drain(&store, &q));
    store.blocking_close().expect("close the reopened store");
}

/// A leaked `dequeue` is handed the next committed item. A single `try_dequeue` then finds
/// nothing (a miss that could be racing a waiter's wake-up), the second takes the item. The
/// leaked request is out of the line afterwards: the next item is visible to everyone.
async fn leaked_dequeue_loses_its_item_to_the_second_miss(kind: Kind) {
    let f = Fixture::new(kind);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue_in_task(&f.q, &mut leaked_tx).await;
    assert_eq!(f.state(), (0, 1), "the leaked request waits in line");

    f.commit_async(&[1]).await;
    assert_eq!(f.state(), (0, 0), "handed to the leaked request");

    let mut tx = f.store.begin();
    assert_eq!(f.q.try_dequeue(&mut tx).await.expect("try_dequeue"), None);
    assert_eq!(
        f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
        Some(1)
    );
    tx.commit().await.expect("commit the dequeue");

    f.commit_async(&[2]).await;
    assert_eq!(f.state(), (1, 0), "the leaked request lost its place");
    assert_eq!(drain(&f.store, &f.q), [2]);
    assert_eq!(leaked_tx.dequeued(), 0, "the leaked request took nothing");
    leaked_tx
        .commit()
        .await
        .expect("commit the empty transaction");
    assert_eq!(f.state(), (0, 0));
    check_after_reopen(f, &[]);
}

/// A leaked `dequeue` first in line takes the next item out of circulation, but not the
/// items after it: a waiter behind it is served next. The item it holds goes to the consumer
/// of the second miss after the hand-over, here a `dequeue` that finds nothing.
async fn leaked_dequeue_does_not_hold_up_later_waiters(kind: Kind) {
    let f = Fixture::new(kind);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue_in_task(&f.q, &mut leaked_tx).await;
    let behind = spawn_waiter(&f);
    until_waiters(&f.q, 2).await;

    f.commit_async(&[1]).await;
    assert_eq!(
        f.state(),
        (0, 1),
        "1 handed to the leaked request, first in line"
    );
    f.commit_async(&[2]).await;
    assert_eq!(behind.await.expect("waiter task"), 2);

    // First miss since the hand-over: this consumer waits.
    let first = spawn_waiter(&f);
    until_waiters(&f.q, 1).await;
    // Second miss: this consumer takes the item at once.
    let second = spawn_waiter(&f);
    assert_eq!(second.await.expect("waiter task"), 1);
    assert_eq!(f.state(), (0, 1));

    f.commit_async(&[3]).await;
    assert_eq!(first.await.expect("waiter task"), 3);
    assert_eq!(f.state(), (0, 0));
    assert!(drain(&f.store, &f.q).is_empty());
    drop(leaked_tx);
    check_after_reopen(f, &[]);
}

/// A `dequeue` that is kept but not polled loses the item handed to it to the second miss;
/// polled again, it waits at the place it had, ahead of a waiter that came after it, and is
/// served first.
async fn unpolled_dequeue_waits_again_at_its_place(kind: Kind) {
    let f = Fixture::new(kind);
    let mut slow_tx = f.store.begin();
    {
        let mut slow = pin!(f.q.dequeue(&mut slow_tx));
        assert!(poll_once(&mut slow).is_pending());
        let behind = spawn_waiter(&f);
        until_waiters(&f.q, 2).await;

        f.commit_async(&[1]).await;
        let mut tx = f.store.begin();
        assert_eq!(f.q.try_dequeue(&mut tx).await.expect("try_dequeue"), None);
        assert_eq!(
            f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
            Some(1)
        );
        tx.commit().await.expect("commit the dequeue");

        // Polled at last: nothing for it, so it waits again, first in line.
        assert!(poll_once(&mut slow).is_pending());
        assert_eq!(f.state(), (0, 2));
        f.commit_async(&[2]).await;
        assert!(matches!(poll_once(&mut slow), Poll::Ready(Ok(2))));
        f.commit_async(&[3]).await;
        assert_eq!(behind.await.expect("waiter task"), 3);
    }
    slow_tx.commit().await.expect("commit the dequeue");
    assert_eq!(f.state(), (0, 0));
    check_after_reopen(f, &[]);
}

/// Threads: a leaked `dequeue` holds item 1; a `blocking_dequeue` that finds nothing waits
/// (first miss), a `blocking_dequeue_timeout` on another thread takes 1 at once (second miss),
/// and the waiting thread gets the next item.
fn blocking_consumer_takes_the_item_of_a_leaked_dequeue(kind: Kind) {
    let f = Fixture::new(kind);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    f.commit(&[1]);
    assert_eq!(f.state(), (0, 0), "handed to the leaked request");

    let waiting = spawn_blocking_waiter(&f);
    until_waiters_blocking(&f.q, 1);
    let taker = {
        let (store, q) = (f.store.clone(), f.q.clone());
        std::thread::spawn(move || {
            let mut tx = store.begin();
            // The patience only bounds a failure; the item is there at the first look.
            let item = q
                .blocking_dequeue_timeout(&mut tx, SCENARIO_LIMIT)
                .expect("blocking_dequeue_timeout");
            tx.blocking_commit().expect("commit the dequeue");
            item
        })
    };
    assert_eq!(taker.join().expect("taker thread"), Some(1));
    assert_eq!(f.state(), (0, 1));

    f.commit(&[2]);
    assert_eq!(waiting.join().expect("waiting thread"), 2);
    assert_eq!(f.state(), (0, 0));
    assert!(drain(&f.store, &f.q).is_empty());
    leaked_tx
        .blocking_abort()
        .expect("abort the empty transaction");
    check_after_reopen(f, &[]);
}

/// `n` leaked `dequeue`s are handed one item each by one commit; the next `n + 1` misses take
/// all of them back, oldest hand-over first: the first miss finds nothing, each later one
/// takes one item.
fn every_leaked_dequeue_is_reclaimed_within_n_plus_one_misses(kind: Kind) {
    const N: u64 = 4;
    let f = Fixture::new(kind);
    let mut leaked: Vec<Transaction> = (0..N).map(|_| f.store.begin()).collect();
    for tx in &mut leaked {
        leak_waiting_dequeue(&f.q, tx);
    }
    assert_eq!(f.state(), (0, N as usize));
    let items: Vec<u64> = (1..=N).collect();
    f.commit(&items);
    assert_eq!(f.state(), (0, 0), "one item handed to each leaked request");

    // Only the miss count decides: each try runs in its own transaction, the ones that took
    // an item commit.
    let mut taken = Vec::new();
    for miss in 0..=N {
        let mut tx = f.store.begin();
        let got = f.q.blocking_try_dequeue(&mut tx).expect("try_dequeue");
        assert_eq!(got, (miss > 0).then_some(miss), "miss {}", miss + 1);
        tx.blocking_commit().expect("commit");
        taken.extend(got);
    }
    assert_exactly_once(&items, taken);

    f.commit(&[10]);
    assert_eq!(f.state(), (1, 0), "no leaked request is in line any more");
    assert_eq!(drain(&f.store, &f.q), [10]);
    drop(leaked);
    check_after_reopen(f, &[]);
}

/// A request leaked while it waits is handed an item only later; it loses it the same way.
/// On disk, an item still reserved for a leaked request when the store closes is in the
/// queue after reopening.
fn leaked_dequeue_handed_an_item_later_loses_it_too(kind: Kind) {
    let f = Fixture::new(kind);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    // Misses while nothing is reserved count for nothing.
    for _ in 0..3 {
        let mut tx = f.store.begin();
        assert_eq!(
            f.q.blocking_try_dequeue(&mut tx).expect("try_dequeue"),
            None
        );
        tx.blocking_abort().expect("abort");
    }
    f.commit(&[1, 2]);
    assert_eq!(
        f.state(),
        (1, 0),
        "1 handed to the leaked request, 2 visible"
    );
    let mut tx = f.store.begin();
    assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
    assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), None);
    assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
    // Aborted: both come back, visible to everyone, first 2 then 1 (the order taken).
    tx.blocking_abort().expect("abort");
    assert_eq!(f.state(), (2, 0));

    // Another leaked request, handed 2 (the front) and never polled; the store closes.
    let mut leaked_again = f.store.begin();
    let mut tx = f.store.begin();
    assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
    assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
    leak_waiting_dequeue(&f.q, &mut leaked_again);
    tx.blocking_abort().expect("abort");
    assert_eq!(
        f.state(),
        (1, 0),
        "2 handed to the new leaked request, 1 visible"
    );
    // The leaked requests' transactions stay alive (and unused) to the end: only misses
    // can reclaim.
    if kind == Kind::Memory {
        // Nothing to reopen. A drain takes 1, misses once (and commits), then its second
        // miss takes 2.
        let mut tx = f.store.begin();
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), None);
        tx.blocking_commit().expect("commit");
        assert_eq!(drain(&f.store, &f.q), [2]);
        check_after_reopen(f, &[]);
    } else {
        check_after_reopen(f, &[1, 2]);
    }
    drop((leaked_tx, leaked_again));
}

/// The leaked request is first in line and every other consumer is asleep in line behind it,
/// so nobody misses: the item handed to the leaked request goes to the next waiter as soon as
/// the leaked request's transaction ends (dropped here), without any other dequeue attempt.
fn leaked_dequeue_gives_its_item_back_when_its_transaction_ends(kind: Kind) {
    let (f, leaked_tx, waiter) = item_handed_to_a_leaked_request_first_in_line(kind);
    drop(leaked_tx);
    assert_eq!(
        waiter.join().expect("the waiter"),
        1,
        "the waiter got the item"
    );
    assert_eq!(f.state(), (0, 0));
    check_after_reopen(f, &[]);
}

/// As above, the transaction used again instead of dropped: any use of it (here an enqueue)
/// withdraws the leaked request first.
fn leaked_dequeue_gives_its_item_back_when_its_transaction_is_used_again(kind: Kind) {
    let (f, mut leaked_tx, waiter) = item_handed_to_a_leaked_request_first_in_line(kind);
    f.q.enqueue(&mut leaked_tx, 2).expect("enqueue");
    assert_eq!(
        waiter.join().expect("the waiter"),
        1,
        "the waiter got the item"
    );
    leaked_tx.blocking_commit().expect("commit");
    assert_eq!(f.state(), (1, 0));
    check_after_reopen(f, &[2]);
}

/// A leaked request first in line with its transaction, a blocking waiter asleep behind it,
/// and item 1 committed and handed to the leaked request.
fn item_handed_to_a_leaked_request_first_in_line(
    kind: Kind,
) -> (Fixture, Transaction, std::thread::JoinHandle<u64>) {
    let f = Fixture::new(kind);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    let waiter = spawn_blocking_waiter(&f);
    until_waiters_blocking(&f.q, 2);
    f.commit(&[1]);
    assert_eq!(
        f.state(),
        (0, 1),
        "handed to the leaked request, the waiter still waits"
    );
    (f, leaked_tx, waiter)
}
