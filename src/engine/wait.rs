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

/// How many times a waiting thread yields before it parks.
///
/// A commit usually waits for one sync of the disk (hundreds of microseconds), but under load
/// its answer may already be on the way: yielding the processor a few times first avoids a
/// sleep and a wake-up then, and costs little otherwise.
const YIELDS_BEFORE_PARKING: usize = 8;

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
    let mut yields = 0;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        if yields < YIELDS_BEFORE_PARKING {
            yields += 1;
            thread::yield_now();
        } else {
            thread::park();
        }
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
