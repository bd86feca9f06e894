//! [`ReliableConcurrentQueue`]: the typed handle on one named queue.
//!
//! The item path (`enqueue`, `try_dequeue` and their blocking forms, down to the codec and the
//! engine's take) is `#[inline]`: these functions are generic over the item, so they are
//! compiled in the caller's crate, which the default release profile splits into 16 units, and
//! a call from one unit into another is often left a call. Marked, every unit that uses them
//! gets a copy it can inline (ARCHITECTURE.md, "Decisions where the contract is silent").

pub(crate) mod delays;
pub(crate) mod dequeue;
pub(crate) mod import;
mod inspect;
pub(crate) mod lease;
pub(crate) mod set;

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{self, EncodeError};

use crate::engine::proc::Proc;
use crate::engine::{block_on, Engine, Entry, QueueRef};
use crate::error::{Error, Result};
use crate::transaction::Transaction;

/// A named, durable, transactional queue of `T`s with best-effort FIFO order.
///
/// Obtained from [`Store::queue`](crate::Store::queue). Cheap to clone; clones are the same
/// queue. All operations go through a [`Transaction`] of the same store.
///
/// - [`enqueue`](Self::enqueue) is invisible until the transaction commits, to that
///   transaction too.
/// - [`try_dequeue`](Self::try_dequeue) never waits for an item: it takes a visible item no
///   other transaction holds, or returns `None`. The item is invisible to everyone else at
///   once, and comes back at the front of the queue if the transaction does not commit.
/// - [`count`](Self::count) is a point-in-time figure, not part of any transaction.
/// - Items come out roughly in commit order; items given back by an abort come out first.
///   Nothing stronger is promised.
///
/// Calls that may wait on I/O are `async fn`s, each with a `blocking_` form for threads.
///
/// # Examples
///
/// A batch consumer: dequeue up to 16 items, commit, then process.
///
/// ```
/// let store = reliable_queue::Store::in_memory()?;
/// let q = store.blocking_queue::<u32>("work")?;
/// # let mut tx = store.begin(); for i in 0..20 { q.enqueue(&mut tx, i)?; } tx.blocking_commit()?;
/// loop {
///     let mut tx = store.begin();
///     let mut batch = Vec::new();
///     while batch.len() < 16 {
///         match q.blocking_try_dequeue(&mut tx)? {
///             Some(item) => batch.push(item),
///             None => break,
///         }
///     }
///     tx.blocking_commit()?;
///     if batch.is_empty() {
///         break;
///     }
///     // process `batch` here
/// }
/// assert_eq!(q.blocking_count()?, 0);
/// # Ok::<(), reliable_queue::Error>(())
/// ```
pub struct ReliableConcurrentQueue<T> {
    engine: Arc<Engine>,
    queue: QueueRef,
    _items: PhantomData<fn(T) -> T>,
}

impl<T> ReliableConcurrentQueue<T> {
    pub(crate) fn new(engine: Arc<Engine>, queue: QueueRef) -> Self {
        ReliableConcurrentQueue {
            engine,
            queue,
            _items: PhantomData,
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn engine_arc(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub(crate) fn queue_ref(&self) -> &QueueRef {
        &self.queue
    }

    /// The queue's processing-layer state (leases, dead letters, retry policy).
    pub(crate) fn proc(&self) -> &Arc<Proc> {
        &self.queue.proc
    }

    /// The queue's name.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// assert_eq!(store.blocking_queue::<u8>("emails")?.name(), "emails");
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn name(&self) -> &str {
        self.queue.name()
    }

    /// The number of items visible now: committed, and held by no open transaction.
    ///
    /// Not transactional: a snapshot that may be stale as soon as it is read, exact only
    /// while nothing else touches the queue. Ready at once on the embedded engines, but for
    /// tokio's cooperative budget: once the task has spent it, the future yields first.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] after [`Store::close`](crate::Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q").await?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// assert_eq!(q.count().await?, 0); // not committed yet
    /// tx.commit().await?;
    /// assert_eq!(q.count().await?, 1);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<u64> {
        crate::engine::consume_budget().await;
        self.engine.count(&self.queue).await
    }

    /// [`count`](Self::count) for threads.
    ///
    /// # Errors
    ///
    /// As [`count`](Self::count).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u8>("q")?;
    /// assert_eq!(q.blocking_count()?, 0);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_count(&self) -> Result<u64> {
        block_on(self.count())
    }

    /// The number of consumers waiting in [`dequeue`](Self::dequeue) or
    /// [`blocking_dequeue`](Self::blocking_dequeue) (or a waiting lease) right now. A
    /// point-in-time figure. On PostgreSQL, this store's consumers only (other processes'
    /// are not counted), and a consumer counts while it sleeps: not while it looks for an
    /// item or has been woken to look.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// assert_eq!(store.blocking_queue::<u8>("q")?.waiters(), 0);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn waiters(&self) -> usize {
        self.engine.waiters(&self.queue)
    }

    /// Checks that `tx` belongs to this queue's store.
    #[inline]
    pub(crate) fn check(&self, tx: &Transaction) -> Result<()> {
        if std::ptr::eq(tx.engine(), &*self.engine) {
            Ok(())
        } else {
            Err(Error::WrongStore {
                queue: self.name().to_owned(),
            })
        }
    }
}

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// Adds `item` to the transaction; it joins the queue when the transaction commits.
    ///
    /// The item is serialized now, so its errors surface here, and it is taken by reference
    /// (`T` or `&T`): when a limit refuses it, the caller still has it. Not even `tx` can
    /// dequeue it before the commit. Synchronous on every engine: it only buffers.
    ///
    /// # Errors
    ///
    /// [`Error::Serialize`] if `T`'s serialization fails, [`Error::ItemTooLarge`] over the
    /// item size limit (found while encoding: encoding stops at the first byte over the
    /// limit, so refusing a huge item costs no more memory than the limit, and the error's
    /// `size` is at least the size reached then; exact for byte-like items such as `Vec<u8>`
    /// and `String`), [`Error::TransactionTooLarge`] over the transaction size limit,
    /// [`Error::WrongStore`] if `tx` belongs to another store, [`Error::Closed`] after
    /// [`Store::close`](crate::Store::close). On error the transaction is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<String>("q")?;
    /// let mut tx = store.begin();
    /// let item = "hello".to_owned();
    /// q.enqueue(&mut tx, &item)?; // the caller keeps `item`
    /// assert_eq!(q.blocking_try_dequeue(&mut tx)?, None); // no read-your-own-writes
    /// tx.blocking_commit()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    #[inline]
    pub fn enqueue(&self, tx: &mut Transaction, item: impl Borrow<T>) -> Result<()> {
        self.check(tx)?;
        let bytes = self.encode(item.borrow())?;
        self.engine.enqueue(&self.queue, tx.work_mut(), bytes)
    }

    /// Encodes an item within the item size limit, once the store is known open.
    #[inline]
    pub(crate) fn encode(&self, item: &T) -> Result<Box<[u8]>> {
        self.engine.check_open()?;
        let limit = self.engine.max_item_size();
        codec::encode(item, limit).map_err(|e| match e {
            EncodeError::TooLarge { size } => Error::ItemTooLarge {
                queue: self.name().to_owned(),
                size,
                limit,
            },
            EncodeError::Postcard(e) => Error::serialize(self.name(), e),
        })
    }

    /// Takes the item at the front of the queue into the transaction, without waiting for an
    /// item.
    ///
    /// Returns `None` when no item is visible (the queue is empty, or every item is held by
    /// an open transaction or promised to a waiting consumer; a promise its consumer leaves
    /// untaken is broken by the second such miss: see [`dequeue`](Self::dequeue)). The item is hidden from
    /// everyone else at once; it is removed for good when `tx` commits and put back at the
    /// front if it does not. Ready at once on the embedded engines, but for tokio's
    /// cooperative budget: once the task has spent it, the future yields before taking
    /// anything, so a consumer loop cannot starve the other tasks of its runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe on the embedded engines: dropping the future before it completes takes
    /// nothing. On PostgreSQL a future dropped while the database works on the dequeue aborts
    /// the transaction instead (its later calls and its commit fail with
    /// [`Error::TransactionAborted`]; what it held is back in its queues): the database may
    /// have taken the item by then, and only a rollback can give it back.
    ///
    /// # Errors
    ///
    /// [`Error::Deserialize`] if the item's bytes are not a `T` (the item stays held by `tx`:
    /// abort to put it back, commit to discard it), [`Error::WrongStore`] if `tx` belongs to
    /// another store, [`Error::Closed`] after [`Store::close`](crate::Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 10)?; tx.commit().await?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue(&mut tx).await?, Some(10));
    /// assert_eq!(q.count().await?, 0); // held by tx
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub async fn try_dequeue(&self, tx: &mut Transaction) -> Result<Option<T>> {
        // Before taking anything: a future that yields here has taken nothing.
        crate::engine::consume_budget().await;
        self.check(tx)?;
        let mut item = None;
        self.engine
            .take(&self.queue, tx.work_mut(), 1, self.decode_into(&mut item))
            .await?;
        Ok(item)
    }

    /// [`try_dequeue`](Self::try_dequeue) for threads.
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
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 10)?; tx.blocking_commit()?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.blocking_try_dequeue(&mut tx)?, Some(10));
    /// assert_eq!(q.blocking_count()?, 0); // held by tx
    /// tx.blocking_commit()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    #[inline]
    pub fn blocking_try_dequeue(&self, tx: &mut Transaction) -> Result<Option<T>> {
        self.check(tx)?;
        let mut item = None;
        self.engine
            .blocking_take(&self.queue, tx.work_mut(), 1, self.decode_into(&mut item))?;
        Ok(item)
    }

    /// Takes up to `n` items from the front of the queue into the transaction, as many calls
    /// of [`try_dequeue`](Self::try_dequeue) would, without waiting: fewer (or none) when
    /// fewer are visible. On PostgreSQL it is one round trip, where `n` calls of
    /// `try_dequeue` are `n`.
    ///
    /// # Cancel safety
    ///
    /// As [`try_dequeue`](Self::try_dequeue).
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue). On [`Error::Deserialize`] every item taken by
    /// the call stays held by `tx` (abort to put them back).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q").await?;
    /// # let mut tx = store.begin(); for i in 0..3 { q.enqueue(&mut tx, i)?; } tx.commit().await?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue_many(&mut tx, 64).await?, [0, 1, 2]);
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_dequeue_many(&self, tx: &mut Transaction, n: usize) -> Result<Vec<T>> {
        crate::engine::consume_budget().await;
        self.check(tx)?;
        let mut items = Vec::with_capacity(n.min(1024));
        self.engine
            .take(&self.queue, tx.work_mut(), n, |entry| {
                items.push(self.decode(entry)?);
                Ok(())
            })
            .await?;
        Ok(items)
    }

    /// [`try_dequeue_many`](Self::try_dequeue_many) for threads.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue_many`](Self::try_dequeue_many).
    pub fn blocking_try_dequeue_many(&self, tx: &mut Transaction, n: usize) -> Result<Vec<T>> {
        block_on(self.try_dequeue_many(tx, n))
    }

    /// Decodes an entry the transaction now holds.
    /// What [`try_dequeue`](Self::try_dequeue) hands the engine's take: decodes the entry
    /// into `item`.
    #[inline]
    fn decode_into<'a>(&'a self, item: &'a mut Option<T>) -> impl FnMut(&Entry) -> Result<()> + 'a {
        move |entry| {
            *item = Some(self.decode(entry)?);
            Ok(())
        }
    }

    #[inline]
    pub(crate) fn decode(&self, entry: &Entry) -> Result<T> {
        codec::decode(&entry.bytes).map_err(|e| Error::Deserialize {
            queue: self.name().to_owned(),
            item_id: entry.id,
            source: Arc::new(e),
        })
    }
}

impl<T> Clone for ReliableConcurrentQueue<T> {
    fn clone(&self) -> Self {
        ReliableConcurrentQueue::new(self.engine.clone(), self.queue.clone())
    }
}

impl<T> fmt::Debug for ReliableConcurrentQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReliableConcurrentQueue")
            .field("name", &self.name())
            .finish()
    }
}
