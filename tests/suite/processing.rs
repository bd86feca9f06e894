//! The processing layer (P1-P11) on every engine of the conformance suite
//! (`tests/common/engines.rs`: memory, sled, and PostgreSQL when the crate is built with the
//! `postgres` feature; without a server the output says PostgreSQL was skipped), with an
//! injected clock: no test sleeps for an expiry or a backoff. Where an engine's documented
//! behaviour differs (ARCHITECTURE.md, "Where this engine differs"), the test says so next to
//! the assertion.

use crate::common;
use crate::engine_case;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use common::engines::{Engine, EngineStore};
use common::scenarios::fill;
use reliable_queue::{
    Error, Failed, ImportedItem, ItemState, ManualClock, QueueStats, Replay, RetryPolicy, Store,
    MAX_ATTEMPTS, MAX_DELAY, MAX_TTL,
};

const START: u64 = 1_700_000_000_000;
const TTL: Duration = Duration::from_secs(30);

fn clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_millis(START)).unwrap()
}

/// A fresh store of `engine` on `clock`: the engine's name, the store, and the engine's
/// handle on the store's place (a directory, a schema), for a restart.
fn open(engine: &'static Engine, clock: &ManualClock) -> (&'static str, Store, EngineStore) {
    let clock = clock.clone();
    let at = engine.store_with(move |b| b.clock(clock.clone()));
    (engine.name, at.store.clone(), at)
}

/// The store as the next process finds it, where its data outlives it (sled, PostgreSQL):
/// closed and opened again on the same data, on the same clock; `None` in memory, where
/// nothing outlives the store (S9).
fn next_process(store: Store, at: &EngineStore) -> Option<Store> {
    if !at.durable() {
        return None;
    }
    store.blocking_close().unwrap();
    at.reopen()
}

/// [`next_process`], or the same store in memory.
fn restarted(store: Store, at: &EngineStore) -> Store {
    match at.durable() {
        true => next_process(store, at).expect("a store on disk or on a server"),
        false => store,
    }
}

/// Waits (bounded) until `done` holds: for what an engine does in the background, such as
/// PostgreSQL's rollback of a dropped transaction or release of a dropped lease (sent
/// without blocking the dropper).
fn eventually(name: &str, what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{name}: {what}, still not after 10 s"
        );
        std::thread::yield_now();
    }
}

fn no_jitter(max: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(max)
        .initial_backoff(Duration::from_secs(1))
        .max_backoff(Duration::from_secs(60))
        .jitter(0.0)
}

fn p1_a_lease_hides_the_item_and_counts_the_attempt(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2]);
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(*lease.item(), 1, "{name}");
        assert_eq!(lease.attempt(), 1, "{name}");
        assert_eq!(
            lease.deadline(),
            UNIX_EPOCH + Duration::from_millis(START) + TTL,
            "{name}"
        );
        let stats = q.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.leased), (1, 1), "{name}");
        assert!(matches!(
            q.blocking_lease(Duration::ZERO),
            Err(Error::InvalidArgument {
                argument: "ttl",
                ..
            })
        ));
        assert!(matches!(
            q.blocking_lease(MAX_TTL + Duration::from_secs(1)),
            Err(Error::InvalidArgument { .. })
        ));
        lease.blocking_complete().unwrap();
        let many = q.blocking_lease_many(5, TTL).unwrap();
        assert_eq!(many.len(), 1, "{name}: only one item left");
        drop(many);
        // On PostgreSQL the drop sends the release from a task: a round trip later.
        eventually(name, "a dropped lease gives back", || {
            q.blocking_count().unwrap() == 1
        });
    }
}

fn p2_expiry_returns_the_item_to_the_head_and_counts_the_attempts(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        q.blocking_set_retry_policy(no_jitter(2)).unwrap();
        fill(&store, &q, [1, 2]);
        let first = q.blocking_lease(TTL).unwrap();
        clock.advance(TTL - Duration::from_millis(1));
        assert_eq!(q.blocking_count().unwrap(), 1, "{name}: not yet expired");
        clock.advance(Duration::from_millis(1));
        assert_eq!(q.blocking_count().unwrap(), 2, "{name}: expired");
        // Back at the head.
        let second = q.blocking_lease(TTL).unwrap();
        assert_eq!((*second.item(), second.attempt()), (1, 2), "{name}");
        // Fencing: the first holder's lease is over.
        assert!(matches!(
            first.blocking_complete(),
            Err(Error::LeaseExpired { .. })
        ));
        // Expiry at the maximum attempts: dead letters.
        clock.advance(TTL);
        let stats = q.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.dead), (1, 1), "{name}");
        let dead = q.blocking_dead_letters(None, 10).unwrap();
        assert_eq!((dead[0].item, dead[0].attempts), (1, 2), "{name}");
        assert_eq!(dead[0].reason, "lease expired");
        assert!(matches!(
            second.blocking_fail("late"),
            Err(Error::LeaseExpired { .. })
        ));
    }
}

fn a_holder_whose_lease_expired_cannot_ack_and_the_next_holder_completes_it_once(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let out = store.blocking_queue::<u64>("out").unwrap();
        fill(&store, &q, [7]);
        let slow = q.blocking_lease(TTL).unwrap();
        clock.advance(TTL);
        let fast = q.blocking_lease(TTL).unwrap();
        let mut tx = store.begin();
        out.enqueue(&mut tx, 7).unwrap();
        fast.ack(&mut tx).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        out.enqueue(&mut tx, 7).unwrap();
        if engine.on_server() {
            // The database's clock decides, at commit: the whole commit fails.
            slow.ack(&mut tx).unwrap();
            assert!(
                matches!(tx.blocking_commit(), Err(Error::LeaseExpired { .. })),
                "{name}"
            );
        } else {
            assert!(
                matches!(slow.ack(&mut tx), Err(Error::LeaseExpired { .. })),
                "{name}"
            );
            drop(tx);
        }
        assert_eq!(
            common::drain(&store, &out),
            vec![7],
            "{name}: completed once"
        );
        assert_eq!(q.blocking_stats().unwrap(), Default::default(), "{name}");
    }
}

fn p3_an_ack_whose_lease_expires_before_commit_fails_the_whole_commit(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let out = store.blocking_queue::<u64>("out").unwrap();
        fill(&store, &q, [1, 2]);
        let lease = q.blocking_lease(TTL).unwrap();
        let mut tx = store.begin();
        out.enqueue(&mut tx, 100).unwrap();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
        lease.ack(&mut tx).unwrap();
        clock.advance(TTL);
        assert!(
            matches!(tx.blocking_commit(), Err(Error::LeaseExpired { .. })),
            "{name}"
        );
        assert_eq!(out.blocking_count().unwrap(), 0, "{name}: nothing applied");
        assert_eq!(q.blocking_count().unwrap(), 2, "{name}: both items back");
    }
}

fn p4_extend_is_the_heartbeat(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1]);
        let mut lease = q.blocking_lease(TTL).unwrap();
        clock.advance(TTL / 2);
        lease.blocking_extend(TTL).unwrap();
        clock.advance(TTL / 2 + Duration::from_secs(1));
        assert_eq!(
            q.blocking_stats().unwrap().leased,
            1,
            "{name}: still leased"
        );
        assert!(matches!(
            lease.blocking_extend(Duration::ZERO),
            Err(Error::InvalidArgument { .. })
        ));
        lease.blocking_complete().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 0, "{name}");
    }
}

/// The batch consumer's loop: the acks of one batch and the attempts of the next commit
/// together, all or nothing.
fn commit_and_lease_acks_one_batch_and_leases_the_next_in_one_commit(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let out = store.blocking_queue::<u64>("out").unwrap();
        fill(&store, &q, [1, 2, 3, 4, 5]);
        let mut tx = store.begin();
        for lease in q.blocking_lease_many(2, TTL).unwrap() {
            out.enqueue(&mut tx, *lease.item() * 10).unwrap();
            lease.ack(&mut tx).unwrap();
        }
        let next = q.blocking_commit_and_lease(tx, 2, TTL).unwrap();
        let taken: Vec<(u64, u32)> = next.iter().map(|l| (*l.item(), l.attempt())).collect();
        assert_eq!(taken, [(3, 1), (4, 1)], "{name}");
        let stats = q.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.leased), (1, 2), "{name}");
        assert_eq!(
            out.blocking_count().unwrap(),
            2,
            "{name}: the commit applied"
        );

        // An ack whose lease ended fails the commit: nothing applies, no lease is granted,
        // and the item the call took is back with its attempt uncounted.
        let mut tx = store.begin();
        out.enqueue(&mut tx, 99).unwrap();
        for lease in next {
            lease.ack(&mut tx).unwrap();
        }
        clock.advance(TTL);
        assert!(
            matches!(
                q.blocking_commit_and_lease(tx, 3, TTL),
                Err(Error::LeaseExpired { .. })
            ),
            "{name}"
        );
        assert_eq!(
            out.blocking_count().unwrap(),
            2,
            "{name}: nothing of the failed commit"
        );
        let mut attempts: Vec<(u64, u32)> = q
            .blocking_lease_many(3, TTL)
            .unwrap()
            .into_iter()
            .map(|l| {
                let seen = (*l.item(), l.attempt());
                drop(l);
                seen
            })
            .collect();
        attempts.sort_unstable();
        assert_eq!(attempts, [(3, 2), (4, 2), (5, 1)], "{name}");
        eventually(name, "the dropped leases are given back", || {
            q.blocking_stats().unwrap().leased == 0
        });

        // Nothing visible: no lease, and the commit still applies.
        let leases = q.blocking_lease_many(3, TTL).unwrap();
        let mut tx = store.begin();
        for lease in leases {
            lease.ack(&mut tx).unwrap();
        }
        out.enqueue(&mut tx, 7).unwrap();
        assert!(q.blocking_commit_and_lease(tx, 3, TTL).unwrap().is_empty());
        let stats = q.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.leased), (0, 0), "{name}");
        assert_eq!(out.blocking_count().unwrap(), 3, "{name}");
        if let Some(store) = next_process(store, &dir) {
            let q = store.blocking_queue::<u64>("q").unwrap();
            assert_eq!(
                q.blocking_count().unwrap(),
                0,
                "{name}: the acks are durable"
            );
            assert_eq!(
                store
                    .blocking_queue::<u64>("out")
                    .unwrap()
                    .blocking_count()
                    .unwrap(),
                3
            );
        }
    }
}

/// An item that does not decode stops `commit_and_lease` before it, at the front; the commit
/// applies, and the next lease reports the item.
fn commit_and_lease_leaves_an_undecodable_item_at_the_front(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<bool>("mixed").unwrap();
        let raw = store.blocking_queue::<u64>("mixed").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, true).unwrap();
        q.enqueue(&mut tx, true).unwrap();
        raw.enqueue(&mut tx, 7).unwrap();
        q.enqueue(&mut tx, false).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        q.blocking_lease(TTL).unwrap().ack(&mut tx).unwrap();
        let next = q.blocking_commit_and_lease(tx, 5, TTL).unwrap();
        assert_eq!(next.len(), 1, "{name}: stopped before the undecodable item");
        next.into_iter()
            .next()
            .unwrap()
            .blocking_complete()
            .unwrap();
        let stats = q.blocking_stats().unwrap();
        assert_eq!(
            (stats.visible, stats.leased, stats.held),
            (2, 0, 0),
            "{name}"
        );
        assert!(
            matches!(q.blocking_lease(TTL), Err(Error::Deserialize { .. })),
            "{name}"
        );
        assert_eq!(raw.blocking_lease(TTL).unwrap().item(), &7, "{name}");
    }
}

fn p5_fail_retries_after_the_backoff_then_buries_and_release_keeps_the_attempts(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        q.blocking_set_retry_policy(no_jitter(3)).unwrap();
        fill(&store, &q, [1]);
        let lease = q.blocking_lease(TTL).unwrap();
        let now = clock.now();
        assert_eq!(
            lease.blocking_fail("boom").unwrap(),
            Failed::Retry {
                at: now + Duration::from_secs(1)
            },
            "{name}"
        );
        assert_eq!(q.blocking_stats().unwrap().delayed, 1, "{name}");
        assert!(
            q.blocking_try_lease(TTL).unwrap().is_none(),
            "{name}: backing off"
        );
        clock.advance(Duration::from_secs(1));
        let lease = q.blocking_try_lease(TTL).unwrap().expect("due again");
        assert_eq!(lease.attempt(), 2, "{name}");
        // Release without a failure: back at once, attempts unchanged.
        lease.blocking_release(Duration::ZERO).unwrap();
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            lease.attempt(),
            3,
            "{name}: each lease counts, a release does not"
        );
        assert_eq!(
            lease.blocking_fail("boom again").unwrap(),
            Failed::Dead,
            "{name}"
        );
        let dead = q.blocking_dead_letters(None, 10).unwrap();
        assert_eq!(dead.len(), 1, "{name}");
        assert_eq!(
            (dead[0].item, dead[0].attempts, dead[0].reason.as_str()),
            (1, 3, "boom again")
        );
        assert!(dead[0].first_attempt.is_some() && dead[0].last_attempt >= dead[0].first_attempt);
        // The policy is kept in the store.
        if let Some(store) = next_process(store, &dir) {
            let q = store.blocking_queue::<u64>("q").unwrap();
            assert_eq!(q.retry_policy(), no_jitter(3));
            let dead = q.blocking_dead_letters(None, 10).unwrap();
            assert_eq!(
                (dead[0].item, dead[0].attempts),
                (1, 3),
                "dead letters survive a restart"
            );
        }
    }
}

fn p6_delayed_items_are_invisible_until_due_then_come_in_due_order_and_survive_restart(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 3, Duration::from_secs(30))
            .unwrap();
        q.enqueue_after(&mut tx, 2, Duration::from_secs(20))
            .unwrap();
        q.enqueue_after(&mut tx, 0, Duration::ZERO).unwrap();
        assert!(matches!(
            q.enqueue_at(&mut tx, 9, UNIX_EPOCH - Duration::from_secs(1)),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            q.enqueue_after(&mut tx, 9, Duration::MAX),
            Err(Error::InvalidArgument { .. })
        ));
        tx.blocking_commit().unwrap();
        assert_eq!(q.blocking_stats().unwrap().delayed, 2, "{name}");
        assert_eq!(
            common::drain(&store, &q),
            vec![0],
            "{name}: a zero delay is plain"
        );
        let store = restarted(store, &dir);
        let q = store.blocking_queue::<u64>("q").unwrap();
        assert_eq!(
            q.blocking_stats().unwrap().delayed,
            2,
            "{name}: kept across restart"
        );
        clock.advance(Duration::from_secs(30));
        assert_eq!(common::drain(&store, &q), vec![2, 3], "{name}: due order");
    }
}

fn a_waiting_consumer_is_woken_when_a_delayed_item_falls_due(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 5, Duration::from_secs(10))
            .unwrap();
        tx.blocking_commit().unwrap();
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || *q.blocking_lease(TTL).unwrap().item())
        };
        while q.waiters() == 0 {
            std::thread::yield_now();
        }
        clock.advance(Duration::from_secs(10));
        assert_eq!(consumer.join().unwrap(), 5, "{name}");
    }
}

fn p7_dead_letters_replay_and_purge(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        q.blocking_set_retry_policy(no_jitter(1)).unwrap();
        fill(&store, &q, [1, 2, 3]);
        for _ in 0..3 {
            q.blocking_lease(TTL)
                .unwrap()
                .blocking_fail("poison")
                .unwrap();
        }
        assert_eq!(q.blocking_stats().unwrap().dead, 3, "{name}");
        let store = restarted(store, &dir);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let dead = q.blocking_dead_letters(None, 10).unwrap();
        assert_eq!(
            dead.iter().map(|d| d.item).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "{name}"
        );
        let page = q.blocking_dead_letters(Some(dead[0].id), 1).unwrap();
        assert_eq!(page[0].item, 2, "{name}: paged");
        assert!(matches!(
            q.blocking_replay(Replay::Ids(vec![dead[0].id, 12345]), true),
            Err(Error::NotDeadLetter { id: 12345, .. })
        ));
        assert_eq!(
            q.blocking_stats().unwrap().dead,
            3,
            "{name}: nothing replayed"
        );
        assert_eq!(
            q.blocking_replay(Replay::Ids(vec![dead[0].id]), true)
                .unwrap(),
            1
        );
        assert_eq!(q.blocking_replay(Replay::First(1), false).unwrap(), 1);
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (1, 1),
            "{name}: attempts reset"
        );
        lease.blocking_complete().unwrap();
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (2, 2),
            "{name}: attempts kept"
        );
        lease.blocking_complete().unwrap();
        assert_eq!(q.blocking_purge(Replay::All).unwrap(), 1, "{name}");
        assert_eq!(q.blocking_stats().unwrap(), Default::default(), "{name}");
        if let Some(store) = next_process(store, &dir) {
            let q = store.blocking_queue::<u64>("q").unwrap();
            assert_eq!(
                q.blocking_stats().unwrap(),
                Default::default(),
                "{name}: after restart"
            );
        }
    }
}

fn p8_browse_lists_without_consuming_and_stats_count_every_state(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2, 3]);
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 4, Duration::from_secs(5)).unwrap();
        tx.blocking_commit().unwrap();
        let lease = q.blocking_lease(TTL).unwrap();
        let mut held = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(2));
        let stats = q.blocking_stats().unwrap();
        assert_eq!(
            (
                stats.visible,
                stats.delayed,
                stats.leased,
                stats.held,
                stats.dead
            ),
            (1, 1, 1, 1, 0),
            "{name}"
        );
        assert_eq!(
            stats.front_enqueued_at,
            Some(UNIX_EPOCH + Duration::from_millis(START)),
            "{name}"
        );
        let all = q.blocking_browse(None, 10).unwrap();
        let items: Vec<u64> = all.iter().map(|b| b.item).collect();
        // By id. The embedded engines give a leased item a new id (a new version of it);
        // on PostgreSQL it keeps its row and id.
        let (ready, delayed, leased) = if name == "postgres" {
            assert_eq!(items, vec![1, 3, 4], "{name}: by id");
            (1, 2, 0)
        } else {
            assert_eq!(
                items,
                vec![3, 4, 1],
                "{name}: by id; the lease has a newer id"
            );
            (0, 1, 2)
        };
        assert!(matches!(all[ready].state, ItemState::Ready));
        assert!(matches!(all[delayed].state, ItemState::Delayed { .. }));
        assert!(matches!(
            all[leased].state,
            ItemState::Leased { attempt: 1, .. }
        ));
        assert_eq!(
            all[ready].enqueued_at,
            Some(UNIX_EPOCH + Duration::from_millis(START))
        );
        let page = q.blocking_browse(Some(all[0].id), 1).unwrap();
        assert_eq!(page[0].item, all[1].item, "{name}");
        drop(held);
        drop(lease);
        eventually(name, "browse took nothing", || {
            q.blocking_count().unwrap() == 3
        });
    }
}

fn a_plain_dequeue_and_abort_is_not_an_attempt(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1]);
        for _ in 0..3 {
            let mut tx = store.begin();
            q.blocking_try_dequeue(&mut tx).unwrap();
            tx.blocking_abort().unwrap();
        }
        assert_eq!(q.blocking_lease(TTL).unwrap().attempt(), 1, "{name}");
    }
}

/// An imported item keeps its attempts, due time and times; an imported dead letter its
/// reason; both survive a restart; an aborted import leaves nothing.
fn an_import_keeps_attempts_due_times_and_dead_letters_and_survives_restart(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        // The clock runs on from one engine's turn to the next.
        let now = clock.now();
        let at = |ms: i64| {
            if ms < 0 {
                now - Duration::from_millis(ms.unsigned_abs())
            } else {
                now + Duration::from_millis(ms.unsigned_abs())
            }
        };
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.import(&mut tx, 1, &ImportedItem::default()).unwrap();
        tx.blocking_abort().unwrap();
        assert_eq!(
            q.blocking_stats().unwrap(),
            QueueStats::default(),
            "{name}: aborted"
        );

        let mut tx = store.begin();
        let leased_before = ImportedItem {
            attempts: 2,
            enqueued_at: Some(at(-60_000)),
            first_attempt: Some(at(-50_000)),
            last_attempt: Some(at(-40_000)),
            ..ImportedItem::default()
        };
        q.import(&mut tx, 10, &leased_before).unwrap();
        let later = ImportedItem {
            due: Some(at(20_000)),
            ..ImportedItem::default()
        };
        q.import(&mut tx, 11, &later).unwrap();
        let dead = ImportedItem {
            attempts: 5,
            enqueued_at: Some(at(-90_000)),
            ..ImportedItem::default()
        };
        q.import_dead_letter(&mut tx, 12, &dead, "poison").unwrap();
        assert!(matches!(
            q.import(
                &mut tx,
                9,
                &ImportedItem {
                    due: Some(UNIX_EPOCH - Duration::from_secs(1)),
                    ..ImportedItem::default()
                }
            ),
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(
            q.blocking_count().unwrap(),
            0,
            "{name}: invisible until commit"
        );
        tx.blocking_commit().unwrap();

        let store = restarted(store, &dir);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let stats = q.blocking_stats().unwrap();
        assert_eq!(
            (stats.visible, stats.delayed, stats.dead),
            (1, 1, 1),
            "{name}"
        );
        let browsed = q.blocking_browse(None, 10).unwrap();
        let ten = browsed.iter().find(|b| b.item == 10).unwrap();
        assert_eq!(ten.attempts, 2, "{name}");
        assert_eq!(ten.enqueued_at, Some(at(-60_000)), "{name}");
        let eleven = browsed.iter().find(|b| b.item == 11).unwrap();
        assert_eq!(
            eleven.state,
            ItemState::Delayed { until: at(20_000) },
            "{name}"
        );
        let letters = q.blocking_dead_letters(None, 10).unwrap();
        assert_eq!(letters.len(), 1, "{name}");
        assert_eq!(
            (
                letters[0].item,
                letters[0].reason.as_str(),
                letters[0].attempts
            ),
            (12, "poison", 5),
            "{name}"
        );
        assert_eq!(letters[0].enqueued_at, Some(at(-90_000)), "{name}");

        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (10, 3),
            "{name}: attempts carried on"
        );
        lease.blocking_complete().unwrap();
        clock.advance(Duration::from_secs(20));
        assert_eq!(
            common::drain(&store, &q),
            vec![11],
            "{name}: due at its time"
        );
        assert_eq!(q.blocking_replay(Replay::All, false).unwrap(), 1, "{name}");
        assert_eq!(common::drain(&store, &q), vec![12], "{name}: replayed");
    }
}

/// P2: the attempt is durable across a restart; on the embedded engines a restart ends every
/// lease of the previous process, on PostgreSQL a lease outlives restarts and ends at its
/// deadline (DESIGN.md, P2). In memory nothing outlives the store (S9): nothing to check.
fn attempts_survive_a_restart_and_a_restart_ends_leases(engine: &'static Engine) {
    let clock = clock();
    let (name, store, at) = open(engine, &clock);
    let q = store.blocking_queue::<u64>("q").unwrap();
    fill(&store, &q, [1]);
    let lease = q.blocking_lease(TTL).unwrap();
    std::mem::forget(lease); // the holder "dies" with the process
    let Some(store) = next_process(store, &at) else {
        return;
    };
    let q = store.blocking_queue::<u64>("q").unwrap();
    if engine.on_server() {
        assert_eq!(
            q.blocking_count().unwrap(),
            0,
            "the lease outlives the restart"
        );
        clock.advance(TTL);
    }
    assert_eq!(q.blocking_count().unwrap(), 1, "{name}: the lease is over");
    assert_eq!(
        q.blocking_lease(TTL).unwrap().attempt(),
        2,
        "{name}: the attempt was durable"
    );
}

fn a_lease_settled_with_another_store_is_refused(engine: &'static Engine) {
    let clock = clock();
    let (name, a, _a) = open(engine, &clock);
    let (_, b, _b) = open(engine, &clock);
    let qa = a.blocking_queue::<u64>("q").unwrap();
    fill(&a, &qa, [1]);
    let lease = qa.blocking_lease(TTL).unwrap();
    let mut tx = b.begin();
    assert!(matches!(lease.ack(&mut tx), Err(Error::WrongStore { .. })));
    // On PostgreSQL the refused lease is given back from a task: a round trip later.
    eventually(name, "given back, nothing lost", || {
        qa.blocking_count().unwrap() == 1
    });
}

/// A lease acked with a transaction of another store of the same engine is refused
/// (`WrongStore`), the other transaction is left as it was, and the item is given back at
/// once, as by a dropped lease (`ack` takes the lease), its attempt counted. On PostgreSQL
/// the release is sent from a task, so it is visible a round trip later; the clock never
/// moves here, so nothing but the release can bring the item back.
fn a_lease_acked_with_another_stores_transaction_is_given_back_at_once(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let (_, other, _other_dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let elsewhere = other.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1]);
        let lease = q.blocking_lease(TTL).unwrap();
        let mut tx = other.begin();
        elsewhere.enqueue(&mut tx, 2).unwrap();
        match lease.ack(&mut tx) {
            Err(Error::WrongStore { queue }) => assert_eq!(queue, "q", "{name}"),
            got => panic!("{name}: expected WrongStore, got {got:?}"),
        }
        eventually(name, "the item is given back", || {
            q.blocking_count().unwrap() == 1
        });
        assert_eq!(q.blocking_stats().unwrap().leased, 0, "{name}");
        tx.blocking_commit().unwrap();
        assert_eq!(
            elsewhere.blocking_count().unwrap(),
            1,
            "{name}: the other store's transaction is intact"
        );
        let again = q.blocking_lease(TTL).unwrap();
        assert_eq!((*again.item(), again.attempt()), (1, 2), "{name}");
        again.blocking_complete().unwrap();
    }
}

/// A retry policy past what every engine can store (PostgreSQL keeps the maximum attempts in
/// an `int4` and the backoffs as milliseconds in an `int8`) is clamped to the documented
/// maxima, `MAX_ATTEMPTS` and `MAX_DELAY`, the same on every engine; a failure under it is a
/// retry due at the longest backoff, not an error that leaves the item leased.
fn a_retry_policy_past_the_storage_maxima_is_clamped_and_a_failure_retries(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let huge = RetryPolicy::default()
            .max_attempts(u32::MAX)
            .initial_backoff(Duration::MAX)
            .max_backoff(Duration::MAX)
            .jitter(0.0);
        q.blocking_set_retry_policy(huge).unwrap();
        fill(&store, &q, [1, 2]);
        let lease = q.blocking_lease(TTL).unwrap();
        let now = clock.now();
        assert_eq!(
            lease.blocking_fail("boom").unwrap(),
            Failed::Retry {
                at: now + MAX_DELAY
            },
            "{name}"
        );
        // With the widest jitter the wait is at most twice the longest backoff.
        q.blocking_set_retry_policy(huge.jitter(1.0)).unwrap();
        let lease = q.blocking_lease(TTL).unwrap();
        match lease.blocking_fail("boom") {
            Ok(Failed::Retry { at }) => assert!(at <= now + 2 * MAX_DELAY, "{name}"),
            got => panic!("{name}: expected a retry, got {got:?}"),
        }
        let stats = q.blocking_stats().unwrap();
        assert_eq!(
            (stats.visible, stats.delayed, stats.leased, stats.dead),
            (0, 2, 0, 0),
            "{name}"
        );
        assert_eq!(huge.attempts_allowed(), MAX_ATTEMPTS);
        assert_eq!(huge.backoff(1, 0), MAX_DELAY);
        assert_eq!(huge.backoff(40, 0), MAX_DELAY);
        // As stored: `stats` reads it back on PostgreSQL, a restart on sled.
        assert_eq!(q.retry_policy(), huge.jitter(1.0), "{name}");
        if let Some(store) = next_process(store, &dir) {
            let q = store.blocking_queue::<u64>("q").unwrap();
            assert_eq!(
                q.retry_policy(),
                huge.jitter(1.0),
                "{name}: after a restart"
            );
        }
    }
}

/// An import refuses attempts past `MAX_ATTEMPTS` (PostgreSQL counts them in an `int4`, and a
/// lease adds one), for an item or a dead letter, before anything is buffered. An item at the
/// maximum is leased with its count kept there (attempts never go down, and count no
/// further), and the queue goes on leasing.
fn an_import_with_more_attempts_than_the_engines_count_is_refused_and_the_queue_keeps_leasing(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let attempts = |n: u32| ImportedItem {
            attempts: n,
            ..ImportedItem::default()
        };
        let mut tx = store.begin();
        for n in [u32::MAX, MAX_ATTEMPTS + 1] {
            assert!(
                matches!(
                    q.import(&mut tx, 1, &attempts(n)),
                    Err(Error::InvalidArgument {
                        argument: "attempts",
                        ..
                    })
                ),
                "{name}: {n} attempts"
            );
            assert!(
                matches!(
                    q.import_dead_letter(&mut tx, 1, &attempts(n), "poison"),
                    Err(Error::InvalidArgument {
                        argument: "attempts",
                        ..
                    })
                ),
                "{name}: a dead letter with {n} attempts"
            );
        }
        q.import(&mut tx, 2, &attempts(MAX_ATTEMPTS)).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(
            q.blocking_stats().unwrap().visible,
            1,
            "{name}: only the item at the maximum"
        );
        fill(&store, &q, [3]);
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (2, MAX_ATTEMPTS),
            "{name}"
        );
        lease.blocking_release(Duration::ZERO).unwrap();
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (2, MAX_ATTEMPTS),
            "{name}: counts no further"
        );
        let next = q
            .blocking_try_lease(TTL)
            .unwrap()
            .expect("the queue still leases");
        assert_eq!((*next.item(), next.attempt()), (3, 1), "{name}");
        assert_eq!(
            lease.blocking_fail("poison").unwrap(),
            Failed::Dead,
            "{name}"
        );
        next.blocking_complete().unwrap();
        assert_eq!(q.blocking_replay(Replay::All, false).unwrap(), 1, "{name}");
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(
            (*lease.item(), lease.attempt()),
            (2, MAX_ATTEMPTS),
            "{name}"
        );
        lease.blocking_complete().unwrap();
    }
}

/// A queue name with a NUL character is refused at open with `InvalidQueueName`, on every
/// engine (PostgreSQL's text cannot hold one, so no engine makes one: an export of any
/// store imports into any other).
fn a_queue_name_with_a_nul_is_refused_on_every_engine(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        for bad in ["a\0b", "\0", "tail\0"] {
            match store.blocking_queue::<u64>(bad) {
                Err(Error::InvalidQueueName {
                    name: got,
                    expected,
                }) => {
                    assert_eq!(got, bad, "{name}");
                    assert!(expected.contains("NUL"), "{name}: {expected}");
                }
                got => panic!("{name}: {bad:?}: expected InvalidQueueName, got {got:?}"),
            }
        }
        assert!(store.queue_names().is_empty(), "{name}: nothing was made");
        store.blocking_queue::<u64>("a b").unwrap();
        assert_eq!(store.queue_names(), ["a b"], "{name}");
    }
}

/// `fail` refuses a reason with a NUL character (PostgreSQL's text cannot hold one) with
/// `InvalidArgument` before anything is recorded: no backoff, no dead letter. `fail` takes the
/// lease, so the item is given back at once, as by a dropped lease, its attempt counted (on
/// PostgreSQL from a task: a round trip later). An imported dead letter with such a reason is
/// refused the same way, nothing buffered.
fn a_fail_reason_with_a_nul_is_refused_before_anything_is_recorded(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        q.blocking_set_retry_policy(no_jitter(1)).unwrap();
        fill(&store, &q, [1]);
        let lease = q.blocking_lease(TTL).unwrap();
        assert!(
            matches!(
                lease.blocking_fail("bad\0input"),
                Err(Error::InvalidArgument {
                    argument: "reason",
                    ..
                })
            ),
            "{name}"
        );
        eventually(name, "the item is given back", || {
            q.blocking_count().unwrap() == 1
        });
        let stats = q.blocking_stats().unwrap();
        assert_eq!(
            (stats.visible, stats.delayed, stats.leased, stats.dead),
            (1, 0, 0, 0),
            "{name}: no failure recorded"
        );
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!(lease.attempt(), 2, "{name}");
        assert_eq!(
            lease.blocking_fail("bad input").unwrap(),
            Failed::Dead,
            "{name}"
        );

        let mut tx = store.begin();
        assert!(
            matches!(
                q.import_dead_letter(&mut tx, 2, &ImportedItem::default(), "x\0y"),
                Err(Error::InvalidArgument {
                    argument: "reason",
                    ..
                })
            ),
            "{name}"
        );
        q.import_dead_letter(&mut tx, 3, &ImportedItem::default(), "fine")
            .unwrap();
        tx.blocking_commit().unwrap();
        let dead = q.blocking_dead_letters(None, 10).unwrap();
        let dead: Vec<(u64, &str)> = dead.iter().map(|d| (d.item, d.reason.as_str())).collect();
        assert_eq!(dead, [(1, "bad input"), (3, "fine")], "{name}");
    }
}

fn p10_past_its_deadline_a_transaction_gives_back_at_once_and_its_later_calls_fail(
    engine: &'static Engine,
) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let out = store.blocking_queue::<u64>("out").unwrap();
        fill(&store, &q, [1, 2, 3]);
        let mut tx = store.begin();
        assert!(matches!(
            tx.set_timeout(Duration::ZERO),
            Err(Error::InvalidArgument { .. })
        ));
        tx.set_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
        out.enqueue(&mut tx, 10).unwrap();
        assert_eq!(q.blocking_stats().unwrap().held, 2, "{name}");
        clock.advance(Duration::from_secs(5));
        let stats = q.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.held), (3, 0), "{name}: back at once");
        assert!(matches!(
            q.blocking_try_dequeue(&mut tx),
            Err(Error::TransactionExpired)
        ));
        assert!(matches!(
            out.enqueue(&mut tx, 11),
            Err(Error::TransactionExpired)
        ));
        assert!(matches!(
            q.blocking_dequeue(&mut tx),
            Err(Error::TransactionExpired)
        ));
        assert!(matches!(
            tx.blocking_commit(),
            Err(Error::TransactionExpired)
        ));
        assert_eq!(out.blocking_count().unwrap(), 0, "{name}: nothing applied");
        let mut sorted = common::drain(&store, &q);
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2, 3], "{name}: each item once");

        // Before its deadline a transaction commits as usual; an abort after expiry gives
        // nothing back twice.
        fill(&store, &q, [4, 5]);
        let mut tx = store.begin();
        tx.set_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(4));
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        tx.set_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(5));
        clock.advance(Duration::from_secs(6));
        tx.blocking_abort().unwrap();
        assert_eq!(common::drain(&store, &q), vec![5], "{name}");
        assert_eq!(q.blocking_stats().unwrap(), Default::default(), "{name}");
    }
}

fn p10_the_store_default_deadline_applies_to_every_transaction(engine: &'static Engine) {
    let clock = clock();
    let at = {
        let clock = clock.clone();
        engine.store_with(move |b| {
            b.clock(clock.clone())
                .transaction_timeout(Duration::from_secs(2))
        })
    };
    let store = at.store.clone();
    let q = store.blocking_queue::<u64>("q").unwrap();
    fill(&store, &q, [1]);
    let mut tx = store.begin();
    assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
    clock.advance(Duration::from_secs(2));
    assert_eq!(q.blocking_count().unwrap(), 1);
    assert!(matches!(
        tx.blocking_commit(),
        Err(Error::TransactionExpired)
    ));
    // A lease acked in an expired transaction goes back too: in
    // `a_lease_acked_in_a_transaction_that_does_not_commit_is_given_back`.
    let (builder, _place) = engine.fresh_builder();
    assert!(matches!(
        builder.transaction_timeout(Duration::ZERO).open(),
        Err(Error::InvalidConfig {
            setting: "transaction_timeout",
            ..
        })
    ));
}

/// P5, P10, S4: a lease acked in a transaction that does not commit (aborted, dropped, or past
/// the store's default deadline) is given back as a dropped lease is, its attempt counted:
/// visible again at once (on PostgreSQL a drop gives back from a task, a round trip later:
/// ARCHITECTURE.md, "Where this engine differs").
fn a_lease_acked_in_a_transaction_that_does_not_commit_is_given_back(engine: &'static Engine) {
    let clock = clock();
    let at = {
        let clock = clock.clone();
        engine.store_with(move |b| {
            b.clock(clock.clone())
                .transaction_timeout(Duration::from_secs(2))
        })
    };
    let (name, store) = (engine.name, at.store.clone());
    let q = store.blocking_queue::<u64>("q").unwrap();
    fill(&store, &q, [1, 2, 3]);
    for (attempt, how) in (1..).zip(["abort", "drop", "the deadline"]) {
        let lease = q.blocking_lease(TTL).unwrap();
        assert_eq!((*lease.item(), lease.attempt()), (1, attempt), "{name}");
        let mut tx = store.begin();
        lease.ack(&mut tx).unwrap();
        match how {
            "abort" => tx.blocking_abort().unwrap(),
            "drop" => drop(tx),
            _ => {
                clock.advance(Duration::from_secs(2));
                assert!(matches!(
                    tx.blocking_commit(),
                    Err(Error::TransactionExpired)
                ));
            }
        }
        eventually(
            name,
            &format!("the lease acked before {how} is given back"),
            || q.blocking_count().unwrap() == 3,
        );
        assert_eq!(q.blocking_stats().unwrap().leased, 0, "{name}: {how}");
    }
}

fn p11_an_enqueue_whose_key_is_in_the_queue_is_a_no_op_and_says_so(engine: &'static Engine) {
    use reliable_queue::Enqueued::{Duplicate, Enqueued};
    fn unique(
        q: &reliable_queue::ReliableConcurrentQueue<u64>,
        tx: &mut reliable_queue::Transaction,
        item: u64,
        key: &[u8],
    ) -> reliable_queue::Enqueued {
        q.enqueue_unique(tx, item, key, Duration::ZERO).unwrap()
    }
    fn commit_or_abort(tx: reliable_queue::Transaction, commit: bool) {
        if commit {
            tx.blocking_commit().unwrap();
        } else {
            tx.blocking_abort().unwrap();
        }
    }
    let clock = clock();
    {
        let (name, store, dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        q.blocking_set_retry_policy(no_jitter(1)).unwrap();
        // Buffered by an open transaction: reserved; an abort frees it.
        let mut a = store.begin();
        assert_eq!(unique(&q, &mut a, 1, b"k"), Enqueued, "{name}");
        let mut b = store.begin();
        assert_eq!(
            unique(&q, &mut b, 2, b"k"),
            Duplicate,
            "{name}: buffered elsewhere"
        );
        drop(a);
        assert_eq!(
            unique(&q, &mut b, 2, b"k"),
            Enqueued,
            "{name}: freed by the abort"
        );
        b.blocking_commit().unwrap();
        if engine.on_server() {
            // A key already in the database: the call cannot know without a round trip, so
            // it answers `Enqueued` and the commit inserts nothing for it (P11's no-op).
            let mut tx = store.begin();
            assert_eq!(unique(&q, &mut tx, 3, b"k"), Enqueued, "{name}");
            tx.blocking_commit().unwrap();
            assert_eq!(
                q.blocking_count().unwrap(),
                1,
                "{name}: the commit was a no-op"
            );
            // Held by an open transaction: the insert of its key is a no-op either way (if it
            // comes first, it waits for that transaction, as PostgreSQL's unique indexes do).
            let mut held = store.begin();
            assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(2));
            let committer = {
                let (store, q) = (store.clone(), q.clone());
                std::thread::spawn(move || {
                    let mut tx = store.begin();
                    q.enqueue_unique(&mut tx, 3, b"k", Duration::ZERO).unwrap();
                    tx.blocking_commit()
                })
            };
            held.blocking_abort().unwrap();
            committer.join().unwrap().unwrap();
            assert_eq!(
                q.blocking_count().unwrap(),
                1,
                "{name}: held, still a no-op"
            );
            let lease = q.blocking_lease(TTL).unwrap();
            let mut tx = store.begin();
            unique(&q, &mut tx, 3, b"k");
            tx.blocking_commit().unwrap();
            assert_eq!(
                q.blocking_stats().unwrap().visible,
                0,
                "{name}: leased, still a no-op"
            );
            lease.blocking_fail("to the dead letters").unwrap();
        }
        // Visible, held, leased, delayed: all count as in the queue.
        let mut tx = store.begin();
        if !engine.on_server() {
            assert_eq!(unique(&q, &mut tx, 3, b"k"), Duplicate, "{name}: visible");
            let mut held = store.begin();
            assert_eq!(q.blocking_try_dequeue(&mut held).unwrap(), Some(2));
            assert_eq!(unique(&q, &mut tx, 3, b"k"), Duplicate, "{name}: held");
            held.blocking_abort().unwrap();
            let lease = q.blocking_lease(TTL).unwrap();
            assert_eq!(unique(&q, &mut tx, 3, b"k"), Duplicate, "{name}: leased");
            lease.blocking_fail("to the dead letters").unwrap();
        }
        assert_eq!(
            unique(&q, &mut tx, 3, b"k"),
            Enqueued,
            "{name}: a dead letter frees its key"
        );
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        assert!(matches!(
            q.enqueue_unique(&mut tx, 4, b"d", Duration::from_secs(9)),
            Ok(Enqueued)
        ));
        tx.blocking_commit().unwrap();
        let store = restarted(store, &dir);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        // (On PostgreSQL the keys are in the database: the call answers `Enqueued`, and this
        // transaction is dropped below anyway.)
        let in_queue = if engine.on_server() {
            Enqueued
        } else {
            Duplicate
        };
        for key in [&b"k"[..], b"d"] {
            assert_eq!(
                q.enqueue_unique(&mut tx, 5, key, Duration::ZERO).unwrap(),
                in_queue,
                "{name}: keys kept across a restart"
            );
        }
        assert!(matches!(
            q.enqueue_unique(&mut tx, 5, b"", Duration::ZERO),
            Err(Error::InvalidArgument {
                argument: "key",
                ..
            })
        ));
        assert!(matches!(
            q.enqueue_unique(&mut tx, 5, &[0; 1025], Duration::ZERO),
            Err(Error::InvalidArgument {
                argument: "key",
                ..
            })
        ));
        drop(tx);
        // A committed dequeue, and an ack, free the key.
        assert_eq!(common::drain(&store, &q), vec![3], "{name}");
        clock.advance(Duration::from_secs(9));
        q.blocking_lease(TTL).unwrap().blocking_complete().unwrap();
        let mut tx = store.begin();
        for key in [&b"k"[..], b"d"] {
            assert_eq!(
                q.enqueue_unique(&mut tx, 6, key, Duration::ZERO).unwrap(),
                Enqueued,
                "{name}: key {key:?}"
            );
        }
        tx.blocking_commit().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 2, "{name}");
        common::drain(&store, &q);
        // A transaction that dequeues a keyed item may enqueue its successor with the key (a
        // job that schedules its next run): once, and an abort brings the old item back and
        // drops the new one.
        let mut tx = store.begin();
        assert_eq!(unique(&q, &mut tx, 7, b"s"), Enqueued, "{name}");
        tx.blocking_commit().unwrap();
        for commit in [false, true] {
            let mut tx = store.begin();
            assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(7), "{name}");
            assert_eq!(
                unique(&q, &mut tx, 8, b"s"),
                Enqueued,
                "{name}: its successor"
            );
            assert_eq!(
                unique(&q, &mut tx, 9, b"s"),
                Duplicate,
                "{name}: one successor"
            );
            let mut other = store.begin();
            assert_eq!(
                unique(&q, &mut other, 9, b"s"),
                Duplicate,
                "{name}: not for others"
            );
            drop(other);
            commit_or_abort(tx, commit);
        }
        assert_eq!(
            common::drain(&store, &q),
            vec![8],
            "{name}: the successor alone"
        );
        let mut tx = store.begin();
        assert_eq!(
            unique(&q, &mut tx, 10, b"s"),
            Enqueued,
            "{name}: and its key freed"
        );
        tx.blocking_commit().unwrap();
        // So may a transaction that acknowledges a leased keyed item, after the ack (before
        // it the leased item still holds the key: the embedded engines say so at once, the
        // server engines' commit finds the key taken).
        for commit in [false, true] {
            let lease = q.blocking_lease(TTL).unwrap();
            assert_eq!(*lease.item(), 10, "{name}");
            let mut tx = store.begin();
            if !engine.on_server() {
                assert_eq!(
                    unique(&q, &mut tx, 11, b"s"),
                    Duplicate,
                    "{name}: before the ack"
                );
            }
            lease.ack(&mut tx).unwrap();
            assert_eq!(
                unique(&q, &mut tx, 11, b"s"),
                Enqueued,
                "{name}: the leased item's successor"
            );
            assert_eq!(
                unique(&q, &mut tx, 12, b"s"),
                Duplicate,
                "{name}: one successor of a lease"
            );
            commit_or_abort(tx, commit);
        }
        assert_eq!(
            common::drain(&store, &q),
            vec![11],
            "{name}: the lease's successor alone"
        );
    }
}

fn p9_queue_sets_serve_by_priority_or_weight_and_wait_on_any(engine: &'static Engine) {
    use reliable_queue::{QueueSet, SetOrder};
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let a = store.blocking_queue::<u64>("a").unwrap();
        let b = store.blocking_queue::<u64>("b").unwrap();
        fill(&store, &a, [1, 2]);
        fill(&store, &b, [10, 20]);
        let set = QueueSet::new(&[a.clone(), b.clone()], SetOrder::Priority).unwrap();
        let mut tx = store.begin();
        let got: Vec<(usize, u64)> =
            std::iter::from_fn(|| set.blocking_try_dequeue(&mut tx).unwrap()).collect();
        assert_eq!(
            got,
            vec![(0, 1), (0, 2), (1, 10), (1, 20)],
            "{name}: strict priority"
        );
        tx.blocking_commit().unwrap();

        // Equal weights take turns; 3:1 weights serve 3:1 while both have items.
        let items: Vec<u64> = (0..400).collect();
        fill(&store, &a, &items);
        fill(&store, &b, &items);
        let equal = QueueSet::new(&[a.clone(), b.clone()], SetOrder::Weighted(vec![1, 1])).unwrap();
        let mut tx = store.begin();
        let turns: Vec<usize> = (0..6)
            .map(|_| equal.blocking_try_dequeue(&mut tx).unwrap().unwrap().0)
            .collect();
        assert_eq!(
            turns,
            vec![0, 1, 0, 1, 0, 1],
            "{name}: equal weights alternate"
        );
        tx.blocking_commit().unwrap();
        let weighted =
            QueueSet::new(&[a.clone(), b.clone()], SetOrder::Weighted(vec![3, 1])).unwrap();
        let mut tx = store.begin();
        let mut served = [0, 0];
        for _ in 0..200 {
            served[weighted.blocking_try_dequeue(&mut tx).unwrap().unwrap().0] += 1;
        }
        assert_eq!(served, [150, 50], "{name}: served by weight");
        tx.blocking_commit().unwrap();
        common::drain(&store, &a);
        common::drain(&store, &b);

        // The waiting form wakes on any queue, and a lease from the set is a lease.
        let set = Arc::new(set);
        let waiter = {
            let (set, store) = (Arc::clone(&set), store.clone());
            std::thread::spawn(move || {
                let mut tx = store.begin();
                let got = set.blocking_dequeue(&mut tx, None).unwrap();
                tx.blocking_commit().unwrap();
                got
            })
        };
        while b.waiters() == 0 {
            std::thread::yield_now();
        }
        fill(&store, &b, [99]);
        assert_eq!(waiter.join().unwrap(), Some((1, 99)), "{name}");
        assert_eq!(
            (a.waiters(), b.waiters()),
            (0, 0),
            "{name}: no request left in line"
        );
        fill(&store, &a, [5]);
        let (i, lease) = set.blocking_lease(TTL, None).unwrap().unwrap();
        assert_eq!((i, *lease.item(), lease.attempt()), (0, 5, 1), "{name}");
        lease.blocking_complete().unwrap();
        let mut tx = store.begin();
        assert_eq!(
            set.blocking_dequeue(&mut tx, Some(Duration::from_millis(1)))
                .unwrap(),
            None
        );
        assert!(matches!(
            QueueSet::<u64>::new(&[], SetOrder::Priority),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            QueueSet::new(std::slice::from_ref(&a), SetOrder::Weighted(vec![1, 2])),
            Err(Error::InvalidArgument { .. })
        ));
    }
}

async fn p9_the_async_forms_wait_on_any_queue_of_the_set(engine: &'static Engine) {
    use reliable_queue::{QueueSet, SetOrder};
    let at = engine.store();
    let store = at.store.clone();
    let a = store.queue::<u64>("a").await.unwrap();
    let b = store.queue::<u64>("b").await.unwrap();
    let set =
        Arc::new(QueueSet::new(&[a.clone(), b.clone()], SetOrder::Weighted(vec![2, 1])).unwrap());
    let consumer = {
        let (set, store) = (Arc::clone(&set), store.clone());
        tokio::spawn(async move {
            let mut tx = store.begin();
            let got = set.dequeue(&mut tx).await.unwrap();
            tx.commit().await.unwrap();
            got
        })
    };
    while a.waiters() == 0 || b.waiters() == 0 {
        tokio::task::yield_now().await;
    }
    let mut tx = store.begin();
    b.enqueue(&mut tx, 7).unwrap();
    tx.commit().await.unwrap();
    assert_eq!(consumer.await.unwrap(), (1, 7));
    let leaser = {
        let set = Arc::clone(&set);
        tokio::spawn(async move {
            let (i, lease) = set.lease(TTL).await.unwrap();
            let item = *lease.item();
            lease.complete().await.unwrap();
            (i, item)
        })
    };
    while a.waiters() == 0 || b.waiters() == 0 {
        tokio::task::yield_now().await;
    }
    let mut tx = store.begin();
    a.enqueue(&mut tx, 8).unwrap();
    tx.commit().await.unwrap();
    assert_eq!(leaser.await.unwrap(), (0, 8));
    assert_eq!((a.count().await.unwrap(), b.count().await.unwrap()), (0, 0));
    assert_eq!((a.waiters(), b.waiters()), (0, 0));
}

fn p6_a_delay_runs_from_the_commit(engine: &'static Engine) {
    let clock = clock();
    {
        let (name, store, _dir) = open(engine, &clock);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 1, Duration::from_millis(100))
            .unwrap();
        clock.advance(Duration::from_millis(60));
        tx.blocking_commit().unwrap();
        clock.advance(Duration::from_millis(99));
        assert_eq!(
            q.blocking_count().unwrap(),
            0,
            "{name}: due 100 ms after the commit"
        );
        clock.advance(Duration::from_millis(1));
        assert_eq!(q.blocking_count().unwrap(), 1, "{name}");
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(p1_a_lease_hides_the_item_and_counts_the_attempt),
        engine_case!(p2_expiry_returns_the_item_to_the_head_and_counts_the_attempts),
        engine_case!(a_holder_whose_lease_expired_cannot_ack_and_the_next_holder_completes_it_once),
        engine_case!(p3_an_ack_whose_lease_expires_before_commit_fails_the_whole_commit),
        engine_case!(p4_extend_is_the_heartbeat),
        engine_case!(commit_and_lease_acks_one_batch_and_leases_the_next_in_one_commit),
        engine_case!(commit_and_lease_leaves_an_undecodable_item_at_the_front),
        engine_case!(p5_fail_retries_after_the_backoff_then_buries_and_release_keeps_the_attempts),
        engine_case!(p6_delayed_items_are_invisible_until_due_then_come_in_due_order_and_survive_restart),
        engine_case!(a_waiting_consumer_is_woken_when_a_delayed_item_falls_due),
        engine_case!(p7_dead_letters_replay_and_purge),
        engine_case!(p8_browse_lists_without_consuming_and_stats_count_every_state),
        engine_case!(a_plain_dequeue_and_abort_is_not_an_attempt),
        engine_case!(attempts_survive_a_restart_and_a_restart_ends_leases),
        engine_case!(a_lease_settled_with_another_store_is_refused),
        engine_case!(p10_past_its_deadline_a_transaction_gives_back_at_once_and_its_later_calls_fail),
        engine_case!(p10_the_store_default_deadline_applies_to_every_transaction),
        engine_case!(a_lease_acked_in_a_transaction_that_does_not_commit_is_given_back),
        engine_case!(p11_an_enqueue_whose_key_is_in_the_queue_is_a_no_op_and_says_so),
        engine_case!(p9_queue_sets_serve_by_priority_or_weight_and_wait_on_any),
        engine_case!(an_import_keeps_attempts_due_times_and_dead_letters_and_survives_restart),
        engine_case!(p6_a_delay_runs_from_the_commit),
        engine_case!(async p9_the_async_forms_wait_on_any_queue_of_the_set),
        engine_case!(a_lease_acked_with_another_stores_transaction_is_given_back_at_once),
        engine_case!(a_retry_policy_past_the_storage_maxima_is_clamped_and_a_failure_retries),
        engine_case!(an_import_with_more_attempts_than_the_engines_count_is_refused_and_the_queue_keeps_leasing),
        engine_case!(a_queue_name_with_a_nul_is_refused_on_every_engine),
        engine_case!(a_fail_reason_with_a_nul_is_refused_before_anything_is_recorded),
    ]
}
