//! [`ReliableConcurrentQueue`]: the typed handle on one named queue.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::core::{Entry, QueueCore};
use crate::error::{Error, Result};
use crate::store::StoreInner;
use crate::transaction::Transaction;

/// A named, durable, transactional queue of `T`s with best-effort FIFO order.
///
/// Obtained from [`Store::queue`](crate::Store::queue). Cheap to clone; clones are the same
/// queue. All operations go through a [`Transaction`] of the same store.
///
/// - [`enqueue`](Self::enqueue) is invisible until the transaction commits, to that
///   transaction too.
/// - [`try_dequeue`](Self::try_dequeue) never waits: it takes a visible item no other
///   transaction holds, or returns `None`. The item is invisible to everyone else at once, and
///   comes back at the front of the queue if the transaction does not commit.
/// - [`count`](Self::count) is a point-in-time figure, not part of any transaction.
/// - Items come out roughly in commit order; items given back by an abort come out first.
///   Nothing stronger is promised.
///
/// # Examples
///
/// A batch consumer: dequeue up to 16 items, commit, then process.
///
/// ```
/// let store = reliable_queue::Store::in_memory()?;
/// let q = store.queue::<u32>("work")?;
/// # let mut tx = store.begin(); for i in 0..20 { q.enqueue(&mut tx, i)?; } tx.commit()?;
/// loop {
///     let mut tx = store.begin();
///     let mut batch = Vec::new();
///     while batch.len() < 16 {
///         match q.try_dequeue(&mut tx)? {
///             Some(item) => batch.push(item),
///             None => break,
///         }
///     }
///     tx.commit()?;
///     if batch.is_empty() {
///         break;
///     }
///     // process `batch` here
/// }
/// assert_eq!(q.count(), 0);
/// # Ok::<(), reliable_queue::Error>(())
/// ```
pub struct ReliableConcurrentQueue<T> {
    pub(crate) store: Arc<StoreInner>,
    pub(crate) core: Arc<QueueCore>,
    _items: PhantomData<fn(T) -> T>,
}

impl<T> ReliableConcurrentQueue<T> {
    pub(crate) fn new(store: Arc<StoreInner>, core: Arc<QueueCore>) -> Self {
        ReliableConcurrentQueue {
            store,
            core,
            _items: PhantomData,
        }
    }

    /// The queue's name.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// assert_eq!(store.queue::<u8>("emails")?.name(), "emails");
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn name(&self) -> &str {
        self.core.name()
    }

    /// The number of items visible now: committed, and held by no open transaction.
    ///
    /// Not transactional: a snapshot that may be stale as soon as it is read, exact only
    /// while nothing else touches the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// assert_eq!(q.count(), 0); // not committed yet
    /// tx.commit()?;
    /// assert_eq!(q.count(), 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn count(&self) -> u64 {
        self.core.count()
    }

    /// The number of consumers waiting in [`dequeue`](Self::dequeue) or
    /// [`blocking_dequeue`](Self::blocking_dequeue) right now. A point-in-time figure.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// assert_eq!(store.queue::<u8>("q")?.waiters(), 0);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn waiters(&self) -> usize {
        self.core.waiters()
    }

    /// Checks that `tx` belongs to this queue's store.
    pub(crate) fn check(&self, tx: &Transaction) -> Result<()> {
        if Arc::ptr_eq(tx.store(), &self.store) {
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
    /// The item is serialized now, so its errors surface here. Not even `tx` can dequeue it
    /// before the commit.
    ///
    /// # Errors
    ///
    /// [`Error::Serialize`] if `T`'s serialization fails, [`Error::ItemTooLarge`] over the
    /// item size limit, [`Error::TransactionTooLarge`] over the transaction size limit,
    /// [`Error::WrongStore`] if `tx` belongs to another store. On error the transaction is
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<String>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, "hello".into())?;
    /// assert_eq!(q.try_dequeue(&mut tx)?, None); // no read-your-own-writes
    /// tx.commit()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn enqueue(&self, tx: &mut Transaction, item: T) -> Result<()> {
        self.check(tx)?;
        let bytes = codec::encode(&item).map_err(|e| Error::serialize(self.name(), e))?;
        let limit = self.store.config.max_item_size;
        if bytes.len() > limit {
            return Err(Error::ItemTooLarge {
                queue: self.name().to_owned(),
                size: bytes.len(),
                limit,
            });
        }
        tx.push_enqueue(self.core.clone(), bytes)
    }

    /// Takes the item at the front of the queue into the transaction, without waiting.
    ///
    /// Returns `None` when no item is visible (the queue is empty, or every item is held by
    /// an open transaction or promised to a waiting consumer). The item is hidden from
    /// everyone else at once; it is removed for good when `tx` commits and put back at the
    /// front if it does not.
    ///
    /// # Errors
    ///
    /// [`Error::Deserialize`] if the item's bytes are not a `T` (the item stays held by `tx`:
    /// abort to put it back, commit to discard it), [`Error::WrongStore`] if `tx` belongs to
    /// another store.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q")?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 10)?; tx.commit()?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue(&mut tx)?, Some(10));
    /// assert_eq!(q.count(), 0); // held by tx
    /// tx.commit()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn try_dequeue(&self, tx: &mut Transaction) -> Result<Option<T>> {
        self.check(tx)?;
        match self.core.try_take() {
            Some(entry) => self.accept(tx, entry).map(Some),
            None => Ok(None),
        }
    }

    /// Hands `entry` to `tx` and decodes it.
    pub(crate) fn accept(&self, tx: &mut Transaction, entry: Entry) -> Result<T> {
        let entry = tx.hold(self.core.clone(), entry);
        codec::decode(&entry.bytes).map_err(|e| Error::Deserialize {
            queue: self.name().to_owned(),
            item_id: entry.id,
            source: Arc::new(e),
        })
    }
}

impl<T> Clone for ReliableConcurrentQueue<T> {
    fn clone(&self) -> Self {
        ReliableConcurrentQueue::new(self.store.clone(), self.core.clone())
    }
}

impl<T> fmt::Debug for ReliableConcurrentQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReliableConcurrentQueue")
            .field("name", &self.name())
            .field("count", &self.count())
            .finish()
    }
}
