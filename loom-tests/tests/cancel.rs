//! Waiters that give up racing a hand-off: an item handed to a request that is dropped goes
//! back to the queue or to the next waiter, never stranded.
//!
//! `blocking_dequeue` and `blocking_dequeue_timeout` are not modelled: they park the calling
//! thread with `std::thread::park`/`park_timeout`, which loom does not control (a parked loom
//! thread would block the whole model), and loom has no clock for the deadline. Their
//! staging path is the one `dequeue` uses (`poll_take`, then `withdraw` at the deadline),
//! which these models cover; `tests/suite/waiting.rs` checks the blocking variants on real
//! threads.
#![cfg(reliable_queue_loom)]

use std::pin::pin;

use loom::thread;
use loom_tests::{check, commit, poll_once, store_with, take_all};

/// A consumer polls `dequeue` once, then drops the future and its transaction, while a
/// producer commits an item: afterwards the item is visible and `try_dequeue` finds it.
#[test]
fn dropped_waiter_races_handoff() {
    check(|| {
        let (store, q) = store_with(&[]);
        let quitter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                {
                    let dequeue = pin!(q.dequeue(&mut tx));
                    // Pending (registered) or Ready (took the item into `tx`); either way
                    // the future is dropped now, and the transaction aborted below.
                    let _ = poll_once(dequeue);
                }
                tx.blocking_abort().expect("abort");
            })
        };
        commit(&store, &q, &[1]);
        quitter.join().unwrap();
        assert_eq!(
            (q.blocking_count().unwrap(), q.waiters()),
            (1, 0),
            "the item is visible, nobody waits"
        );
        assert_eq!(take_all(&store, &q), [1]);
    });
}

/// A waiter that gives up while an item is being handed out, and a second waiter that stays:
/// the second always gets the item, whichever of the two it was handed to first.
#[test]
fn cancelled_waiter_passes_item_to_next() {
    check(|| {
        let (store, q) = store_with(&[]);
        let quitter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                {
                    let dequeue = pin!(q.dequeue(&mut tx));
                    let _ = poll_once(dequeue);
                }
                tx.blocking_abort().expect("abort");
            })
        };
        let stayer = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let item = loom::future::block_on(q.dequeue(&mut tx)).unwrap();
                tx.blocking_commit().unwrap();
                item
            })
        };
        commit(&store, &q, &[1]);
        quitter.join().unwrap();
        assert_eq!(stayer.join().unwrap(), 1);
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
    });
}
