//! The line of waiting dequeue requests of one queue, served first come, first served, and
//! the entries handed to requests that have not taken them yet.
//!
//! A dequeuer that finds the queue empty joins the line with a ticket (its place in it).
//! Whoever makes an item visible (a commit publishing, an abort giving items back, a cancelled
//! waiter giving back what it was handed) hands the entry straight to the oldest waiter and
//! wakes only that one. The entry is then *staged* under the ticket until the request takes
//! it at its next poll. The holder of the queue lock owns this structure; it never blocks and
//! never wakes anyone itself: it returns the waker so the caller can wake after unlocking.
//!
//! # Reclaiming what a request does not take
//!
//! A request whose future is never polled again (leaked with `mem::forget`, or kept and not
//! polled) would keep a staged entry forever. So a hand-over is a reservation with a bound,
//! counted in *misses*: a miss is a dequeue attempt on the queue that finds nothing to take
//! (a `try_take` on an empty deque, a `poll_take` that waits). Every miss while something is
//! staged counts; the [`RECLAIM_AFTER`]-th miss after an entry was handed over takes that
//! entry from its request and gives it to the consumer that missed, as if it had been
//! visible. One entry per miss, the one handed over first. A request that lost its entry
//! this way is out of the line; if it is polled again it joins it again under its old ticket,
//! at the place it had (see [`Waiters::rejoin`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::task::Waker;

use super::entry::Entry;

/// A waiter's place in line. Tickets are handed out in increasing order.
pub(crate) type Ticket = u64;

/// The miss (a dequeue attempt that finds nothing to take) that reclaims an entry handed to a
/// request that has not taken it: the second one after the hand-over. One miss is a race with
/// the waiter's wake-up (it has been woken and not run yet) and takes nothing.
pub(crate) const RECLAIM_AFTER: u64 = 2;

// A reclaiming miss comes strictly after the hand-over, so that a ticket handed an entry
// again (after it lost one and joined the line again) gets a later miss count.
const _: () = assert!(RECLAIM_AFTER >= 1);

/// An entry handed to a request that has not taken it yet.
#[derive(Debug)]
struct Staged {
    entry: Entry,
    /// [`Waiters::misses`] when the entry was handed over.
    at: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next_ticket: Ticket,
    /// Requests still waiting, oldest first, with the waker to call when served.
    waiting: BTreeMap<Ticket, Waker>,
    /// Entries handed to a request that has not collected them yet.
    handed: HashMap<Ticket, Staged>,
    /// `(ticket, at)` of every staged entry, in the order they were handed over (so `at` never
    /// decreases), plus stale pairs whose entry was taken since. The front pair is never
    /// stale, and the deque is empty when nothing is staged (see [`Waiters::tidy`]).
    order: VecDeque<(Ticket, u64)>,
    /// Misses counted so far (only while something is staged: a miss ages staged entries).
    misses: u64,
}

impl Waiters {
    /// Is any request waiting for an entry?
    pub(crate) fn any(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Number of requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Number of entries handed over and not taken yet.
    #[cfg(test)]
    pub(crate) fn staged(&self) -> usize {
        self.handed.len()
    }

    /// Is `ticket` waiting in line (neither served nor reclaimed nor gone)?
    pub(crate) fn is_waiting(&self, ticket: Ticket) -> bool {
        self.waiting.contains_key(&ticket)
    }

    /// Is an entry staged for `ticket`?
    pub(crate) fn is_served(&self, ticket: Ticket) -> bool {
        self.handed.contains_key(&ticket)
    }

    /// Checks that `ticket` was issued by this line (a request of another queue's line, or a
    /// forged one, would find or take someone else's place).
    fn check_issued(&self, ticket: Ticket) {
        debug_assert!(
            ticket < self.next_ticket,
            "ticket {ticket} was never issued by this line (next is {})",
            self.next_ticket
        );
    }

    /// Puts a new request at the back of the line.
    pub(crate) fn join(&mut self, waker: &Waker) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket = ticket.wrapping_add(1);
        self.waiting.insert(ticket, waker.clone());
        ticket
    }

    /// Puts back in line a request whose entry was reclaimed, under its old ticket: ahead of
    /// every request that joined after it first did.
    pub(crate) fn rejoin(&mut self, ticket: Ticket, waker: &Waker) {
        debug_assert!(
            ticket < self.next_ticket && !self.handed.contains_key(&ticket),
            "only a ticket whose entry was reclaimed joins again"
        );
        let previous = self.waiting.insert(ticket, waker.clone());
        debug_assert!(previous.is_none(), "a ticket waits once");
    }

    /// Hands `entry` to the oldest waiting request and returns its waker, or gives the entry
    /// back when nobody waits. Inline, with the look into the line out of it: nobody waits on
    /// most publishes.
    #[inline]
    pub(crate) fn hand(&mut self, entry: Entry) -> Result<Waker, Entry> {
        match self.any() {
            true => self.hand_oldest(entry),
            false => Err(entry),
        }
    }

    /// [`hand`](Self::hand) past its check.
    fn hand_oldest(&mut self, entry: Entry) -> Result<Waker, Entry> {
        match self.waiting.pop_first() {
            Some((ticket, waker)) => {
                self.check_issued(ticket);
                let at = self.misses;
                let previous = self.handed.insert(ticket, Staged { entry, at });
                debug_assert!(previous.is_none(), "a ticket holds one entry at a time");
                self.order.push_back((ticket, at));
                Ok(waker)
            }
            None => Err(entry),
        }
    }

    /// Takes the entry handed to `ticket`, if there is one yet.
    pub(crate) fn collect(&mut self, ticket: Ticket) -> Option<Entry> {
        self.check_issued(ticket);
        let staged = self.handed.remove(&ticket)?;
        self.tidy();
        Some(staged.entry)
    }

    /// Counts a miss: a dequeue attempt that found nothing to take. Returns the entry it
    /// reclaims, now the caller's: the one handed over first, if [`RECLAIM_AFTER`] misses
    /// (this one included) have happened since its hand-over. Costs one branch when nothing
    /// is staged.
    pub(crate) fn miss(&mut self) -> Option<Entry> {
        if self.handed.is_empty() {
            return None;
        }
        self.misses = self.misses.wrapping_add(1);
        let &(ticket, at) = self.order.front()?;
        if self.misses.wrapping_sub(at) < RECLAIM_AFTER {
            return None;
        }
        self.order.pop_front();
        let staged = self.handed.remove(&ticket);
        debug_assert!(
            staged.as_ref().is_some_and(|s| s.at == at),
            "the front of the hand-over order is current"
        );
        self.tidy();
        staged.map(|s| s.entry)
    }

    /// Drops the stale pairs at the front of `order`, so that its front is the entry handed
    /// over first among those still staged.
    fn tidy(&mut self) {
        if self.handed.is_empty() {
            self.order.clear();
            return;
        }
        while let Some(&(ticket, at)) = self.order.front() {
            if self.handed.get(&ticket).is_some_and(|s| s.at == at) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// Replaces the waker of a waiting request (a future may move between tasks).
    pub(crate) fn rewake(&mut self, ticket: Ticket, waker: &Waker) {
        debug_assert!(
            self.waiting.contains_key(&ticket),
            "only a request in line has its waker replaced"
        );
        if let Some(current) = self.waiting.get_mut(&ticket) {
            if !current.will_wake(waker) {
                *current = waker.clone();
            }
        }
    }

    /// Removes a request, waiting or served; returns the entry already handed to it, which
    /// the caller now owns. A request whose entry was reclaimed is already gone.
    pub(crate) fn leave(&mut self, ticket: Ticket) -> Option<Entry> {
        self.check_issued(ticket);
        if self.waiting.remove(&ticket).is_some() {
            debug_assert!(
                !self.handed.contains_key(&ticket),
                "a request in line has nothing staged"
            );
            None
        } else {
            self.collect(ticket)
        }
    }

    /// Empties the line (the store is closing) and returns every waiting request's waker.
    /// Entries already handed stay until their requests collect them or leave.
    pub(crate) fn dismiss(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.waiting).into_values().collect()
    }

    /// Checks the bookkeeping of staged entries (debug builds).
    pub(crate) fn check(&self) {
        debug_assert_eq!(
            self.handed.is_empty(),
            self.order.is_empty(),
            "the hand-over order is empty exactly when nothing is staged"
        );
        debug_assert!(
            self.order.len() >= self.handed.len(),
            "every staged entry is in the hand-over order"
        );
        debug_assert!(
            self.order
                .front()
                .is_none_or(|&(t, at)| self.handed.get(&t).is_some_and(|s| s.at == at)),
            "the front of the hand-over order is current"
        );
    }
}

#[cfg(all(test, not(reliable_queue_loom)))]
mod tests {
    use super::*;
    use std::task::Waker;

    fn entry(id: u64) -> Entry {
        Entry::new(id, Box::new([1]), 0)
    }

    fn ids(entries: impl IntoIterator<Item = Option<Entry>>) -> Vec<Option<u64>> {
        entries.into_iter().map(|e| e.map(|e| e.id)).collect()
    }

    #[test]
    fn serves_in_order_of_joining() {
        let mut w = Waiters::default();
        let a = w.join(Waker::noop());
        let b = w.join(Waker::noop());
        assert!(w.hand(entry(1)).is_ok());
        assert!(w.hand(entry(2)).is_ok());
        assert_eq!(w.hand(entry(3)).unwrap_err().id, 3);
        assert_eq!(w.collect(b).unwrap().id, 2);
        assert_eq!(w.collect(a).unwrap().id, 1);
        assert!(w.collect(a).is_none());
        w.check();
    }

    #[test]
    fn leaving_returns_what_was_handed() {
        let mut w = Waiters::default();
        let a = w.join(Waker::noop());
        let b = w.join(Waker::noop());
        assert!(w.leave(a).is_none());
        assert!(w.hand(entry(5)).is_ok());
        assert_eq!(w.leave(b).map(|e| e.id), Some(5));
        assert!(w.leave(b).is_none());
        assert!(!w.any());
        w.check();
    }

    #[test]
    fn misses_count_only_while_something_is_staged() {
        let mut w = Waiters::default();
        for _ in 0..10 {
            assert!(w.miss().is_none());
        }
        let _a = w.join(Waker::noop());
        assert!(w.hand(entry(1)).is_ok());
        // Nothing was staged before: the ten misses do not count against entry 1.
        assert_eq!(ids([w.miss(), w.miss()]), [None, Some(1)]);
        assert_eq!(w.staged(), 0);
        w.check();
    }

    #[test]
    fn the_reclaim_after_th_miss_reclaims_and_not_before() {
        let mut w = Waiters::default();
        let a = w.join(Waker::noop());
        assert!(w.hand(entry(1)).is_ok());
        for _ in 1..RECLAIM_AFTER {
            assert!(w.miss().is_none());
        }
        assert_eq!(w.miss().map(|e| e.id), Some(1));
        // The request lost its entry and its place.
        assert!(w.collect(a).is_none());
        assert!(!w.is_waiting(a));
        assert!(w.leave(a).is_none());
        w.check();
    }

    #[test]
    fn one_entry_per_miss_first_handed_first() {
        let mut w = Waiters::default();
        let tickets: Vec<_> = (0..3).map(|_| w.join(Waker::noop())).collect();
        for id in 1..=3 {
            assert!(w.hand(entry(id)).is_ok());
        }
        assert_eq!(
            ids([w.miss(), w.miss(), w.miss(), w.miss()]),
            [None, Some(1), Some(2), Some(3)]
        );
        assert!(tickets.iter().all(|&t| w.collect(t).is_none()));
        w.check();
    }

    #[test]
    fn an_entry_collected_in_time_is_not_reclaimed() {
        let mut w = Waiters::default();
        let a = w.join(Waker::noop());
        let b = w.join(Waker::noop());
        assert!(w.hand(entry(1)).is_ok());
        assert!(w.miss().is_none());
        assert!(w.hand(entry(2)).is_ok());
        // `a` takes its entry in time; `b`'s entry was handed after one miss, so it is
        // reclaimed one miss later than `a`'s would have been.
        assert_eq!(w.collect(a).map(|e| e.id), Some(1));
        assert!(w.miss().is_none());
        assert_eq!(w.miss().map(|e| e.id), Some(2));
        assert!(w.collect(b).is_none());
        w.check();
    }

    #[test]
    fn collecting_out_of_order_keeps_the_order_tidy() {
        let mut w = Waiters::default();
        let tickets: Vec<_> = (0..4).map(|_| w.join(Waker::noop())).collect();
        for id in 0..4 {
            assert!(w.hand(entry(id)).is_ok());
        }
        assert_eq!(w.collect(tickets[2]).map(|e| e.id), Some(2));
        assert_eq!(w.collect(tickets[1]).map(|e| e.id), Some(1));
        w.check();
        assert_eq!(w.collect(tickets[0]).map(|e| e.id), Some(0));
        w.check();
        assert_eq!(
            w.order.len(),
            1,
            "the stale pairs behind the front are gone"
        );
        assert_eq!(ids([w.miss(), w.miss()]), [None, Some(3)]);
        assert!(w.order.is_empty());
        w.check();
    }

    #[test]
    fn a_reclaimed_ticket_rejoins_at_its_old_place_and_can_be_served_again() {
        let mut w = Waiters::default();
        let a = w.join(Waker::noop());
        assert!(w.hand(entry(1)).is_ok());
        let b = w.join(Waker::noop());
        assert_eq!(ids([w.miss(), w.miss()]), [None, Some(1)]);
        w.rejoin(a, Waker::noop());
        assert!(w.is_waiting(a));
        // `a` came before `b`: it is served first.
        assert!(w.hand(entry(2)).is_ok());
        assert_eq!(w.collect(a).map(|e| e.id), Some(2));
        assert!(w.hand(entry(3)).is_ok());
        assert_eq!(w.collect(b).map(|e| e.id), Some(3));
        w.check();
    }
}
