//! The in-memory core: per-queue ready items and the line of waiting dequeue requests.
//!
//! The core does no I/O and knows nothing of item types, transactions or engines: it moves
//! [`Entry`]s between a queue's ready deque, its waiters and its callers (the embedded
//! engines). An entry handed to a waiter is reserved for it until it takes it, or until the
//! second dequeue attempt after the hand-over that finds nothing takes it instead (so a
//! waiter that is never polled again cannot strand it; see `waiters.rs`). It takes its locks and atomics from `crate::sync`, so loom can model-check it,
//! from the in-crate models below and from `loom-tests`.

mod entry;
mod queue;
mod waiters;

#[cfg(all(test, reliable_queue_loom))]
mod loom_models;

pub(crate) use entry::{Entry, Meta, QueueId, QueueIndex};
pub(crate) use queue::{len_u64, QueueCore, Request};
pub(crate) use waiters::Ticket;

use std::sync::Arc;
use std::task::Waker;

/// Every queue a store has made, each at its [`QueueIndex`], read without a lock. It only
/// grows: a queue keeps its place for as long as the store is open (a queue whose creation
/// could not be recorded is taken out of the catalog's names, and its empty core stays here).
#[derive(Debug, Default)]
pub(crate) struct QueueTable(boxcar::Vec<Arc<QueueCore>>);

impl QueueTable {
    /// Adds the queue `make` builds, giving it the next index. Callers add one queue at a time
    /// (under their catalog's lock), so the index given to `make` is the one the queue gets.
    pub(crate) fn add(&self, make: impl FnOnce(QueueIndex) -> QueueCore) -> Arc<QueueCore> {
        let next = self.0.count();
        // Queue ids are `u32`, and every queue has an index of its own: at most 2^32 of them.
        let index = QueueIndex(u32::try_from(next).unwrap_or(u32::MAX));
        let core = Arc::new(make(index));
        let at = self.0.push(Arc::clone(&core));
        debug_assert_eq!(at, next, "queues are added to the table one at a time");
        core
    }

    /// The queue at `index`.
    #[inline]
    pub(crate) fn get(&self, index: QueueIndex) -> &QueueCore {
        self.at(index)
    }

    #[inline]
    fn at(&self, index: QueueIndex) -> &Arc<QueueCore> {
        // An index is only ever read off a queue, after `add` put it in the table.
        self.0
            .get(index.0 as usize)
            .expect("an index names a queue in the table")
    }

    /// `items` with counted references to their queues, for what outlives the borrow (the
    /// server engines' commits).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn counted<T>(
        &self,
        items: impl IntoIterator<Item = (QueueIndex, T)>,
    ) -> Vec<(Arc<QueueCore>, T)> {
        items
            .into_iter()
            .map(|(queue, item)| (Arc::clone(self.at(queue)), item))
            .collect()
    }
}

/// Groups items by queue, keeping their order within each queue; groups come in increasing
/// queue id order, the order in which several queues may be locked together.
fn by_queue<T>(
    table: &QueueTable,
    items: impl IntoIterator<Item = (QueueIndex, T)>,
) -> Vec<(&QueueCore, Vec<T>)> {
    let mut groups: Vec<(&QueueCore, Vec<T>)> = Vec::new();
    for (queue, item) in items {
        match groups.iter_mut().find(|(q, _)| q.index() == queue) {
            Some((_, group)) => group.push(item),
            None => groups.push((table.get(queue), vec![item])),
        }
    }
    groups.sort_by_key(|(q, _)| q.id());
    groups
}

/// The queue every item belongs to, if they all belong to one.
fn single_queue<T>(items: &[(QueueIndex, T)]) -> Option<QueueIndex> {
    let (first, _) = items.first()?;
    items.iter().all(|(q, _)| q == first).then_some(*first)
}

/// Makes freshly committed items visible: the `n`-th item gets id `first + n`, and `time` as
/// its enqueue time. Items for several queues become visible at once: every queue is locked
/// (in id order) before any changes.
pub(crate) fn publish_all<L>(table: &QueueTable, items: L, first: u64, time: u64)
where
    L: IntoIterator<Item = (QueueIndex, Box<[u8]>)> + AsRef<[(QueueIndex, Box<[u8]>)]>,
{
    if items.as_ref().len() == 1 {
        // The commonest commit, without the iterator adapters below.
        if let Some((queue, bytes)) = items.into_iter().next() {
            table.get(queue).publish_one(Entry::new(first, bytes, time));
        }
        return;
    }
    let single = single_queue(items.as_ref());
    let entries = items.into_iter().zip(first..);
    match single {
        Some(queue) => table
            .get(queue)
            .publish(entries.map(|((_, bytes), id)| Entry::new(id, bytes, time))),
        // Several queues, or none (nothing is locked then).
        None => {
            let entries = entries.map(|((queue, bytes), id)| (queue, Entry::new(id, bytes, time)));
            change_together(by_queue(table, entries), |lock, entries, wake| {
                lock.publish(entries, wake)
            });
        }
    }
}

/// Gives held items back: no longer held, at the front of their queues, in their order, all
/// queues at once.
pub(crate) fn give_back_all<L>(table: &QueueTable, items: L)
where
    L: IntoIterator<Item = (QueueIndex, Entry)> + AsRef<[(QueueIndex, Entry)]>,
    L::IntoIter: DoubleEndedIterator,
{
    match single_queue(items.as_ref()) {
        Some(queue) => {
            let core = table.get(queue);
            core.unhold(len_u64(items.as_ref().len()));
            core.restore(items.into_iter().map(|(_, entry)| entry));
        }
        // Several queues, or none (nothing is locked then).
        None => {
            let groups = by_queue(table, items);
            for (core, entries) in &groups {
                core.unhold(len_u64(entries.len()));
            }
            change_together(groups, |lock, entries, wake| {
                lock.restore(entries.into_iter(), wake)
            });
        }
    }
}

/// Applies `change` to each queue's entries with every queue locked (in the increasing id
/// order `by_queue` gives), so that the changes appear at once; wakes whoever was served
/// after the locks are released.
fn change_together(
    groups: Vec<(&QueueCore, Vec<Entry>)>,
    change: impl Fn(&mut queue::Locked<'_>, Vec<Entry>, &mut Vec<Waker>),
) {
    debug_assert!(
        groups.windows(2).all(|w| w[0].0.id() < w[1].0.id()),
        "queues are locked in increasing id order, each once"
    );
    let (queues, entries): (Vec<_>, Vec<_>) = groups.into_iter().unzip();
    let mut wake = Vec::new();
    let mut locked: Vec<_> = queues.iter().map(|q| q.lock()).collect();
    for (lock, entries) in locked.iter_mut().zip(entries) {
        change(lock, entries, &mut wake);
    }
    drop(locked);
    wake.into_iter().for_each(Waker::wake);
}
