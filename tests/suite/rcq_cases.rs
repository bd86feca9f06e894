//! The documented cases of Service Fabric's ReliableConcurrentQueue, each run on every engine
//! of the conformance suite (`tests/common/engines.rs`).

use crate::common;
use crate::engine_case;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::thread;

use common::engines::Engine;
use common::{drain, peek_all};
use reliable_queue::{ReliableConcurrentQueue, Store};

/// Runs `case` against a fresh store of `engine`.
fn on(engine: &'static Engine, case: impl Fn(&Store)) {
    case(&engine.store());
}

/// Commits `items` in one transaction.
fn enqueue_all(store: &Store, queue: &ReliableConcurrentQueue<u32>, items: &[u32]) {
    let mut tx = store.begin();
    for &item in items {
        queue.enqueue(&mut tx, item).expect("enqueue");
    }
    tx.blocking_commit().expect("commit enqueues");
}

fn set(items: &[u32]) -> BTreeSet<u32> {
    items.iter().copied().collect()
}

/// A queue holding 10, 20, ..., 60, committed in one transaction.
fn populated(store: &Store) -> ReliableConcurrentQueue<u32> {
    let queue = store.blocking_queue::<u32>("q").expect("open queue");
    enqueue_all(store, &queue, &[10, 20, 30, 40, 50, 60]);
    assert_eq!(queue.blocking_count().unwrap(), 6);
    queue
}

fn single_enqueue_task_holds_exactly_both_items(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        enqueue_all(store, &queue, &[10, 20]);
        assert_eq!(queue.blocking_count().unwrap(), 2);
        let items = peek_all(store, &queue);
        assert!(
            items == [10, 20] || items == [20, 10],
            "queue holds {items:?}"
        );
        assert_eq!(
            queue.blocking_count().unwrap(),
            2,
            "peeking consumed nothing"
        );
    });
}

fn parallel_enqueue_tasks_lose_nothing(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        // Both transactions are open, with their items enqueued, before either commits.
        let ready = Arc::new(Barrier::new(2));
        let tasks: Vec<_> = [[10, 20], [30, 40]]
            .into_iter()
            .map(|items| {
                let (store, queue, ready) = (store.clone(), queue.clone(), ready.clone());
                thread::spawn(move || {
                    let mut tx = store.begin();
                    for item in items {
                        queue.enqueue(&mut tx, item).unwrap();
                    }
                    ready.wait();
                    tx.blocking_commit().unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.join().expect("enqueue task");
        }
        assert_eq!(queue.blocking_count().unwrap(), 4);
        let mut items = drain(store, &queue);
        assert_eq!(items.len(), 4, "each item exactly once: {items:?}");
        items.sort_unstable();
        assert_eq!(items, [10, 20, 30, 40]);
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

fn single_dequeue_task_takes_three_distinct_items_and_leaves_the_rest(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        let mut tx = store.begin();
        let taken: Vec<u32> = (0..3)
            .map(|_| {
                queue
                    .blocking_try_dequeue(&mut tx)
                    .unwrap()
                    .expect("an item")
            })
            .collect();
        tx.blocking_commit().unwrap();

        assert_eq!(set(&taken).len(), 3, "distinct items: {taken:?}");
        assert!(set(&taken).is_subset(&set(&[10, 20, 30, 40, 50, 60])));
        assert_eq!(queue.blocking_count().unwrap(), 3);
        let rest = drain(store, &queue);
        assert_eq!(rest.len(), 3);
        let mut all = taken.clone();
        all.extend(&rest);
        assert_eq!(set(&all), set(&[10, 20, 30, 40, 50, 60]));
    });
}

fn parallel_dequeue_tasks_take_disjoint_items(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        // Both transactions hold their two items before either commits.
        let ready = Arc::new(Barrier::new(2));
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (store, queue, ready) = (store.clone(), queue.clone(), ready.clone());
                thread::spawn(move || {
                    let mut tx = store.begin();
                    let taken: Vec<u32> = (0..2)
                        .map(|_| {
                            queue
                                .blocking_try_dequeue(&mut tx)
                                .unwrap()
                                .expect("an item")
                        })
                        .collect();
                    ready.wait();
                    tx.blocking_commit().unwrap();
                    taken
                })
            })
            .collect();
        let lists: Vec<Vec<u32>> = tasks.into_iter().map(|t| t.join().unwrap()).collect();
        let (first, second) = (set(&lists[0]), set(&lists[1]));
        assert_eq!((first.len(), second.len()), (2, 2), "{lists:?}");
        assert!(first.is_disjoint(&second), "both took an item: {lists:?}");

        assert_eq!(queue.blocking_count().unwrap(), 2);
        let rest = drain(store, &queue);
        let mut all = lists.concat();
        all.extend(&rest);
        all.sort_unstable();
        assert_eq!(all, [10, 20, 30, 40, 50, 60], "remaining {rest:?}");
    });
}

fn abort_puts_dequeued_items_back_at_the_head(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        let mut tx = store.begin();
        let first = queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        let second = queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 4);
        tx.blocking_abort().expect("abort");
        assert_eq!(
            queue.blocking_count().unwrap(),
            6,
            "returned items are visible at once"
        );

        let mut tx = store.begin();
        let again = [
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap(),
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap(),
        ];
        assert_eq!(
            set(&again),
            set(&[first, second]),
            "aborted items come first"
        );
        let next = queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        assert!(!set(&again).contains(&next));
        tx.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 3);
    });
}

fn aborted_items_come_before_items_committed_meanwhile(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        let mut holder = store.begin();
        let held = [
            queue.blocking_try_dequeue(&mut holder).unwrap().unwrap(),
            queue.blocking_try_dequeue(&mut holder).unwrap().unwrap(),
        ];
        // Meanwhile the rest is consumed and a newer item committed.
        let mut tx = store.begin();
        let mut others = Vec::new();
        while let Some(item) = queue.blocking_try_dequeue(&mut tx).unwrap() {
            others.push(item);
        }
        tx.blocking_commit().unwrap();
        enqueue_all(store, &queue, &[70]);
        drop(holder);
        engine.after_drop("the dropped transaction's items are back", || {
            queue.blocking_count().unwrap() == 3
        });

        let mut tx = store.begin();
        let returned = [
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap(),
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap(),
        ];
        assert_eq!(set(&returned), set(&held));
        assert_eq!(queue.blocking_try_dequeue(&mut tx).unwrap(), Some(70));
        tx.blocking_commit().unwrap();
        assert_eq!(others.len(), 4);
    });
}

fn dequeued_item_is_hidden_from_others_until_abort(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        enqueue_all(store, &queue, &[10]);
        let mut a = store.begin();
        let mut b = store.begin();
        assert_eq!(queue.blocking_try_dequeue(&mut a).unwrap(), Some(10));
        assert_eq!(
            queue.blocking_try_dequeue(&mut b).unwrap(),
            None,
            "held by a"
        );
        a.blocking_abort().expect("abort");
        assert_eq!(
            queue.blocking_try_dequeue(&mut b).unwrap(),
            Some(10),
            "visible to b at once"
        );
        b.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 0);
        assert!(peek_all(store, &queue).is_empty());
    });
}

fn peek_by_dequeue_then_abort_leaves_the_queue_unchanged(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        let before = peek_all(store, &queue);

        let mut tx = store.begin();
        let peeked = queue
            .blocking_try_dequeue(&mut tx)
            .unwrap()
            .expect("an item");
        tx.blocking_abort().expect("abort");

        assert_eq!(queue.blocking_count().unwrap(), 6);
        let mut tx = store.begin();
        assert_eq!(
            queue.blocking_try_dequeue(&mut tx).unwrap(),
            Some(peeked),
            "the peeked item is still first"
        );
        tx.blocking_abort().expect("abort");
        assert_eq!(peek_all(store, &queue), before);
    });
}

fn peek_commits_only_when_the_item_is_processed(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        enqueue_all(store, &queue, &[5, 15]);
        // The documented pattern: process (and commit) only values over 10.
        let mut processed = Vec::new();
        for _ in 0..2 {
            let mut tx = store.begin();
            match queue.blocking_try_dequeue(&mut tx).unwrap() {
                Some(v) if v > 10 => {
                    processed.push(v);
                    tx.blocking_commit().unwrap();
                }
                _ => tx.blocking_abort().expect("abort"),
            }
        }
        // 5 was peeked and put back twice; 15 was never reached.
        assert!(processed.is_empty());
        assert_eq!(peek_all(store, &queue), [5, 15]);
    });
}

fn batch_dequeue_loop_sees_every_item_exactly_once(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let items: Vec<u32> = (0..23).collect();
        for chunk in items.chunks(4) {
            enqueue_all(store, &queue, chunk);
        }
        const BATCH: usize = 5;
        let mut processed = Vec::new();
        loop {
            let mut batch = Vec::new();
            let mut tx = store.begin();
            while batch.len() < BATCH {
                match queue.blocking_try_dequeue(&mut tx).unwrap() {
                    Some(item) => batch.push(item),
                    None => break,
                }
            }
            tx.blocking_commit().unwrap();
            assert!(batch.len() <= BATCH);
            if batch.is_empty() {
                break;
            }
            processed.extend(batch);
        }
        processed.sort_unstable();
        assert_eq!(processed, items);
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

fn count_threshold_processing_takes_full_batches(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        const THRESHOLD: u64 = 5;
        let mut processed = Vec::new();
        for item in 0..17u32 {
            enqueue_all(store, &queue, &[item]);
            if queue.blocking_count().unwrap() < THRESHOLD {
                continue;
            }
            let mut tx = store.begin();
            let mut batch = Vec::new();
            while (batch.len() as u64) < THRESHOLD {
                match queue.blocking_try_dequeue(&mut tx).unwrap() {
                    Some(v) => batch.push(v),
                    None => break,
                }
            }
            tx.blocking_commit().unwrap();
            assert_eq!(batch.len() as u64, THRESHOLD, "count promised a full batch");
            processed.extend(batch);
        }
        assert_eq!(processed.len(), 15);
        assert_eq!(queue.blocking_count().unwrap(), 2);
        processed.extend(drain(store, &queue));
        processed.sort_unstable();
        assert_eq!(processed, (0..17).collect::<Vec<_>>());
    });
}

fn best_effort_drain_after_all_tasks_stop_gets_everything(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        // Producers commit; consumers take items and abort, so items go back and forth.
        let tasks: Vec<_> = (0..4u32)
            .map(|task| {
                let (store, queue) = (store.clone(), queue.clone());
                thread::spawn(move || {
                    for round in 0..25u32 {
                        let mut tx = store.begin();
                        queue.enqueue(&mut tx, task * 1000 + round).unwrap();
                        tx.blocking_commit().unwrap();
                        let mut tx = store.begin();
                        let _ = queue.blocking_try_dequeue(&mut tx).unwrap();
                        let _ = queue.blocking_try_dequeue(&mut tx).unwrap();
                        tx.blocking_abort().expect("abort");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.join().unwrap();
        }
        // The documented drain: batches of five until a dequeue finds nothing.
        let mut drained = Vec::new();
        loop {
            let mut tx = store.begin();
            let mut batch = 0;
            let exhausted = loop {
                match queue.blocking_try_dequeue(&mut tx).unwrap() {
                    Some(v) => {
                        drained.push(v);
                        batch += 1;
                        if batch == 5 {
                            break false;
                        }
                    }
                    None => break true,
                }
            };
            tx.blocking_commit().unwrap();
            if exhausted {
                break;
            }
        }
        drained.sort_unstable();
        let expected: Vec<u32> = (0..4)
            .flat_map(|task| (0..25).map(move |r| task * 1000 + r))
            .collect();
        assert_eq!(drained, expected);
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

fn enqueue_is_invisible_before_commit_even_to_its_own_transaction(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 10).unwrap();
        assert_eq!(
            queue.blocking_try_dequeue(&mut tx).unwrap(),
            None,
            "own write"
        );
        let mut other = store.begin();
        assert_eq!(
            queue.blocking_try_dequeue(&mut other).unwrap(),
            None,
            "other reader"
        );
        assert_eq!(queue.blocking_count().unwrap(), 0);
        tx.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 1);
        assert_eq!(queue.blocking_try_dequeue(&mut other).unwrap(), Some(10));
        other.blocking_commit().unwrap();
    });
}

fn own_enqueue_is_not_dequeued_after_the_committed_items(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        enqueue_all(store, &queue, &[1, 2]);
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 3).unwrap();
        let mut seen = Vec::new();
        while let Some(v) = queue.blocking_try_dequeue(&mut tx).unwrap() {
            seen.push(v);
        }
        assert_eq!(set(&seen), set(&[1, 2]), "the uncommitted 3 is not visible");
        tx.blocking_commit().unwrap();
        assert_eq!(peek_all(store, &queue), [3]);
    });
}

fn count_is_exact_when_idle_and_excludes_held_items(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 0);
        enqueue_all(store, &queue, &(0..10).collect::<Vec<_>>());
        assert_eq!(queue.blocking_count().unwrap(), 10);

        let mut a = store.begin();
        for _ in 0..3 {
            queue.blocking_try_dequeue(&mut a).unwrap().unwrap();
        }
        assert_eq!(queue.blocking_count().unwrap(), 7);
        let mut b = store.begin();
        for _ in 0..2 {
            queue.blocking_try_dequeue(&mut b).unwrap().unwrap();
        }
        queue.enqueue(&mut b, 99).unwrap();
        assert_eq!(
            queue.blocking_count().unwrap(),
            5,
            "held and uncommitted items are excluded"
        );

        a.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 5);
        b.blocking_abort().expect("abort");
        assert_eq!(queue.blocking_count().unwrap(), 7);
        assert_eq!(drain(store, &queue).len(), 7);
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

fn dropping_a_transaction_aborts_it(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        {
            let mut tx = store.begin();
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
            queue.enqueue(&mut tx, 70).unwrap();
            assert_eq!(queue.blocking_count().unwrap(), 4);
        }
        engine.after_drop("the dropped transaction's items are back", || {
            queue.blocking_count().unwrap() == 6
        });
        let mut items = drain(store, &queue);
        items.sort_unstable();
        assert_eq!(items, [10, 20, 30, 40, 50, 60], "70 was never committed");
    });
}

fn a_transaction_dropped_in_another_thread_gives_its_items_back(engine: &'static Engine) {
    on(engine, |store| {
        let queue = populated(store);
        let (store2, queue2) = (store.clone(), queue.clone());
        let taken = thread::spawn(move || {
            let mut tx = store2.begin();
            let item = queue2.blocking_try_dequeue(&mut tx).unwrap().unwrap();
            assert_eq!(queue2.blocking_count().unwrap(), 5);
            item
            // tx dropped here, in this thread
        })
        .join()
        .unwrap();
        engine.after_drop("the dropped transaction's item is back", || {
            queue.blocking_count().unwrap() == 6
        });
        assert!(peek_all(store, &queue).contains(&taken));
    });
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(single_enqueue_task_holds_exactly_both_items),
        engine_case!(parallel_enqueue_tasks_lose_nothing),
        engine_case!(single_dequeue_task_takes_three_distinct_items_and_leaves_the_rest),
        engine_case!(parallel_dequeue_tasks_take_disjoint_items),
        engine_case!(abort_puts_dequeued_items_back_at_the_head),
        engine_case!(aborted_items_come_before_items_committed_meanwhile),
        engine_case!(dequeued_item_is_hidden_from_others_until_abort),
        engine_case!(peek_by_dequeue_then_abort_leaves_the_queue_unchanged),
        engine_case!(peek_commits_only_when_the_item_is_processed),
        engine_case!(batch_dequeue_loop_sees_every_item_exactly_once),
        engine_case!(count_threshold_processing_takes_full_batches),
        engine_case!(best_effort_drain_after_all_tasks_stop_gets_everything),
        engine_case!(enqueue_is_invisible_before_commit_even_to_its_own_transaction),
        engine_case!(own_enqueue_is_not_dequeued_after_the_committed_items),
        engine_case!(count_is_exact_when_idle_and_excludes_held_items),
        engine_case!(dropping_a_transaction_aborts_it),
        engine_case!(a_transaction_dropped_in_another_thread_gives_its_items_back),
    ]
}
