//! Waiting consumers racing publishers: no lost wake-up, each entry to exactly one waiter,
//! and no `try_dequeue` takes an entry promised to a waiter.
#![cfg(reliable_queue_loom)]

use std::pin::pin;
use std::task::Poll;

use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;
use loom_tests::{
    assert_exactly_once, check, commit, dequeue_or_stop, poll_once, store_with, take_all, Queue,
    Stop,
};
use reliable_queue::Store;

/// Spawns a consumer that waits in `dequeue` and commits what it gets.
fn spawn_waiter(store: &Store, q: &Queue) -> thread::JoinHandle<u32> {
    let (store, q) = (store.clone(), q.clone());
    thread::spawn(move || {
        let mut tx = store.begin();
        let item = block_on(q.dequeue(&mut tx)).unwrap();
        tx.blocking_commit().unwrap();
        item
    })
}

/// A consumer registering in `dequeue` while a producer commits: the consumer completes
/// with the item whichever comes first.
#[test]
fn registration_races_publish() {
    check(|| {
        let (store, q) = store_with(&[]);
        let waiter = spawn_waiter(&store, &q);
        commit(&store, &q, &[1]);
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
    });
}

/// Two waiters, two one-item commits: each waiter gets a different item.
#[test]
fn two_waiters_two_items() {
    check(|| {
        let (store, q) = store_with(&[]);
        let waiters = [spawn_waiter(&store, &q), spawn_waiter(&store, &q)];
        commit(&store, &q, &[1]);
        commit(&store, &q, &[2]);
        assert_exactly_once(&[1, 2], waiters.map(|w| w.join().unwrap()));
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
    });
}

/// Two waiters, one item committed while both may give up at any moment: the item goes to
/// at most one of them, and if nobody keeps it, it is back in the queue. Nobody is left
/// registered.
#[test]
fn two_waiters_one_item() {
    check(|| {
        let (store, q) = store_with(&[]);
        let stops = [Arc::new(Stop::default()), Arc::new(Stop::default())];
        let waiters = stops.clone().map(|stop| {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let item = block_on(dequeue_or_stop(&q, &mut tx, &stop));
                tx.blocking_commit().unwrap();
                item
            })
        });
        commit(&store, &q, &[1]);
        stops.iter().for_each(|stop| stop.stop());
        let served: Vec<u32> = waiters
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        assert!(served.len() <= 1, "one item served twice: {served:?}");
        assert_eq!(q.waiters(), 0);
        assert_eq!(q.blocking_count().unwrap(), 1 - served.len() as u64);
        let rest = take_all(&store, &q);
        assert_exactly_once(&[1], served.into_iter().chain(rest));
    });
}

/// A transaction that dequeues one item and enqueues another commits while a consumer waits:
/// the waiter gets whichever item is visible or published, the committed dequeue is gone for
/// good, and every item is accounted for exactly once.
#[test]
fn requeue_commit_serves_waiter() {
    check(|| {
        let (store, q) = store_with(&[1]);
        let mover = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let taken = q.blocking_try_dequeue(&mut tx).unwrap();
                q.enqueue(&mut tx, 2).unwrap();
                tx.blocking_commit().unwrap();
                taken
            })
        };
        let waiter = spawn_waiter(&store, &q);
        let taken = mover.join().unwrap();
        let served = waiter.join().unwrap();
        assert_eq!(q.waiters(), 0);
        let rest = take_all(&store, &q);
        assert_exactly_once(&[1, 2], taken.into_iter().chain([served]).chain(rest));
    });
}

/// A registered request polled again with a different waker (the future moved to another
/// task) while a producer commits: the new waker is the one woken.
#[test]
fn repoll_with_new_waker_races_publish() {
    check(|| {
        let (store, q) = store_with(&[]);
        let mut tx = store.begin();
        let producer = {
            let mut dequeue = pin!(q.dequeue(&mut tx));
            assert!(poll_once(dequeue.as_mut()).is_pending());
            let producer = {
                let (store, q) = (store.clone(), q.clone());
                thread::spawn(move || commit(&store, &q, &[1]))
            };
            assert_eq!(block_on(dequeue).unwrap(), 1);
            producer
        };
        producer.join().unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
    });
}

/// While a request waits, an item committed concurrently with a `try_dequeue` goes to the
/// waiter: `try_dequeue` never jumps the line. (A `try_dequeue` that finds nothing is one
/// miss; only a second one would take an item the waiter has not collected: `leak.rs`.)
#[test]
fn try_dequeue_does_not_jump_the_line() {
    check(|| {
        let (store, q) = store_with(&[]);
        let mut tx = store.begin();
        {
            let mut dequeue = pin!(q.dequeue(&mut tx));
            assert!(poll_once(dequeue.as_mut()).is_pending());
            let producer = {
                let (store, q) = (store.clone(), q.clone());
                thread::spawn(move || commit(&store, &q, &[1]))
            };
            let other = {
                let (store, q) = (store.clone(), q.clone());
                thread::spawn(move || {
                    let mut tx = store.begin();
                    q.blocking_try_dequeue(&mut tx).unwrap()
                })
            };
            assert_eq!(
                other.join().unwrap(),
                None,
                "try_dequeue took a promised item"
            );
            producer.join().unwrap();
            assert!(matches!(poll_once(dequeue.as_mut()), Poll::Ready(Ok(1))));
        }
        tx.blocking_commit().unwrap();
        assert_eq!((q.blocking_count().unwrap(), q.waiters()), (0, 0));
        assert!(take_all(&store, &q).is_empty());
    });
}
