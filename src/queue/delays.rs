//! Delayed and keyed enqueues: [`enqueue_after`](ReliableConcurrentQueue::enqueue_after),
//! [`enqueue_at`](ReliableConcurrentQueue::enqueue_at) and
//! [`enqueue_unique`](ReliableConcurrentQueue::enqueue_unique).

use std::borrow::Borrow;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::ReliableConcurrentQueue;
use crate::clock::wall_ms;
use crate::core::Entry;
use crate::error::{Error, Result};
use crate::processing::check_delay;
use crate::transaction::Transaction;

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

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
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
    /// letter brings its key back, even if another item has it meanwhile). A transaction that
    /// dequeued the item with the key, or acknowledged ([`Lease::ack`](crate::Lease::ack)) a
    /// lease of it, may then enqueue one successor with it (a job scheduling its next run):
    /// its commit consumes the old item and keeps the new one; an abort brings the old one
    /// back and drops the new one. With `delay`, the
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
        let entry = self.encode_entry(item.borrow())?;
        let buffered = self.engine().enqueue_entry(
            self.queue_ref(),
            tx.work_mut(),
            entry,
            delay,
            Some(key),
        )?;
        Ok(match buffered {
            true => Enqueued::Enqueued,
            false => Enqueued::Duplicate,
        })
    }

    fn encode_entry(&self, item: &T) -> Result<Entry> {
        Ok(Entry::new(0, self.encode(item)?, 0))
    }

    /// Buffers `item`, due at `at` (ms since the epoch) or, with a non-zero `delay`, that
    /// many ms after the commit.
    fn enqueue_due(&self, tx: &mut Transaction, item: &T, at: u64, delay: u64) -> Result<()> {
        self.check(tx)?;
        let mut entry = self.encode_entry(item)?;
        entry.set_not_before(at);
        self.engine()
            .enqueue_entry(self.queue_ref(), tx.work_mut(), entry, delay, None)?;
        Ok(())
    }
}
