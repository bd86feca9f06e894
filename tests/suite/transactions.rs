//! Transactions across queues and stores: atomic moves, all-or-nothing commits, misuse,
//! empty commits, async commits and waiting dequeues, on every engine of the conformance suite
//! (`tests/common/engines.rs`: memory, sled, and PostgreSQL when the crate is built with the
//! `postgres` feature; without a server the output says PostgreSQL was skipped).

use crate::common;
use crate::engine_case;

use std::thread;
use std::time::{Duration, Instant};

use common::engines::{Engine, ENGINES};
use common::{drain, peek_all};
use reliable_queue::{Error, Store};
use serde::{Deserialize, Serialize};

/// Runs `case` against a fresh store of `engine`.
fn on(engine: &'static Engine, case: impl Fn(&Store)) {
    case(&engine.store());
}

/// Waits, without sleeping, until `done` holds; fails the test after ten seconds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::yield_now();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Job {
    id: u64,
    name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Outcome {
    Done { job: u64, note: String },
    Failed(u64),
}

fn move_between_queues_aborted_leaves_both_unchanged(engine: &'static Engine) {
    on(engine, |store| {
        let a = store.blocking_queue::<u64>("a").unwrap();
        let b = store.blocking_queue::<u64>("b").unwrap();
        let mut tx = store.begin();
        a.enqueue(&mut tx, 7).unwrap();
        tx.blocking_commit().unwrap();

        let mut tx = store.begin();
        let item = a.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        b.enqueue(&mut tx, item).unwrap();
        assert_eq!(
            (a.blocking_count().unwrap(), b.blocking_count().unwrap()),
            (0, 0),
            "in flight"
        );
        tx.blocking_abort().expect("abort");

        assert_eq!(
            (a.blocking_count().unwrap(), b.blocking_count().unwrap()),
            (1, 0)
        );
        assert_eq!(peek_all(store, &a), [7]);
        assert!(peek_all(store, &b).is_empty());
    });
}

fn move_between_queues_committed_moves_the_item(engine: &'static Engine) {
    on(engine, |store| {
        let a = store.blocking_queue::<u64>("a").unwrap();
        let b = store.blocking_queue::<u64>("b").unwrap();
        let mut tx = store.begin();
        a.enqueue(&mut tx, 7).unwrap();
        tx.blocking_commit().unwrap();

        let mut tx = store.begin();
        let item = a.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        b.enqueue(&mut tx, item).unwrap();
        tx.blocking_commit().unwrap();

        assert_eq!(
            (a.blocking_count().unwrap(), b.blocking_count().unwrap()),
            (0, 1)
        );
        assert!(drain(store, &a).is_empty());
        assert_eq!(drain(store, &b), [7]);
    });
}

fn move_between_queues_of_different_item_types(engine: &'static Engine) {
    on(engine, |store| {
        let jobs = store.blocking_queue::<Job>("jobs").unwrap();
        let outcomes = store.blocking_queue::<Outcome>("outcomes").unwrap();
        let job = Job {
            id: 3,
            name: "resize".into(),
        };
        let mut tx = store.begin();
        jobs.enqueue(&mut tx, job.clone()).unwrap();
        tx.blocking_commit().unwrap();

        // Aborted: the job stays, no outcome. (An abort, not a drop: on PostgreSQL a dropped
        // transaction rolls back in a task, so its items are back a moment later, S4.)
        let mut tx = store.begin();
        let got = jobs.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        assert_eq!(got, job);
        outcomes.enqueue(&mut tx, Outcome::Failed(got.id)).unwrap();
        tx.blocking_abort().unwrap();
        assert_eq!(
            (
                jobs.blocking_count().unwrap(),
                outcomes.blocking_count().unwrap()
            ),
            (1, 0)
        );

        // Committed: the job is gone, the outcome is there.
        let mut tx = store.begin();
        let got = jobs.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        let done = Outcome::Done {
            job: got.id,
            note: format!("{} ok", got.name),
        };
        outcomes.enqueue(&mut tx, done.clone()).unwrap();
        tx.blocking_commit().unwrap();
        assert!(drain(store, &jobs).is_empty());
        assert_eq!(drain(store, &outcomes), [done]);
    });
}

/// S3, S7: a committed move is there, whole, for the next process (in memory nothing
/// outlives the store, S9: nothing to check).
fn committed_move_survives_a_restart(engine: &'static Engine) {
    let at = engine.store();
    {
        let store = &at.store;
        let a = store.blocking_queue::<u64>("a").unwrap();
        let b = store.blocking_queue::<String>("b").unwrap();
        let mut tx = store.begin();
        a.enqueue(&mut tx, 1).unwrap();
        a.enqueue(&mut tx, 2).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        let item = a.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        b.enqueue(&mut tx, format!("moved {item}")).unwrap();
        tx.blocking_commit().unwrap();
    }
    if !at.durable() {
        return;
    }
    at.store.clone().blocking_close().unwrap();
    let store = at.reopen().expect("a store on disk or on a server");
    let a = store.blocking_queue::<u64>("a").unwrap();
    let b = store.blocking_queue::<String>("b").unwrap();
    assert_eq!(drain(&store, &a), [2]);
    assert_eq!(drain(&store, &b), ["moved 1"]);
}

fn three_queue_transaction_commits_all_or_nothing(engine: &'static Engine) {
    on(engine, |store| {
        let inbox = store.blocking_queue::<u32>("inbox").unwrap();
        let audit = store.blocking_queue::<String>("audit").unwrap();
        let out = store.blocking_queue::<(u32, bool)>("out").unwrap();
        let mut tx = store.begin();
        inbox.enqueue(&mut tx, 1).unwrap();
        inbox.enqueue(&mut tx, 2).unwrap();
        tx.blocking_commit().unwrap();

        let work = |store: &Store| {
            let mut tx = store.begin();
            let x = inbox.blocking_try_dequeue(&mut tx).unwrap().unwrap();
            audit.enqueue(&mut tx, format!("saw {x}")).unwrap();
            out.enqueue(&mut tx, (x, true)).unwrap();
            assert_eq!(
                (
                    inbox.blocking_count().unwrap(),
                    audit.blocking_count().unwrap(),
                    out.blocking_count().unwrap()
                ),
                (1, 0, 0)
            );
            (tx, x)
        };

        let (tx, _) = work(store);
        tx.blocking_abort().expect("abort");
        assert_eq!(
            (
                inbox.blocking_count().unwrap(),
                audit.blocking_count().unwrap(),
                out.blocking_count().unwrap()
            ),
            (2, 0, 0)
        );

        let (tx, x) = work(store);
        tx.blocking_commit().unwrap();
        assert_eq!(
            (
                inbox.blocking_count().unwrap(),
                audit.blocking_count().unwrap(),
                out.blocking_count().unwrap()
            ),
            (1, 1, 1)
        );
        assert_eq!(drain(store, &audit), [format!("saw {x}")]);
        assert_eq!(drain(store, &out), [(x, true)]);
        let rest = drain(store, &inbox);
        assert_eq!(rest.len(), 1);
        assert_ne!(rest[0], x);
    });
}

/// A transaction of a store of `engine` with the queue of another store of it, and of a store
/// of every engine of the suite, both ways.
fn transaction_of_another_store_is_rejected_and_changes_nothing(engine: &'static Engine) {
    let mine = engine.store();
    let others: Vec<_> = std::iter::once(engine)
        .chain(ENGINES)
        .map(|other| other.store())
        .collect();
    let pairs = others
        .iter()
        .flat_map(|other| [(&mine.store, &other.store), (&other.store, &mine.store)]);
    for (n, (mine, theirs)) in pairs.enumerate() {
        let queue = theirs.blocking_queue::<u32>(&format!("q{n}")).unwrap();
        let mut setup = theirs.begin();
        queue.enqueue(&mut setup, 5).unwrap();
        setup.blocking_commit().unwrap();

        let mut tx = mine.begin();
        match queue.enqueue(&mut tx, 6) {
            Err(Error::WrongStore { queue: name }) => assert_eq!(name, queue.name()),
            other => panic!("enqueue with a foreign transaction: {other:?}"),
        }
        assert!(matches!(
            queue.blocking_try_dequeue(&mut tx),
            Err(Error::WrongStore { .. })
        ));
        assert!(matches!(
            queue.blocking_dequeue_timeout(&mut tx, Duration::from_millis(1)),
            Err(Error::WrongStore { .. })
        ));
        assert_eq!((tx.enqueued(), tx.dequeued()), (0, 0));
        assert_eq!(
            queue.blocking_count().unwrap(),
            1,
            "the foreign queue kept its item"
        );
        tx.blocking_commit().unwrap();
        assert_eq!(peek_all(theirs, &queue), [5]);
    }
}

fn a_clone_of_the_store_is_the_same_store(engine: &'static Engine) {
    on(engine, |store| {
        let other = store.clone();
        let queue = other.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 1).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(
            store
                .blocking_queue::<u32>("q")
                .unwrap()
                .blocking_count()
                .unwrap(),
            1
        );
    });
}

fn committing_an_empty_transaction_is_ok(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        store.begin().blocking_commit().unwrap();

        // A transaction whose dequeue found nothing is empty too.
        let mut tx = store.begin();
        assert_eq!(queue.blocking_try_dequeue(&mut tx).unwrap(), None);
        tx.blocking_commit().unwrap();

        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(store.begin().commit()).unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

fn async_commit_applies_the_transaction(engine: &'static Engine) {
    on(engine, |store| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let queue = store.blocking_queue::<u64>("q").unwrap();
        let done = store.blocking_queue::<u64>("done").unwrap();
        runtime.block_on(async {
            // Consumers wait for items; producers commit asynchronously.
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let (store, queue, done) = (store.clone(), queue.clone(), done.clone());
                    tokio::spawn(async move {
                        for _ in 0..10 {
                            let mut tx = store.begin();
                            let item = queue.dequeue(&mut tx).await.unwrap();
                            done.enqueue(&mut tx, item).unwrap();
                            tx.commit().await.unwrap();
                        }
                    })
                })
                .collect();
            let producers: Vec<_> = (0..4u64)
                .map(|p| {
                    let (store, queue) = (store.clone(), queue.clone());
                    tokio::spawn(async move {
                        for i in 0..5 {
                            let mut tx = store.begin();
                            queue.enqueue(&mut tx, p * 100 + i).unwrap();
                            tx.commit().await.unwrap();
                        }
                    })
                })
                .collect();
            for task in producers.into_iter().chain(consumers) {
                tokio::time::timeout(Duration::from_secs(30), task)
                    .await
                    .expect("tasks finish")
                    .unwrap();
            }
        });
        assert_eq!(queue.blocking_count().unwrap(), 0);
        let mut moved = drain(store, &done);
        moved.sort_unstable();
        let expected: Vec<u64> = (0..4)
            .flat_map(|p| (0..5).map(move |i| p * 100 + i))
            .collect();
        assert_eq!(moved, expected);
    });
}

fn blocking_dequeue_timeout_gives_none_on_an_empty_queue(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        let start = Instant::now();
        let got = queue
            .blocking_dequeue_timeout(&mut tx, Duration::from_millis(50))
            .unwrap();
        assert_eq!(got, None);
        assert!(
            start.elapsed() >= Duration::from_millis(50),
            "waited the timeout"
        );
        assert_eq!(tx.dequeued(), 0);
        assert_eq!(queue.waiters(), 0, "the request was withdrawn");
        tx.blocking_commit().unwrap();
    });
}

fn blocking_dequeue_timeout_gets_an_item_once_committed(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let consumer = {
            let (store, queue) = (store.clone(), queue.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let got = queue
                    .blocking_dequeue_timeout(&mut tx, Duration::from_secs(30))
                    .unwrap();
                tx.blocking_commit().unwrap();
                got
            })
        };
        wait_until("the consumer to wait", || queue.waiters() == 1);
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 42).unwrap();
        assert_eq!(queue.waiters(), 1, "an uncommitted item wakes nobody");
        tx.blocking_commit().unwrap();
        assert_eq!(consumer.join().unwrap(), Some(42));
        assert_eq!(queue.blocking_count().unwrap(), 0);
        assert!(drain(store, &queue).is_empty());
    });
}

fn waiting_consumer_gets_an_item_another_transaction_aborts(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 9).unwrap();
        tx.blocking_commit().unwrap();

        let mut holder = store.begin();
        assert_eq!(queue.blocking_try_dequeue(&mut holder).unwrap(), Some(9));
        let consumer = {
            let (store, queue) = (store.clone(), queue.clone());
            thread::spawn(move || {
                let mut tx = store.begin();
                let got = queue.blocking_dequeue(&mut tx).unwrap();
                tx.blocking_commit().unwrap();
                got
            })
        };
        wait_until("the consumer to wait", || queue.waiters() == 1);
        holder.blocking_abort().expect("abort");
        assert_eq!(consumer.join().unwrap(), 9);
        assert_eq!(queue.blocking_count().unwrap(), 0);
    });
}

/// `try_dequeue_many` takes up to n items at the front, in order, held like single dequeues:
/// out of `count`, out of the next batch, back at the front on abort.
fn a_batch_dequeue_takes_up_to_n_at_the_front(engine: &'static Engine) {
    on(engine, |store| {
        let q = store.blocking_queue::<u32>("batch").unwrap();
        let mut tx = store.begin();
        for i in 0..10 {
            q.enqueue(&mut tx, i).unwrap();
        }
        tx.blocking_commit().unwrap();
        let mut a = store.begin();
        assert_eq!(
            q.blocking_try_dequeue_many(&mut a, 4).unwrap(),
            [0, 1, 2, 3]
        );
        assert_eq!((a.dequeued(), q.blocking_count().unwrap()), (4, 6));
        let mut b = store.begin();
        assert_eq!(
            q.blocking_try_dequeue_many(&mut b, 64).unwrap(),
            [4, 5, 6, 7, 8, 9]
        );
        assert!(q.blocking_try_dequeue_many(&mut b, 64).unwrap().is_empty());
        a.blocking_abort().unwrap();
        b.blocking_commit().unwrap();
        assert_eq!(drain(store, &q), [0, 1, 2, 3]);
    });
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(move_between_queues_aborted_leaves_both_unchanged),
        engine_case!(move_between_queues_committed_moves_the_item),
        engine_case!(move_between_queues_of_different_item_types),
        engine_case!(committed_move_survives_a_restart),
        engine_case!(three_queue_transaction_commits_all_or_nothing),
        engine_case!(transaction_of_another_store_is_rejected_and_changes_nothing),
        engine_case!(a_clone_of_the_store_is_the_same_store),
        engine_case!(committing_an_empty_transaction_is_ok),
        engine_case!(async_commit_applies_the_transaction),
        engine_case!(blocking_dequeue_timeout_gives_none_on_an_empty_queue),
        engine_case!(blocking_dequeue_timeout_gets_an_item_once_committed),
        engine_case!(waiting_consumer_gets_an_item_another_transaction_aborts),
        engine_case!(a_batch_dequeue_takes_up_to_n_at_the_front),
    ]
}
