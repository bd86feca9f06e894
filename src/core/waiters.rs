//! The line of waiting dequeue requests of one queue, served first come, first served.
//!
//! A dequeuer that finds the queue empty joins the line with a ticket (its place in it).
//! Whoever makes an item visible (a commit publishing, an abort giving items back, a cancelled
//! waiter giving back what it was handed) hands the entry straight to the oldest waiter and
//! wakes only that one. The holder of the queue lock owns this structure; it never blocks and
//! never wakes anyone itself: it returns the waker so the caller can wake after unlocking.

use std::collections::{BTreeMap, HashMap};
use std::task::Waker;

use super::entry::Entry;

/// A waiter's place in line. Tickets are handed out in increasing order.
pub(crate) type Ticket = u64;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next_ticket: Ticket,
    /// Requests still waiting, oldest first, with the waker to call when served.
    waiting: BTreeMap<Ticket, Waker>,
    /// Entries handed to a request that has not collected them yet.
    handed: HashMap<Ticket, Entry>,
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

    /// Puts a new request at the back of the line.
    pub(crate) fn join(&mut self, waker: &Waker) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket = ticket.wrapping_add(1);
        self.waiting.insert(ticket, waker.clone());
        ticket
    }

    /// Hands `entry` to the oldest waiting request and returns its waker, or gives the entry
    /// back when nobody waits.
    pub(crate) fn hand(&mut self, entry: Entry) -> Result<Waker, Entry> {
        match self.waiting.pop_first() {
            Some((ticket, waker)) => {
                debug_assert!(
                    !self.handed.contains_key(&ticket),
                    "a ticket is served once"
                );
                self.handed.insert(ticket, entry);
                Ok(waker)
            }
            None => Err(entry),
        }
    }

    /// Takes the entry handed to `ticket`, if there is one yet.
    pub(crate) fn collect(&mut self, ticket: Ticket) -> Option<Entry> {
        self.handed.remove(&ticket)
    }

    /// Replaces the waker of a waiting request (a future may move between tasks).
    pub(crate) fn rewake(&mut self, ticket: Ticket, waker: &Waker) {
        if let Some(current) = self.waiting.get_mut(&ticket) {
            if !current.will_wake(waker) {
                *current = waker.clone();
            }
        }
    }

    /// Removes a request, waiting or served; returns the entry already handed to it, which
    /// the caller now owns.
    pub(crate) fn leave(&mut self, ticket: Ticket) -> Option<Entry> {
        if self.waiting.remove(&ticket).is_some() {
            None
        } else {
            self.handed.remove(&ticket)
        }
    }

    /// Empties the line (the store is closing) and returns every waiting request's waker.
    /// Entries already handed stay until their requests collect them or leave.
    pub(crate) fn dismiss(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.waiting).into_values().collect()
    }
}

#[cfg(all(test, not(reliable_queue_loom)))]
mod tests {
    use super::*;
    use std::task::Waker;

    fn entry(id: u64) -> Entry {
        Entry::new(id, Box::new([1]))
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
    }
}
