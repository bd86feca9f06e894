//! The seam's processing-layer calls (`impl Engine`): lease grants, their settlements (ack,
//! fail, release, extend), dead letters and retry policies, and the burial of an item whose
//! last lease expired, which the timers ask of the engine ([`BuryExpired`]). What they work
//! on (`Proc`, `Move`, `Timers`) is in `processing.rs`, below the engines.

use std::sync::Arc;

use super::processing::{
    count_attempt, cut_reason, BuryExpired, DeadSlot, Grant, GrantState, Granted, Leased, Move,
    MoveKind, Pending, Proc, EXPIRED,
};
use super::{Engine, Flavor, QueueRef, Work};
use crate::core::Entry;
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;

impl Engine {
    /// Claims what the moves of `work` settle, all or nothing: acknowledged leases must still
    /// run now (else [`Error::LeaseExpired`] and nothing is claimed).
    pub(crate) fn prepare_moves(&self, work: &mut Work) -> Result<()> {
        let now = self.now();
        let mut failed = None;
        for mv in &mut work.moves {
            if let MoveKind::Ack { token, claimed } = &mut mv.kind {
                if claimed.is_none() {
                    *claimed = mv.proc.claim(*token, now);
                    if claimed.is_none() {
                        failed = Some(Error::LeaseExpired {
                            queue: mv.proc.core.name().to_owned(),
                            token: *token,
                        });
                        break;
                    }
                }
            }
        }
        match failed {
            // The caller aborts the work, which gives back what was claimed.
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Turns the items dequeued into `work` from its `from`th on into leases of `ttl` ms:
    /// commits `work` (its other items, enqueues and moves too) with their next attempt,
    /// then returns the leases in the order the items were dequeued.
    pub(crate) async fn grant(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        from: usize,
        ttl: u64,
    ) -> Result<Vec<Granted>> {
        self.check_embedded("leases")?;
        if let Some(granted) = self.grant_at_once(queue, work, from, ttl) {
            return granted;
        }
        let pending = self.lease_moves(queue, work, from, ttl);
        self.commit(work).await?;
        Ok(self.granted(pending))
    }

    /// [`grant`](Self::grant) for threads.
    pub(crate) fn blocking_grant(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        from: usize,
        ttl: u64,
    ) -> Result<Vec<Granted>> {
        self.check_embedded("leases")?;
        if let Some(granted) = self.grant_at_once(queue, work, from, ttl) {
            return granted;
        }
        let pending = self.lease_moves(queue, work, from, ttl);
        self.blocking_commit(work)?;
        Ok(self.granted(pending))
    }

    /// The memory engine's grant: with no write to wait for, the leases are made in the
    /// caller's thread, with what a commit of their `Lease` moves would do (new ids, the
    /// attempt counted, the lease table, the expiry timers) and none of its hand-over (no
    /// `Grant` to fill in, no moves to build). `None` when the grant needs a commit: on disk,
    /// or when `work` has anything else in it or a deadline.
    fn grant_at_once(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        from: usize,
        ttl: u64,
    ) -> Option<Result<Vec<Granted>>> {
        let Flavor::Memory(memory) = &self.flavor else {
            return None;
        };
        if from > 0 || !work.enqueues.is_empty() || !work.moves.is_empty() || work.expiry.is_some()
        {
            return None;
        }
        work.withdraw_leaked();
        if let Err(e) = self.check_open() {
            super::abort(std::mem::take(work));
            return Some(Err(e));
        }
        let now = self.now();
        let deadline = now.saturating_add(ttl);
        let n = u64::try_from(work.dequeued.len()).unwrap_or(u64::MAX);
        let first = memory.take_ids(n);
        let mut granted = Vec::with_capacity(work.dequeued.len());
        let leased = work
            .dequeued
            .drain(..)
            .zip(first..)
            .map(|((core, mut entry), id)| {
                core.unhold(1);
                entry.id = id;
                count_attempt(&mut entry, now);
                granted.push(Granted {
                    token: id,
                    deadline,
                    attempt: entry.attempts,
                });
                (id, Leased { entry, deadline })
            });
        if let Some(deadline) = queue.proc.insert_leases(leased) {
            self.timers.watch(&queue.proc, deadline);
        }
        Some(Ok(granted))
    }

    /// The memory engine's lease of the front item of `queue`, if one is visible: taken from
    /// the queue and leased in the caller's thread, with no transaction to hold it meanwhile
    /// (as [`grant_at_once`](Self::grant_at_once) does for a transaction's items). `decode`
    /// reads the item first; if it fails, the item goes back to the front. `None` on disk or
    /// when no item is visible: the caller takes the transaction's way.
    pub(crate) fn lease_front_at_once<X>(
        &self,
        queue: &QueueRef,
        ttl: u64,
        decode: impl FnOnce(&Entry) -> Result<X>,
    ) -> Option<Result<(Granted, X)>> {
        let Flavor::Memory(memory) = &self.flavor else {
            return None;
        };
        if let Err(e) = self.check_open() {
            return Some(Err(e));
        }
        let mut entry = queue.core.try_take()?;
        let item = match decode(&entry) {
            Ok(item) => item,
            Err(e) => {
                queue.core.restore(std::iter::once(entry));
                return Some(Err(e));
            }
        };
        let now = self.now();
        let deadline = now.saturating_add(ttl);
        let token = memory.take_ids(1);
        entry.id = token;
        count_attempt(&mut entry, now);
        let granted = Granted {
            token,
            deadline,
            attempt: entry.attempts,
        };
        if let Some(deadline) = queue.proc.insert_lease(token, Leased { entry, deadline }) {
            self.timers.watch(&queue.proc, deadline);
        }
        Some(Ok((granted, item)))
    }

    /// The memory engine's completion of lease `token`: claimed and gone at once, as the
    /// commit of its `Ack` alone would do. `None` on disk (the ack needs a durable write).
    pub(crate) fn complete_at_once(&self, proc: &Arc<Proc>, token: u64) -> Option<Result<()>> {
        if !matches!(self.flavor, Flavor::Memory(_)) {
            return None;
        }
        let done = self.claim(proc, token, self.now()).map(|leased| {
            if let Some(key) = &leased.entry.key {
                proc.core.release_key(key);
            }
        });
        // Counted as the one-ack commit it stands for on the other engines.
        if done.is_ok() {
            self.metrics.commit(true, 0, 1, None);
        }
        Some(done)
    }

    fn lease_moves(&self, queue: &QueueRef, work: &mut Work, from: usize, ttl: u64) -> Pending {
        let now = self.now();
        let mut grants = Vec::with_capacity(work.dequeued.len().saturating_sub(from));
        for (core, mut entry) in work.dequeued.drain(from..) {
            core.unhold(1);
            count_attempt(&mut entry, now);
            let grant = Arc::new(Grant::default());
            grants.push(Arc::clone(&grant));
            work.moves.push(Move {
                proc: Arc::clone(&queue.proc),
                kind: MoveKind::Lease { entry, ttl, grant },
            });
        }
        Pending {
            proc: Arc::clone(&queue.proc),
            grants,
        }
    }

    fn granted(&self, mut pending: Pending) -> Vec<Granted> {
        let grants = std::mem::take(&mut pending.grants);
        grants
            .iter()
            .filter_map(|g| match g.state() {
                GrantState::Granted {
                    token,
                    deadline,
                    attempt,
                } => Some(Granted {
                    token,
                    deadline,
                    attempt,
                }),
                _ => None,
            })
            .collect()
    }

    /// The work that settles lease `token` of `proc` with a failure: a retry after the
    /// backoff, or the dead letters once the item had its attempts.
    pub(crate) fn fail_work(
        &self,
        proc: &Arc<Proc>,
        token: u64,
        reason: &str,
    ) -> Result<(Work, Option<u64>)> {
        let now = self.now();
        let leased = self.claim(proc, token, now)?;
        let mut entry = leased.entry;
        let policy = proc.policy();
        let mut work = Work::default();
        let due = if entry.attempts >= policy.attempts_allowed() {
            work.moves.push(Move {
                proc: Arc::clone(proc),
                kind: MoveKind::Bury {
                    entry,
                    reason: cut_reason(reason),
                },
            });
            None
        } else {
            let due = now.saturating_add(policy.backoff_ms(entry.attempts, entry.id));
            entry.not_before = due;
            work.moves.push(Move {
                proc: Arc::clone(proc),
                kind: MoveKind::Retry { entry },
            });
            Some(due)
        };
        Ok((work, due))
    }

    /// Settles lease `token` by giving the item back, due after `delay` ms: at once without a
    /// write when `delay` is 0; else the work to commit.
    pub(crate) fn release_work(
        &self,
        proc: &Arc<Proc>,
        token: u64,
        delay: u64,
    ) -> Result<Option<Work>> {
        let now = self.now();
        let leased = self.claim(proc, token, now)?;
        let mut entry = leased.entry;
        if delay == 0 {
            proc.core.restore(std::iter::once(entry));
            return Ok(None);
        }
        entry.not_before = now.saturating_add(delay);
        let mut work = Work::default();
        work.moves.push(Move {
            proc: Arc::clone(proc),
            kind: MoveKind::Retry { entry },
        });
        Ok(Some(work))
    }

    fn claim(&self, proc: &Arc<Proc>, token: u64, now: u64) -> Result<Leased> {
        self.check_open()?;
        let leased = proc.claim(token, now).ok_or_else(|| Error::LeaseExpired {
            queue: proc.core.name().to_owned(),
            token,
        })?;
        Ok(leased)
    }

    /// Gives back lease `token` at once (its `Lease` was dropped unsettled).
    pub(crate) fn drop_lease(&self, proc: &Arc<Proc>, token: u64) {
        if let Some(leased) = proc.take_lease(token) {
            proc.core.restore(std::iter::once(leased.entry));
        }
    }

    /// Moves the deadline of lease `token` to `ttl` ms from now.
    pub(crate) fn extend(&self, proc: &Arc<Proc>, token: u64, ttl: u64) -> Result<u64> {
        self.check_open()?;
        let now = self.now();
        let deadline = now.saturating_add(ttl);
        let Some(watch) = proc.extend(token, now, deadline) else {
            return Err(Error::LeaseExpired {
                queue: proc.core.name().to_owned(),
                token,
            });
        };
        if let Some(deadline) = watch {
            self.timers.watch(proc, deadline);
        }
        Ok(deadline)
    }

    /// The work that replays (or, with `purge`, deletes) the dead letters `ids` of `proc`.
    /// Fails with [`Error::NotDeadLetter`] for an id that is not one, taking nothing.
    pub(crate) fn dead_work(
        &self,
        proc: &Arc<Proc>,
        ids: &[u64],
        reset: bool,
        purge: bool,
    ) -> Result<Work> {
        self.check_open()?;
        let mut work = Work::default();
        for &id in ids {
            let Some(slot) = proc.take_dead(id) else {
                work.undo_moves();
                return Err(Error::NotDeadLetter {
                    queue: proc.core.name().to_owned(),
                    id,
                });
            };
            let kind = if purge {
                MoveKind::Purge { slot }
            } else {
                MoveKind::Replay { slot, reset }
            };
            work.moves.push(Move {
                proc: Arc::clone(proc),
                kind,
            });
        }
        Ok(work)
    }

    /// Bytes of the dead letters in `slots` that the engine keeps on disk only.
    pub(crate) async fn dead_bytes(&self, slots: &mut [DeadSlot]) -> Result<()> {
        let ids: Vec<u64> = slots
            .iter()
            .filter(|s| !s.has_bytes)
            .map(|s| s.entry.id)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let Flavor::Sled(sled) = &self.flavor else {
            return Ok(());
        };
        let read = sled.read_items(ids).await?;
        for slot in slots.iter_mut().filter(|s| !s.has_bytes) {
            if let Some((_, bytes)) = read.iter().find(|(id, _)| *id == slot.entry.id) {
                slot.entry.bytes = bytes.clone();
                slot.has_bytes = true;
            }
        }
        Ok(())
    }

    /// Sets the retry policy of `proc`'s queue, durably.
    pub(crate) async fn set_policy(&self, proc: &Arc<Proc>, policy: RetryPolicy) -> Result<()> {
        self.check_open()?;
        if let Flavor::Sled(sled) = &self.flavor {
            sled.set_policy(proc.core.id(), policy).await?;
        }
        proc.set_policy(policy);
        Ok(())
    }

    /// Delayed items of `proc`'s queue, for browsing.
    pub(crate) fn delayed_entries(&self, proc: &Arc<Proc>) -> Vec<Entry> {
        self.timers.delayed_entries(proc)
    }
}

impl BuryExpired for Engine {
    /// A lease expired at the maximum attempts: its item moves to the dead letters.
    fn bury_expired(&self, proc: &Arc<Proc>, entry: Entry) {
        let mut work = Work::default();
        work.moves.push(Move {
            proc: Arc::clone(proc),
            kind: MoveKind::Bury {
                entry,
                reason: EXPIRED.to_owned(),
            },
        });
        match self.blocking_commit(&mut work) {
            Ok(()) => {
                crate::metrics::buried(proc.core.name(), true, 1);
                tracing::debug!(
                    queue = proc.core.name(),
                    "an item whose last lease expired moved to the dead letters"
                );
            }
            Err(e) => {
                tracing::warn!(queue = proc.core.name(), error = %e, "moving an expired item to the dead letters failed; it is back in its queue");
            }
        }
    }
}
