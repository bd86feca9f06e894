//! A `Dequeue` future that is never polled again (leaked with `std::mem::forget`, or kept and
//! not polled) cannot keep a committed item from every other consumer: the item handed to it
//! is taken by the second *miss* after the hand-over (a dequeue attempt on the queue that
//! finds nothing to take), and the request loses its place in line; and whatever happens, the
//! item goes back when the leaked future's transaction is used again or ends. Nothing is lost or given
//! twice. Each scenario runs on every engine of the conformance suite (`tests/common/engines.rs`).
//!
//! Where the engines differ, by the contract: the hand-over and the misses are the embedded
//! engines' staging (DESIGN.md section 3). On PostgreSQL a commit hands a waiter its *turn*,
//! not the item: the item stays visible (counted) and the woken waiter is the one to look
//! for it; until it has, this process's other takes miss, and the second miss takes the turn
//! (ARCHITECTURE.md, "Waiting dequeue"). So the same misses reclaim a leaked request's turn,
//! and what differs is the count (the item is visible) and which of two items a consumer
//! gets (the oldest visible one). A waiter is counted in `waiters()` on PostgreSQL once its
//! first look found nothing (that look runs in a task of the store, so a leaked request is
//! counted a moment after it is leaked: the scenarios wait for it), and not while it has a
//! turn (handed its turn, like a request handed an item on the embedded engines, or
//! looking).
//!
//! Every step is ordered by events (commits returning, `waiters()` counts, tasks and threads
//! finishing), never by time.

use crate::common;
use crate::engine_case;

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use common::engines::{wait_until, Engine};
use common::{drain, drain_async};
use reliable_queue::Transaction;

use common::scenarios::{
    spawn_blocking_waiter, spawn_waiter, until_waiters, until_waiters_blocking, Fixture, Queue,
    SCENARIO_LIMIT,
};

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

/// Where the data outlives the store (sled, PostgreSQL): the item left with a leaked request
/// was never consumed, so a reopened store has it (in memory there is nothing to reopen).
/// Closes the fixture's store.
fn check_after_reopen(f: Fixture, expected: &[u64]) {
    let Fixture { store, q, at } = f;
    drop(q);
    store.blocking_close().expect("close");
    let Some(store) = at.reopen() else { return };
    let q = store.blocking_queue::<u64>("jobs").expect("open the queue");
    assert_exactly_once(expected, drain(&store, &q));
    store.blocking_close().expect("close the reopened store");
}

/// [`check_after_reopen`] from async code: on a thread of the blocking pool.
async fn check_after_reopen_async(f: Fixture, expected: &'static [u64]) {
    tokio::task::spawn_blocking(move || check_after_reopen(f, expected))
        .await
        .expect("the check after reopening");
}

/// A leaked `dequeue` is handed the next committed item. A single `try_dequeue` then finds
/// nothing (a miss that could be racing a waiter's wake-up), the second takes the item. The
/// leaked request is out of the line afterwards: the next item is visible to everyone.
async fn leaked_dequeue_loses_its_item_to_the_second_miss(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue_in_task(&f.q, &mut leaked_tx).await;
    until_waiters(&f.q, 1).await;
    assert_eq!(
        f.state_async().await,
        (0, 1),
        "the leaked request waits in line"
    );

    f.commit_async(&[1]).await;
    let expected = match engine.name {
        "postgres" | "redis" => ((1, 0), "visible, the turn handed to the leaked request"),
        _ => ((0, 0), "handed to the leaked request"),
    };
    assert_eq!(f.state_async().await, expected.0, "{}", expected.1);
    let mut tx = f.store.begin();
    assert_eq!(
        f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
        None,
        "first miss"
    );
    assert_eq!(
        f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
        Some(1),
        "second miss"
    );
    tx.commit().await.expect("commit the dequeue");

    f.commit_async(&[2]).await;
    assert_eq!(
        f.state_async().await,
        (1, 0),
        "the leaked request holds nothing, and lost its place"
    );
    assert_eq!(drain_async(&f.store, &f.q).await, [2]);
    assert_eq!(leaked_tx.dequeued(), 0, "the leaked request took nothing");
    leaked_tx
        .commit()
        .await
        .expect("commit the empty transaction");
    assert_eq!(f.q.count().await.unwrap(), 0);
    check_after_reopen_async(f, &[]).await;
}

/// A leaked `dequeue` first in line takes the next item out of circulation, but not the
/// items after it: a waiter behind it is served next. The item it holds goes to the consumer
/// of the second miss after the hand-over, here a `dequeue` that finds nothing.
async fn leaked_dequeue_does_not_hold_up_later_waiters(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let pg = usize::from(engine.on_server());
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue_in_task(&f.q, &mut leaked_tx).await;
    until_waiters(&f.q, 1).await;
    let behind = spawn_waiter(&f);
    until_waiters(&f.q, 2).await;

    f.commit_async(&[1]).await;
    assert_eq!(
        f.state_async().await,
        (pg as u64, 1),
        "1 (on PostgreSQL its turn) handed to the leaked request, first in line"
    );
    f.commit_async(&[2]).await;
    if pg == 1 {
        // The commit hands its turn to the waiter behind, which waits for the leaked request
        // ahead of it (a miss); a new consumer's look is the second miss, which takes the
        // leaked request's turn. The two take 1 and 2 in whichever order they look.
        let first = spawn_waiter(&f);
        let mut got = [
            first.await.expect("waiter task"),
            behind.await.expect("waiter task"),
        ];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        assert_eq!(f.state_async().await, (0, 0));
        drop(leaked_tx);
        check_after_reopen_async(f, &[]).await;
        return;
    }
    // The waiter behind is served.
    let (behind_gets, second_gets) = (2, 1);
    assert_eq!(behind.await.expect("waiter task"), behind_gets);

    // First miss since the hand-over: this consumer waits.
    let first = spawn_waiter(&f);
    until_waiters(&f.q, 1).await;
    // Second miss: this consumer takes the item at once.
    let second = spawn_waiter(&f);
    assert_eq!(second.await.expect("waiter task"), second_gets);
    assert_eq!(f.state_async().await, (0, 1));

    f.commit_async(&[3]).await;
    assert_eq!(first.await.expect("waiter task"), 3);
    assert_eq!(f.state_async().await, (0, 0));
    assert!(drain_async(&f.store, &f.q).await.is_empty());
    drop(leaked_tx);
    check_after_reopen_async(f, &[]).await;
}

/// A `dequeue` that is kept but not polled loses the item handed to it to the second miss;
/// polled again, it waits at the place it had, ahead of a waiter that came after it, and is
/// served first.
async fn unpolled_dequeue_waits_again_at_its_place(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut slow_tx = f.store.begin();
    {
        let mut slow = pin!(f.q.dequeue(&mut slow_tx));
        assert!(poll_once(&mut slow).is_pending());
        until_waiters(&f.q, 1).await;
        let behind = spawn_waiter(&f);
        until_waiters(&f.q, 2).await;

        f.commit_async(&[1]).await;
        served_in_place(&f, slow.as_mut(), behind).await;
    }
    slow_tx.commit().await.expect("commit the dequeue");
    assert_eq!(f.state_async().await, (0, 0));
    check_after_reopen_async(f, &[]).await;
}

/// The embedded engines' part of [`unpolled_dequeue_waits_again_at_its_place`]: 1 was handed
/// to `slow`, which is not polled, and `behind` waits behind it.
async fn served_in_place(
    f: &Fixture,
    mut slow: Pin<&mut reliable_queue::Dequeue<'_, u64>>,
    behind: tokio::task::JoinHandle<u64>,
) {
    let mut tx = f.store.begin();
    assert_eq!(f.q.try_dequeue(&mut tx).await.expect("try_dequeue"), None);
    assert_eq!(
        f.q.try_dequeue(&mut tx).await.expect("try_dequeue"),
        Some(1)
    );
    tx.commit().await.expect("commit the dequeue");

    if matches!(f.engine(), "postgres" | "redis") {
        // Polled at last, it joins its line again at its place and looks (from a task of
        // the store): driven until it is counted again.
        tokio::select! {
            got = slow.as_mut() => panic!("nothing is visible, yet the dequeue gave {got:?}"),
            () = until_waiters(&f.q, 2) => {}
        }
        assert_eq!(f.state_async().await, (0, 2));
        f.commit_async(&[2]).await;
        assert_eq!(slow.as_mut().await.expect("dequeue"), 2);
    } else {
        // Polled at last: nothing for it, so it waits again, first in line.
        assert!(poll_once(&mut slow).is_pending());
        assert_eq!(f.state_async().await, (0, 2));
        f.commit_async(&[2]).await;
        assert!(matches!(poll_once(&mut slow), Poll::Ready(Ok(2))));
    }
    f.commit_async(&[3]).await;
    assert_eq!(behind.await.expect("waiter task"), 3);
}

/// Threads: a leaked `dequeue` holds item 1; a `blocking_dequeue` that finds nothing waits
/// (first miss), a `blocking_dequeue_timeout` on another thread takes 1 at once (second miss),
/// and the waiting thread gets the next item.
fn blocking_consumer_takes_the_item_of_a_leaked_dequeue(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let pg = usize::from(engine.on_server());
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    until_waiters_blocking(&f.q, 1);
    f.commit(&[1]);
    assert_eq!(
        f.state(),
        (pg as u64, 0),
        "handed to the leaked request (on PostgreSQL its turn)"
    );

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
    // On PostgreSQL the take woke the waiting thread, which looks (and is not counted)
    // until it has found nothing.
    until_waiters_blocking(&f.q, 1);
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
fn every_leaked_dequeue_is_reclaimed_within_n_plus_one_misses(engine: &'static Engine) {
    const N: u64 = 4;
    let f = Fixture::new(engine);
    let mut leaked: Vec<Transaction> = (0..N).map(|_| f.store.begin()).collect();
    for (i, tx) in leaked.iter_mut().enumerate() {
        leak_waiting_dequeue(&f.q, tx);
        until_waiters_blocking(&f.q, i + 1);
    }
    assert_eq!(f.state(), (0, N as usize));
    let items: Vec<u64> = (1..=N).collect();
    f.commit(&items);
    if engine.on_server() {
        // The commit of four items hands a turn to each leaked request (none counts as
        // waiting then, as on the embedded engines); the misses take the turns in order.
        assert_eq!(f.state(), (N, 0), "visible, a turn handed to each");
    } else {
        assert_eq!(f.state(), (0, 0), "one item handed to each leaked request");
    }

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
fn leaked_dequeue_handed_an_item_later_loses_it_too(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    until_waiters_blocking(&f.q, 1);
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
    if engine.on_server() {
        // The turn handed to the leaked request: the first try misses, the second takes
        // the turn and the oldest item, the third the other.
        assert_eq!(f.state(), (2, 0), "both visible, the turn handed over");
        let mut tx = f.store.begin();
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), None);
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
        assert_eq!(f.q.blocking_try_dequeue(&mut tx).unwrap(), None);
        // Another request leaked while both are held; once they are given back, both are
        // visible to everyone, and there after a restart.
        let mut leaked_again = f.store.begin();
        leak_waiting_dequeue(&f.q, &mut leaked_again);
        until_waiters_blocking(&f.q, 1);
        tx.blocking_abort().expect("abort");
        let expected = match engine.name {
            // ARCHITECTURE.md, "The Redis engine": an abort wakes a waiter of the queues it
            // gives back to (here the leaked request: its turn, not counted as waiting).
            "redis" => (
                (2, 0),
                "both visible, the turn handed to the new leaked request",
            ),
            // A rollback wakes nobody: the request waits for its fallback poll.
            _ => ((2, 1), "both visible, the new leaked request in line"),
        };
        assert_eq!(f.state(), expected.0, "{}", expected.1);
        check_after_reopen(f, &[1, 2]);
        drop((leaked_tx, leaked_again));
        return;
    }
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
    if engine.is("memory") {
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
fn leaked_dequeue_gives_its_item_back_when_its_transaction_ends(engine: &'static Engine) {
    let (f, leaked_tx, waiter) = item_handed_to_a_leaked_request_first_in_line(engine);
    drop(leaked_tx);
    assert_eq!(
        waiter.join().expect("the waiter"),
        1,
        "the waiter got the item"
    );
    assert_eq!(f.q.blocking_count().unwrap(), 0);
    check_after_reopen(f, &[]);
}

/// As above, the transaction used again instead of dropped: any use of it (here an enqueue)
/// withdraws the leaked request first.
fn leaked_dequeue_gives_its_item_back_when_its_transaction_is_used_again(engine: &'static Engine) {
    let (f, mut leaked_tx, waiter) = item_handed_to_a_leaked_request_first_in_line(engine);
    f.q.enqueue(&mut leaked_tx, 2).expect("enqueue");
    assert_eq!(
        waiter.join().expect("the waiter"),
        1,
        "the waiter got the item"
    );
    leaked_tx.blocking_commit().expect("commit");
    assert_eq!(f.q.blocking_count().unwrap(), 1);
    check_after_reopen(f, &[2]);
}

/// A leaked request first in line with its transaction, a blocking waiter asleep behind it,
/// and item 1 committed and handed to the leaked request (on PostgreSQL its turn).
fn item_handed_to_a_leaked_request_first_in_line(
    engine: &'static Engine,
) -> (Fixture, Transaction, std::thread::JoinHandle<u64>) {
    let f = Fixture::new(engine);
    let mut leaked_tx = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut leaked_tx);
    until_waiters_blocking(&f.q, 1);
    let waiter = spawn_blocking_waiter(&f);
    until_waiters_blocking(&f.q, 2);
    f.commit(&[1]);
    let pg = usize::from(engine.on_server());
    assert_eq!(
        f.state(),
        (pg as u64, 1),
        "handed to the leaked request (on PostgreSQL its turn), the waiter still waits"
    );
    (f, leaked_tx, waiter)
}

/// A leaked request leaves the line once its transaction ends (dropped) or is used again
/// (`dequeue`'s documentation, "Its transaction ends it too"): nobody is counted waiting.
fn a_leaked_request_leaves_the_line_when_its_transaction_ends(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut dropped = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut dropped);
    until_waiters_blocking(&f.q, 1);
    assert_eq!(f.state(), (0, 1));
    drop(dropped);
    wait_until(
        "the leaked request of a dropped transaction to leave the line",
        LINE_LIMIT,
        || f.q.waiters() == 0,
    );
    let mut used = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut used);
    until_waiters_blocking(&f.q, 1);
    assert_eq!(f.state(), (0, 1));
    f.q.enqueue(&mut used, 5).expect("enqueue");
    wait_until(
        "the leaked request of a used transaction to leave the line",
        LINE_LIMIT,
        || f.q.waiters() == 0,
    );
    used.blocking_commit().expect("commit");
    assert_eq!(f.state(), (1, 0));
    check_after_reopen(f, &[5]);
}

/// How long a leaked request may take to leave the line, or its item to come back, once its
/// transaction has ended (at once on the embedded engines; a round trip on PostgreSQL, where
/// a dropped transaction rolls back from a task: ARCHITECTURE.md, "Where this engine
/// differs").
const LINE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Two leaked requests: the first in line when 1 is committed, the second leaked after. Once
/// both transactions have ended (dropped), 1 is visible to everyone: a leaked `Dequeue` keeps
/// no committed item from the other consumers (`dequeue`'s documentation, "A future that is
/// not polled").
fn a_leaked_dequeue_keeps_no_item_once_its_transaction_ends(engine: &'static Engine) {
    let f = Fixture::new(engine);
    let mut first = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut first);
    f.commit(&[1]);
    let mut second = f.store.begin();
    leak_waiting_dequeue(&f.q, &mut second);
    drop((second, first));
    wait_until("1 to be visible again", LINE_LIMIT, || {
        f.q.blocking_count().unwrap() == 1
    });
    let mut tx = f.store.begin();
    assert_eq!(
        f.q.blocking_try_dequeue(&mut tx).unwrap(),
        Some(1),
        "1 is kept from everyone"
    );
    tx.blocking_commit().expect("commit");
    check_after_reopen(f, &[]);
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(async leaked_dequeue_loses_its_item_to_the_second_miss),
        engine_case!(async leaked_dequeue_does_not_hold_up_later_waiters),
        engine_case!(async unpolled_dequeue_waits_again_at_its_place),
        engine_case!(blocking_consumer_takes_the_item_of_a_leaked_dequeue),
        engine_case!(every_leaked_dequeue_is_reclaimed_within_n_plus_one_misses),
        engine_case!(leaked_dequeue_handed_an_item_later_loses_it_too),
        engine_case!(leaked_dequeue_gives_its_item_back_when_its_transaction_ends),
        engine_case!(leaked_dequeue_gives_its_item_back_when_its_transaction_is_used_again),
        engine_case!(a_leaked_request_leaves_the_line_when_its_transaction_ends),
        engine_case!(a_leaked_dequeue_keeps_no_item_once_its_transaction_ends),
    ]
}
