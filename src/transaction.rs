//! [`Transaction`]: a unit of enqueues and dequeues that commits or aborts as one.

use std::fmt;
use std::sync::Arc;

use crate::core::{publish_all, restore_all, Enqueues, Entry, Held, QueueCore};
use crate::error::{Error, Result};
use crate::log::{CommitRequest, Completion, Reply};
use crate::store::{Backend, StoreInner};

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
/// let store = reliable_queue::Store::in_memory()?;
/// let inbox = store.queue::<String>("inbox")?;
/// let done = store.queue::<String>("done")?;
/// # let mut tx = store.begin(); inbox.enqueue(&mut tx, "a".into())?; tx.commit()?;
///
/// let mut tx = store.begin();
/// if let Some(item) = inbox.try_dequeue(&mut tx)? {
///     done.enqueue(&mut tx, item)?;
/// }
/// tx.commit()?;
/// assert_eq!((inbox.count(), done.count()), (0, 1));
/// # Ok::<(), reliable_queue::Error>(())
/// ```
#[must_use = "a transaction does nothing until committed, and aborts when dropped"]
pub struct Transaction {
    store: Arc<StoreInner>,
    enqueues: Enqueues,
    dequeued: Held,
    enqueued_bytes: usize,
}

impl Transaction {
    pub(crate) fn new(store: Arc<StoreInner>) -> Self {
        Transaction {
            store,
            enqueues: Enqueues::new(),
            dequeued: Held::new(),
            enqueued_bytes: 0,
        }
    }

    pub(crate) fn store(&self) -> &Arc<StoreInner> {
        &self.store
    }

    /// Adds an encoded item, within the transaction size limit.
    pub(crate) fn push_enqueue(&mut self, queue: Arc<QueueCore>, bytes: Box<[u8]>) -> Result<()> {
        let limit = self.store.config.max_transaction_size;
        let size = self.enqueued_bytes + bytes.len();
        if size > limit {
            return Err(Error::TransactionTooLarge { size, limit });
        }
        self.enqueued_bytes = size;
        self.enqueues.push((queue, bytes));
        Ok(())
    }

    /// Takes ownership of a dequeued item until commit or abort.
    pub(crate) fn hold(&mut self, queue: Arc<QueueCore>, entry: Entry) -> &Entry {
        self.dequeued.push((queue, entry));
        &self.dequeued[self.dequeued.len() - 1].1
    }

    /// Number of items enqueued so far.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// assert_eq!(tx.enqueued(), 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn enqueued(&self) -> usize {
        self.enqueues.len()
    }

    /// Number of items dequeued (and held) so far.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue(&mut tx)?, None);
    /// assert_eq!(tx.dequeued(), 0);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn dequeued(&self) -> usize {
        self.dequeued.len()
    }

    /// Applies every enqueue and dequeue of the transaction atomically, and returns once they
    /// are durable (under [`Durability::Sync`](crate::Durability::Sync)). Concurrent commits
    /// share one log write and one fsync.
    ///
    /// This blocks the calling thread; in async code use
    /// [`commit_async`](Transaction::commit_async).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if the log cannot be written, [`Error::Closed`] if the store stopped
    /// committing after an earlier failure. Either way nothing was applied and the dequeued
    /// items are back at the front of their queues.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path())?;
    /// let q = store.queue::<u64>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 42)?;
    /// tx.commit()?;
    /// assert_eq!(q.count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn commit(mut self) -> Result<()> {
        let Some((enqueues, dequeued)) = self.take_work() else {
            return Ok(());
        };
        match &self.store.backend {
            Backend::Memory { next_id } => {
                apply_in_memory(next_id, enqueues, dequeued);
                Ok(())
            }
            Backend::Durable(durable) => {
                let (completion, reply) = Completion::new();
                durable.submit(CommitRequest {
                    enqueues,
                    dequeued,
                    reply,
                });
                completion.wait()
            }
        }
    }

    /// Like [`commit`](Transaction::commit), but waits without blocking the thread.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before its first poll aborts the transaction. Once polled, the
    /// commit is in the committer's hands and completes (or fails) whether or not the future
    /// is still awaited; only its outcome is lost. Do not retry a commit whose future was
    /// dropped: it may have been applied.
    ///
    /// # Errors
    ///
    /// As [`commit`](Transaction::commit).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path())?;
    /// let q = store.queue::<u64>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 42)?;
    /// tx.commit_async().await?;
    /// # Ok(()) }
    /// ```
    pub async fn commit_async(mut self) -> Result<()> {
        let Some((enqueues, dequeued)) = self.take_work() else {
            return Ok(());
        };
        match &self.store.backend {
            Backend::Memory { next_id } => {
                apply_in_memory(next_id, enqueues, dequeued);
                Ok(())
            }
            Backend::Durable(durable) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                durable.submit(CommitRequest {
                    enqueues,
                    dequeued,
                    reply: Reply::Async(tx),
                });
                rx.await.unwrap_or(Err(Error::Closed))
            }
        }
    }

    /// Discards the enqueues and puts the dequeued items back at the front of their queues,
    /// visible at once. Same as dropping the transaction.
    ///
    /// # Examples
    ///
    /// Peek: dequeue, look, abort.
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q")?;
    /// # let mut tx = store.begin(); q.enqueue(&mut tx, 7)?; tx.commit()?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.try_dequeue(&mut tx)?, Some(7));
    /// tx.abort();
    /// assert_eq!(q.count(), 1);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn abort(self) {
        drop(self);
    }

    /// Moves the transaction's work out, leaving it empty; `None` if there is nothing to do.
    fn take_work(&mut self) -> Option<(Enqueues, Held)> {
        if self.enqueues.is_empty() && self.dequeued.is_empty() {
            return None;
        }
        self.enqueued_bytes = 0;
        Some((
            std::mem::take(&mut self.enqueues),
            std::mem::take(&mut self.dequeued),
        ))
    }
}

/// Applies a commit in memory: ids in commit order, items visible at once.
fn apply_in_memory(next_id: &crate::sync::process::AtomicU64, enqueues: Enqueues, dequeued: Held) {
    if !enqueues.is_empty() {
        let first = StoreInner::memory_ids(next_id, enqueues.len() as u64);
        publish_all(enqueues, first);
    }
    drop(dequeued);
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if !self.dequeued.is_empty() {
            restore_all(std::mem::take(&mut self.dequeued));
        }
    }
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("enqueued", &self.enqueues.len())
            .field("dequeued", &self.dequeued.len())
            .finish()
    }
}
