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

pub(crate) use entry::{Entry, Meta, QueueId};
pub(crate) use queue::{QueueCore, Request};
pub(crate) use waiters::Ticket;

use std::sync::Arc;
use std::task::Waker;

/// Groups items by queue, keeping their order within each queue; groups come in increasing
/// queue id order, the order in which several queues may be locked together.
fn by_queue<T>(
    items: impl IntoIterator<Item = (Arc<QueueCore>, T)>,
) -> Vec<(Arc<QueueCore>, Vec<T>)> {
    let mut groups: Vec<(Arc<QueueCore>, Vec<T>)> = Vec::new();
    for (queue, item) in items {
        match groups.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &queue)) {
            Some((_, group)) => group.push(item),
            None => groups.push((queue, vec![item])),
        }
    }
    groups.sort_by_key(|(q, _)| q.id());
    groups
}

/// The queue every item belongs to, if they all belong to one.
fn single_queue<T>(items: &[(Arc<QueueCore>, T)]) -> Option<Arc<QueueCore>> {
    let (first, _) = items.first()?;
    items
        .iter()
        .all(|(q, _)| Arc::ptr_eq(q, first))
        .then(|| first.clone())
}

/// Makes freshly committed items visible: the `n`-th item gets id `first + n`, and `time` as
/// its enqueue time. Items for several queues become visible at once: every queue is locked
/// (in id order) before any changes.
pub(crate) fn publish_all<L>(items: L, first: u64, time: u64)
where
    L: IntoIterator<Item = (Arc<QueueCore>, Box<[u8]>)> + AsRef<[(Arc<QueueCore>, Box<[u8]>)]>,
{
    if items.as_ref().is_empty() {
        return;
    }
    if items.as_ref().len() == 1 {
        // Most commits: the item's own handle on its queue serves, no count of its own.
        if let Some((queue, bytes)) = items.into_iter().next() {
            queue.publish(std::iter::once(Entry::new(first, bytes, time)));
        }
        return;
    }
    if let Some(queue) = single_queue(items.as_ref()) {
        let entries = items.into_iter().zip(first..);
        queue.publish(entries.map(|((_, bytes), id)| Entry::new(id, bytes, time)));
        return;
    }
    let entries = items
        .into_iter()
        .zip(first..)
        .map(|((queue, bytes), id)| (queue, Entry::new(id, bytes, time)));
    change_together(by_queue(entries), |lock, entries, wake| {
        lock.publish(entries, wake)
    });
}

/// Gives items back to the front of their queues, in their order, all queues at once.
pub(crate) fn restore_all<L>(items: L)
where
    L: IntoIterator<Item = (Arc<QueueCore>, Entry)> + AsRef<[(Arc<QueueCore>, Entry)]>,
    L::IntoIter: DoubleEndedIterator,
{
    if items.as_ref().is_empty() {
        return;
    }
    if items.as_ref().len() == 1 {
        if let Some((queue, entry)) = items.into_iter().next() {
            queue.restore(std::iter::once(entry));
        }
        return;
    }
    if let Some(queue) = single_queue(items.as_ref()) {
        queue.restore(items.into_iter().map(|(_, entry)| entry));
        return;
    }
    change_together(by_queue(items), |lock, entries, wake| {
        lock.restore(entries.into_iter(), wake)
    });
}

/// Applies `change` to each queue's entries with every queue locked (in the increasing id
/// order `by_queue` gives), so that the changes appear at once; wakes whoever was served
/// after the locks are released.
fn change_together(
    groups: Vec<(Arc<QueueCore>, Vec<Entry>)>,
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
