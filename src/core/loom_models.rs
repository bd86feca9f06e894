//! loom models that drive the core's types directly, under `--cfg reliable_queue_loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg reliable_queue_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release --lib core::loom_models
//! ```
//!
//! The models of `loom-tests/` drive the same core through the public API; these reach the
//! parts the API cannot isolate (closing a queue under a waiter, a restore racing a take).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use loom::thread;

use super::queue::{Closed, QueueCore, Request};
use super::Entry;

fn queue_with(ids: &[u64]) -> Arc<QueueCore> {
    let ready: VecDeque<Entry> = ids
        .iter()
        .map(|&id| Entry::new(id, Box::new([0])))
        .collect();
    Arc::new(QueueCore::new(0, "q".into(), ready))
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
        q.publish([Entry::new(1, Box::new([0]))]);
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
            thread::spawn(move || q.publish([Entry::new(7, Box::new([0]))]))
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
