//! loom models of reliable-queue's in-memory core.
//!
//! The models live in `tests/`, one file per concern; this library holds the harness they
//! share. Everything here exists only under `--cfg reliable_queue_loom`, so a normal
//! `cargo test --workspace` compiles the crate to nothing.
//!
//! The models drive the public API on `reliable_queue::Store::in_memory`: an in-memory commit publishes its
//! items in the committing thread, and the queue core's mutex and atomics are loom's under the
//! cfg, so loom explores every interleaving of the core's critical sections. The rest of the
//! store (catalog mutex, id counter, `Arc`s) uses ordinary primitives; the models only touch
//! the catalog before spawning threads, and the id counter is a lone `fetch_add`, so nothing
//! loom cannot see is ever contended.
//!
//! Run them with:
//!
//! ```text
//! RUSTFLAGS="--cfg reliable_queue_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release -p loom-tests
//! ```
//!
//! Without `LOOM_MAX_PREEMPTIONS` the harness bounds preemptions at 2.

#[cfg(reliable_queue_loom)]
mod harness {
    use std::future::{poll_fn, Future};
    use std::pin::{pin, Pin};
    use std::task::{Context, Poll, Waker};

    use loom::future::AtomicWaker;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use reliable_queue::{ReliableConcurrentQueue, Store, Transaction};

    /// The queue type every model uses.
    pub type Queue = ReliableConcurrentQueue<u32>;

    /// Preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set.
    const DEFAULT_PREEMPTIONS: usize = 2;

    /// Checks `model` under every interleaving loom explores within the preemption bound,
    /// and prints how many it explored (seen with `--nocapture`).
    pub fn check(model: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
        }
        // A plain std counter: it is outside the model, which loom runs one execution at a
        // time.
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = runs.clone();
        builder.check(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            model();
        });
        let bound = builder.preemption_bound.unwrap_or(DEFAULT_PREEMPTIONS);
        println!(
            "{}: {} executions explored (preemption bound {bound})",
            std::thread::current().name().unwrap_or("model"),
            runs.load(std::sync::atomic::Ordering::Relaxed),
        );
    }

    /// A fresh in-memory store with one queue holding `items`, committed in order.
    pub fn store_with(items: &[u32]) -> (Store, Queue) {
        let store = Store::in_memory().expect("open an in-memory store");
        let queue = store.blocking_queue::<u32>("q").expect("open the queue");
        if !items.is_empty() {
            commit(&store, &queue, items);
        }
        (store, queue)
    }

    /// Enqueues `items` in one transaction and commits it.
    pub fn commit(store: &Store, queue: &Queue, items: &[u32]) {
        let mut tx = store.begin();
        for &item in items {
            queue.enqueue(&mut tx, item).expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
    }

    /// Takes up to `max` items with `try_dequeue` in one transaction and commits it.
    pub fn take(store: &Store, queue: &Queue, max: usize) -> Vec<u32> {
        let mut tx = store.begin();
        let mut out = Vec::new();
        while out.len() < max {
            match queue.blocking_try_dequeue(&mut tx).expect("try_dequeue") {
                Some(item) => out.push(item),
                None => break,
            }
        }
        tx.blocking_commit().expect("commit the dequeues");
        out
    }

    /// Takes everything visible, committing the dequeues.
    pub fn take_all(store: &Store, queue: &Queue) -> Vec<u32> {
        take(store, queue, usize::MAX)
    }

    /// Polls `future` once with a waker that does nothing.
    pub fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    /// A signal, set from another thread, that makes [`dequeue_or_stop`] give up.
    #[derive(Debug, Default)]
    pub struct Stop {
        stopped: AtomicBool,
        waker: AtomicWaker,
    }

    impl Stop {
        /// Tells the consumer to give up, waking it if it waits.
        pub fn stop(&self) {
            self.stopped.store(true, Ordering::SeqCst);
            self.waker.wake();
        }
    }

    /// Waits in `queue.dequeue(tx)` until an item comes (`Some`) or `stop` is set (`None`,
    /// the dequeue future is dropped: a consumer giving up, as under a timeout).
    pub async fn dequeue_or_stop(queue: &Queue, tx: &mut Transaction, stop: &Stop) -> Option<u32> {
        let mut dequeue = pin!(queue.dequeue(tx));
        poll_fn(|cx| {
            stop.waker.register_by_ref(cx.waker());
            if stop.stopped.load(Ordering::SeqCst) {
                return Poll::Ready(None);
            }
            dequeue
                .as_mut()
                .poll(cx)
                .map(|item| Some(item.expect("dequeue")))
        })
        .await
    }

    /// Asserts that `seen` holds every item of `expected` exactly once, and nothing else.
    pub fn assert_exactly_once(expected: &[u32], seen: impl IntoIterator<Item = u32>) {
        let mut seen: Vec<u32> = seen.into_iter().collect();
        seen.sort_unstable();
        let mut expected = expected.to_vec();
        expected.sort_unstable();
        assert_eq!(seen, expected, "every item exactly once");
    }
}

#[cfg(reliable_queue_loom)]
pub use harness::*;
