//! What an open transaction has done so far, as its engine keeps it ([`Work`]), and how it is
//! undone ([`abort`]). The engines are handed a transaction's `Work` to commit; the seam
//! (`engine/mod.rs`) builds it up.

use std::sync::Arc;

use smallvec::SmallVec;

use super::moves::{Move, MoveKind};
#[cfg(feature = "postgres")]
use super::postgres;
#[cfg(feature = "redis")]
use super::redis;
use super::timers::TxExpiry;
use crate::core::{give_back_all, Entry, QueueCore, QueueIndex, QueueTable, Ticket};
use crate::error::{Error, Result};

/// Encoded items a transaction enqueues, with their queues. One-item transactions, the most
/// common kind, keep theirs inline.
pub(crate) type Enqueues = SmallVec<[(QueueIndex, Box<[u8]>); 1]>;

/// What buffering one item costs a transaction beyond its encoded bytes, as the transaction
/// size limit counts it: its `(queue, bytes)` slot in [`Enqueues`] (24 bytes on 64-bit
/// targets) plus the smallest heap block its bytes take (32 bytes with glibc's allocator,
/// whose blocks carry an 8-byte header and are rounded up to 16 bytes). Measured (glibc,
/// x86-64, resident memory): 4M such slots pushed one by one, each with a one-byte box (a
/// `()` item in its envelope), take 56 bytes per item, and each counts 57 (its encoded byte
/// plus this); a larger item's header and rounding take at most 23 bytes, so this is an
/// upper bound for it. Without it, a transaction of zero-sized items could grow without
/// bound under any limit.
pub(crate) const ITEM_OVERHEAD: usize =
    std::mem::size_of::<(QueueIndex, Box<[u8]>)>() + MIN_HEAP_BLOCK;

/// The smallest block glibc's `malloc` hands out, header included (on 64-bit targets).
const MIN_HEAP_BLOCK: usize = 32;

/// Items a transaction dequeued and holds, with their queues.
pub(crate) type Held = SmallVec<[(QueueIndex, Entry); 1]>;

/// What an open transaction has done so far, as its engine keeps it.
///
/// On the embedded engines that is all of it: the encoded items to enqueue and the entries
/// dequeued (taken out of their queues' cores). On PostgreSQL it would also hold the pooled
/// connection with its open database transaction, whose `FOR UPDATE SKIP LOCKED` row locks
/// are the dequeued items.
#[derive(Debug, Default)]
pub(crate) struct Work {
    pub(crate) enqueues: Enqueues,
    pub(crate) dequeued: Held,
    /// What `enqueues` cost, checked against the transaction size limit: each item's encoded
    /// size plus [`ITEM_OVERHEAD`].
    pub(crate) enqueued_bytes: usize,
    /// Waiting dequeues of this transaction that joined a line and have not finished: their
    /// queues and tickets. A `Dequeue` borrows its transaction mutably, so when the
    /// transaction is used again every one of them is gone: dropped (and withdrawn already)
    /// or leaked (`mem::forget`), in which case [`Work::withdraw_leaked`] withdraws it.
    pub(super) requests: SmallVec<[(Arc<QueueCore>, Ticket); 1]>,
    /// Processing-layer changes (delayed enqueues, lease records, settlements, dead-letter
    /// moves), applied after the enqueues; see `processing`.
    pub(crate) moves: Vec<Move>,
    /// On PostgreSQL: the connection with the transaction's open database transaction.
    #[cfg(feature = "postgres")]
    pub(crate) pg: postgres::PgSlot,
    /// On PostgreSQL: the places in line of this transaction's waiting dequeue while it
    /// waits. Its future leaves them when it ends or is dropped; one that is leaked leaves
    /// them when this is dropped (the transaction ends or is used again).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) seats: Option<Box<super::line::Seats>>,
    /// On Redis: the transaction's token and the items it holds on the server.
    #[cfg(feature = "redis")]
    pub(crate) rd: redis::RedisSlot,
    /// The transaction's deadline, if it has one (P10).
    pub(crate) expiry: Option<Arc<TxExpiry>>,
}

impl Work {
    /// Fails once the transaction's deadline has passed.
    #[inline]
    pub(crate) fn check_live(&self) -> Result<()> {
        match &self.expiry {
            Some(x) if x.is_expired() => Err(Error::TransactionExpired),
            _ => Ok(()),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.enqueues.is_empty() && self.dequeued.is_empty() && self.moves.is_empty()
    }

    /// Items the transaction holds: taken from the in-memory core, or rows deleted in its
    /// database transaction.
    /// The items a commit of this work adds to queues and removes from them, for the
    /// metrics: enqueues (imports to a queue's tail among them) and dequeues (acks among
    /// them).
    pub(crate) fn tally(&self) -> (usize, usize) {
        let mut enqueued = self.enqueues.len();
        let mut dequeued = self.held();
        for mv in &self.moves {
            match mv.kind {
                MoveKind::Enqueue { .. } | MoveKind::Import { reason: None, .. } => enqueued += 1,
                MoveKind::Ack { .. } => dequeued += 1,
                _ => {}
            }
        }
        (enqueued, dequeued)
    }

    pub(crate) fn held(&self) -> usize {
        #[cfg(feature = "postgres")]
        if !self.pg.is_idle() {
            return self.dequeued.len() + self.pg.held();
        }
        #[cfg(feature = "redis")]
        if self.rd.held() > 0 {
            return self.dequeued.len() + self.rd.held();
        }
        self.dequeued.len()
    }

    /// Checks (debug builds) that every held entry is held once: an item taken twice (by
    /// this transaction, or handed to it and to another) would be committed or given back
    /// twice.
    fn check_held(&self) {
        debug_assert!(
            {
                let mut seen = std::collections::HashSet::with_capacity(self.dequeued.len());
                self.dequeued
                    .iter()
                    .all(|(queue, entry)| seen.insert((*queue, entry.id)))
            },
            "a transaction holds each dequeued item once"
        );
    }

    /// Gives the last item dequeued back to the front of its queue (it could not be decoded).
    pub(crate) fn give_back_last(&mut self, table: &QueueTable) {
        let Some((queue, entry)) = self.dequeued.pop() else {
            return;
        };
        // Past the deadline the timer has put the item's copy back already.
        if self
            .expiry
            .as_ref()
            .is_none_or(|x| x.forget(queue, entry.id))
        {
            give_back_all(table, [(queue, entry)]);
        }
    }

    /// The dequeued items were committed: no longer held, gone from their queues, so their
    /// keys are free again. Leaves `dequeued` empty.
    pub(crate) fn settle_dequeued(&mut self, table: &QueueTable) {
        self.check_held();
        // Popped, not drained: the order does not matter, and most commits settle one item.
        while let Some((queue, entry)) = self.dequeued.pop() {
            let core = table.get(queue);
            core.unhold(1);
            if let Some(key) = entry.key() {
                core.release_key(key);
            }
        }
    }

    /// Undoes what the moves took (after a failed commit or an abort).
    pub(crate) fn undo_moves(&mut self) {
        for mv in self.moves.drain(..) {
            mv.undo();
        }
    }

    /// Withdraws the requests of waiting dequeues whose futures are gone: an item handed to a
    /// leaked one goes back to the front of its queue (or to the next waiter). Called by every
    /// use of the transaction other than a waiting dequeue's own polls. Withdrawing a request
    /// that was dropped properly does nothing.
    #[inline]
    pub(crate) fn withdraw_leaked(&mut self) {
        #[cfg(any(feature = "postgres", feature = "redis"))]
        if self.seats.is_some() {
            self.seats = None;
        }
        if !self.requests.is_empty() {
            self.withdraw_requests();
        }
    }

    /// See [`withdraw_leaked`](Self::withdraw_leaked): the waiting dequeues' requests.
    #[cold]
    fn withdraw_requests(&mut self) {
        for (core, ticket) in self.requests.drain(..) {
            core.cancel_ticket(ticket);
        }
    }
}

/// Gives `work`'s dequeued items back and undoes its moves; its enqueues are dropped.
pub(crate) fn abort(mut work: Work, table: &QueueTable) {
    debug_assert!(
        work.expiry.is_none(),
        "a deadline is settled before the work is undone"
    );
    work.withdraw_leaked();
    work.undo_moves();
    if !work.dequeued.is_empty() {
        work.check_held();
        give_back_all(table, work.dequeued);
    }
}
