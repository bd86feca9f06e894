//! Waiting dequeues: the [`Dequeue`] future and the blocking forms.
//!
//! Both put a request in the queue's line of waiters when nothing is visible; the next item
//! to become visible is handed straight to the oldest request and only its waiter is woken.
//! A request that ends early (future dropped, timeout, unwinding) leaves the line, and an
//! item already handed to it goes back to the front of the queue, or to the next waiter.
//! A request that is never polled again (a future leaked with `mem::forget`) cannot leave;
//! the item handed to it is taken by the second dequeue attempt after the hand-over that
//! finds nothing (see [`ReliableConcurrentQueue::dequeue`] and `core/waiters.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::block_on_until;
use crate::engine::take::{no_item_without_deadline, Wait};
use crate::error::Result;
use crate::queue::ReliableConcurrentQueue;
use crate::transaction::Transaction;

/// Future returned by [`ReliableConcurrentQueue::dequeue`].
///
/// Resolves to the next item handed to this transaction. Dropping it before it resolves is
/// safe: see the method's `# Cancel safety`.
#[must_use = "futures do nothing unless polled"]
pub struct Dequeue<'a, T> {
    inner: Taking<'a, T>,
}

/// A waiting take into a transaction, until a deadline if any: resolves to the item, or
/// `None` past the deadline.
struct Taking<'a, T> {
    queue: &'a ReliableConcurrentQueue<T>,
    state: State<'a>,
}

enum State<'a> {
    /// Not polled yet: the transaction is checked at the first poll.
    Start {
        tx: &'a mut Transaction,
        deadline: Option<Instant>,
    },
    /// In the engine's hands.
    Waiting(Wait<'a, 'a>),
    /// Resolved.
    Done,
}

impl<T> std::fmt::Debug for Dequeue<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dequeue")
            .field("queue", &self.inner.queue.name())
            .finish_non_exhaustive()
    }
}

impl<T> Future for Dequeue<'_, T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let taken = std::task::ready!(Pin::new(&mut self.get_mut().inner).poll(cx));
        // Without a deadline the wait only ends with an item or an error.
        Poll::Ready(taken.and_then(|item| item.ok_or_else(no_item_without_deadline)))
    }
}

impl<T> Future for Taking<'_, T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    type Output = Result<Option<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Option<T>>> {
        let this = self.get_mut();
        match std::mem::replace(&mut this.state, State::Done) {
            State::Start { tx, deadline } => {
                this.queue.check(tx)?;
                let queues = vec![(0, this.queue.queue_ref())];
                let wait = this.queue.engine().wait(queues, tx.work_mut(), deadline);
                this.state = State::Waiting(wait);
            }
            other => this.state = other,
        }
        let State::Waiting(wait) = &mut this.state else {
            return Poll::Ready(Err(crate::Error::Bug {
                invariant: "a resolved dequeue is not polled again",
            }));
        };
        let taken = std::task::ready!(wait.poll_take(cx));
        let item = taken.and_then(|got| match got {
            Some((_, _, entry)) => this.queue.decode(entry).map(Some),
            None => Ok(None),
        });
        this.state = State::Done;
        Poll::Ready(item)
    }
}

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// Takes the item at the front of the queue into the transaction, waiting for one to be
    /// committed if none is visible.
    ///
    /// Waiting consumers are served first come, first served: an item that becomes visible is
    /// handed straight to the oldest waiting request, only that waiter is woken, and the
    /// request takes the item when the future is polled next. While anyone waits,
    /// [`try_dequeue`](Self::try_dequeue) finds nothing, so it cannot jump the line (but see
    /// below for a request that is not polled). Like tokio's own resources it takes part in
    /// tokio's cooperative budget: once the task has spent it, the future yields before
    /// taking an item, even one that is ready.
    ///
    /// There is no built-in timeout: wrap the future in `tokio::time::timeout`. After
    /// [`Store::close`](crate::Store::close), waiting consumers wake with
    /// [`Error::Closed`](crate::Error::Closed).
    ///
    /// # A future that is not polled
    ///
    /// The item handed to a request is reserved for it within a bound, so that a `Dequeue`
    /// that is never polled again (leaked with [`std::mem::forget`], or kept and not polled)
    /// cannot keep a committed item from every other consumer. The bound is counted in
    /// *misses*, the dequeue attempts on this queue, by any transaction, that find nothing to
    /// take: a `try_dequeue` that returns `None`, a poll of a `Dequeue` that returns `Pending`
    /// (other than one refused by the cooperative budget), a check by a blocking dequeue that
    /// goes (back) to waiting.
    ///
    /// - **The second miss after an item was handed to a request that has not taken it takes
    ///   the item itself**: that `try_dequeue` returns it, that `Dequeue` resolves to it, as
    ///   if it had been visible. A single miss takes nothing, so a `try_dequeue` racing the
    ///   wake-up of a waiter finds nothing, as long as the waiter takes its item before a
    ///   second miss.
    /// - Misses take such items one each, the one handed over first first: when `n`
    ///   requests hold items they have not taken, the first `n + 1` misses after the last of
    ///   those hand-overs take them all.
    /// - A request whose item was taken this way has lost its place too. Never polled again,
    ///   it holds nothing and keeps no one waiting: a leaked `Dequeue` takes at most one item
    ///   out of circulation, and only until those misses. Polled again, it takes a visible
    ///   item if there is one, else it waits again at the place in line it had, ahead of the
    ///   requests that came after it.
    /// - **Its transaction ends it too.** The future borrows its transaction mutably, so once
    ///   the transaction is used again (any dequeue, enqueue, `commit` or `abort` on it) or
    ///   dropped, the future is gone: a leaked one's request is withdrawn then, and its item
    ///   goes back to the front of the queue or to the next waiter, misses or not. This covers
    ///   the case misses do not: every other consumer already asleep in line.
    /// - Until then, the reserved item is not visible ([`count`](Self::count) leaves it out).
    ///   It is never lost, nor given to two consumers; in a store on disk it is still in the
    ///   queue after a restart. Only a leaked future whose transaction is leaked too (or kept
    ///   unused) while every other consumer sleeps keeps its item until the next miss.
    ///
    /// On PostgreSQL the line is this process's and a commit hands the oldest waiter its
    /// *turn*, not the item: the item stays visible until the waiter looks, the same misses
    /// take the turn, and another process's consumer may take the item first (ARCHITECTURE.md,
    /// "Waiting dequeue").
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. Dropping the future at any point loses nothing: if an item had already
    /// been handed to it, the item goes back to the front of the queue (or to the next
    /// waiter), and the transaction is left as it was before the call. On PostgreSQL, one
    /// dropped while its look is in flight leaves the transaction aborted (its later calls
    /// and commit fail with [`Error::TransactionAborted`](crate::Error::TransactionAborted);
    /// ARCHITECTURE.md, "Cancelled calls").
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue): [`Error::Deserialize`](crate::Error::Deserialize)
    /// (the item stays held by `tx`), [`Error::WrongStore`](crate::Error::WrongStore),
    /// [`Error::Closed`](crate::Error::Closed).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use reliable_queue::Store;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    ///
    /// let producer = {
    ///     let (store, q) = (store.clone(), q.clone());
    ///     tokio::spawn(async move {
    ///         let mut tx = store.begin();
    ///         q.enqueue(&mut tx, 5)?;
    ///         tx.commit().await
    ///     })
    /// };
    ///
    /// let mut tx = store.begin();
    /// let item = tokio::time::timeout(Duration::from_secs(10), q.dequeue(&mut tx)).await??;
    /// assert_eq!(item, 5);
    /// tx.commit().await?;
    /// producer.await??;
    /// # Ok(()) }
    /// ```
    pub fn dequeue<'a>(&'a self, tx: &'a mut Transaction) -> Dequeue<'a, T> {
        Dequeue {
            inner: self.taking(tx, None),
        }
    }

    /// A waiting take into `tx`, until `deadline` if there is one.
    fn taking<'a>(&'a self, tx: &'a mut Transaction, deadline: Option<Instant>) -> Taking<'a, T> {
        Taking {
            queue: self,
            state: State::Start { tx, deadline },
        }
    }

    /// Like [`dequeue`](Self::dequeue), for threads outside an async runtime: blocks the
    /// thread until an item is handed to the transaction.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u32>("q")?;
    /// let consumer = {
    ///     let (store, q) = (store.clone(), q.clone());
    ///     std::thread::spawn(move || {
    ///         let mut tx = store.begin();
    ///         let item = q.blocking_dequeue(&mut tx)?;
    ///         tx.blocking_commit()?;
    ///         Ok::<_, reliable_queue::Error>(item)
    ///     })
    /// };
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 9)?;
    /// tx.blocking_commit()?;
    /// assert_eq!(consumer.join().unwrap()?, 9);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_dequeue(&self, tx: &mut Transaction) -> Result<T> {
        block_on_until(self.dequeue(tx), None)
    }

    /// Like [`blocking_dequeue`](Self::blocking_dequeue), giving up after `timeout`:
    /// `Ok(None)` if no item was handed to the transaction in time. A timeout too long to
    /// represent as a deadline (`Duration::MAX`) waits without one.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u32>("q")?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.blocking_dequeue_timeout(&mut tx, Duration::from_millis(1))?, None);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_dequeue_timeout(
        &self,
        tx: &mut Transaction,
        timeout: Duration,
    ) -> Result<Option<T>> {
        let deadline = Instant::now().checked_add(timeout);
        block_on_until(self.taking(tx, deadline), deadline)
    }
}
