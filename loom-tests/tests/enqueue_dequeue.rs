//! Committed enqueues racing `try_dequeue`: no item is lost or handed out twice.
#![cfg(reliable_queue_loom)]

use loom::thread;
use loom_tests::{assert_exactly_once, check, commit, store_with, take, take_all};

/// A producer commits two one-item transactions while two consumers take what they find.
/// Every item ends up with exactly one consumer or still in the queue, and `count()` is the
/// number left.
#[test]
fn commits_race_try_dequeue() {
    check(|| {
        let (store, q) = store_with(&[]);
        let consumers: Vec<_> = [2, 1]
            .into_iter()
            .map(|max| {
                let (store, q) = (store.clone(), q.clone());
                thread::spawn(move || take(&store, &q, max))
            })
            .collect();
        commit(&store, &q, &[1]);
        commit(&store, &q, &[2]);
        let mut seen: Vec<u32> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        let left = q.blocking_count().unwrap();
        let rest = take_all(&store, &q);
        assert_eq!(left, rest.len() as u64, "count() is what is left");
        assert_eq!(q.blocking_count().unwrap(), 0);
        seen.extend(rest);
        assert_exactly_once(&[1, 2], seen);
    });
}

/// The items of one commit become visible on their queue together: a consumer that finds the
/// first one also finds the second.
#[test]
fn one_commit_is_visible_all_at_once() {
    check(|| {
        let (store, q) = store_with(&[]);
        let consumer = {
            let (store, q) = (store.clone(), q.clone());
            thread::spawn(move || take(&store, &q, 2))
        };
        commit(&store, &q, &[1, 2]);
        let got = consumer.join().unwrap();
        assert!(
            got.is_empty() || got == [1, 2],
            "saw half a commit: {got:?}"
        );
        let rest = take_all(&store, &q);
        assert_exactly_once(&[1, 2], got.into_iter().chain(rest));
    });
}

/// A commit that enqueues to two queues becomes visible on both at once: an observer that
/// finds the item in the first queue finds the other item in the second, and a concurrent
/// abort that gives items back to both queues is seen whole in the same way.
#[test]
fn commit_across_queues_is_visible_all_at_once() {
    check(|| {
        let store = reliable_queue::Store::in_memory().expect("open an in-memory store");
        let a = store.blocking_queue::<u32>("a").expect("queue a");
        let b = store.blocking_queue::<u32>("b").expect("queue b");
        let observer = {
            let (store, a, b) = (store.clone(), a.clone(), b.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let from_a = a.blocking_try_dequeue(&mut tx).expect("dequeue a");
                let from_b = b.blocking_try_dequeue(&mut tx).expect("dequeue b");
                tx.blocking_abort().expect("abort");
                (from_a, from_b)
            })
        };
        let mut tx = store.begin();
        a.enqueue(&mut tx, 1).expect("enqueue a");
        b.enqueue(&mut tx, 2).expect("enqueue b");
        tx.blocking_commit().expect("commit");
        let (from_a, from_b) = observer.join().unwrap();
        if from_a.is_some() {
            assert_eq!(from_b, Some(2), "saw the commit on a but not on b");
        }
        assert_eq!(
            (a.blocking_count().unwrap(), b.blocking_count().unwrap()),
            (1, 1),
            "the abort gave both back"
        );
    });
}
