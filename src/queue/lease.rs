//! [`Lease`]: an item taken for processing for a limited time, and the queue's
//! processing-layer calls (leases, delayed enqueues, dead letters, browse, stats).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::system_time;
use crate::engine::proc::{check_reason, Granted, Proc};
use crate::engine::take::no_item_without_deadline;
use crate::engine::{block_on, block_on_until, Engine};
use crate::error::{Error, Result};
use crate::processing::check_ttl;
use crate::queue::ReliableConcurrentQueue;
use crate::transaction::Transaction;

/// An item leased from a queue: invisible to everyone else until the lease is settled or its
/// deadline passes.
///
/// Settle it exactly once: [`ack`](Lease::ack) it in a transaction (with the follow-up work
/// of the job), [`complete`](Lease::complete) it, [`fail`](Lease::fail) it (retry after the
/// queue's backoff, or dead letters at the maximum attempts) or [`release`](Lease::release)
/// it. Dropping it unsettled gives the item back at once. At its deadline the item goes back
/// by itself (or to the dead letters, at the maximum attempts); every later settlement then
/// fails with [`Error::LeaseExpired`], also when nobody has leased the item again: the
/// fencing token is checked, not the item.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), reliable_queue::Error> {
/// let store = reliable_queue::Store::in_memory()?;
/// let jobs = store.queue::<String>("jobs").await?;
/// let done = store.queue::<String>("done").await?;
/// # let mut tx = store.begin(); jobs.enqueue(&mut tx, "resize".to_owned())?; tx.commit().await?;
///
/// let lease = jobs.lease(Duration::from_secs(30)).await?;
/// assert_eq!(lease.attempt(), 1);
/// let mut tx = store.begin();
/// done.enqueue(&mut tx, format!("{} ok", lease.item()))?;
/// lease.ack(&mut tx)?;
/// tx.commit().await?; // the follow-up and the completion, atomically
/// assert_eq!((jobs.count().await?, done.count().await?), (0, 1));
/// # Ok(()) }
/// ```
pub struct Lease<T> {
    engine: Arc<Engine>,
    proc: Arc<Proc>,
    item: T,
    token: u64,
    deadline: u64,
    attempt: u32,
    settled: bool,
}

/// What [`Lease::fail`] did with the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failed {
    /// Due again at this time (the backoff).
    Retry {
        /// When it becomes visible again.
        at: SystemTime,
    },
    /// Moved to the queue's dead letters: it had its attempts.
    Dead,
}

impl<T> Lease<T> {
    /// The leased item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The leased item, to change before settling.
    pub fn item_mut(&mut self) -> &mut T {
        &mut self.item
    }

    /// This lease's attempt: the number of leases the item has been granted, this one
    /// included (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the lease ends unless extended.
    pub fn deadline(&self) -> SystemTime {
        system_time(self.deadline)
    }

    /// The fencing token: unique in the store, never reused. Settling checks it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Completes the item in `tx`: when `tx` commits, the item is gone for good, atomically
    /// with the transaction's enqueues, dequeues and other acks. If the lease has ended by
    /// commit time the whole commit fails with [`Error::LeaseExpired`] and nothing of it
    /// applies; if `tx` aborts, the item goes back to the front of its queue.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] if the lease has ended already (nothing is buffered).
    /// [`Error::WrongStore`] if `tx` belongs to another store: `tx` is left as it was and,
    /// since `ack` takes the lease, the item is given back at once as by a dropped lease (its
    /// attempt counted; on PostgreSQL from a task, without blocking), on every engine.
    ///
    /// # Examples
    ///
    /// See [`Lease`].
    pub fn ack(mut self, tx: &mut Transaction) -> Result<()> {
        if !std::ptr::eq(tx.engine(), &*self.engine) {
            // Unsettled, the lease gives the item back as it is dropped here.
            return Err(Error::WrongStore {
                queue: self.proc.core.name().to_owned(),
            });
        }
        self.settled = true;
        self.engine.ack(&self.proc, self.token, tx.work_mut())
    }

    /// Acks the lease in a transaction of its own and commits it.
    ///
    /// # Cancel safety
    ///
    /// As [`Transaction::commit`]: once polled, the completion happens whether or not the
    /// future is awaited further.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] if the lease ended; the commit's errors.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q").await?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 1)?; tx.commit().await?;
    /// q.lease(std::time::Duration::from_secs(5)).await?.complete().await?;
    /// assert_eq!(q.stats().await?.leased, 0);
    /// # Ok(()) }
    /// ```
    pub async fn complete(mut self) -> Result<()> {
        self.settled = true;
        self.engine.complete(&self.proc, self.token).await
    }

    /// [`complete`](Lease::complete) for threads.
    ///
    /// # Errors
    ///
    /// As [`complete`](Lease::complete).
    pub fn blocking_complete(self) -> Result<()> {
        block_on(self.complete())
    }

    /// Settles the lease as failed, with `reason` (kept up to 4 KiB; one with a NUL character
    /// is refused, as no engine stores it): below the queue's maximum attempts the item is due
    /// again after the [`RetryPolicy`](crate::RetryPolicy)'s backoff (then at the tail); at the maximum it moves
    /// to the dead letters. Durable when this returns.
    ///
    /// # Cancel safety
    ///
    /// Once polled, the failure is recorded whether or not the future is awaited further.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] if the lease has ended (nothing is done); the commit's errors
    /// (the item is then back at the front of its queue). [`Error::InvalidArgument`] for a
    /// `reason` with a NUL character, on every engine, before anything is recorded (no
    /// backoff, no dead letter): since `fail` takes the lease, the item is given back at once
    /// as by a dropped lease, its attempt counted (on PostgreSQL from a task, without
    /// blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Failed, RetryPolicy};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q").await?;
    /// q.set_retry_policy(RetryPolicy::default().max_attempts(1)).await?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 1)?; tx.commit().await?;
    /// let lease = q.lease(std::time::Duration::from_secs(5)).await?;
    /// assert_eq!(lease.fail("bad input").await?, Failed::Dead);
    /// assert_eq!(q.dead_letters(None, 10).await?[0].reason, "bad input");
    /// # Ok(()) }
    /// ```
    pub async fn fail(mut self, reason: &str) -> Result<Failed> {
        // Unsettled, the lease gives the item back as it is dropped.
        check_reason(reason)?;
        self.settled = true;
        let due = self.engine.fail(&self.proc, self.token, reason).await?;
        Ok(self.failed(due))
    }

    /// [`fail`](Lease::fail) for threads.
    ///
    /// # Errors
    ///
    /// As [`fail`](Lease::fail).
    pub fn blocking_fail(self, reason: &str) -> Result<Failed> {
        block_on(self.fail(reason))
    }

    /// Gives the item back without a failure, due after `delay` (at once, at the front, for a
    /// zero delay; otherwise at the tail once due, durably). The attempt count stays.
    ///
    /// # Cancel safety
    ///
    /// Once polled, the release happens whether or not the future is awaited further.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] if the lease has ended, [`Error::InvalidArgument`] for a delay
    /// over [`MAX_DELAY`](crate::MAX_DELAY) (the lease is then given back at once).
    pub async fn release(mut self, delay: Duration) -> Result<()> {
        self.settled = true;
        self.engine.release(&self.proc, self.token, delay).await
    }

    /// [`release`](Lease::release) for threads.
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release).
    pub fn blocking_release(self, delay: Duration) -> Result<()> {
        block_on(self.release(delay))
    }

    /// Moves the deadline to `ttl` from now: the heartbeat of a long job. Not logged (a
    /// restart ends the lease anyway on the embedded engines).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe on the embedded engines: it is done at once.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] if the lease has ended, [`Error::InvalidArgument`] for a zero
    /// or over-long `ttl`.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl = check_ttl(ttl)?;
        self.deadline = self.engine.extend(&self.proc, self.token, ttl).await?;
        Ok(())
    }

    /// [`extend`](Lease::extend) for threads.
    ///
    /// # Errors
    ///
    /// As [`extend`](Lease::extend).
    pub fn blocking_extend(&mut self, ttl: Duration) -> Result<()> {
        block_on(self.extend(ttl))
    }
}

impl<T> Lease<T> {
    /// What a failure did, counted in the metrics.
    fn failed(&self, due: Option<u64>) -> Failed {
        let queue = self.proc.core.name();
        match due {
            Some(at) => {
                crate::metrics::retried(queue);
                self.engine.metrics.activity.failed(false);
                Failed::Retry {
                    at: system_time(at),
                }
            }
            None => {
                crate::metrics::buried(queue, false, 1);
                self.engine.metrics.activity.failed(true);
                tracing::debug!(queue, "a failed item moved to the dead letters");
                Failed::Dead
            }
        }
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        if !self.settled {
            self.engine.drop_lease(&self.proc, self.token);
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("queue", &self.proc.core.name())
            .field("item", &self.item)
            .field("token", &self.token)
            .field("attempt", &self.attempt)
            .field("deadline_ms", &self.deadline)
            .finish()
    }
}

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    pub(crate) fn leases(&self, leased: Vec<(Granted, T)>) -> Vec<Lease<T>> {
        leased
            .into_iter()
            .map(|(g, item)| self.lease_of(g, item))
            .collect()
    }

    /// Leases up to `n` items for `ttl`; with `wait`, waiting for the first until `deadline`
    /// (if any). Empty only without `wait` or past the deadline.
    pub(crate) async fn lease_up_to(
        &self,
        n: usize,
        ttl: Duration,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<Vec<Lease<T>>> {
        let ttl = check_ttl(ttl)?;
        let leased = self
            .engine()
            .lease(&[(0, self.queue_ref())], n, ttl, wait, deadline, |_, e| {
                self.decode(e)
            })
            .await?;
        Ok(leased.map_or_else(Vec::new, |(_, leased)| self.leases(leased)))
    }

    fn lease_of(&self, g: Granted, item: T) -> Lease<T> {
        Lease {
            engine: Arc::clone(self.engine_arc()),
            proc: Arc::clone(self.proc()),
            item,
            token: g.token,
            deadline: g.deadline,
            attempt: g.attempt,
            settled: false,
        }
    }

    /// Leases the item at the front of the queue for `ttl`, waiting for one if none is
    /// visible: records the attempt durably, then returns the [`Lease`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped future leaves no item leased to nobody. Dropped while waiting,
    /// it took nothing; dropped while the attempt is being recorded, the item goes back to
    /// the front once it is (its attempt counted).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero `ttl` or one over [`MAX_TTL`](crate::MAX_TTL),
    /// [`Error::Deserialize`] if the item is not a `T` (it goes back), the commit's errors,
    /// [`Error::Closed`] after close.
    ///
    /// # Examples
    ///
    /// See [`Lease`].
    pub async fn lease(&self, ttl: Duration) -> Result<Lease<T>> {
        let leased = self.lease_up_to(1, ttl, true, None).await?.pop();
        // Without a deadline the wait only ends with a lease or an error.
        leased.ok_or_else(no_item_without_deadline)
    }

    /// [`lease`](Self::lease) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_lease(&self, ttl: Duration) -> Result<Lease<T>> {
        block_on_until(self.lease(ttl), None)
    }

    /// Leases up to `n` items at once, in one durable write: waits for the first, then takes
    /// what else is visible. Returns at least one lease.
    ///
    /// # Cancel safety
    ///
    /// As [`lease`](Self::lease).
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); for i in 0..5 { q.enqueue(&mut tx, i)?; } tx.commit().await?;
    /// let leases = q.lease_many(3, std::time::Duration::from_secs(5)).await?;
    /// assert_eq!(leases.len(), 3);
    /// assert_eq!(q.stats().await?.leased, 3);
    /// # Ok(()) }
    /// ```
    pub async fn lease_many(&self, n: usize, ttl: Duration) -> Result<Vec<Lease<T>>> {
        self.lease_up_to(n.max(1), ttl, true, None).await
    }

    /// [`lease_many`](Self::lease_many) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_lease_many(&self, n: usize, ttl: Duration) -> Result<Vec<Lease<T>>> {
        block_on_until(self.lease_many(n, ttl), None)
    }

    /// Commits `tx` and, in the same durable write, leases up to `n` more items of this queue
    /// that are visible now (it does not wait for any): the loop of a batch consumer, whose
    /// acknowledgements of one batch ([`Lease::ack`]) and attempts of the next then cost one
    /// write, not two. Atomic: if the commit fails, nothing of `tx` applies and no lease is
    /// granted (the items taken go back to the front, their attempts not counted). Returns
    /// the leases, in queue order; none when nothing was visible (then wait with
    /// [`lease_many`](Self::lease_many)). An item that cannot be decoded is left at the front
    /// and taking stops there; the next lease reports it.
    ///
    /// # Cancel safety
    ///
    /// As [`Transaction::commit`] and [`lease`](Self::lease): once polled, the commit
    /// happens; leases granted to a dropped future go back at once (their attempts counted).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero `ttl` or one over [`MAX_TTL`](crate::MAX_TTL),
    /// [`Error::WrongStore`] if `tx` belongs to another store (`tx` is then aborted), and the
    /// commit's errors, such as [`Error::LeaseExpired`] for an acknowledged lease that ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); for i in 0..5 { q.enqueue(&mut tx, i)?; } tx.commit().await?;
    /// let mut leases = q.lease_many(2, Duration::from_secs(5)).await?;
    /// while !leases.is_empty() {
    ///     let mut tx = store.begin();
    ///     for lease in leases {
    ///         // ... process lease.item() ...
    ///         lease.ack(&mut tx)?;
    ///     }
    ///     leases = q.commit_and_lease(tx, 2, Duration::from_secs(5)).await?;
    /// }
    /// assert_eq!(q.stats().await?.leased, 0);
    /// # Ok(()) }
    /// ```
    pub async fn commit_and_lease(
        &self,
        mut tx: Transaction,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Lease<T>>> {
        let ttl = check_ttl(ttl)?;
        self.check(&tx)?;
        let work = std::mem::take(tx.work_mut());
        let leased = self
            .engine()
            .commit_and_lease(work, self.queue_ref(), n, ttl, |e| self.decode(e))
            .await?;
        Ok(self.leases(leased))
    }

    /// [`commit_and_lease`](Self::commit_and_lease) for threads.
    ///
    /// # Errors
    ///
    /// As [`commit_and_lease`](Self::commit_and_lease).
    pub fn blocking_commit_and_lease(
        &self,
        tx: Transaction,
        n: usize,
        ttl: Duration,
    ) -> Result<Vec<Lease<T>>> {
        block_on(self.commit_and_lease(tx, n, ttl))
    }

    /// Leases the front item if one is visible, without waiting for one to be committed
    /// (it waits only for the attempt to be recorded).
    ///
    /// # Cancel safety
    ///
    /// As [`lease`](Self::lease).
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q").await?;
    /// assert!(q.try_lease(std::time::Duration::from_secs(5)).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_lease(&self, ttl: Duration) -> Result<Option<Lease<T>>> {
        Ok(self.lease_up_to(1, ttl, false, None).await?.pop())
    }

    /// [`try_lease`](Self::try_lease) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_try_lease(&self, ttl: Duration) -> Result<Option<Lease<T>>> {
        block_on(self.try_lease(ttl))
    }
}
