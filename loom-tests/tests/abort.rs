//! Aborts giving items back while others dequeue: the items come back, nobody gets a
//! duplicate, and a waiting consumer is handed what comes back.
#![cfg(reliable_queue_loom)]

use loom::thread;
use loom_tests::{assert_exactly_once, check, store_with, take, take_all};

/// One transaction takes what it can and aborts, another takes what it can and commits.
/// Whatever the first held comes back: each item is committed by the second or left in the
/// queue, exactly once.
#[test]
fn abort_races_try_dequeue() {
    check(|| {
        let (store, q) = store_with(&[1, 2]);
        let aborter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let held = [
                    q.blocking_try_dequeue(&mut tx),
                    q.blocking_try_dequeue(&mut tx),
                ];
                tx.blocking_abort().expect("abort");
                held.into_iter().flat_map(|r| r.unwrap()).count()
            })
        };
        let committer = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || take(&store, &q, 2))
        };
        aborter.join().unwrap();
        let got = committer.join().unwrap();
        let left = q.blocking_count().unwrap();
        let rest = take_all(&store, &q);
        assert_eq!(left, rest.len() as u64, "count() is what is left");
        assert_exactly_once(&[1, 2], got.into_iter().chain(rest));
    });
}

/// An abort racing a consumer that waits in `dequeue`: the returned item is handed to the
/// waiter (or found by it), and the waiter is woken.
#[test]
fn abort_hands_returned_item_to_waiter() {
    check(|| {
        let (store, q) = store_with(&[1]);
        let mut held = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(1));
        let aborter = thread::spawn(move || held.blocking_abort().expect("abort"));
        let waiter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let item = loom::future::block_on(q.dequeue(&mut tx)).unwrap();
                tx.blocking_commit().unwrap();
                item
            })
        };
        aborter.join().unwrap();
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
        assert!(take_all(&store, &q).is_empty());
    });
}

/// An abort giving back two items while one consumer waits in `dequeue` and another calls
/// `try_dequeue`: the waiter is served, the other item goes to the front of the queue or to
/// the other consumer, and each item ends up in exactly one place.
#[test]
fn abort_splits_items_between_waiter_and_queue() {
    check(|| {
        let (store, q) = store_with(&[1, 2]);
        let mut held = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(1));
        assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(2));
        let aborter = thread::spawn(move || held.blocking_abort().expect("abort"));
        let waiter = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let item = loom::future::block_on(q.dequeue(&mut tx)).unwrap();
                tx.blocking_commit().unwrap();
                item
            })
        };
        let taker = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || take(&store, &q, 1))
        };
        aborter.join().unwrap();
        let served = waiter.join().unwrap();
        let taken = taker.join().unwrap();
        assert_eq!(q.waiters(), 0);
        let left = q.blocking_count().unwrap();
        let rest = take_all(&store, &q);
        assert_eq!(left, rest.len() as u64, "count() is what is left");
        assert_exactly_once(&[1, 2], [served].into_iter().chain(taken).chain(rest));
    });
}
