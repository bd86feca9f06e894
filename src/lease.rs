//! [`Lease`]: an item taken for processing for a limited time, and the queue's
//! processing-layer calls (leases, delayed enqueues, dead letters, browse, stats).

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::{system_time, wall_ms};
use crate::core::Entry;
#[cfg(feature = "postgres")]
use crate::engine::postgres::{FailOutcome, Granted as PgGranted, Postgres as PgEngine};
use crate::engine::processing::{check_reason, DeadSlot, Granted, Move, MoveKind, Proc};
use crate::engine::{Engine, Work};
use crate::error::{Error, Result};
use crate::processing::{
    check_delay, check_ttl, BrowsedItem, DeadLetter, ItemState, QueueStats, Replay, RetryPolicy,
};
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

/// Longest deduplication key, in bytes.
const MAX_KEY: usize = 1024;

/// What [`enqueue_unique`](ReliableConcurrentQueue::enqueue_unique) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// Buffered in the transaction, as by `enqueue`; its key is reserved.
    Enqueued,
    /// An item with this key is in the queue or buffered already: nothing was buffered.
    Duplicate,
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

    /// In memory, completes at once what a transaction of its own would (see
    /// `Engine::complete_at_once`); `None` on disk.
    fn complete_at_once(&mut self) -> Option<Result<()>> {
        let done = self.engine.complete_at_once(&self.proc, self.token)?;
        self.settled = true;
        Some(done)
    }

    fn expired(&self) -> Error {
        Error::LeaseExpired {
            queue: self.proc.core.name().to_owned(),
            token: self.token,
        }
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
            // Unsettled, the lease gives the item back as it is dropped here: the same way
            // on every engine (on PostgreSQL the embedded engines' lease table has nothing).
            return Err(Error::WrongStore {
                queue: self.proc.core.name().to_owned(),
            });
        }
        self.settled = true;
        // On PostgreSQL the commit checks the lease (the database's clock decides).
        if !self.engine.is_remote()
            && self
                .proc
                .lease_state(self.token, self.engine.now())
                .is_none()
        {
            return Err(self.expired());
        }
        tx.work_mut().moves.push(Move {
            proc: Arc::clone(&self.proc),
            kind: MoveKind::Ack {
                token: self.token,
                claimed: None,
            },
        });
        Ok(())
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
        if let Some(done) = self.complete_at_once() {
            return done;
        }
        let mut tx = Transaction::new(Arc::clone(&self.engine));
        self.ack(&mut tx)?;
        tx.commit().await
    }

    /// [`complete`](Lease::complete) for threads.
    ///
    /// # Errors
    ///
    /// As [`complete`](Lease::complete).
    pub fn blocking_complete(mut self) -> Result<()> {
        if let Some(done) = self.complete_at_once() {
            return done;
        }
        let mut tx = Transaction::new(Arc::clone(&self.engine));
        self.ack(&mut tx)?;
        tx.blocking_commit()
    }

    /// Settles the lease as failed, with `reason` (kept up to 4 KiB; one with a NUL character
    /// is refused, as no engine stores it): below the queue's maximum attempts the item is due
    /// again after the [`RetryPolicy`]'s backoff (then at the tail); at the maximum it moves
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine.postgres() {
            return match pg.fail(&self.proc.core, self.token, reason).await? {
                FailOutcome::Ended => Err(self.expired()),
                FailOutcome::Retry(at) => Ok(self.failed(Some(at))),
                FailOutcome::Dead => Ok(self.failed(None)),
            };
        }
        let (mut work, due) = self.engine.fail_work(&self.proc, self.token, reason)?;
        self.engine.commit(&mut work).await?;
        Ok(self.failed(due))
    }

    /// [`fail`](Lease::fail) for threads.
    ///
    /// # Errors
    ///
    /// As [`fail`](Lease::fail).
    pub fn blocking_fail(mut self, reason: &str) -> Result<Failed> {
        #[cfg(feature = "postgres")]
        if self.engine.is_remote() {
            return crate::engine::block_on(self.fail(reason));
        }
        check_reason(reason)?;
        self.settled = true;
        let (mut work, due) = self.engine.fail_work(&self.proc, self.token, reason)?;
        self.engine.blocking_commit(&mut work)?;
        Ok(self.failed(due))
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine.postgres() {
            let delay = match check_delay(delay) {
                Ok(d) => d,
                Err(e) => {
                    pg.drop_lease(self.token);
                    return Err(e);
                }
            };
            return match pg.release(self.token, delay).await? {
                true => Ok(()),
                false => Err(self.expired()),
            };
        }
        let work = self.release_work(delay)?;
        match work {
            Some(mut work) => self.engine.commit(&mut work).await,
            None => Ok(()),
        }
    }

    /// [`release`](Lease::release) for threads.
    ///
    /// # Errors
    ///
    /// As [`release`](Lease::release).
    pub fn blocking_release(mut self, delay: Duration) -> Result<()> {
        #[cfg(feature = "postgres")]
        if self.engine.is_remote() {
            return crate::engine::block_on(self.release(delay));
        }
        self.settled = true;
        match self.release_work(delay)? {
            Some(mut work) => self.engine.blocking_commit(&mut work),
            None => Ok(()),
        }
    }

    fn release_work(&self, delay: Duration) -> Result<Option<Work>> {
        let delay = match check_delay(delay) {
            Ok(d) => d,
            Err(e) => {
                self.engine.drop_lease(&self.proc, self.token);
                return Err(e);
            }
        };
        self.engine.release_work(&self.proc, self.token, delay)
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine.postgres() {
            let ttl = check_ttl(ttl)?;
            return match pg.extend(self.token, ttl).await? {
                Some(deadline) => {
                    self.deadline = deadline;
                    Ok(())
                }
                None => Err(self.expired()),
            };
        }
        self.blocking_extend(ttl)
    }

    /// [`extend`](Lease::extend) for threads.
    ///
    /// # Errors
    ///
    /// As [`extend`](Lease::extend).
    pub fn blocking_extend(&mut self, ttl: Duration) -> Result<()> {
        #[cfg(feature = "postgres")]
        if self.engine.is_remote() {
            return crate::engine::block_on(self.extend(ttl));
        }
        let ttl = check_ttl(ttl)?;
        self.deadline = self.engine.extend(&self.proc, self.token, ttl)?;
        Ok(())
    }
}

impl<T> Lease<T> {
    /// What a failure did, counted in the metrics.
    fn failed(&self, due: Option<u64>) -> Failed {
        let queue = self.proc.core.name();
        match due {
            Some(at) => {
                crate::metrics::retried(queue);
                Failed::Retry {
                    at: system_time(at),
                }
            }
            None => {
                crate::metrics::buried(queue, false, 1);
                tracing::debug!(queue, "a failed item moved to the dead letters");
                Failed::Dead
            }
        }
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        if !self.settled {
            #[cfg(feature = "postgres")]
            if let Some(pg) = self.engine.postgres() {
                pg.drop_lease(self.token);
                return;
            }
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
    fn proc(&self) -> &Arc<Proc> {
        &self.queue_ref().proc
    }

    fn leases(&self, granted: Vec<Granted>, items: Vec<T>) -> Vec<Lease<T>> {
        granted
            .into_iter()
            .zip(items)
            .map(|(g, item)| self.lease_of(g, item))
            .collect()
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

    /// Turns the one item `tx` holds (taken from this queue) into a lease.
    pub(crate) async fn grant_one(
        &self,
        tx: &mut Transaction,
        item: T,
        ttl: Duration,
    ) -> Result<Lease<T>> {
        let ttl_ms = check_ttl(ttl)?;
        let granted = self
            .engine()
            .grant(self.queue_ref(), tx.work_mut(), 0, ttl_ms)
            .await?;
        let granted = granted.into_iter().next().ok_or(Error::Closed)?;
        Ok(self.lease_of(granted, item))
    }

    /// [`grant_one`](Self::grant_one) for threads.
    pub(crate) fn blocking_grant_one(
        &self,
        tx: &mut Transaction,
        item: T,
        ttl: Duration,
    ) -> Result<Lease<T>> {
        let ttl_ms = check_ttl(ttl)?;
        let granted = self
            .engine()
            .blocking_grant(self.queue_ref(), tx.work_mut(), 0, ttl_ms)?;
        let granted = granted.into_iter().next().ok_or(Error::Closed)?;
        Ok(self.lease_of(granted, item))
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
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return self
                .remote_lease(1, ttl, true)
                .await?
                .pop()
                .ok_or(Error::Closed);
        }
        if let Some(lease) = self.lease_front_at_once(ttl) {
            return lease;
        }
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let item = self.dequeue(&mut tx).await?;
        self.grant_one(&mut tx, item, ttl).await
    }

    /// [`lease`](Self::lease) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_lease(&self, ttl: Duration) -> Result<Lease<T>> {
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return crate::engine::block_on(self.lease(ttl));
        }
        if let Some(lease) = self.lease_front_at_once(ttl) {
            return lease;
        }
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let item = self.blocking_take(&mut tx)?;
        self.blocking_grant_one(&mut tx, item, ttl)
    }

    /// In memory, leases the front item at once if one is visible (see
    /// `Engine::lease_front_at_once`); `None` otherwise. Checks `ttl` first.
    fn lease_front_at_once(&self, ttl: Duration) -> Option<Result<Lease<T>>> {
        let ttl = match check_ttl(ttl) {
            Ok(ttl) => ttl,
            Err(e) => return Some(Err(e)),
        };
        let leased = self
            .engine()
            .lease_front_at_once(self.queue_ref(), ttl, |entry| self.decode(entry))?;
        Some(leased.map(|(granted, item)| self.lease_of(granted, item)))
    }

    /// The front item if one is visible, else the first one committed: a waiting dequeue
    /// that skips setting up a wait when it need not.
    fn blocking_take(&self, tx: &mut Transaction) -> Result<T> {
        match self.blocking_try_dequeue(tx)? {
            Some(item) => Ok(item),
            None => self.blocking_dequeue(tx),
        }
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
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return self.remote_lease(n.max(1), ttl, true).await;
        }
        let ttl_ms = check_ttl(ttl)?;
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let mut items = vec![self.dequeue(&mut tx).await?];
        while items.len() < n {
            match self.blocking_try_dequeue(&mut tx)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        let granted = self
            .engine()
            .grant(self.queue_ref(), tx.work_mut(), 0, ttl_ms)
            .await?;
        Ok(self.leases(granted, items))
    }

    /// [`lease_many`](Self::lease_many) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_lease_many(&self, n: usize, ttl: Duration) -> Result<Vec<Lease<T>>> {
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return crate::engine::block_on(self.lease_many(n, ttl));
        }
        let ttl_ms = check_ttl(ttl)?;
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let mut items = vec![self.blocking_take(&mut tx)?];
        while items.len() < n {
            match self.blocking_try_dequeue(&mut tx)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        let granted = self
            .engine()
            .blocking_grant(self.queue_ref(), tx.work_mut(), 0, ttl_ms)?;
        Ok(self.leases(granted, items))
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.check(&tx)?;
            let work = std::mem::take(tx.work_mut());
            let granted = self
                .engine()
                .commit_remote_and_lease(pg, work, Some((self.queue_ref(), n, ttl)))
                .await?;
            return self.remote_leases(pg, granted, true).await;
        }
        let (from, items) = self.take_visible(&mut tx, n)?;
        let granted = self
            .engine()
            .grant(self.queue_ref(), tx.work_mut(), from, ttl)
            .await?;
        Ok(self.leases(granted, items))
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
        // Nothing in it waits but the commit, which `block_on` waits for as
        // `blocking_commit` does.
        crate::engine::block_on(self.commit_and_lease(tx, n, ttl))
    }

    /// Takes up to `n` visible items into `tx`, stopping before one that cannot be decoded
    /// (it goes back to the front). Returns where they start among `tx`'s dequeued items,
    /// and the items.
    fn take_visible(&self, tx: &mut Transaction, n: usize) -> Result<(usize, Vec<T>)> {
        self.check(tx)?;
        let from = tx.work_mut().dequeued.len();
        let mut items = Vec::with_capacity(n.min(1024));
        while items.len() < n {
            match self.blocking_try_dequeue(tx) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                // The item was taken, then failed to decode.
                Err(Error::Deserialize { .. }) => {
                    tx.work_mut().give_back_last();
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok((from, items))
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
        check_ttl(ttl)?;
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return Ok(self.remote_lease(1, ttl, false).await?.pop());
        }
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let Some(item) = self.try_dequeue(&mut tx).await? else {
            return Ok(None);
        };
        self.grant_one(&mut tx, item, ttl).await.map(Some)
    }

    /// [`try_lease`](Self::try_lease) for threads.
    ///
    /// # Errors
    ///
    /// As [`lease`](Self::lease).
    pub fn blocking_try_lease(&self, ttl: Duration) -> Result<Option<Lease<T>>> {
        check_ttl(ttl)?;
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return crate::engine::block_on(self.try_lease(ttl));
        }
        let mut tx = Transaction::new(Arc::clone(self.engine_arc()));
        let Some(item) = self.blocking_try_dequeue(&mut tx)? else {
            return Ok(None);
        };
        self.blocking_grant_one(&mut tx, item, ttl).map(Some)
    }

    /// Enqueues `item` in `tx`, invisible until `delay` after the commit: then it is appended
    /// at the tail (items falling due together, in due order) and waiting consumers are
    /// woken. Durable like any enqueue; a restart keeps it delayed. A zero delay is a plain
    /// [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); [`Error::InvalidArgument`] for a delay over
    /// [`MAX_DELAY`](crate::MAX_DELAY).
    ///
    /// # Examples
    ///
    /// See [`ManualClock`](crate::ManualClock).
    pub fn enqueue_after(
        &self,
        tx: &mut Transaction,
        item: impl Borrow<T>,
        delay: Duration,
    ) -> Result<()> {
        let delay = check_delay(delay)?;
        if delay == 0 {
            return self.enqueue(tx, item);
        }
        self.enqueue_due(tx, item.borrow(), 0, delay)
    }

    /// Enqueues `item` in `tx`, invisible until `at` (by the store's clock); a time not in
    /// the future is a plain [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); [`Error::InvalidArgument`] for a time before the Unix
    /// epoch.
    pub fn enqueue_at(
        &self,
        tx: &mut Transaction,
        item: impl Borrow<T>,
        at: SystemTime,
    ) -> Result<()> {
        let due = wall_ms(at)?;
        if due <= self.engine().now() {
            return self.enqueue(tx, item);
        }
        self.enqueue_due(tx, item.borrow(), due, 0)
    }

    /// Enqueues `item` in `tx` with deduplication key `key` (P11): while an item with this
    /// key is in the queue (visible, delayed, leased, or held by a transaction) or buffered
    /// by an open transaction, another such enqueue is a no-op that says so, returning
    /// [`Enqueued::Duplicate`] at once (the key is reserved when the first is buffered, and
    /// freed if its transaction does not commit). The key is free again once the item leaves
    /// the queue: a committed dequeue, an ack, a move to the dead letters (a replayed dead
    /// letter brings its key back, even if another item has it meanwhile). With `delay`, the
    /// item is also delayed, as by [`enqueue_after`](Self::enqueue_after).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); [`Error::InvalidArgument`] for an empty key or one over
    /// 1 KiB, or a delay over [`MAX_DELAY`](crate::MAX_DELAY).
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::Enqueued;
    /// use std::time::Duration;
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<String>("emails")?;
    /// let mut tx = store.begin();
    /// let key = b"welcome:user-42";
    /// assert_eq!(q.enqueue_unique(&mut tx, "hi".to_owned(), key, Duration::ZERO)?, Enqueued::Enqueued);
    /// assert_eq!(q.enqueue_unique(&mut tx, "hi".to_owned(), key, Duration::ZERO)?, Enqueued::Duplicate);
    /// tx.blocking_commit()?;
    /// assert_eq!(q.blocking_count()?, 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn enqueue_unique(
        &self,
        tx: &mut Transaction,
        item: impl Borrow<T>,
        key: &[u8],
        delay: Duration,
    ) -> Result<Enqueued> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(Error::InvalidArgument {
                argument: "key",
                expected: "1 byte to 1 KiB",
            });
        }
        let delay = check_delay(delay)?;
        self.check(tx)?;
        tx.work_mut().check_live()?;
        let mut entry = self.encode_entry(item.borrow())?;
        let core = &self.proc().core;
        if !core.reserve_key(key) {
            return Ok(Enqueued::Duplicate);
        }
        entry.key = Some(key.into());
        tx.work_mut().moves.push(Move {
            proc: Arc::clone(self.proc()),
            kind: MoveKind::Enqueue { entry, delay },
        });
        Ok(Enqueued::Enqueued)
    }

    fn encode_entry(&self, item: &T) -> Result<Entry> {
        Ok(Entry::new(0, self.encode(item)?, 0))
    }

    /// Buffers `item`, due at `at` (ms since the epoch) or, with a non-zero `delay`, that
    /// many ms after the commit.
    fn enqueue_due(&self, tx: &mut Transaction, item: &T, at: u64, delay: u64) -> Result<()> {
        self.check(tx)?;
        tx.work_mut().check_live()?;
        let mut entry = self.encode_entry(item)?;
        entry.not_before = at;
        tx.work_mut().moves.push(Move {
            proc: Arc::clone(self.proc()),
            kind: MoveKind::Enqueue { entry, delay },
        });
        Ok(())
    }

    /// Counts of the queue's items: visible, delayed, leased, held by open transactions, dead;
    /// and the enqueue time of the item at the front. Each is a snapshot, taken one after the
    /// other, not together: an item moving between states at that moment may be counted in
    /// neither or in both (one whose lease expired at the maximum attempts is in neither while
    /// its move to the dead letters is written). None lists anything, so it costs the same
    /// however long the queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] after close.
    pub async fn stats(&self) -> Result<QueueStats> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.engine().check_open()?;
            let (stats, policy) = pg.stats(&self.proc().core).await?;
            self.proc().set_policy(policy);
            return Ok(stats);
        }
        self.blocking_stats()
    }

    /// [`stats`](Self::stats) for threads.
    ///
    /// # Errors
    ///
    /// As [`stats`](Self::stats).
    pub fn blocking_stats(&self) -> Result<QueueStats> {
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return crate::engine::block_on(self.stats());
        }
        self.engine().check_open()?;
        let proc = self.proc();
        Ok(QueueStats {
            visible: proc.core.count(),
            delayed: proc.delayed(),
            leased: proc.leased(),
            held: proc.core.held(),
            dead: proc.dead_count(),
            front_enqueued_at: known(proc.core.front_enqueued_at()),
        })
    }

    /// The queue's retry policy (the default until one is set).
    pub fn retry_policy(&self) -> RetryPolicy {
        self.proc().policy()
    }

    /// Sets the queue's retry policy, durably (in the store: every handle and later opens
    /// use it). A value past what every engine stores (a policy not made by its setters,
    /// such as a deserialized one) is clamped to its maximum first, as the setters do (see
    /// [`RetryPolicy`]).
    ///
    /// # Cancel safety
    ///
    /// Once polled, the policy is stored whether or not the future is awaited further.
    ///
    /// # Errors
    ///
    /// Storage errors; [`Error::Closed`] after close.
    pub async fn set_retry_policy(&self, policy: RetryPolicy) -> Result<()> {
        let policy = policy.clamped();
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.engine().check_open()?;
            pg.set_policy(&self.proc().core, policy).await?;
            self.proc().set_policy(policy);
            return Ok(());
        }
        self.engine().set_policy(self.proc(), policy).await
    }

    /// [`set_retry_policy`](Self::set_retry_policy) for threads.
    ///
    /// # Errors
    ///
    /// As [`set_retry_policy`](Self::set_retry_policy).
    pub fn blocking_set_retry_policy(&self, policy: RetryPolicy) -> Result<()> {
        crate::engine::block_on(self.set_retry_policy(policy))
    }

    /// Lists up to `limit` items with ids above `after` (all of them from `None`), in id
    /// order, without taking, hiding or reordering anything: ready, delayed and leased items
    /// (items held by open transactions are not listed; [`stats`](Self::stats) counts them).
    /// Continue from the last id returned. Each page copies the queue's ready items under its
    /// lock: a tool for operators, not for a hot path.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Deserialize`] for an item that is not a `T`; [`Error::Closed`] after close.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::ItemState;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); for i in 0..3 { q.enqueue(&mut tx, i)?; } tx.commit().await?;
    /// let page = q.browse(None, 2).await?;
    /// assert_eq!(page.len(), 2);
    /// assert_eq!(page[0].state, ItemState::Ready);
    /// let rest = q.browse(Some(page[1].id), 2).await?;
    /// assert_eq!(rest.len(), 1);
    /// assert_eq!(q.count().await?, 3); // nothing consumed
    /// # Ok(()) }
    /// ```
    pub async fn browse(&self, after: Option<u64>, limit: usize) -> Result<Vec<BrowsedItem<T>>> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.engine().check_open()?;
            let found = pg.browse(&self.proc().core, after, limit).await?;
            return self.browsed(found);
        }
        self.blocking_browse(after, limit)
    }

    /// [`browse`](Self::browse) for threads.
    ///
    /// # Errors
    ///
    /// As [`browse`](Self::browse).
    pub fn blocking_browse(&self, after: Option<u64>, limit: usize) -> Result<Vec<BrowsedItem<T>>> {
        #[cfg(feature = "postgres")]
        if self.engine().is_remote() {
            return crate::engine::block_on(self.browse(after, limit));
        }
        self.engine().check_open()?;
        let proc = self.proc();
        let above = |id: u64| after.is_none_or(|a| id > a);
        let mut found: Vec<(Entry, ItemState)> = Vec::new();
        for e in proc.core.ready_entries() {
            if above(e.id) {
                found.push((e, ItemState::Ready));
            }
        }
        for e in self.engine().delayed_entries(proc) {
            if above(e.id) {
                let until = system_time(e.not_before);
                found.push((e, ItemState::Delayed { until }));
            }
        }
        for (token, deadline, e) in proc.leased_entries() {
            if above(token) {
                let state = ItemState::Leased {
                    until: system_time(deadline),
                    attempt: e.attempts,
                };
                found.push((e, state));
            }
        }
        found.sort_by_key(|(e, _)| e.id);
        found.truncate(limit);
        self.browsed(found)
    }

    fn browsed(&self, found: Vec<(Entry, ItemState)>) -> Result<Vec<BrowsedItem<T>>> {
        found
            .into_iter()
            .map(|(e, state)| {
                Ok(BrowsedItem {
                    id: e.id,
                    item: self.decode(&e)?,
                    state,
                    attempts: e.attempts,
                    enqueued_at: known(e.times.enqueued_at),
                })
            })
            .collect()
    }

    /// Lists up to `limit` dead letters with ids above `after`, oldest first. On disk their
    /// items are read from the log (they are not kept in memory).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Deserialize`] for an item that is not a `T`; storage errors; [`Error::Closed`].
    ///
    /// # Examples
    ///
    /// See [`Lease::fail`].
    pub async fn dead_letters(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter<T>>> {
        self.engine().check_open()?;
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            let slots = pg.dead_letters(&self.proc().core, after, limit).await?;
            return slots.into_iter().map(|s| self.dead_letter(s)).collect();
        }
        let mut slots = self.proc().dead_page(after, limit);
        self.engine().dead_bytes(&mut slots).await?;
        slots.into_iter().map(|s| self.dead_letter(s)).collect()
    }

    /// [`dead_letters`](Self::dead_letters) for threads.
    ///
    /// # Errors
    ///
    /// As [`dead_letters`](Self::dead_letters).
    pub fn blocking_dead_letters(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter<T>>> {
        crate::engine::block_on(self.dead_letters(after, limit))
    }

    fn dead_letter(&self, slot: DeadSlot) -> Result<DeadLetter<T>> {
        let item = self.decode(&slot.entry)?;
        let e = slot.entry;
        Ok(DeadLetter {
            id: e.id,
            item,
            reason: slot.reason,
            attempts: e.attempts,
            first_attempt: known(e.times.first_attempt),
            last_attempt: known(e.times.last_attempt),
            enqueued_at: known(e.times.enqueued_at),
        })
    }

    fn chosen(&self, which: &Replay) -> Vec<u64> {
        match which {
            Replay::All => self.proc().dead_ids(None),
            Replay::First(n) => self.proc().dead_ids(Some(*n)),
            Replay::Ids(ids) => ids.clone(),
        }
    }

    /// Moves dead letters back to the tail of the queue, visible at once, atomically and
    /// durably; with `reset_attempts` their attempt counts start again from 0. Returns how
    /// many moved.
    ///
    /// # Cancel safety
    ///
    /// Once polled, the replay happens whether or not the future is awaited further.
    ///
    /// # Errors
    ///
    /// [`Error::NotDeadLetter`] for an id that is not a dead letter of this queue (nothing is
    /// replayed); storage errors; [`Error::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Replay, RetryPolicy};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q").await?;
    /// q.set_retry_policy(RetryPolicy::default().max_attempts(1)).await?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 1)?; tx.commit().await?;
    /// q.lease(std::time::Duration::from_secs(5)).await?.fail("flaky").await?;
    /// assert_eq!(q.replay(Replay::All, true).await?, 1);
    /// assert_eq!(q.count().await?, 1);
    /// # Ok(()) }
    /// ```
    pub async fn replay(&self, which: Replay, reset_attempts: bool) -> Result<usize> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.engine().check_open()?;
            return pg
                .dead_work(&self.proc().core, which, reset_attempts, false)
                .await;
        }
        let ids = self.chosen(&which);
        let mut work = self
            .engine()
            .dead_work(self.proc(), &ids, reset_attempts, false)?;
        self.engine().commit(&mut work).await?;
        Ok(ids.len())
    }

    /// [`replay`](Self::replay) for threads.
    ///
    /// # Errors
    ///
    /// As [`replay`](Self::replay).
    pub fn blocking_replay(&self, which: Replay, reset_attempts: bool) -> Result<usize> {
        crate::engine::block_on(self.replay(which, reset_attempts))
    }

    /// Deletes dead letters for good, atomically and durably. Returns how many.
    ///
    /// # Cancel safety
    ///
    /// As [`replay`](Self::replay).
    ///
    /// # Errors
    ///
    /// As [`replay`](Self::replay).
    pub async fn purge(&self, which: Replay) -> Result<usize> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.engine().postgres() {
            self.engine().check_open()?;
            return pg.dead_work(&self.proc().core, which, false, true).await;
        }
        let ids = self.chosen(&which);
        let mut work = self.engine().dead_work(self.proc(), &ids, false, true)?;
        self.engine().commit(&mut work).await?;
        Ok(ids.len())
    }

    /// [`purge`](Self::purge) for threads.
    ///
    /// # Errors
    ///
    /// As [`purge`](Self::purge).
    pub fn blocking_purge(&self, which: Replay) -> Result<usize> {
        crate::engine::block_on(self.purge(which))
    }
}

#[cfg(feature = "postgres")]
impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// On PostgreSQL: leases up to `n` items, waiting for the first with `wait`.
    async fn remote_lease(&self, n: usize, ttl: Duration, wait: bool) -> Result<Vec<Lease<T>>> {
        let ttl = check_ttl(ttl)?;
        let pg = self.engine().postgres().ok_or(Error::Bug {
            invariant: "a remote lease is on a remote engine",
        })?;
        let granted = self
            .engine()
            .lease_remote(self.queue_ref(), n, ttl, wait, None)
            .await?;
        self.remote_leases(pg, granted, false).await
    }

    /// Turns leases granted on PostgreSQL into `Lease`s. An item that does not decode is
    /// given back with its lease (its attempt not counted): with `partial`, it and the ones
    /// after it, keeping those before; otherwise all of them, and the call fails.
    async fn remote_leases(
        &self,
        pg: &PgEngine,
        granted: Vec<PgGranted>,
        partial: bool,
    ) -> Result<Vec<Lease<T>>> {
        let mut leases: Vec<Lease<T>> = Vec::with_capacity(granted.len());
        let mut rest = granted.into_iter();
        while let Some(g) = rest.next() {
            match self.decode(&g.entry) {
                Ok(item) => leases.push(self.lease_of(
                    Granted {
                        token: g.token,
                        deadline: g.deadline,
                        attempt: g.entry.attempts,
                    },
                    item,
                )),
                Err(e) => {
                    let mut back = vec![g.token];
                    back.extend(rest.map(|g| g.token));
                    if !partial {
                        for lease in &mut leases {
                            lease.settled = true;
                            back.push(lease.token);
                        }
                    }
                    pg.unlease(&self.proc().core, back).await?;
                    return if partial { Ok(leases) } else { Err(e) };
                }
            }
        }
        Ok(leases)
    }
}

fn known(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| system_time(ms))
}
