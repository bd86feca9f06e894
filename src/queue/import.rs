//! Importing items as they stood in another store: what `rq import` writes, and what a
//! service moving its queues between engines calls.
//!
//! An ordinary enqueue makes a fresh item: no attempts, enqueued at the commit. An import
//! keeps what the item had where it came from (its attempts, when it falls due, when it was
//! first enqueued and leased), or makes it a dead letter with its reason. It is a move of the
//! processing layer like a delayed enqueue: buffered in the transaction, given a fresh id at
//! commit, as durable and atomic as the rest of the commit. On the sled engine it is written
//! as the log's `Moved` op (an item version that replaces none, as compaction writes); on
//! PostgreSQL it is one `INSERT ... SELECT FROM unnest(...)` per kind at commit.

use std::borrow::Borrow;
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::wall_ms;
use crate::core::Entry;
use crate::engine::proc::{check_reason, cut_reason};
use crate::error::{Error, Result};
use crate::processing::MAX_ATTEMPTS;
use crate::queue::ReliableConcurrentQueue;
use crate::transaction::Transaction;

/// What an imported item keeps of its past: see [`ReliableConcurrentQueue::import`].
///
/// Every field is optional in effect: `Default` is an item never leased, due at once,
/// enqueued at the import's commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportedItem {
    /// Leases it was granted before: at most [`MAX_ATTEMPTS`](crate::MAX_ATTEMPTS), the
    /// most any engine counts (an import with more is refused).
    pub attempts: u32,
    /// Not due before this time (`None`, or a time past: due at once).
    pub due: Option<SystemTime>,
    /// When its first enqueue committed (`None`: at the import's commit).
    pub enqueued_at: Option<SystemTime>,
    /// When its first lease was granted, if ever.
    pub first_attempt: Option<SystemTime>,
    /// When its latest lease was granted, if ever.
    pub last_attempt: Option<SystemTime>,
}

impl ImportedItem {
    /// `entry` with these times and attempts; refuses attempts past [`MAX_ATTEMPTS`].
    fn fill(&self, entry: &mut Entry) -> Result<()> {
        if self.attempts > MAX_ATTEMPTS {
            return Err(Error::InvalidArgument {
                argument: "attempts",
                expected: "at most MAX_ATTEMPTS (2^31 - 1) attempts",
            });
        }
        let ms = |t: Option<SystemTime>| t.map_or(Ok(0), wall_ms);
        entry.set_attempts(self.attempts);
        entry.set_not_before(ms(self.due)?);
        entry.enqueued_at = ms(self.enqueued_at)?;
        entry.set_first_attempt(ms(self.first_attempt)?);
        entry.set_last_attempt(ms(self.last_attempt)?);
        Ok(())
    }
}

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// Adds `item` to the transaction as it stood in another store: with `meta`'s attempts,
    /// due time and times instead of a fresh item's. It joins the queue when `tx` commits
    /// (delayed until `meta.due` if that is in the future), under a fresh id, at the tail.
    ///
    /// With [`RawItem`](crate::RawItem) as `T` the item's encoded bytes are written as they
    /// are, which is how `rq import` moves a store's items between engines without knowing
    /// their types. The queue's deduplication keys are not carried over.
    ///
    /// Every engine counts at most [`MAX_ATTEMPTS`](crate::MAX_ATTEMPTS) attempts (PostgreSQL
    /// keeps them in an `int4`), so an item with more is refused rather than clamped: what an
    /// import writes is what the other store had. A lease of an item at the maximum counts no
    /// further.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a time before the Unix epoch, or for `meta.attempts` over
    /// [`MAX_ATTEMPTS`](crate::MAX_ATTEMPTS) (nothing is buffered);
    /// [`Error::TransactionExpired`](crate::Error::TransactionExpired) past the transaction's
    /// deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::ImportedItem;
    /// use std::time::{Duration, SystemTime};
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<String>("jobs")?;
    /// let mut tx = store.begin();
    /// let past = ImportedItem { attempts: 2, ..ImportedItem::default() };
    /// q.import(&mut tx, "resize photo 7".to_owned(), &past)?;
    /// tx.blocking_commit()?;
    /// let lease = q.blocking_lease(Duration::from_secs(30))?;
    /// assert_eq!(lease.attempt(), 3); // its third lease
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn import(
        &self,
        tx: &mut Transaction,
        item: impl Borrow<T>,
        meta: &ImportedItem,
    ) -> Result<()> {
        self.buffer_import(tx, item.borrow(), meta, None)
    }

    /// Adds `item` to the transaction as one of the queue's dead letters, with `reason` (cut
    /// at 4 KiB) and `meta`'s attempts and times (`meta.due` is ignored). It is listed by
    /// [`dead_letters`](Self::dead_letters) once `tx` commits, and can be replayed and
    /// purged like any other.
    ///
    /// # Errors
    ///
    /// As [`import`](Self::import); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a `reason` with a NUL character, which no engine stores (as
    /// [`Lease::fail`](crate::Lease::fail)): nothing is buffered.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::ImportedItem;
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<String>("jobs")?;
    /// let mut tx = store.begin();
    /// let meta = ImportedItem { attempts: 5, ..ImportedItem::default() };
    /// q.import_dead_letter(&mut tx, "bad job".to_owned(), &meta, "no such user")?;
    /// tx.blocking_commit()?;
    /// let dead = q.blocking_dead_letters(None, 10)?;
    /// assert_eq!((dead[0].item.as_str(), dead[0].reason.as_str()), ("bad job", "no such user"));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn import_dead_letter(
        &self,
        tx: &mut Transaction,
        item: impl Borrow<T>,
        meta: &ImportedItem,
        reason: &str,
    ) -> Result<()> {
        check_reason(reason)?;
        self.buffer_import(tx, item.borrow(), meta, Some(cut_reason(reason)))
    }

    fn buffer_import(
        &self,
        tx: &mut Transaction,
        item: &T,
        meta: &ImportedItem,
        reason: Option<String>,
    ) -> Result<()> {
        self.check(tx)?;
        let mut entry = Entry::new(0, self.encode(item)?, 0);
        meta.fill(&mut entry)?;
        self.engine()
            .import(self.queue_ref(), tx.work_mut(), entry, reason)
    }
}
