//! loom models that drive the core's types directly, under `--cfg reliable_queue_loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg reliable_queue_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_
//! ```
//!
//! The models of `loom-tests/` drive the same core through the public API; these reach the
//! parts the API cannot isolate (closing a queue under a waiter, a restore racing a take, a
//! miss reclaiming an entry from a request that is late or never polled again). The lease
//! table's models, one layer up, are in `engine/loom_leases.rs`; the command runs both.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use loom::thread;

use super::queue::{Closed, QueueCore, Request};
use super::waiters::RECLAIM_AFTER;
use super::Entry;

fn queue_with(ids: &[u64]) -> Arc<QueueCore> {
    let ready: VecDeque<Entry> = ids
        .iter()
        .map(|&id| Entry::new(id, Box::new([0]), 0))
        .collect();
    Arc::new(QueueCore::new(0, super::QueueIndex(0), "q".into(), ready))
}

/// Waits in `poll_take` until an entry is handed over or the queue closes.
fn take_waiting(q: &QueueCore) -> Result<u64, Closed> {
    let mut request = Request::default();
    let taken = loom::future::block_on(poll_fn(|cx| q.poll_take(&mut request, cx.waker())));
    taken.map(|entry| entry.id)
}

/// A publish racing a consumer that is about to wait: the consumer gets the entry (from the
/// deque or handed over) and is woken; nothing is left behind.
#[test]
fn publish_reaches_a_waiting_consumer() {
    loom::model(|| {
        let q = queue_with(&[]);
        let consumer = {
            let q = q.clone();
            thread::spawn(move || take_waiting(&q))
        };
        q.publish_one(Entry::new(1, Box::new([0]), 0));
        assert_eq!(consumer.join().unwrap(), Ok(1));
        assert_eq!((q.count(), q.waiters()), (0, 0));
    });
}

/// An entry given back races a `try_take`: it is taken exactly once, or stays visible.
#[test]
fn restore_races_try_take() {
    loom::model(|| {
        let q = queue_with(&[1]);
        let held = q.try_take().expect("the entry");
        let restorer = {
            let q = q.clone();
            thread::spawn(move || q.restore(std::iter::once(held)))
        };
        let taken = q.try_take().map(|e| e.id);
        restorer.join().unwrap();
        let left = q.count();
        assert_eq!(u64::from(taken.is_some()) + left, 1, "exactly once");
    });
}

/// Closing the queue under a waiter wakes it: it ends with `Closed`, or with the entry
/// published before the close; it never waits forever and the entry is never lost.
#[test]
fn close_wakes_a_waiter() {
    loom::model(|| {
        let q = queue_with(&[]);
        let consumer = {
            let q = q.clone();
            thread::spawn(move || take_waiting(&q))
        };
        let publisher = {
            let q = q.clone();
            thread::spawn(move || q.publish([Entry::new(7, Box::new([0]), 0)]))
        };
        q.close();
        publisher.join().unwrap();
        match consumer.join().unwrap() {
            Ok(id) => assert_eq!((id, q.count()), (7, 0)),
            Err(Closed) => assert_eq!(q.count(), 1, "the entry stays in the queue"),
        }
        assert_eq!(q.waiters(), 0);
        let mut late = Request::default();
        let polled = q.poll_take(&mut late, std::task::Waker::noop());
        assert!(
            !matches!(polled, Poll::Pending),
            "nobody waits on a closed queue"
        );
    });
}

/// Two misses race the late poll of a request that was handed an entry: the entry goes to
/// exactly one of them. If the misses took it, the request waits again (at its place) and is
/// served the next entry.
#[test]
fn reclaim_races_a_late_collect() {
    loom::model(|| {
        let q = queue_with(&[]);
        let mut late = Request::default();
        assert!(q
            .poll_take(&mut late, std::task::Waker::noop())
            .is_pending());
        q.publish([Entry::new(1, Box::new([0]), 0)]);
        let misser = {
            let q = q.clone();
            thread::spawn(move || {
                (0..RECLAIM_AFTER)
                    .filter_map(|_| q.try_take().map(|e| e.id))
                    .collect::<Vec<_>>()
            })
        };
        let polled = q.poll_take(&mut late, std::task::Waker::noop());
        let taken = misser.join().unwrap();
        match polled {
            Poll::Ready(Ok(entry)) => assert_eq!((entry.id, taken.len()), (1, 0)),
            Poll::Pending => {
                assert_eq!(taken, [1], "reclaimed by the misses");
                assert_eq!(q.waiters(), 1, "the late request waits again");
                q.publish([Entry::new(2, Box::new([0]), 0)]);
                let served = q.poll_take(&mut late, std::task::Waker::noop());
                assert!(matches!(served, Poll::Ready(Ok(ref e)) if e.id == 2));
            }
            Poll::Ready(Err(Closed)) => panic!("the queue is open"),
        }
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    });
}

/// A request in line that is never polled again (a leaked future) is handed the entry a
/// publisher makes visible, while a live consumer waits and the main thread misses twice;
/// a second entry is published last. The live consumer always gets an entry, the leaked one
/// never keeps one, and each entry ends up in exactly one place.
#[test]
fn a_leaked_request_does_not_strand_an_entry() {
    loom::model(|| {
        let q = queue_with(&[]);
        let mut leaked = Request::default();
        assert!(q
            .poll_take(&mut leaked, std::task::Waker::noop())
            .is_pending());
        let publisher = {
            let q = q.clone();
            thread::spawn(move || q.publish([Entry::new(1, Box::new([0]), 0)]))
        };
        let live = {
            let q = q.clone();
            thread::spawn(move || take_waiting(&q))
        };
        publisher.join().unwrap();
        let mut seen: Vec<u64> = (0..RECLAIM_AFTER)
            .filter_map(|_| q.try_take().map(|e| e.id))
            .collect();
        assert_eq!(
            q.staged(),
            0,
            "{RECLAIM_AFTER} misses after the hand-over reclaim it"
        );
        q.publish([Entry::new(2, Box::new([0]), 0)]);
        seen.push(live.join().unwrap().expect("the queue is open"));
        seen.extend(std::iter::from_fn(|| q.try_take()).map(|e| e.id));
        seen.sort_unstable();
        assert_eq!(seen, [1, 2], "each entry exactly once");
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    });
}

/// A request that was handed an entry is dropped (cancelled) while two misses race it: the
/// entry goes back to the queue or to the misses, exactly once, and nothing stays staged.
#[test]
fn cancel_races_a_reclaim() {
    loom::model(|| {
        let q = queue_with(&[]);
        let mut late = Request::default();
        assert!(q
            .poll_take(&mut late, std::task::Waker::noop())
            .is_pending());
        q.publish([Entry::new(1, Box::new([0]), 0)]);
        let misser = {
            let q = q.clone();
            thread::spawn(move || {
                (0..RECLAIM_AFTER)
                    .filter_map(|_| q.try_take().map(|e| e.id))
                    .count()
            })
        };
        q.cancel(&mut late);
        let taken = misser.join().unwrap();
        assert_eq!(u64::try_from(taken).unwrap() + q.count(), 1, "exactly once");
        assert_eq!((q.waiters(), q.staged()), (0, 0));
    });
}
