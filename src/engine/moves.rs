//! Moves: every processing-layer change of an item is a [`Move`] in a transaction's
//! [`Work`](super::Work). A move retires the item's current id and (but for an ack or a
//! purge) gives the item a new version under a fresh id, assigned at commit like an
//! enqueue's. A commit applies its moves after its enqueues, with the same durability: on the
//! sled engine each move is one op of the group's record (see `sled::record`), so a lease's
//! attempt count, a retry's due time and a dead-letter move are as durable as any commit.

use std::sync::Arc;

use super::proc::{DeadSlot, Grant, GrantState, Leased, Proc};
use super::timers::Timers;
use crate::core::Entry;
use crate::processing::MAX_ATTEMPTS;

/// One processing-layer change of an item, applied by a commit (see the module docs).
#[derive(Debug)]
pub(crate) struct Move {
    pub(crate) proc: Arc<Proc>,
    pub(crate) kind: MoveKind,
}

#[derive(Debug)]
pub(crate) enum MoveKind {
    /// A fresh item that is delayed or has a deduplication key (reserved in its queue when it
    /// was buffered); its id is assigned at commit. It is due `delay` ms after the commit,
    /// or at `entry.not_before` when `delay` is 0.
    Enqueue { entry: Entry, delay: u64 },
    /// A lease: `entry` is the item taken from the queue (its id the old one) with its next
    /// attempt counted.
    Lease {
        entry: Entry,
        ttl: u64,
        grant: Arc<Grant>,
    },
    /// A settled lease (token `entry.id`) due again at `entry.not_before`.
    Retry { entry: Entry },
    /// To the dead letters (from a settled lease, token `entry.id`, or an expired one).
    Bury { entry: Entry, reason: String },
    /// A dead letter back to the queue (at its tail): claimed at commit start; on the sled
    /// engine its bytes are read from the log by the committer.
    Replay { slot: DeadSlot, reset: bool },
    /// An acknowledged lease: claimed at commit start (`claimed`), then gone.
    Ack { token: u64, claimed: Option<Leased> },
    /// A dead letter deleted.
    Purge { slot: DeadSlot },
    /// An item imported as it stood in another store (`rq import`): its attempts, due
    /// time and times kept, a fresh id assigned at commit; with `reason`, a dead letter.
    Import {
        entry: Entry,
        reason: Option<String>,
    },
}

impl Move {
    /// Does the move give the item a new version (and so take a fresh id)?
    pub(crate) fn makes_version(&self) -> bool {
        !matches!(self.kind, MoveKind::Ack { .. } | MoveKind::Purge { .. })
    }

    /// Undoes the move after an abort or a failed commit. Whatever item it took goes back to
    /// the front of its queue, as a dequeued item would: the one taken for a lease (its
    /// attempt not counted), a settled lease (nobody holds its `Lease` any more), a lease
    /// acknowledged in the transaction; a dead letter goes back to the dead letters.
    pub(crate) fn undo(self) {
        let Move { proc, kind } = self;
        let back = match kind {
            MoveKind::Enqueue { entry, .. } => {
                if let Some(key) = entry.key() {
                    proc.core.release_key(key);
                }
                None
            }
            MoveKind::Lease {
                mut entry, grant, ..
            } => {
                grant.abandon();
                entry.set_attempts(entry.attempts().saturating_sub(1));
                Some(entry)
            }
            MoveKind::Retry { entry } | MoveKind::Bury { entry, .. } => Some(entry),
            MoveKind::Replay { slot, .. } | MoveKind::Purge { slot } => {
                proc.put_dead(slot);
                None
            }
            MoveKind::Ack { token, claimed } => {
                claimed.or_else(|| proc.take_lease(token)).map(|l| l.entry)
            }
            MoveKind::Import { .. } => None,
        };
        if let Some(entry) = back {
            proc.core.restore(std::iter::once(entry));
        }
    }
}

/// What a committed move becomes, given its new id (if it takes one) and the commit time.
/// With `dead_on_disk` a dead letter keeps no bytes in memory (the sled engine reads them
/// from its log).
pub(crate) fn apply(mv: Move, id: u64, now: u64, timers: &Timers, dead_on_disk: bool) {
    let Move { proc, kind } = mv;
    match kind {
        MoveKind::Enqueue { mut entry, delay } => {
            entry.id = id;
            entry.enqueued_at = now;
            entry.set_not_before(due_after(&entry, delay, now));
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Retry { mut entry } => {
            entry.id = id;
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Replay { slot, reset } => {
            let mut entry = slot.entry;
            entry.id = id;
            entry.set_not_before(0);
            if reset {
                entry.set_attempts(0);
            }
            if let Some(key) = entry.key() {
                proc.core.add_key(key.into());
            }
            proc.core.publish_one(entry);
        }
        MoveKind::Lease {
            mut entry,
            ttl,
            grant,
        } => {
            entry.id = id;
            let deadline = now.saturating_add(ttl);
            let mut state = grant.0.lock();
            if *state == GrantState::Abandoned {
                drop(state);
                proc.core.restore(std::iter::once(entry));
                return;
            }
            let attempt = entry.attempts();
            let watch = proc.insert_lease(id, Leased { entry, deadline });
            *state = GrantState::Granted {
                token: id,
                deadline,
                attempt,
            };
            drop(state);
            if let Some(deadline) = watch {
                timers.watch(&proc, deadline);
            }
        }
        MoveKind::Bury { entry, reason } => bury(&proc, entry, id, reason, dead_on_disk),
        MoveKind::Ack { claimed, .. } => {
            if let Some(key) = claimed.as_ref().and_then(|l| l.entry.key()) {
                proc.core.release_key(key);
            }
        }
        MoveKind::Purge { .. } => {}
        MoveKind::Import {
            mut entry,
            reason: None,
        } => {
            entry.id = id;
            if entry.enqueued_at == 0 {
                entry.enqueued_at = now;
            }
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Import {
            mut entry,
            reason: Some(reason),
        } => {
            if entry.enqueued_at == 0 {
                entry.enqueued_at = now;
            }
            bury(&proc, entry, id, reason, dead_on_disk);
        }
    }
}

/// `entry` (its new version `id`) into the dead letters of `proc`. With `dead_on_disk` its
/// bytes are not kept in memory (the sled engine reads them from its log).
fn bury(proc: &Arc<Proc>, mut entry: Entry, id: u64, reason: String, dead_on_disk: bool) {
    entry.id = id;
    entry.set_not_before(0);
    // A dead letter is not in its queue: its key is free.
    if let Some(key) = entry.key() {
        proc.core.release_key(key);
    }
    if dead_on_disk {
        entry.bytes = Box::default();
    }
    proc.put_dead(DeadSlot {
        entry,
        reason,
        has_bytes: !dead_on_disk,
    });
}

/// Counts a lease granted at `now` as the item's next attempt: no further than
/// [`MAX_ATTEMPTS`], as on PostgreSQL (a count above it, written before the maximum was
/// enforced, is kept as it is: attempts never go down).
pub(super) fn count_attempt(entry: &mut Entry, now: u64) {
    if entry.attempts() < MAX_ATTEMPTS {
        entry.set_attempts(entry.attempts().saturating_add(1));
    }
    if entry.first_attempt() == 0 {
        entry.set_first_attempt(now);
    }
    entry.set_last_attempt(now);
}

/// When a fresh item committed at `now` is due: `delay` after the commit, or at the time it
/// was given (`entry.not_before`).
pub(crate) fn due_after(entry: &Entry, delay: u64, now: u64) -> u64 {
    if delay > 0 {
        now.saturating_add(delay)
    } else {
        entry.not_before()
    }
}
