//! One queue's in-memory state: the ready deque and its staging of waiters.
//!
//! Invariants, all under the queue lock:
//! - `visible` equals the length of `ready` (the items a dequeuer could take now).
//! - While a request waits, `ready` is empty: an item that becomes visible goes to the oldest
//!   waiter first, so `try_take` can never jump the line.
//! - An entry is in exactly one place: `ready`, handed to one request, or owned by a caller
//!   (a transaction, or the committer about to publish it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Poll, Waker};

use super::entry::{Entry, QueueId};
use super::staging::{Staging, Ticket, Withdrawn};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

#[derive(Debug, Default)]
struct State {
    /// Visible items: returned ones at the front, committed ones at the back.
    ready: VecDeque<Entry>,
    staging: Staging,
}

/// A dequeue request that may wait: created empty, registered on the first poll that finds
/// nothing, finished when it collects an entry or is withdrawn.
#[derive(Debug, Default)]
pub(crate) struct Request {
    ticket: Option<Ticket>,
}

impl Request {
    /// Is the request registered and not yet finished?
    #[cfg(test)]
    pub(crate) fn is_waiting(&self) -> bool {
        self.ticket.is_some()
    }
}

/// The in-memory state of one named queue.
#[derive(Debug)]
pub(crate) struct QueueCore {
    id: QueueId,
    name: Arc<str>,
    state: Mutex<State>,
    /// Mirror of `ready.len()`, readable without the lock.
    visible: AtomicU64,
}

impl QueueCore {
    /// A queue holding `ready` (recovered items, in order).
    pub(crate) fn new(id: QueueId, name: Arc<str>, ready: VecDeque<Entry>) -> Self {
        let visible = AtomicU64::new(ready.len() as u64);
        QueueCore {
            id,
            name,
            state: Mutex::new(State {
                ready,
                staging: Staging::default(),
            }),
            visible,
        }
    }

    pub(crate) fn id(&self) -> QueueId {
        self.id
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Items visible now: committed, and held by no transaction or waiter.
    pub(crate) fn count(&self) -> u64 {
        self.visible.load(Ordering::Acquire)
    }

    /// Number of dequeue requests waiting.
    pub(crate) fn waiters(&self) -> usize {
        self.state.lock().staging.waiting()
    }

    /// Takes the item at the front, if any. Never waits for anything but the queue lock.
    pub(crate) fn try_take(&self) -> Option<Entry> {
        let mut state = self.state.lock();
        let entry = state.ready.pop_front()?;
        self.visible
            .store(state.ready.len() as u64, Ordering::Release);
        Some(entry)
    }

    /// Makes committed entries visible at the back, in the given order; the oldest waiters
    /// are served first.
    pub(crate) fn publish(&self, entries: impl IntoIterator<Item = Entry>) {
        let mut wake = Vec::new();
        self.lock().publish(entries, &mut wake);
        wake.into_iter().for_each(Waker::wake);
    }

    /// Puts entries given back (abort, failed commit, cancelled waiter) at the front, so that
    /// the first entry comes out first; waiters are served first.
    pub(crate) fn restore(&self, entries: impl DoubleEndedIterator<Item = Entry>) {
        let mut wake = Vec::new();
        self.lock().restore(entries, &mut wake);
        wake.into_iter().for_each(Waker::wake);
    }

    /// Locks the queue for a change that must appear at once with changes to other queues.
    /// Whoever holds several queues locked must have taken them in increasing id order.
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked {
            core: self,
            state: self.state.lock(),
        }
    }

    /// Takes an item for `request`, or registers it to be woken through `waker` when one is
    /// handed to it. After `Ready` the request is finished and may be polled afresh.
    pub(crate) fn poll_take(&self, request: &mut Request, waker: &Waker) -> Poll<Entry> {
        let mut state = self.state.lock();
        match request.ticket {
            Some(ticket) => match state.staging.collect(ticket) {
                Some(entry) => {
                    request.ticket = None;
                    Poll::Ready(entry)
                }
                None => {
                    state.staging.rewake(ticket, waker);
                    Poll::Pending
                }
            },
            None => match state.ready.pop_front() {
                Some(entry) => {
                    self.visible
                        .store(state.ready.len() as u64, Ordering::Release);
                    Poll::Ready(entry)
                }
                None => {
                    request.ticket = Some(state.staging.register(waker));
                    Poll::Pending
                }
            },
        }
    }

    /// Ends `request` without waiting further. An entry already handed to it is returned to
    /// the caller, who must either use it or [`restore`](Self::restore) it.
    pub(crate) fn withdraw(&self, request: &mut Request) -> Option<Entry> {
        let ticket = request.ticket.take()?;
        match self.state.lock().staging.withdraw(ticket) {
            Withdrawn::Handed(entry) => Some(entry),
            Withdrawn::Waiting | Withdrawn::Unknown => None,
        }
    }

    /// Ends `request`; an entry already handed to it goes back to the front (or to the next
    /// waiter). This is what dropping a waiting dequeue does.
    pub(crate) fn cancel(&self, request: &mut Request) {
        if let Some(entry) = self.withdraw(request) {
            self.restore(std::iter::once(entry));
        }
    }
}

/// A locked queue. Changes are visible to others when it is dropped; wakers collected in
/// `wake` must be called after that.
pub(crate) struct Locked<'a> {
    core: &'a QueueCore,
    state: MutexGuard<'a, State>,
}

impl Locked<'_> {
    /// See [`QueueCore::publish`].
    pub(crate) fn publish(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
        wake: &mut Vec<Waker>,
    ) {
        let state = &mut *self.state;
        let mut entries = entries.into_iter();
        // The oldest waiters are served first; once nobody waits, the rest goes to the back.
        while state.staging.has_waiters() {
            let Some(entry) = entries.next() else { break };
            if let Ok(waker) = state.staging.fulfil(entry) {
                wake.push(waker);
            }
        }
        for entry in entries {
            state.ready.push_back(entry);
        }
        self.core
            .visible
            .store(state.ready.len() as u64, Ordering::Release);
    }

    /// See [`QueueCore::restore`].
    pub(crate) fn restore(
        &mut self,
        entries: impl DoubleEndedIterator<Item = Entry>,
        wake: &mut Vec<Waker>,
    ) {
        let state = &mut *self.state;
        let mut entries = entries;
        // Waiters get the oldest entries, in order...
        while state.staging.has_waiters() {
            let Some(entry) = entries.next() else { break };
            if let Ok(waker) = state.staging.fulfil(entry) {
                wake.push(waker);
            }
        }
        // ...and the rest go to the front, keeping their order.
        for entry in entries.rev() {
            state.ready.push_front(entry);
        }
        self.core
            .visible
            .store(state.ready.len() as u64, Ordering::Release);
    }
}

impl std::fmt::Debug for Locked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked")
            .field("queue", &self.core.name)
            .finish()
    }
}

#[cfg(all(test, not(reliable_queue_loom)))]
mod tests {
    use super::*;

    fn core() -> QueueCore {
        QueueCore::new(0, "q".into(), VecDeque::new())
    }

    fn entry(id: u64) -> Entry {
        Entry::new(id, Box::new([1]))
    }

    fn ids(core: &QueueCore) -> Vec<u64> {
        std::iter::from_fn(|| core.try_take())
            .map(|e| e.id)
            .collect()
    }

    #[test]
    fn restore_puts_entries_in_front_in_order() {
        let q = core();
        q.publish([entry(3), entry(4)]);
        q.restore([entry(1), entry(2)].into_iter());
        assert_eq!(q.count(), 4);
        assert_eq!(ids(&q), vec![1, 2, 3, 4]);
        assert_eq!(q.count(), 0);
    }

    #[test]
    fn waiters_are_served_before_the_deque() {
        let q = core();
        let mut a = Request::default();
        let mut b = Request::default();
        assert!(q.poll_take(&mut a, Waker::noop()).is_pending());
        assert!(q.poll_take(&mut b, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert_eq!(q.count(), 0, "handed entries are not visible");
        q.restore([entry(0), entry(9)].into_iter());
        assert_eq!(q.count(), 1);
        assert!(matches!(q.poll_take(&mut a, Waker::noop()), Poll::Ready(e) if e.id == 1));
        assert!(matches!(q.poll_take(&mut b, Waker::noop()), Poll::Ready(e) if e.id == 0));
        assert_eq!(ids(&q), vec![9]);
    }

    #[test]
    fn cancelled_waiter_gives_its_entry_to_the_next() {
        let q = core();
        let mut a = Request::default();
        let mut b = Request::default();
        assert!(q.poll_take(&mut a, Waker::noop()).is_pending());
        assert!(q.poll_take(&mut b, Waker::noop()).is_pending());
        q.publish([entry(7)]);
        q.cancel(&mut a);
        assert!(!a.is_waiting());
        assert!(matches!(q.poll_take(&mut b, Waker::noop()), Poll::Ready(e) if e.id == 7));
        assert_eq!(q.waiters(), 0);
    }
}
