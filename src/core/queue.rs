//! One queue's in-memory state: the ready deque and its line of waiters.
//!
//! Invariants, all under the queue lock (asserted in debug builds after every change):
//! - `visible` equals the length of `ready` (the items a dequeuer could take now).
//! - While a request waits, `ready` is empty: an item that becomes visible goes to the oldest
//!   waiter first, so `try_take` can never jump the line.
//! - An entry is in exactly one place: `ready`, handed to one request, or owned by a caller
//!   (a transaction, or a commit about to publish it).
//! - Once the queue is closed, nobody joins the line again.
//!
//! An entry handed to a request stays staged until the request takes it, or until the
//! request is overdue: the second dequeue attempt after the hand-over that finds nothing to
//! take (a miss: `try_take` on an empty deque, `poll_take` about to wait) takes the entry
//! itself (see `waiters.rs`). That is the bound on what a request that is never polled again
//! (a leaked future) keeps from everyone else.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::task::{Poll, Waker};

use super::entry::{Entry, QueueId};
use super::waiters::{Ticket, Waiters};
use super::QueueIndex;
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
        self.waiters.check();
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
/// nothing, finished when it collects an entry or leaves. While it has a ticket it is
/// waiting, served (an entry is staged for it), or reclaimed (its entry was taken by a miss;
/// its next poll puts it back in line at its old place).
#[derive(Debug, Default)]
pub(crate) struct Request {
    ticket: Option<Ticket>,
}

impl Request {
    /// The request's ticket while it has one.
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        self.ticket
    }

    /// Does the request hold a ticket (waiting, served or reclaimed), not yet finished?
    #[cfg(all(test, not(reliable_queue_loom)))]
    pub(crate) fn is_waiting(&self) -> bool {
        self.ticket.is_some()
    }
}

/// The in-memory state of one named queue.
#[derive(Debug)]
pub(crate) struct QueueCore {
    id: QueueId,
    /// Its place in the store's table of queues.
    index: QueueIndex,
    name: Arc<str>,
    state: Mutex<State>,
    /// Mirror of `ready.len()`, readable without the lock.
    visible: AtomicU64,
    /// Entries held by open transactions (a statistic: counted by the engines as they
    /// move entries into and out of transactions).
    held: AtomicU64,
    /// Deduplication keys of the items in the queue (visible, delayed, leased or held) and of
    /// keyed enqueues buffered by open transactions, each with its count (a replayed dead
    /// letter may bring a second item with a key already present).
    keys: Mutex<HashMap<Box<[u8]>, u32>>,
}

pub(crate) fn len_u64(len: usize) -> u64 {
    // usize is at most 64 bits on every target Rust supports.
    u64::try_from(len).unwrap_or(u64::MAX)
}

impl QueueCore {
    /// A queue holding `ready` (recovered items, in order).
    pub(crate) fn new(
        id: QueueId,
        index: QueueIndex,
        name: Arc<str>,
        ready: VecDeque<Entry>,
    ) -> Self {
        let visible = AtomicU64::new(len_u64(ready.len()));
        let mut keys: HashMap<Box<[u8]>, u32> = HashMap::new();
        for key in ready.iter().filter_map(|e| e.key().map(Box::from)) {
            *keys.entry(key).or_insert(0) += 1;
        }
        QueueCore {
            id,
            index,
            name,
            state: Mutex::new(State {
                ready,
                waiters: Waiters::default(),
                closed: false,
            }),
            visible,
            held: AtomicU64::new(0),
            keys: Mutex::new(keys),
        }
    }

    pub(crate) fn id(&self) -> QueueId {
        self.id
    }

    /// Its place in the store's table of queues.
    #[inline]
    pub(crate) fn index(&self) -> QueueIndex {
        self.index
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Items visible now: committed, and held by no transaction or waiter.
    pub(crate) fn count(&self) -> u64 {
        self.visible.load(Ordering::Acquire)
    }

    /// Entries held by open transactions now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// One more entry held by a transaction.
    #[inline]
    pub(crate) fn hold(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` entries no longer held (committed or given back).
    #[inline]
    pub(crate) fn unhold(&self, n: u64) {
        let before = self.held.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "more entries given back than held");
    }

    /// Reserves deduplication key `key` for an item about to be enqueued: false (and nothing
    /// changes) if an item with that key is in the queue or reserved already.
    pub(crate) fn reserve_key(&self, key: &[u8]) -> bool {
        let mut keys = self.keys.lock();
        if keys.contains_key(key) {
            return false;
        }
        keys.insert(key.into(), 1);
        true
    }

    /// Counts one more item with `key` (recovered, or a replayed dead letter).
    pub(crate) fn add_key(&self, key: Box<[u8]>) {
        *self.keys.lock().entry(key).or_insert(0) += 1;
    }

    /// An item with `key` left the queue (or its enqueue was dropped).
    pub(crate) fn release_key(&self, key: &[u8]) {
        let mut keys = self.keys.lock();
        debug_assert!(keys.contains_key(key), "a key is released only while held");
        if let Some(n) = keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(key);
            }
        }
    }

    /// The enqueue time of the item at the front (0: none, or unknown).
    pub(crate) fn front_enqueued_at(&self) -> u64 {
        self.state.lock().ready.front().map_or(0, |e| e.enqueued_at)
    }

    /// The `limit` visible entries with the lowest ids above `after`, lowest first (`browse`).
    /// One pass over the queue under its lock, cloning only the entries returned: a browse
    /// of a large queue costs committers a scan, not a copy of the queue.
    pub(crate) fn ready_entries_above(&self, after: Option<u64>, limit: usize) -> Vec<Entry> {
        let state = self.state.lock();
        // The `limit` lowest ids seen so far, the highest of them on top; with their places.
        let mut lowest: BinaryHeap<(u64, usize)> =
            BinaryHeap::with_capacity(limit.min(state.ready.len()));
        for (at, e) in state.ready.iter().enumerate() {
            if after.is_some_and(|a| e.id <= a) {
                continue;
            }
            if lowest.len() < limit {
                lowest.push((e.id, at));
            } else if lowest.peek().is_some_and(|&(top, _)| e.id < top) {
                lowest.pop();
                lowest.push((e.id, at));
            }
        }
        lowest
            .into_sorted_vec()
            .into_iter()
            .filter_map(|(_, at)| state.ready.get(at).cloned())
            .collect()
    }

    /// Number of dequeue requests waiting.
    pub(crate) fn waiters(&self) -> usize {
        self.state.lock().waiters.len()
    }

    /// Number of entries handed to requests that have not taken them yet.
    #[cfg(test)]
    pub(crate) fn staged(&self) -> usize {
        self.state.lock().waiters.staged()
    }

    fn set_visible(&self, state: &State) {
        self.visible
            .store(len_u64(state.ready.len()), Ordering::Release);
        state.check(&self.visible);
    }

    /// Takes the item at the front, if any. Never waits for anything but the queue lock.
    /// With nothing visible it is a miss, and takes an entry handed to a request that is
    /// overdue, if there is one (see the module docs).
    pub(crate) fn try_take(&self) -> Option<Entry> {
        let mut state = self.state.lock();
        match state.ready.pop_front() {
            Some(entry) => {
                self.set_visible(&state);
                Some(entry)
            }
            None => {
                let reclaimed = state.waiters.miss();
                state.check(&self.visible);
                reclaimed
            }
        }
    }

    /// Makes committed entries visible at the back, in the given order; the oldest waiters
    /// are served first.
    pub(crate) fn publish(&self, entries: impl IntoIterator<Item = Entry>) {
        let mut wake = Vec::new();
        self.lock().publish(entries, &mut wake);
        wake.into_iter().for_each(Waker::wake);
    }

    /// [`publish`](Self::publish) of one entry (most commits' and timers'): without the
    /// iterators and the list of wakers.
    pub(crate) fn publish_one(&self, entry: Entry) {
        let mut locked = self.lock();
        let waker = locked.offer(entry);
        locked.core.set_visible(&locked.state);
        drop(locked);
        if let Some(waker) = waker {
            waker.wake();
        }
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
    ///
    /// A poll that finds nothing is a miss: it may take an entry handed to another request
    /// that is overdue (see the module docs). A request whose own entry was taken that way
    /// polls afresh and, if it has to wait, waits at the place in line it had.
    pub(crate) fn poll_take(
        &self,
        request: &mut Request,
        waker: &Waker,
    ) -> Poll<Result<Entry, Closed>> {
        let mut state = self.state.lock();
        let polled = match request.ticket {
            Some(ticket) => {
                if let Some(entry) = state.waiters.collect(ticket) {
                    request.ticket = None;
                    Poll::Ready(Ok(entry))
                } else if state.closed {
                    request.ticket = None;
                    Poll::Ready(Err(Closed))
                } else if state.waiters.is_waiting(ticket) {
                    // Polled while in line (woken for another reason, or moved): a miss, since
                    // `ready` is empty while anyone waits.
                    match state.waiters.miss() {
                        Some(entry) => {
                            let left = state.waiters.leave(ticket);
                            debug_assert!(left.is_none(), "a waiting request holds nothing");
                            request.ticket = None;
                            Poll::Ready(Ok(entry))
                        }
                        None => {
                            state.waiters.rewake(ticket, waker);
                            Poll::Pending
                        }
                    }
                } else {
                    // Its entry was reclaimed by a miss: it polls afresh, keeping its place.
                    self.take_or_wait(&mut state, request, waker)
                }
            }
            None => self.take_or_wait(&mut state, request, waker),
        };
        state.check(&self.visible);
        polled
    }

    /// `poll_take` for a request that is not in line and has nothing staged: a fresh one, or
    /// one whose entry was reclaimed (it joins again under its old ticket).
    fn take_or_wait(
        &self,
        state: &mut State,
        request: &mut Request,
        waker: &Waker,
    ) -> Poll<Result<Entry, Closed>> {
        debug_assert!(
            request
                .ticket
                .is_none_or(|t| !state.waiters.is_waiting(t) && !state.waiters.is_served(t)),
            "a request polled afresh is neither in line nor served"
        );
        if let Some(entry) = state.ready.pop_front() {
            self.set_visible(state);
            request.ticket = None;
            return Poll::Ready(Ok(entry));
        }
        if state.closed {
            request.ticket = None;
            return Poll::Ready(Err(Closed));
        }
        if let Some(entry) = state.waiters.miss() {
            request.ticket = None;
            return Poll::Ready(Ok(entry));
        }
        match request.ticket {
            Some(ticket) => state.waiters.rejoin(ticket, waker),
            None => request.ticket = Some(state.waiters.join(waker)),
        }
        Poll::Pending
    }

    /// Ends `request` without waiting further. An entry already handed to it (and not
    /// reclaimed) is returned to the caller, who must either use it or
    /// [`restore`](Self::restore) it.
    pub(crate) fn withdraw(&self, request: &mut Request) -> Option<Entry> {
        let ticket = request.ticket.take()?;
        self.state.lock().waiters.leave(ticket)
    }

    /// Ends the request holding `ticket`, if it is still in line or holds a handed entry; the
    /// entry goes back to the front (or to the next waiter). Nothing happens for a ticket that
    /// is finished: tickets are never reused. For a request whose owner is gone without
    /// dropping it (a leaked `Dequeue`), found by its transaction.
    pub(crate) fn cancel_ticket(&self, ticket: Ticket) {
        let entry = self.state.lock().waiters.leave(ticket);
        if let Some(entry) = entry {
            self.restore(std::iter::once(entry));
        }
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
            let wake = state.waiters.dismiss();
            state.check(&self.visible);
            wake
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

    /// Hands `entry` to the oldest waiter and returns its waker, or puts it at the back.
    fn offer(&mut self, entry: Entry) -> Option<Waker> {
        match self.state.waiters.hand(entry) {
            Ok(waker) => Some(waker),
            Err(entry) => {
                self.state.ready.push_back(entry);
                None
            }
        }
    }

    /// See [`QueueCore::publish`].
    pub(crate) fn publish(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
        wake: &mut Vec<Waker>,
    ) {
        // One at a time: most commits publish one item, and `extend` of an iterator that
        // does not know its length costs more than that item's `push_back`.
        for entry in entries {
            wake.extend(self.offer(entry));
        }
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
        QueueCore::new(0, QueueIndex(0), "q".into(), VecDeque::new())
    }

    fn entry(id: u64) -> Entry {
        Entry::new(id, Box::new([1]), 0)
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
    fn a_browse_takes_the_lowest_ids_above_the_cursor_whatever_the_order() {
        let q = core();
        q.publish([entry(5), entry(6), entry(9), entry(7)]);
        // Given back at the head, out of id order.
        q.restore([entry(8), entry(2)].into_iter());
        let page = |after, limit| {
            q.ready_entries_above(after, limit)
                .iter()
                .map(|e| e.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(page(None, 3), [2, 5, 6]);
        assert_eq!(page(Some(6), 3), [7, 8, 9]);
        assert_eq!(page(Some(8), 10), [9]);
        assert_eq!(page(Some(9), 10), Vec::<u64>::new());
        assert_eq!(page(None, 0), Vec::<u64>::new());
        assert_eq!(page(None, usize::MAX), [2, 5, 6, 7, 8, 9], "no limit");
        assert_eq!(q.count(), 6, "a browse takes nothing");
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

    #[test]
    fn an_entry_left_with_a_request_goes_to_the_second_miss() {
        let q = core();
        let mut leaked = Request::default();
        assert!(q.poll_take(&mut leaked, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 1));
        assert!(q.try_take().is_none(), "one miss takes nothing");
        assert_eq!(q.try_take().map(|e| e.id), Some(1));
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
        // The request is out of the line: the next item is visible, not handed to it.
        q.publish([entry(2)]);
        assert_eq!((q.count(), q.waiters(), q.staged()), (1, 0, 0));
        assert_eq!(ids(&q), vec![2]);
    }

    #[test]
    fn a_waiting_request_that_misses_takes_an_overdue_entry() {
        let q = core();
        let mut leaked = Request::default();
        let mut live = Request::default();
        assert!(q.poll_take(&mut leaked, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        // Joins the line: the first miss since the hand-over.
        assert!(q.poll_take(&mut live, Waker::noop()).is_pending());
        assert_eq!(q.waiters(), 1);
        // Polled again without being served: the second miss.
        assert_eq!(ready_id(q.poll_take(&mut live, Waker::noop())), Some(1));
        assert!(!live.is_waiting());
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    }

    #[test]
    fn a_fresh_request_that_misses_takes_an_overdue_entry() {
        let q = core();
        let mut leaked = Request::default();
        assert!(q.poll_take(&mut leaked, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(q.try_take().is_none());
        let mut fresh = Request::default();
        assert_eq!(ready_id(q.poll_take(&mut fresh, Waker::noop())), Some(1));
        assert!(!fresh.is_waiting());
        assert_eq!((q.waiters(), q.staged()), (0, 0));
    }

    #[test]
    fn a_late_request_waits_again_at_its_old_place() {
        let q = core();
        let mut late = Request::default();
        let mut next = Request::default();
        assert!(q.poll_take(&mut late, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(q.poll_take(&mut next, Waker::noop()).is_pending());
        assert_eq!(q.try_take().map(|e| e.id), Some(1));
        // Polled at last: nothing for it now, so it waits, ahead of `next`.
        assert!(q.poll_take(&mut late, Waker::noop()).is_pending());
        assert!(late.is_waiting());
        assert_eq!(q.waiters(), 2);
        q.publish([entry(2), entry(3)]);
        assert_eq!(ready_id(q.poll_take(&mut next, Waker::noop())), Some(3));
        assert_eq!(ready_id(q.poll_take(&mut late, Waker::noop())), Some(2));
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    }

    #[test]
    fn a_late_request_takes_what_is_visible() {
        let q = core();
        let mut late = Request::default();
        assert!(q.poll_take(&mut late, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(q.try_take().is_none());
        assert_eq!(q.try_take().map(|e| e.id), Some(1));
        q.publish([entry(2)]);
        assert_eq!(ready_id(q.poll_take(&mut late, Waker::noop())), Some(2));
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    }

    #[test]
    fn a_reclaimed_request_cancels_and_withdraws_cleanly() {
        let q = core();
        let mut late = Request::default();
        assert!(q.poll_take(&mut late, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(q.try_take().is_none());
        assert!(q.try_take().is_some());
        assert!(q.withdraw(&mut late).is_none());
        assert!(!late.is_waiting());
        q.cancel(&mut late);
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    }

    #[test]
    fn a_reclaimed_request_finds_the_queue_closed() {
        let q = core();
        let mut late = Request::default();
        assert!(q.poll_take(&mut late, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(q.try_take().is_none());
        assert!(q.try_take().is_some());
        q.close();
        assert_eq!(
            q.poll_take(&mut late, Waker::noop()),
            Poll::Ready(Err(Closed))
        );
        assert!(!late.is_waiting());
    }

    #[test]
    fn a_request_served_in_time_keeps_its_entry() {
        let q = core();
        let mut a = Request::default();
        assert!(q.poll_take(&mut a, Waker::noop()).is_pending());
        q.publish([entry(1)]);
        assert!(
            q.try_take().is_none(),
            "one miss is a race with the wake-up"
        );
        assert_eq!(ready_id(q.poll_take(&mut a, Waker::noop())), Some(1));
        assert!(q.try_take().is_none());
        assert_eq!((q.count(), q.waiters(), q.staged()), (0, 0, 0));
    }
}
