//! [`QueueSet`]: dequeue, wait or lease from several queues of one item type in one call.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::take::no_item_without_deadline;
use crate::engine::{block_on, block_on_until, QueueRef};
use crate::error::{Error, Result};
use crate::processing::check_ttl;
use crate::queue::lease::Lease;
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
        block_on(self.try_dequeue(tx))
    }

    /// Takes the first visible item, in the set's order, into `tx`, without waiting.
    /// Returns the index of its queue in the set, and the item.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it takes nothing unless it completes.
    ///
    /// # Errors
    ///
    /// As [`ReliableConcurrentQueue::try_dequeue`].
    pub async fn try_dequeue(&self, tx: &mut Transaction) -> Result<Option<(usize, T)>> {
        for i in self.order() {
            if let Some(item) = self.queues[i].try_dequeue(tx).await? {
                return Ok(Some((i, item)));
            }
        }
        Ok(None)
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
        let taken = self.wait(tx, None).await?;
        // Without a deadline the wait only ends with an item or an error.
        taken.ok_or_else(no_item_without_deadline)
    }

    /// The waiting take of the set, until `deadline` if there is one.
    async fn wait(
        &self,
        tx: &mut Transaction,
        deadline: Option<Instant>,
    ) -> Result<Option<(usize, T)>> {
        for q in &self.queues {
            q.check(tx)?;
        }
        let queues = self.ordered();
        let mut wait = self.queues[0]
            .engine()
            .wait(queues, tx.work_mut(), deadline);
        poll_fn(|cx| {
            wait.poll_take(cx).map(|taken| match taken? {
                Some((i, _, entry)) => self.queues[i].decode(entry).map(|t| Some((i, t))),
                None => Ok(None),
            })
        })
        .await
    }

    /// The queues in the order to try them in for one call, with their indexes.
    fn ordered(&self) -> Vec<(usize, &QueueRef)> {
        self.order()
            .into_iter()
            .map(|i| (i, self.queues[i].queue_ref()))
            .collect()
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
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        block_on_until(self.wait(tx, deadline), deadline)
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
        let leased = self.lease_until(ttl, None).await?;
        // Without a deadline the wait only ends with a lease or an error.
        leased.ok_or_else(no_item_without_deadline)
    }

    /// The waiting lease of the set, until `deadline` if there is one.
    async fn lease_until(
        &self,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Option<(usize, Lease<T>)>> {
        let ttl = check_ttl(ttl)?;
        let queues = self.ordered();
        let leased = self.queues[0]
            .engine()
            .lease(&queues, 1, ttl, true, deadline, |i, e| {
                self.queues[i].decode(e)
            })
            .await?;
        Ok(leased.and_then(|(i, leased)| {
            let lease = self.queues[i].leases(leased).pop()?;
            Some((i, lease))
        }))
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
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        block_on_until(self.lease_until(ttl, deadline), deadline)
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
