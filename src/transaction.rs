//! [`Transaction`]: a unit of enqueues and dequeues that commits or aborts as one.

use std::fmt;
use std::sync::Arc;

use crate::engine::{block_on, Engine, Work};
use crate::error::Result;

/// A set of enqueues and dequeues, over any queues of one store, applied atomically.
///
/// - Enqueued items are invisible until the commit, to this transaction too.
/// - A dequeued item is invisible to everyone else from the moment it is dequeued.
/// - [`commit`](Transaction::commit) applies everything, durably; [`abort`](Transaction::abort),
///   dropping the transaction or a failed commit discards the enqueues and puts the dequeued
///   items back at the front of their queues.
///
/// Keep transactions short: items a transaction holds are invisible to every consumer.
///
/// # Examples
///
/// Move an item from one queue to another, atomically:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), reliable_queue::Error> {
/// let store = reliable_queue::Store::in_memory()?;
/// let inbox = store.queue::<String>("inbox").await?;
/// let done = store.queue::<String>("done").await?;
/// # let mut tx = store.begin(); inbox.enqueue(&mut tx, "a".to_owned())?; tx.commit().await?;
///
/// let mut tx = store.begin();
/// if let Some(item) = inbox.try_dequeue(&mut tx).await? {
///     done.enqueue(&mut tx, item)?;
/// }
/// tx.commit().await?;
/// assert_eq!((inbox.count().await?, done.count().await?), (0, 1));
/// # Ok(()) }
/// ```
#[must_use = "a transaction does nothing until committed, and aborts when dropped"]
pub struct Transaction {
    engine: Arc<Engine>,
    work: Work,
}

impl Transaction {
    #[inline]
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Transaction {
            engine,
            work: Work::default(),
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn work_mut(&mut self) -> &mut Work {
        &mut self.work
    }

    /// Gives the transaction a deadline `timeout` from now, replacing any it had (such as the
    /// store's default, [`Builder::transaction_timeout`](crate::Builder::transaction_timeout)).
    /// Past it the items the transaction holds go back to the front of their queues at once,
    /// and its later calls and its commit fail with
    /// [`Error::TransactionExpired`](crate::Error::TransactionExpired).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a zero timeout,
    /// [`Error::TransactionExpired`](crate::Error::TransactionExpired) if its deadline passed
    /// already.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use reliable_queue::{Error, ManualClock, Store};
    ///
    /// let clock = ManualClock::new(std::time::SystemTime::now())?;
    /// let store = Store::builder().clock(clock.clone()).open()?;
    /// let q = store.blocking_queue::<u8>("q")?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 1)?; tx.blocking_commit()?;
    /// let mut tx = store.begin();
    /// tx.set_timeout(Duration::from_secs(5))?;
    /// assert_eq!(q.blocking_try_dequeue(&mut tx)?, Some(1));
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(q.blocking_count()?, 1); // back at once
    /// assert!(matches!(tx.blocking_commit(), Err(Error::TransactionExpired)));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn set_timeout(&mut self, timeout: std::time::Duration) -> Result<()> {
        let ms = crate::clock::millis(timeout);
        if ms == 0 {
            return Err(crate::Error::InvalidArgument {
                argument: "timeout",
                expected: "at least 1 ms",
            });
        }
        self.engine.set_timeout(&mut self.work, ms)
    }

    /// Number of items enqueued so far.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// assert_eq!(tx.enqueued(), 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn enqueued(&self) -> usize {
        self.work.enqueues.len()
    }

    /// Number of items dequeued (and held) so far.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.blocking_try_dequeue(&mut tx)?, None);
    /// assert_eq!(tx.dequeued(), 0);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn dequeued(&self) -> usize {
        self.work.held()
    }

    /// Applies every enqueue and dequeue of the transaction atomically, and returns once they
    /// are durable (under [`Durability::Sync`](crate::Durability::Sync)). Concurrent commits
    /// share one log write and one fsync. In memory it is applied at once; once the task has
    /// spent tokio's cooperative budget, the future then yields once before returning.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before its first poll aborts the transaction. Once polled, the
    /// commit is in the engine's hands and completes (or fails) whether or not the future
    /// is still awaited; only its outcome is lost. Do not retry a commit whose future was
    /// dropped: it may have been applied.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`](crate::Error::Storage) if the log cannot be written,
    /// [`Error::PreviousFailure`](crate::Error::PreviousFailure) if an earlier storage failure
    /// stopped the store, [`Error::Closed`](crate::Error::Closed) after
    /// [`Store::close`](crate::Store::close). Either way nothing was applied and the dequeued
    /// items are back at the front of their queues.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// let q = store.queue::<u64>("q").await?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 42)?;
    /// tx.commit().await?;
    /// assert_eq!(q.count().await?, 1);
    /// # Ok(()) }
    /// ```
    pub async fn commit(mut self) -> Result<()> {
        let tally = self.tally();
        let outcome = self.engine.commit(&mut self.work).await;
        self.counted(tally, outcome)
    }

    /// What a commit moves, for the metrics, and when it started if it is timed.
    #[inline]
    fn tally(&self) -> (usize, usize, Option<std::time::Instant>) {
        let work = &self.work;
        let (enqueued, dequeued) = work.tally();
        let started = self.engine.is_durable().then(std::time::Instant::now);
        (enqueued, dequeued, started)
    }

    /// A commit's `outcome`, counted by the metrics with what it moved (its [`tally`](Self::tally)).
    #[inline]
    fn counted(
        &self,
        (enqueued, dequeued, started): (usize, usize, Option<std::time::Instant>),
        outcome: Result<()>,
    ) -> Result<()> {
        self.engine
            .metrics
            .commit(outcome.is_ok(), enqueued, dequeued, started);
        outcome
    }

    /// [`commit`](Transaction::commit) for threads: blocks until the commit is durable.
    ///
    /// # Errors
    ///
    /// As [`commit`](Transaction::commit).
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// let q = store.blocking_queue::<u64>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 42)?;
    /// tx.blocking_commit()?;
    /// assert_eq!(q.blocking_count()?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking_commit(mut self) -> Result<()> {
        let tally = self.tally();
        let outcome = self.engine.blocking_commit(&mut self.work);
        self.counted(tally, outcome)
    }

    /// Discards the enqueues and puts the dequeued items back at the front of their queues,
    /// visible once this returns. Dropping the transaction does the same (on PostgreSQL,
    /// best effort). On the embedded engines it is applied at once and cannot fail; once the
    /// task has spent tokio's cooperative budget, the future then yields once before returning.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped future drops the transaction, which aborts it.
    ///
    /// # Errors
    ///
    /// None on the embedded engines; the `Result` is for engines where aborting is a round
    /// trip.
    ///
    /// # Examples
    ///
    /// Peek: dequeue, look, abort.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 7)?; tx.commit().await?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue(&mut tx).await?, Some(7));
    /// tx.abort().await?;
    /// assert_eq!(q.count().await?, 1);
    /// # Ok(()) }
    /// ```
    pub async fn abort(mut self) -> Result<()> {
        let work = std::mem::take(&mut self.work);
        let aborted = self.engine.abort(work).await;
        crate::engine::consume_budget().await;
        aborted
    }

    /// [`abort`](Transaction::abort) for threads.
    ///
    /// # Errors
    ///
    /// As [`abort`](Transaction::abort).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u32>("q")?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 7)?; tx.blocking_commit()?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.blocking_try_dequeue(&mut tx)?, Some(7));
    /// tx.blocking_abort()?;
    /// assert_eq!(q.blocking_count()?, 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_abort(self) -> Result<()> {
        block_on(self.abort())
    }
}

#[cfg(feature = "postgres")]
impl Transaction {
    /// Runs the service's own SQL statement in this transaction's database transaction (the
    /// PostgreSQL engine), so that it commits or rolls back with the queue operations: enqueue
    /// a job and write its business rows atomically, or complete a job and record its result.
    /// Returns the number of rows the statement affected. A statement that fails aborts the
    /// transaction (as PostgreSQL does): its commit then fails with
    /// [`Error::TransactionAborted`](crate::Error::TransactionAborted) and nothing of it
    /// applies.
    ///
    /// # Cancel safety
    ///
    /// A future dropped before it completes aborts the transaction, as for
    /// [`try_dequeue`](crate::ReliableConcurrentQueue::try_dequeue).
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`](crate::Error::Postgres) for a failed statement or connection,
    /// [`Error::TransactionAborted`](crate::Error::TransactionAborted) if the transaction was
    /// aborted before, [`Error::Unsupported`](crate::Error::Unsupported) on the embedded
    /// engines, [`Error::Closed`](crate::Error::Closed) after close.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::connect("postgresql://app@localhost/app").await?;
    /// let jobs = store.queue::<u64>("invoices").await?;
    /// let mut tx = store.begin();
    /// let order: i64 = 42;
    /// tx.execute("INSERT INTO orders (id, state) VALUES ($1, 'new')", &[&order])
    ///     .await?;
    /// jobs.enqueue(&mut tx, 42)?;
    /// tx.commit().await?; // the row and the job, or neither
    /// # Ok(()) }
    /// ```
    pub async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn crate::postgres::ToSql + Sync)],
    ) -> Result<u64> {
        match self.run_sql(sql, params, false).await? {
            crate::engine::SqlOutcome::Affected(n) => Ok(n),
            crate::engine::SqlOutcome::Rows(rows) => {
                Ok(u64::try_from(rows.len()).unwrap_or(u64::MAX))
            }
        }
    }

    /// Runs the service's own SQL query in this transaction's database transaction and
    /// returns its rows; as [`execute`](Self::execute) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`execute`](Self::execute).
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn crate::postgres::ToSql + Sync)],
    ) -> Result<Vec<crate::postgres::Row>> {
        match self.run_sql(sql, params, true).await? {
            crate::engine::SqlOutcome::Rows(rows) => Ok(rows),
            crate::engine::SqlOutcome::Affected(_) => Ok(Vec::new()),
        }
    }

    /// [`execute`](Self::execute) for threads.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub fn blocking_execute(
        &mut self,
        sql: &str,
        params: &[&(dyn crate::postgres::ToSql + Sync)],
    ) -> Result<u64> {
        block_on(self.execute(sql, params))
    }

    /// [`query`](Self::query) for threads.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub fn blocking_query(
        &mut self,
        sql: &str,
        params: &[&(dyn crate::postgres::ToSql + Sync)],
    ) -> Result<Vec<crate::postgres::Row>> {
        block_on(self.query(sql, params))
    }

    async fn run_sql(
        &mut self,
        sql: &str,
        params: &[&(dyn crate::postgres::ToSql + Sync)],
        rows: bool,
    ) -> Result<crate::engine::SqlOutcome> {
        self.engine.sql(&mut self.work, sql, params, rows).await
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.work.withdraw_leaked();
        if !self.work.dequeued.is_empty()
            || !self.work.moves.is_empty()
            || self.work.expiry.is_some()
        {
            self.engine.discard(std::mem::take(&mut self.work));
        }
    }
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("enqueued", &self.enqueued())
            .field("dequeued", &self.dequeued())
            .finish()
    }
}
