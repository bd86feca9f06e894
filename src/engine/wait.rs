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

/// Wakes a thread parked in [`block_on`].
#[derive(Debug)]
struct Unparker(Thread);

impl Unparker {
    /// A waker for the calling thread.
    fn current() -> Waker {
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

/// Runs `future` to completion on the calling thread: the blocking form of an async call
/// that does not wait for an item (for one that does, [`block_on_until`]).
///
/// First one poll with a waker that does nothing: on the embedded engines most calls are
/// ready at once, and then cost no more than that poll. A future that is not ready is polled
/// again at once with the thread's waker (each of its resources keeps the waker of its
/// latest poll), and from then on the thread parks between polls. Measured on the durable
/// benches (2 CPUs), parking at once beats yielding the processor a few times first: with
/// 16 + 16 committing threads, 28.6k against 21-23k one-item commits/s, and 517k against
/// 467-491k items/s with 4 + 4 threads and 64-item transactions (`BENCHMARKS.md`). The
/// future runs outside tokio's cooperative budget: a thread has no task to yield to (a first
/// poll refused by a spent budget only costs that poll).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    if let Poll::Ready(out) = future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        return out;
    }
    block_on_until(future, None)
}

/// [`block_on`] for a waiting take (an embedded [`Wait`](super::Wait)), polled from the first
/// with the thread's waker: a waiting take's poll that finds nothing is a miss
/// (`core/waiters.rs`), so a first poll with a waker of no use would count one miss too many.
/// Such a future resolves by itself once `deadline` passes but is not woken then: the thread
/// parks until woken or the deadline, whichever comes first, and polls again.
pub(crate) fn block_on_until<F: Future>(future: F, deadline: Option<Instant>) -> F::Output {
    let mut future = pin!(coop::unconstrained(future));
    // One poll per wake-up, each with the thread's waker: a waiting take's poll that finds
    // nothing is a miss (`core/waiters.rs`), so a first poll with a waker of no use would
    // count one miss too many. The thread's waker is made once per thread.
    let mut run = |waker: &Waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            park_until(deadline);
        }
    };
    // While the thread's locals are torn down (a store dropped by one of them), a waker of
    // its own.
    match THREAD_WAKER.try_with(|waker| run(waker)) {
        Ok(out) => out,
        Err(_) => run(&Unparker::current()),
    }
}

thread_local! {
    /// The calling thread's waker, for [`block_on`].
    static THREAD_WAKER: Waker = Unparker::current();
}

/// Parks the calling thread until woken or until `deadline` (`None`: no deadline).
fn park_until(deadline: Option<Instant>) {
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
/// Outside a tokio runtime (and inside `coop::unconstrained`, as in [`block_on`]) the budget
/// is unlimited: a thread-local read, always ready, never a panic.
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
