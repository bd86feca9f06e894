//! [`QueueSet`]: dequeue, wait or lease from several queues of one item type in one call.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::{park_until, poll_budget, Unparker, Waiting};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::processing::check_ttl;
use crate::queue::ReliableConcurrentQueue;
use crate::sync::process::Mutex;
use crate::transaction::Transaction;

/// How a [`QueueSet`] chooses among its queues when several have items.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetOrder {
    /// Strict priority: the first queue with a visible item, in the order given.
    Priority,
    /// By weight: over many calls, each queue with items is served in proportion to its
    /// weight (smooth weighted round robin), so equal weights take turns. A weight of 0 is
    /// taken as 1.
    Weighted(Vec<u32>),
}

/// Several queues of one item type, served as one: by strict priority or by weights.
/// A waiting call waits on every queue at once and takes the first item handed to it.
///
/// Made by [`QueueSet::new`]; cheap to share behind an `Arc`.
///
/// # Examples
///
/// ```
/// use reliable_queue::{QueueSet, SetOrder};
/// let store = reliable_queue::Store::in_memory()?;
/// let urgent = store.blocking_queue::<u32>("urgent")?;
/// let normal = store.blocking_queue::<u32>("normal")?;
/// # let mut tx = store.begin(); normal.enqueue(&mut tx, 1)?; urgent.enqueue(&mut tx, 2)?; tx.blocking_commit()?;
/// let set = QueueSet::new(&[urgent, normal], SetOrder::Priority)?;
/// let mut tx = store.begin();
/// assert_eq!(set.blocking_try_dequeue(&mut tx)?, Some((0, 2))); // urgent first
/// assert_eq!(set.blocking_try_dequeue(&mut tx)?, Some((1, 1)));
/// tx.blocking_commit()?;
/// # Ok::<(), reliable_queue::Error>(())
/// ```
pub struct QueueSet<T> {
    queues: Vec<ReliableConcurrentQueue<T>>,
    weights: Option<Vec<i64>>,
    /// Smooth weighted round robin's running scores.
    scores: Mutex<Vec<i64>>,
}

impl<T> QueueSet<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// A set of `queues` (all of one store), served in `order`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for no queues, or weights not one per queue;
    /// [`Error::WrongStore`] for queues of different stores.
    pub fn new(queues: &[ReliableConcurrentQueue<T>], order: SetOrder) -> Result<QueueSet<T>> {
        let Some(first) = queues.first() else {
            return Err(Error::InvalidArgument {
                argument: "queues",
                expected: "at least one queue",
            });
        };
        if let Some(other) = queues
            .iter()
            .find(|q| !Arc::ptr_eq(q.engine_arc(), first.engine_arc()))
        {
            return Err(Error::WrongStore {
                queue: other.name().to_owned(),
            });
        }
        let weights = match order {
            SetOrder::Priority => None,
            SetOrder::Weighted(w) if w.len() == queues.len() => {
                Some(w.into_iter().map(|w| i64::from(w.max(1))).collect())
            }
            SetOrder::Weighted(_) => {
                return Err(Error::InvalidArgument {
                    argument: "order",
                    expected: "one weight per queue",
                })
            }
        };
        Ok(QueueSet {
            scores: Mutex::new(vec![0; queues.len()]),
            queues: queues.to_vec(),
            weights,
        })
    }

    /// The queues, in the order given.
    pub fn queues(&self) -> &[ReliableConcurrentQueue<T>] {
        &self.queues
    }

    /// The order to try the queues in for one call: the given order by priority; by weight,
    /// the queue smooth weighted round robin picks first, then the others by score.
    fn order(&self) -> Vec<usize> {
        let Some(weights) = &self.weights else {
            return (0..self.queues.len()).collect();
        };
        let mut scores = self.scores.lock();
        let total: i64 = weights.iter().sum();
        for (s, w) in scores.iter_mut().zip(weights) {
            *s += w;
        }
        let mut order: Vec<usize> = (0..self.queues.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(scores[i]));
        scores[order[0]] -= total;
        order
    }

    /// Takes the first visible item, in the set's order, into `tx`, without waiting.
    /// Returns the index of its queue in the set, and the item.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::try_dequeue`].
    pub fn blocking_try_dequeue(&self, tx: &mut Transaction) -> Result<Option<(usize, T)>> {
        for i in self.order() {
            if let Some(item) = self.queues[i].blocking_try_dequeue(tx)? {
                return Ok(Some((i, item)));
            }
        }
        Ok(None)
    }

    /// [`blocking_try_dequeue`](Self::blocking_try_dequeue) for tasks.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it takes nothing unless it completes.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::try_dequeue`].
    pub async fn try_dequeue(&self, tx: &mut Transaction) -> Result<Option<(usize, T)>> {
        #[cfg(feature = "postgres")]
        if self.is_remote() {
            for i in self.order() {
                if let Some(item) = self.queues[i].try_dequeue(tx).await? {
                    return Ok(Some((i, item)));
                }
            }
            return Ok(None);
        }
        crate::engine::consume_budget().await;
        self.blocking_try_dequeue(tx)
    }

    /// Takes an item from the set into `tx`, waiting on every queue at once if none is
    /// visible; the first item handed to it wins (an item handed to it in another queue at
    /// the same moment goes back to the front of that queue).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped future takes nothing, and items handed to it go back.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::dequeue`].
    pub async fn dequeue(&self, tx: &mut Transaction) -> Result<(usize, T)> {
        for q in &self.queues {
            q.check(tx)?;
        }
        #[cfg(feature = "postgres")]
        if self.is_remote() {
            return self.remote_dequeue(tx, None).await?.ok_or(Error::Closed);
        }
        tx.work_mut().withdraw_leaked();
        let order = self.order();
        let mut waits: Vec<Waiting<'_>> = order
            .iter()
            .map(|&i| self.queues[i].engine().waiting(self.queues[i].queue_ref()))
            .collect();
        poll_fn(|cx| {
            let budget = std::task::ready!(poll_budget(cx));
            let polled = self.poll_all(&order, &mut waits, tx, cx.waker());
            if polled.is_ready() {
                budget.made_progress();
            }
            polled
        })
        .await
    }

    fn poll_all(
        &self,
        order: &[usize],
        waits: &mut [Waiting<'_>],
        tx: &mut Transaction,
        waker: &Waker,
    ) -> Poll<Result<(usize, T)>> {
        for (&i, waiting) in order.iter().zip(waits.iter_mut()) {
            let q = &self.queues[i];
            match q.engine().poll_dequeue(waiting, tx.work_mut(), waker) {
                Poll::Ready(Ok(entry)) => return Poll::Ready(q.decode(entry).map(|t| (i, t))),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    /// [`dequeue`](Self::dequeue) for threads, giving up after `timeout` if one is given.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::dequeue`].
    pub fn blocking_dequeue(
        &self,
        tx: &mut Transaction,
        timeout: Option<Duration>,
    ) -> Result<Option<(usize, T)>> {
        for q in &self.queues {
            q.check(tx)?;
        }
        tx.work_mut().withdraw_leaked();
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        #[cfg(feature = "postgres")]
        if self.is_remote() {
            return crate::engine::block_on(self.remote_dequeue(tx, deadline));
        }
        let order = self.order();
        let mut waits: Vec<Waiting<'_>> = order
            .iter()
            .map(|&i| self.queues[i].engine().waiting(self.queues[i].queue_ref()))
            .collect();
        let waker = Unparker::current();
        loop {
            if let Poll::Ready(got) = self.poll_all(&order, &mut waits, tx, &waker) {
                return got.map(Some);
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                for (&i, waiting) in order.iter().zip(waits.iter_mut()) {
                    let q = &self.queues[i];
                    if let Some(entry) = q.engine().withdraw(waiting, tx.work_mut()) {
                        return q.decode(entry).map(|t| Some((i, t)));
                    }
                }
                return Ok(None);
            }
            park_until(deadline);
        }
    }

    /// Leases an item from the set, waiting on every queue at once if none is visible.
    ///
    /// # Cancel safety
    ///
    /// As [`ReliableConcurrentQueue::lease`].
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::lease`].
    pub async fn lease(&self, ttl: Duration) -> Result<(usize, Lease<T>)> {
        check_ttl(ttl)?;
        #[cfg(feature = "postgres")]
        if self.is_remote() {
            return self.remote_lease(ttl, None).await?.ok_or(Error::Closed);
        }
        let q0 = &self.queues[0];
        let mut tx = Transaction::new(Arc::clone(q0.engine_arc()));
        let (i, item) = self.dequeue(&mut tx).await?;
        let lease = self.queues[i].grant_one(&mut tx, item, ttl).await?;
        Ok((i, lease))
    }

    /// [`lease`](Self::lease) for threads; `None` if `timeout` passes first.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::lease`].
    pub fn blocking_lease(
        &self,
        ttl: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<(usize, Lease<T>)>> {
        check_ttl(ttl)?;
        #[cfg(feature = "postgres")]
        if self.is_remote() {
            let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
            return crate::engine::block_on(self.remote_lease(ttl, deadline));
        }
        let q0 = &self.queues[0];
        let mut tx = Transaction::new(Arc::clone(q0.engine_arc()));
        let Some((i, item)) = self.blocking_dequeue(&mut tx, timeout)? else {
            return Ok(None);
        };
        let lease = self.queues[i].blocking_grant_one(&mut tx, item, ttl)?;
        Ok(Some((i, lease)))
    }
}

#[cfg(feature = "postgres")]
impl<T> QueueSet<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    fn is_remote(&self) -> bool {
        self.queues[0].engine().is_remote()
    }

    /// On PostgreSQL: looks in every queue in the set's order; if none has an item, waits
    /// for a notification on any of them (or the fallback poll) and looks again. `None`
    /// past `deadline`.
    async fn remote_dequeue(
        &self,
        tx: &mut Transaction,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<(usize, T)>> {
        let engine = self.queues[0].engine();
        let watches = engine
            .watch_set(self.queues.iter().map(|q| q.queue_ref()).collect())
            .await?;
        loop {
            for i in self.order() {
                if let Some(item) = self.queues[i].try_dequeue(tx).await? {
                    watches.pass_on();
                    return Ok(Some((i, item)));
                }
            }
            if !watches.wait(deadline).await? {
                return Ok(None);
            }
        }
    }

    /// [`remote_dequeue`](Self::remote_dequeue) for leases.
    async fn remote_lease(
        &self,
        ttl: Duration,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<(usize, Lease<T>)>> {
        let engine = self.queues[0].engine();
        let watches = engine
            .watch_set(self.queues.iter().map(|q| q.queue_ref()).collect())
            .await?;
        loop {
            for i in self.order() {
                if let Some(lease) = self.queues[i].try_lease(ttl).await? {
                    watches.pass_on();
                    return Ok(Some((i, lease)));
                }
            }
            if !watches.wait(deadline).await? {
                return Ok(None);
            }
        }
    }
}

impl<T> fmt::Debug for QueueSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueSet")
            .field(
                "queues",
                &self.queues.iter().map(|q| q.name()).collect::<Vec<_>>(),
            )
            .field("weights", &self.weights)
            .finish()
    }
}
