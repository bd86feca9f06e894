//! Waiting for a future on a thread: the blocking forms of the async calls.
//!
//! `block_on` polls the future with a waker that unparks the calling thread. It needs no
//! runtime and never panics inside one (tokio's `blocking_recv` would): on the embedded
//! engines the futures it drives wait only for the committer thread, never for the runtime.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use tokio::task::coop;

/// Wakes a thread parked in [`block_on`] or in a blocking dequeue.
#[derive(Debug)]
pub(crate) struct Unparker(Thread);

impl Unparker {
    /// A waker for the calling thread.
    pub(crate) fn current() -> Waker {
        Waker::from(Arc::new(Unparker(thread::current())))
    }
}

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on the calling thread.
///
/// Between polls the thread parks at once. Measured on the durable benches (2 CPUs), this
/// beats yielding the processor a few times first: with 16 + 16 committing threads, 28.6k
/// against 21-23k one-item commits/s, and 517k against 467-491k items/s with 4 + 4 threads
/// and 64-item transactions (`BENCHMARKS.md`).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    // Most calls are ready at once: try before making a waker.
    if let Poll::Ready(out) = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        return out;
    }
    let waker = Unparker::current();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

/// Parks the calling thread until woken or until `deadline` (`None`: no deadline).
pub(crate) fn park_until(deadline: Option<Instant>) {
    match deadline {
        None => thread::park(),
        Some(deadline) => {
            if let Some(left) = deadline.checked_duration_since(Instant::now()) {
                thread::park_timeout(left);
            }
        }
    }
}

/// Takes one unit of tokio's cooperative budget, the way tokio's own resources do: `Pending`
/// (the task is woken to be polled again at once) when the task has spent its budget, so a
/// loop over futures that are ready at once still gives the other tasks of a runtime their
/// turn. Await it before doing anything a cancelled future must not have done (taking an
/// item), or after what a polled future must have done whatever happens (a commit).
///
/// Outside a tokio runtime (and inside `coop::unconstrained`) the budget is unlimited: a
/// thread-local read, always ready, never a panic. The blocking forms never call it.
#[inline]
pub(crate) async fn consume_budget() {
    coop::consume_budget().await;
}

/// [`consume_budget`] inside a `poll`: `Pending` once the task's budget is spent. The unit is
/// taken only if the caller calls `made_progress` on the returned guard; dropping it without
/// gives the unit back (for a poll that ends `Pending` for another reason).
#[inline]
pub(crate) fn poll_budget(cx: &mut Context<'_>) -> Poll<coop::RestoreOnPending> {
    coop::poll_proceed(cx)
}
