//! What operators look at and settle in a queue: its stats, retry policy, a browse of its
//! items, and its dead letters (list, replay, purge).

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::ReliableConcurrentQueue;
use crate::clock::known_time;
use crate::core::Entry;
use crate::engine::block_on;
use crate::engine::proc::DeadSlot;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::processing::{BrowsedItem, DeadLetter, ItemState, QueueStats, Replay, RetryPolicy};

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
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
        self.engine().stats(self.proc()).await
    }

    /// [`stats`](Self::stats) for threads.
    ///
    /// # Errors
    ///
    /// As [`stats`](Self::stats).
    pub fn blocking_stats(&self) -> Result<QueueStats> {
        block_on(self.stats())
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
        self.engine()
            .set_policy(self.proc(), policy.clamped())
            .await
    }

    /// [`set_retry_policy`](Self::set_retry_policy) for threads.
    ///
    /// # Errors
    ///
    /// As [`set_retry_policy`](Self::set_retry_policy).
    pub fn blocking_set_retry_policy(&self, policy: RetryPolicy) -> Result<()> {
        block_on(self.set_retry_policy(policy))
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
        let found = self.engine().browse(self.proc(), after, limit).await?;
        self.browsed(found)
    }

    /// [`browse`](Self::browse) for threads.
    ///
    /// # Errors
    ///
    /// As [`browse`](Self::browse).
    pub fn blocking_browse(&self, after: Option<u64>, limit: usize) -> Result<Vec<BrowsedItem<T>>> {
        block_on(self.browse(after, limit))
    }

    fn browsed(&self, found: Vec<(Entry, ItemState)>) -> Result<Vec<BrowsedItem<T>>> {
        found
            .into_iter()
            .map(|(e, state)| {
                Ok(BrowsedItem {
                    id: e.id,
                    item: self.decode(&e)?,
                    state,
                    attempts: e.attempts(),
                    enqueued_at: known_time(e.enqueued_at),
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
    /// See [`Lease::fail`](crate::Lease::fail).
    pub async fn dead_letters(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadLetter<T>>> {
        let slots = self
            .engine()
            .dead_letters(self.proc(), after, limit)
            .await?;
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
        block_on(self.dead_letters(after, limit))
    }

    fn dead_letter(&self, slot: DeadSlot) -> Result<DeadLetter<T>> {
        let item = self.decode(&slot.entry)?;
        let e = slot.entry;
        Ok(DeadLetter {
            id: e.id,
            item,
            reason: slot.reason,
            attempts: e.attempts(),
            first_attempt: known_time(e.first_attempt()),
            last_attempt: known_time(e.last_attempt()),
            enqueued_at: known_time(e.enqueued_at),
        })
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
        self.engine()
            .settle_dead(self.proc(), which, reset_attempts, false)
            .await
    }

    /// [`replay`](Self::replay) for threads.
    ///
    /// # Errors
    ///
    /// As [`replay`](Self::replay).
    pub fn blocking_replay(&self, which: Replay, reset_attempts: bool) -> Result<usize> {
        block_on(self.replay(which, reset_attempts))
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
        self.engine()
            .settle_dead(self.proc(), which, false, true)
            .await
    }

    /// [`purge`](Self::purge) for threads.
    ///
    /// # Errors
    ///
    /// As [`purge`](Self::purge).
    pub fn blocking_purge(&self, which: Replay) -> Result<usize> {
        block_on(self.purge(which))
    }
}
