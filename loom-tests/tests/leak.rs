//! A `Dequeue` future leaked with `std::mem::forget` (never polled nor dropped again) racing
//! commits and other consumers: the item handed to it is taken by the second dequeue attempt
//! after the hand-over that finds nothing (a miss), the leaked request never holds up the
//! items after it, and every item ends up in exactly one place.
#![cfg(reliable_queue_loom)]

use std::pin::Pin;

use loom::future::block_on;
use loom::thread;
use loom_tests::{assert_exactly_once, check, commit, poll_once, store_with, Queue};
use reliable_queue::{Store, Transaction};

/// Starts a `dequeue` on `tx` that finds the queue empty and joins the line, then leaks it.
fn leak_waiting_dequeue(q: &Queue, tx: &mut Transaction) {
    let mut dequeue = q.dequeue(tx);
    assert!(poll_once(Pin::new(&mut dequeue)).is_pending());
    std::mem::forget(dequeue);
}

/// `tries` one-item `try_dequeue` transactions, each committed; the items they got.
fn try_times(store: &Store, q: &Queue, tries: usize) -> Vec<u32> {
    (0..tries)
        .filter_map(|_| {
            let mut tx = store.begin();
            let got = q.blocking_try_dequeue(&mut tx).expect("try_dequeue");
            tx.blocking_commit().expect("commit");
            got
        })
        .collect()
}

/// A commit hands its item to a leaked request while another consumer misses twice: that
/// consumer takes the item if both its misses came after the hand-over; otherwise two more
/// misses do. Nobody is left in line.
#[test]
fn leaked_dequeue_item_goes_to_the_second_miss() {
    check(|| {
        let (store, q) = store_with(&[]);
        let mut leaked_tx = store.begin();
        leak_waiting_dequeue(&q, &mut leaked_tx);
        let consumer = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || try_times(&store, &q, 2))
        };
        commit(&store, &q, &[1]);
        let taken = consumer.join().unwrap();
        let rest = try_times(&store, &q, 2);
        assert_exactly_once(&[1], taken.into_iter().chain(rest));
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
        drop(leaked_tx);
    });
}

/// A leaked request first in line, a live waiter, and two commits: the leaked request takes
/// at most the first item out of circulation, the waiter is always served, and two misses
/// afterwards find whatever the leaked request was handed.
#[test]
fn leaked_dequeue_does_not_hold_up_a_waiter() {
    check(|| {
        let (store, q) = store_with(&[]);
        let mut leaked_tx = store.begin();
        leak_waiting_dequeue(&q, &mut leaked_tx);
        let waiter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let item = block_on(q.dequeue(&mut tx)).unwrap();
                tx.blocking_commit().unwrap();
                item
            })
        };
        commit(&store, &q, &[1]);
        commit(&store, &q, &[2]);
        let served = waiter.join().unwrap();
        let rest = try_times(&store, &q, 2);
        assert_exactly_once(&[1, 2], [served].into_iter().chain(rest));
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
        drop(leaked_tx);
    });
}
