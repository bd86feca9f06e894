//! One queue's in-memory state: the ready deque and its line of waiters.
//!
//! Invariants, all under the queue lock (asserted in debug builds after every change):
//! - `visible` equals the length of `ready` (the items a dequeuer could take now).
//! - While a request waits, `ready` is empty: an item that becomes visible goes to the oldest
//!   waiter first, so `try_take` can never jump the line.
//! - An entry is in exactly one place: `ready`, handed to one request, or owned by a caller
//!   (a transaction, or a commit about to publish it).
//! - Once the queue is closed, nobody joins the line again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Poll, Waker};

use super::entry::{Entry, QueueId};
use super::waiters::{Ticket, Waiters};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

#[derive(Debug, Default)]
struct State {
    /// Visible items: returned ones at the front, committed ones at the back.
    ready: VecDeque<Entry>,
    waiters: Waiters,
    /// Set when the store closes: waiting requests are dismissed and new ones refused.
    closed: bool,
}

impl State {
    /// Checks the invariants of the module docs that can be seen from here.
    fn check(&self, visible: &AtomicU64) {
        debug_assert!(
            self.ready.is_empty() || !self.waiters.any(),
            "ready items while a request waits"
        );
        debug_assert_eq!(
            usize::try_from(visible.load(Ordering::Relaxed)).ok(),
            Some(self.ready.len()),
            "the visible count mirrors the ready deque"
        );
    }
}

/// The queue was closed (the store is closing) while a request wanted an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

/// A dequeue request that may wait: created empty, in line after the first poll that finds
/// nothing, finished when it collects an entry or leaves.
#[derive(Debug, Default)]
pub(crate) struct Request {
    ticket: Option<Ticket>,
}

impl Request {
    /// Is the request in line and not yet finished?
    #[cfg(all(test, not(reliable_queue_loom)))]
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

fn len_u64(len: usize) -> u64 {
    // usize is at most 64 bits on every target Rust supports.
    u64::try_from(len).unwrap_or(u64::MAX)
}

impl QueueCore {
    /// A queue holding `ready` (recovered items, in order).
    pub(crate) fn new(id: QueueId, name: Arc<str>, ready: VecDeque<Entry>) -> Self {
        let visible = AtomicU64::new(len_u64(ready.len()));
        QueueCore {
            id,
            name,
            state: Mutex::new(State {
                ready,
                waiters: Waiters::default(),
                closed: false,
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
        self.state.lock().waiters.len()
    }

    fn set_visible(&self, state: &State) {
        self.visible
            .store(len_u64(state.ready.len()), Ordering::Release);
        state.check(&self.visible);
    }

    /// Takes the item at the front, if any. Never waits for anything but the queue lock.
    pub(crate) fn try_take(&self) -> Option<Entry> {
        let mut state = self.state.lock();
        let entry = state.ready.pop_front()?;
        self.set_visible(&state);
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

    /// Takes an item for `request`, or puts it in line to be woken through `waker` when one
    /// is handed to it. After `Ready` the request is finished and may be polled afresh.
    /// `Closed` once the queue is closed, unless an entry was handed to the request before.
    pub(crate) fn poll_take(
        &self,
        request: &mut Request,
        waker: &Waker,
    ) -> Poll<Result<Entry, Closed>> {
        let mut state = self.state.lock();
        let polled = match request.ticket {
            Some(ticket) => match state.waiters.collect(ticket) {
                Some(entry) => {
                    request.ticket = None;
                    Poll::Ready(Ok(entry))
                }
                None if state.closed => {
                    request.ticket = None;
                    Poll::Ready(Err(Closed))
                }
                None => {
                    state.waiters.rewake(ticket, waker);
                    Poll::Pending
                }
            },
            None => match state.ready.pop_front() {
                Some(entry) => {
                    self.set_visible(&state);
                    Poll::Ready(Ok(entry))
                }
                None if state.closed => Poll::Ready(Err(Closed)),
                None => {
                    request.ticket = Some(state.waiters.join(waker));
                    Poll::Pending
                }
            },
        };
        state.check(&self.visible);
        polled
    }

    /// Ends `request` without waiting further. An entry already handed to it is returned to
    /// the caller, who must either use it or [`restore`](Self::restore) it.
    pub(crate) fn withdraw(&self, request: &mut Request) -> Option<Entry> {
        let ticket = request.ticket.take()?;
        self.state.lock().waiters.leave(ticket)
    }

    /// Ends `request`; an entry already handed to it goes back to the front (or to the next
    /// waiter). This is what dropping a waiting dequeue does.
    pub(crate) fn cancel(&self, request: &mut Request) {
        if let Some(entry) = self.withdraw(request) {
            self.restore(std::iter::once(entry));
        }
    }

    /// Closes the queue: every waiting request is woken and finds it closed, and no request
    /// waits again. Items stay where they are.
    pub(crate) fn close(&self) {
        let wake = {
            let mut state = self.state.lock();
            state.closed = true;
            state.waiters.dismiss()
        };
        wake.into_iter().for_each(Waker::wake);
    }
}

/// A locked queue. Changes are visible to others when it is dropped; wakers collected in
/// `wake` must be called after that.
pub(crate) struct Locked<'a> {
    core: &'a QueueCore,
    state: MutexGuard<'a, State>,
}

impl Locked<'_> {
    /// Hands entries to the oldest waiters, one each, while anyone waits; returns the rest.
    fn serve_waiters<I: Iterator<Item = Entry>>(
        &mut self,
        mut entries: I,
        wake: &mut Vec<Waker>,
    ) -> I {
        while self.state.waiters.any() {
            let Some(entry) = entries.next() else { break };
            if let Ok(waker) = self.state.waiters.hand(entry) {
                wake.push(waker);
            }
        }
        entries
    }

    /// See [`QueueCore::publish`].
    pub(crate) fn publish(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
        wake: &mut Vec<Waker>,
    ) {
        let rest = self.serve_waiters(entries.into_iter(), wake);
        self.state.ready.extend(rest);
        self.core.set_visible(&self.state);
    }

    /// See [`QueueCore::restore`].
    pub(crate) fn restore(
        &mut self,
        entries: impl DoubleEndedIterator<Item = Entry>,
        wake: &mut Vec<Waker>,
    ) {
        // Waiters get the oldest entries, in order; the rest go to the front, keeping their
        // order.
        let rest = self.serve_waiters(entries, wake);
        for entry in rest.rev() {
            self.state.ready.push_front(entry);
        }
        self.core.set_visible(&self.state);
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

    fn ready_id(polled: Poll<Result<Entry, Closed>>) -> Option<u64> {
        match polled {
            Poll::Ready(Ok(e)) => Some(e.id),
            _ => None,
        }
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
        assert_eq!(ready_id(q.poll_take(&mut a, Waker::noop())), Some(1));
        assert_eq!(ready_id(q.poll_take(&mut b, Waker::noop())), Some(0));
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
        assert_eq!(ready_id(q.poll_take(&mut b, Waker::noop())), Some(7));
        assert_eq!(q.waiters(), 0);
    }

    #[test]
    fn closing_dismisses_waiters_but_not_what_was_handed() {
        let q = core();
        let mut a = Request::default();
        let mut b = Request::default();
        assert!(q.poll_take(&mut a, Waker::noop()).is_pending());
        assert!(q.poll_take(&mut b, Waker::noop()).is_pending());
        q.publish([entry(4)]);
        q.close();
        assert_eq!(ready_id(q.poll_take(&mut a, Waker::noop())), Some(4));
        assert_eq!(q.poll_take(&mut b, Waker::noop()), Poll::Ready(Err(Closed)));
        assert_eq!(
            q.poll_take(&mut Request::default(), Waker::noop()),
            Poll::Ready(Err(Closed))
        );
        assert_eq!(q.waiters(), 0);
    }
}
