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

/// Groups items by queue, keeping their order within each queue.
pub(crate) fn by_queue(
    items: impl IntoIterator<Item = (Arc<QueueCore>, Entry)>,
) -> Vec<(Arc<QueueCore>, Vec<Entry>)> {
    let mut groups: Vec<(Arc<QueueCore>, Vec<Entry>)> = Vec::new();
    for (queue, entry) in items {
        match groups.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &queue)) {
            Some((_, entries)) => entries.push(entry),
            None => groups.push((queue, vec![entry])),
        }
    }
    groups
}

/// Makes freshly committed items visible: the `n`-th enqueue gets id `first + n`.
pub(crate) fn publish_all(enqueues: Vec<(Arc<QueueCore>, Box<[u8]>)>, first: u64) {
    let entries = enqueues
        .into_iter()
        .zip(first..)
        .map(|((queue, bytes), id)| (queue, Entry::new(id, bytes)));
    for (queue, entries) in by_queue(entries) {
        queue.publish(entries);
    }
}

/// Gives dequeued items back to the front of their queues, in their order.
pub(crate) fn restore_all(items: Vec<(Arc<QueueCore>, Entry)>) {
    for (queue, entries) in by_queue(items) {
        queue.restore(entries.into_iter());
    }
}
