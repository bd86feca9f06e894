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
        let left = q.count();
        let rest = take_all(&store, &q);
        assert_eq!(left, rest.len() as u64, "count() is what is left");
        assert_eq!(q.count(), 0);
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
