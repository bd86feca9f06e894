//! The in-memory core: per-queue ready items and the staging of waiting dequeue requests.
//!
//! The core does no I/O and knows nothing of types or transactions: it moves [`Entry`]s
//! between a queue's ready deque, its waiters and the callers. It takes its locks and atomics
//! from `crate::sync`, so `loom-tests` can model-check it.

mod entry;
mod queue;
mod staging;

pub(crate) use entry::{Entry, QueueId};
pub(crate) use queue::{QueueCore, Request};

use std::sync::Arc;
use std::task::Waker;

use smallvec::SmallVec;

/// Encoded items a transaction enqueues, with their queues. One-item transactions, the most
/// common kind, keep theirs inline.
pub(crate) type Enqueues = SmallVec<[(Arc<QueueCore>, Box<[u8]>); 1]>;

/// Items a transaction dequeued and holds, with their queues.
pub(crate) type Held = SmallVec<[(Arc<QueueCore>, Entry); 1]>;

/// Groups items by queue, keeping their order within each queue; groups come in increasing
/// queue id order, the order in which several queues may be locked together.
pub(crate) fn by_queue<T>(
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

/// Makes freshly committed items visible: the `n`-th enqueue gets id `first + n`. Items for
/// several queues become visible at once: every queue is locked (in id order) before any
/// changes.
pub(crate) fn publish_all(enqueues: Enqueues, first: u64) {
    if enqueues.is_empty() {
        return;
    }
    if let Some(queue) = single_queue(&enqueues) {
        let entries = enqueues.into_iter().zip(first..);
        queue.publish(entries.map(|((_, bytes), id)| Entry::new(id, bytes)));
        return;
    }
    let entries = enqueues
        .into_iter()
        .zip(first..)
        .map(|((queue, bytes), id)| (queue, Entry::new(id, bytes)));
    change_together(by_queue(entries), |lock, entries, wake| {
        lock.publish(entries, wake)
    });
}

/// Gives dequeued items back to the front of their queues, in their order, all queues at once.
pub(crate) fn restore_all(items: Held) {
    if items.is_empty() {
        return;
    }
    if let Some(queue) = single_queue(&items) {
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
    let (queues, entries): (Vec<_>, Vec<_>) = groups.into_iter().unzip();
    let mut wake = Vec::new();
    let mut locked: Vec<_> = queues.iter().map(|q| q.lock()).collect();
    for (lock, entries) in locked.iter_mut().zip(entries) {
        change(lock, entries, &mut wake);
    }
    drop(locked);
    wake.into_iter().for_each(Waker::wake);
}
