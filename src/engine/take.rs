//! Taking items into a transaction: at once ([`Engine::take`]) or waiting for the first item
//! of one or several queues ([`Wait`], for a queue's dequeue and a queue set's).
//!
//! On the embedded engines both are operations of the in-memory core: a take is ready at once
//! and a wait is a request in the queue's line of waiters (`core/waiters.rs`). On PostgreSQL a
//! take is a statement and a wait looks, then sleeps until a notification of a commit to one
//! of its queues, the fallback poll or its deadline, and looks again.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

#[cfg(any(feature = "postgres", feature = "redis"))]
use std::future::Future;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::pin::Pin;

#[cfg(feature = "postgres")]
use super::postgres::Postgres;

#[cfg(any(feature = "postgres", feature = "redis"))]
use super::block_on;
#[cfg(any(feature = "postgres", feature = "redis"))]
use super::Flavor;
use super::{hold, poll_budget, Engine, Entry, QueueRef, Work};
use crate::core::Request;
use crate::core::Ticket;
use crate::error::{Error, Result};

impl Engine {
    /// Takes up to `n` items at the head of `queue` into `work`, in queue order, without
    /// waiting, and hands each to `each` (which decodes it) as it is taken. Returns how many
    /// were taken. An error of `each` ends the take; what was taken stays held by `work`.
    ///
    /// Ready at once on the embedded engines; one round trip on PostgreSQL.
    #[inline]
    pub(crate) async fn take(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize> {
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            // Boxed: the embedded engines' take must not carry the statement's future.
            return Box::pin(self.take_from_server(pg, queue, work, n, each)).await;
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            return Box::pin(self.take_from_server(rd, queue, work, n, each)).await;
        }
        self.take_now(queue, work, n, each)
    }

    /// [`take`](Self::take) for threads: on the embedded engines without a future.
    #[inline]
    pub(crate) fn blocking_take(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize> {
        #[cfg(any(feature = "postgres", feature = "redis"))]
        if self.is_remote() {
            return block_on(self.take(queue, work, n, each));
        }
        self.take_now(queue, work, n, each)
    }

    /// The embedded engines' take, from the in-memory core: ready at once.
    #[inline]
    fn take_now(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        mut each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize> {
        work.withdraw_leaked();
        self.check_open()?;
        work.check_live()?;
        let mut count = 0;
        while count < n {
            let Some(entry) = queue.core.try_take() else {
                break;
            };
            count += 1;
            each(hold(work, queue, entry))?;
        }
        Ok(count)
    }

    /// A waiting take of the first item of any of `queues` (tried in their order; each with
    /// its index in the caller's list) into `work`, until `deadline` if any.
    pub(crate) fn wait<'a, 'q: 'a>(
        &'a self,
        queues: Vec<(usize, &'q QueueRef)>,
        work: &'a mut Work,
        deadline: Option<Instant>,
    ) -> Wait<'a, 'q> {
        debug_assert!(!queues.is_empty(), "a wait is on at least one queue");
        // A wait of this transaction leaked before this one started: withdrawn now.
        work.withdraw_leaked();
        let state = match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => State::Remote {
                looking: Box::pin(self.wait_in_line(pg, queues, work, deadline)),
                got: None,
            },
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => State::Remote {
                looking: Box::pin(self.wait_in_line(rd, queues, work, deadline)),
                got: None,
            },
            _ => State::Core {
                waits: queues
                    .into_iter()
                    .map(|(i, queue)| CoreWait {
                        index: i,
                        queue,
                        request: Request::default(),
                        noted: None,
                    })
                    .collect(),
                work,
            },
        };
        Wait {
            engine: self,
            deadline,
            state,
        }
    }
}

/// What a wait without a deadline that ended without an item returns: it cannot happen (such
/// a wait ends with an item or an error).
pub(crate) fn no_item_without_deadline() -> Error {
    Error::Bug {
        invariant: "a wait without a deadline ends with an item",
    }
}

/// A waiting take, made by [`Engine::wait`]: poll it with [`poll_take`](Self::poll_take).
/// Dropping it withdraws it: an item already handed to it goes back to the front of its queue
/// (or to the next waiter). One that is never dropped nor polled again (leaked) loses the
/// item handed to it, and its place, to the second take on the queue that finds nothing
/// after the hand-over (see `core/waiters.rs`).
pub(crate) struct Wait<'a, 'q> {
    engine: &'a Engine,
    deadline: Option<Instant>,
    state: State<'a, 'q>,
}

enum State<'a, 'q> {
    /// The embedded engines: a request in each queue's line of waiters.
    Core {
        waits: Vec<CoreWait<'q>>,
        work: &'a mut Work,
    },
    /// PostgreSQL, Redis: the looking and sleeping, and the item it found.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    Remote {
        looking: Pin<Box<dyn Future<Output = Result<Option<Found<'q>>>> + Send + 'a>>,
        got: Option<Entry>,
    },
}

/// What a server engine's waiting take found: the queue's index and queue, and the entry.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) type Found<'a> = (usize, &'a QueueRef, Entry);

/// What a wait took: the index of its queue in the caller's list, the queue, and the entry
/// (held by the transaction's work now).
pub(crate) type Taken<'q, 'w> = (usize, &'q QueueRef, &'w Entry);

/// What an embedded wait's poll took: as [`Taken`], with the entry's place in
/// `work.dequeued`.
type TakenAt<'q> = (usize, &'q QueueRef, usize);

/// One queue's request of an embedded wait.
struct CoreWait<'a> {
    index: usize,
    queue: &'a QueueRef,
    request: Request,
    /// The ticket noted in the transaction's [`Work`], so that the transaction can withdraw
    /// the request should the wait be leaked.
    noted: Option<Ticket>,
}

impl Drop for CoreWait<'_> {
    fn drop(&mut self) {
        self.queue.core.cancel(&mut self.request);
    }
}

impl std::fmt::Debug for Wait<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<'q> Wait<'_, 'q> {
    /// Takes the first item that any of the queues has for this wait, returning the queue's
    /// index and the entry (held by the work now); `None` once the deadline has passed (an
    /// item handed over at the last moment is taken still). `Pending` puts the wait in line,
    /// to be woken through `cx`; the embedded engines do not wake it at the deadline: a
    /// caller with a deadline wakes itself then ([`block_on_until`](super::block_on_until)).
    ///
    /// Takes a unit of tokio's cooperative budget before taking anything: a poll refused by
    /// it leaves the transaction as it was.
    pub(crate) fn poll_take(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Taken<'q, '_>>>> {
        let budget = std::task::ready!(poll_budget(cx));
        let engine = self.engine;
        let polled = match &mut self.state {
            State::Core { waits, work } => poll_core(engine, waits, work, self.deadline, cx)
                .map_ok(|got| got.map(|(index, queue, at)| (index, queue, &work.dequeued[at].1))),
            #[cfg(any(feature = "postgres", feature = "redis"))]
            State::Remote { looking, got } => match looking.as_mut().poll(cx) {
                Poll::Ready(Ok(Some((index, queue, entry)))) => {
                    Poll::Ready(Ok(Some((index, queue, &*got.insert(entry)))))
                }
                Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        };
        // Waiting for an item is not progress: the budget unit is given back then.
        if polled.is_ready() {
            budget.made_progress();
        }
        polled
    }
}

/// An embedded wait's poll: the index of the queue and the place in `work.dequeued` of the
/// entry taken.
fn poll_core<'a>(
    engine: &Engine,
    waits: &mut [CoreWait<'a>],
    work: &mut Work,
    deadline: Option<Instant>,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<TakenAt<'a>>>> {
    if let Err(e) = engine.check_open().and_then(|()| work.check_live()) {
        return Poll::Ready(Err(e));
    }
    for wait in waits.iter_mut() {
        let queue = wait.queue;
        let polled = queue.core.poll_take(&mut wait.request, cx.waker());
        if polled.is_pending() {
            if let (None, Some(ticket)) = (wait.noted, wait.request.ticket()) {
                work.requests.push((Arc::clone(&queue.core), ticket));
                wait.noted = Some(ticket);
            }
        } else if let Some(ticket) = wait.noted.take() {
            work.requests.retain(|(_, t)| *t != ticket);
        }
        match polled {
            Poll::Ready(Ok(entry)) => {
                hold(work, queue, entry);
                return Poll::Ready(Ok(Some((wait.index, queue, work.dequeued.len() - 1))));
            }
            Poll::Ready(Err(_closed)) => return Poll::Ready(Err(Error::Closed)),
            Poll::Pending => {}
        }
    }
    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
        // An item handed over at the last moment is the caller's to take.
        for wait in waits.iter_mut() {
            if let Some(ticket) = wait.noted.take() {
                work.requests.retain(|(_, t)| *t != ticket);
            }
            if let Some(entry) = wait.queue.core.withdraw(&mut wait.request) {
                hold(work, wait.queue, entry);
                return Poll::Ready(Ok(Some((wait.index, wait.queue, work.dequeued.len() - 1))));
            }
        }
        return Poll::Ready(Ok(None));
    }
    Poll::Pending
}

#[cfg(feature = "postgres")]
impl super::server_calls::TakeInto for Postgres {
    fn take_into<'l>(
        &'l self,
        core: &'l crate::core::QueueCore,
        work: &'l mut Work,
        n: usize,
        waiter: Option<u64>,
    ) -> impl Future<Output = Result<Vec<Entry>>> + Send + 'l {
        self.try_dequeue(core, &mut work.pg, n, waiter)
    }
}
