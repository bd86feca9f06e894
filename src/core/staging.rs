//! Staging of dequeue requests: the waiters of one queue, served first come, first served.
//!
//! A dequeuer that finds the queue empty registers a request with a ticket (its place in
//! line). Whoever makes an item visible (a committer publishing, an abort returning items, a
//! cancelled waiter giving back what it was handed) fulfils the oldest request first by
//! handing the entry straight to it and waking only that waiter. The holder of the queue lock
//! owns this structure; it never blocks and never wakes anyone itself: it returns the waker
//! so the caller can wake after unlocking.

use std::collections::{BTreeMap, HashMap};
use std::task::Waker;

use super::entry::Entry;

/// A request's place in line. Tickets are handed out in increasing order.
pub(crate) type Ticket = u64;

/// What a withdrawn request left behind.
#[derive(Debug)]
pub(crate) enum Withdrawn {
    /// The request was still waiting; it is gone now.
    Waiting,
    /// An entry had already been handed to it; the caller now owns that entry.
    Handed(Entry),
    /// The ticket is unknown (already collected or withdrawn).
    Unknown,
}

#[derive(Debug, Default)]
pub(crate) struct Staging {
    next_ticket: Ticket,
    /// Requests still waiting, oldest first, with the waker to call when served.
    waiting: BTreeMap<Ticket, Waker>,
    /// Entries handed to a request that has not collected them yet.
    handed: HashMap<Ticket, Entry>,
}

impl Staging {
    /// Is any request waiting for an entry?
    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Number of requests waiting.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Puts a new request at the back of the line.
    pub(crate) fn register(&mut self, waker: &Waker) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting.insert(ticket, waker.clone());
        ticket
    }

    /// Hands `entry` to the oldest waiting request and returns its waker, or gives the entry
    /// back when nobody waits.
    pub(crate) fn fulfil(&mut self, entry: Entry) -> Result<Waker, Entry> {
        match self.waiting.pop_first() {
            Some((ticket, waker)) => {
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

    /// Removes a request, waiting or served.
    pub(crate) fn withdraw(&mut self, ticket: Ticket) -> Withdrawn {
        if self.waiting.remove(&ticket).is_some() {
            Withdrawn::Waiting
        } else if let Some(entry) = self.handed.remove(&ticket) {
            Withdrawn::Handed(entry)
        } else {
            Withdrawn::Unknown
        }
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
    fn serves_in_registration_order() {
        let mut s = Staging::default();
        let a = s.register(Waker::noop());
        let b = s.register(Waker::noop());
        assert!(s.fulfil(entry(1)).is_ok());
        assert!(s.fulfil(entry(2)).is_ok());
        assert_eq!(s.fulfil(entry(3)).unwrap_err().id, 3);
        assert_eq!(s.collect(b).unwrap().id, 2);
        assert_eq!(s.collect(a).unwrap().id, 1);
        assert!(s.collect(a).is_none());
    }

    #[test]
    fn withdraw_reports_what_was_left() {
        let mut s = Staging::default();
        let a = s.register(Waker::noop());
        let b = s.register(Waker::noop());
        assert!(matches!(s.withdraw(a), Withdrawn::Waiting));
        assert!(s.fulfil(entry(5)).is_ok());
        assert!(matches!(s.withdraw(b), Withdrawn::Handed(e) if e.id == 5));
        assert!(matches!(s.withdraw(b), Withdrawn::Unknown));
        assert!(!s.has_waiters());
    }
}
