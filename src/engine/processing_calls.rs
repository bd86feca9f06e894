//! The seam's processing-layer operations (`impl Engine`): leases (waiting or not, and with
//! a commit), their settlements (ack, complete, fail, release, extend), delayed, keyed and
//! imported enqueues, stats, browse, dead letters and retry policies; and the burial of an
//! item whose last lease expired, which the timers ask of the engine ([`BuryExpired`]). Each
//! operation serves every engine; what the embedded engines work on (`Proc`, `Move`,
//! `Timers`) is in `proc.rs`, `moves.rs` and `timers.rs`, below the engines, and PostgreSQL's
//! statements are in its folder.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::moves::{count_attempt, Move, MoveKind};
use super::proc::{
    cut_reason, DeadSlot, Grant, GrantState, Granted, Leased, Pending, Proc, EXPIRED,
};
use super::timers::BuryExpired;
use super::{Engine, Flavor, QueueRef, Work};
use crate::clock::{known_time, system_time};
use crate::core::{len_u64, Entry, QueueCore};
use crate::error::{Error, Result};
use crate::processing::{check_delay, ItemState, QueueStats, Replay, RetryPolicy};

/// A lease the engine granted, with its item as the caller decoded it.
pub(crate) type LeaseOf<X> = (Granted, X);

impl Engine {
    /// Leases up to `n` items of the first of `queues` (tried in their order; each with its
    /// index in the caller's list) that has any, for `ttl` ms, decoding each with `decode`.
    /// With `wait`, waits for the first item until `deadline` (if any); `None` only without
    /// `wait` or past the deadline. If an item fails to decode, every item of the call goes
    /// back and the error is returned.
    pub(crate) async fn lease<X>(
        &self,
        queues: &[(usize, &QueueRef)],
        n: usize,
        ttl: u64,
        wait: bool,
        deadline: Option<Instant>,
        mut decode: impl FnMut(usize, &Entry) -> Result<X>,
    ) -> Result<Option<(usize, Vec<LeaseOf<X>>)>> {
        self.check_open()?;
        #[cfg(any(feature = "postgres", feature = "redis"))]
        if let Some(host) = self.host() {
            let leased = Box::pin(self.lease_on_server(host, queues, n, ttl, wait, deadline));
            let Some((index, queue, granted)) = leased.await? else {
                return Ok(None);
            };
            let decoded = self
                .decoded_on_server(host, queue, granted, false, |e| decode(index, e))
                .await?;
            return Ok(Some((index, decoded)));
        }
        if n == 1 {
            for &(index, queue) in queues {
                if let Some(leased) = self.lease_front_at_once(queue, ttl, |e| decode(index, e)) {
                    return leased.map(|one| Some((index, vec![one])));
                }
            }
        }
        let mut work = Work::default();
        let mut items = Vec::with_capacity(n.min(1024));
        // The first item: waited for, or the first visible one in the queues' order.
        let first = if wait {
            let mut waiting = self.wait(queues.to_vec(), &mut work, deadline);
            std::future::poll_fn(|cx| {
                waiting.poll_take(cx).map(|got| {
                    got?.map(|(i, q, e)| decode(i, e).map(|x| (i, q, x)))
                        .transpose()
                })
            })
            .await
        } else {
            let mut found = Ok(None);
            for &(index, queue) in queues {
                let mut item = None;
                let taken = self
                    .take(queue, &mut work, 1, |e| {
                        item = Some(decode(index, e)?);
                        Ok(())
                    })
                    .await;
                found = taken.map(|_| item.map(|x| (index, queue, x)));
                if !matches!(found, Ok(None)) {
                    break;
                }
            }
            found
        };
        let (index, queue, item) = match first {
            Ok(Some(first)) => first,
            Ok(None) => return Ok(None),
            Err(e) => {
                self.discard(work);
                return Err(e);
            }
        };
        items.push(item);
        if n > 1 {
            let more = self
                .take(queue, &mut work, n - 1, |e| {
                    items.push(decode(index, e)?);
                    Ok(())
                })
                .await;
            if let Err(e) = more {
                self.discard(work);
                return Err(e);
            }
        }
        let granted = self.grant(queue, &mut work, 0, ttl).await?;
        debug_assert_eq!(
            granted.len(),
            items.len(),
            "a grant answers every item taken"
        );
        Ok(Some((index, granted.into_iter().zip(items).collect())))
    }

    /// Commits `work` and, in the same commit, leases up to `n` items of `queue` visible then
    /// for `ttl` ms, decoding each with `decode`. An item that fails to decode ends the
    /// leases there: it and the rest stay in the queue, the leases before it are returned.
    pub(crate) async fn commit_and_lease<X>(
        &self,
        mut work: Work,
        queue: &QueueRef,
        n: usize,
        ttl: u64,
        mut decode: impl FnMut(&Entry) -> Result<X>,
    ) -> Result<Vec<LeaseOf<X>>> {
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            let granted = Box::pin(self.commit_on_redis(rd, work, Some((queue, n, ttl)))).await?;
            return self
                .decoded_on_server(rd, queue, granted, true, decode)
                .await;
        }
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            let granted =
                Box::pin(self.commit_on_postgres(pg, work, Some((queue, n, ttl)))).await?;
            return self
                .decoded_on_server(pg, queue, granted, true, decode)
                .await;
        }
        let from = work.dequeued.len();
        let mut items = Vec::with_capacity(n.min(1024));
        let taken = self
            .take(queue, &mut work, n, |e| {
                items.push(decode(e)?);
                Ok(())
            })
            .await;
        match taken {
            Ok(_) => {}
            // The item was taken, then failed to decode: it stays in the queue.
            Err(Error::Deserialize { .. }) => work.give_back_last(self.table()),
            Err(e) => {
                self.discard(work);
                return Err(e);
            }
        }
        let granted = self.grant(queue, &mut work, from, ttl).await?;
        debug_assert_eq!(
            granted.len(),
            items.len(),
            "a grant answers every item taken"
        );
        Ok(granted.into_iter().zip(items).collect())
    }

    /// Decodes the items of leases a server engine granted. On a failure the lease that
    /// failed and those after it are given back; with `partial` the ones before are
    /// returned, else they are given back too and the error is returned.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    async fn decoded_on_server<X>(
        &self,
        pg: &dyn super::line::Host,
        queue: &QueueRef,
        granted: Vec<super::line::Granted>,
        partial: bool,
        mut decode: impl FnMut(&Entry) -> Result<X>,
    ) -> Result<Vec<LeaseOf<X>>> {
        let mut leases = Vec::with_capacity(granted.len());
        let mut rest = granted.into_iter();
        while let Some(g) = rest.next() {
            match decode(&g.entry) {
                Ok(item) => leases.push((
                    Granted {
                        token: g.token,
                        deadline: g.deadline,
                        attempt: g.entry.attempts(),
                    },
                    item,
                )),
                Err(e) => {
                    let mut back = vec![g.token];
                    back.extend(rest.map(|g| g.token));
                    if !partial {
                        back.extend(leases.iter().map(|(g, _): &LeaseOf<X>| g.token));
                    }
                    pg.unlease(&queue.core, back).await?;
                    return if partial { Ok(leases) } else { Err(e) };
                }
            }
        }
        Ok(leases)
    }

    /// The error of a settlement of lease `token` that had ended.
    pub(crate) fn lease_expired(&self, proc: &Proc, token: u64) -> Error {
        Error::LeaseExpired {
            queue: proc.core.name().to_owned(),
            token,
        }
    }

    /// Buffers the acknowledgement of lease `token` in `work`: the item is gone when `work`
    /// commits. Fails with [`Error::LeaseExpired`] if the lease has ended already (on
    /// PostgreSQL the commit checks it: the database's clock decides).
    pub(crate) fn ack(&self, proc: &Arc<Proc>, token: u64, work: &mut Work) -> Result<()> {
        let checked_at_commit = match &self.flavor {
            Flavor::Memory(_) | Flavor::Sled(_) => false,
            #[cfg(feature = "postgres")]
            Flavor::Postgres(_) => true,
            #[cfg(feature = "redis")]
            Flavor::Redis(_) => true,
        };
        if !checked_at_commit && proc.lease_state(token, self.now()).is_none() {
            return Err(self.lease_expired(proc, token));
        }
        work.moves.push(Move {
            proc: Arc::clone(proc),
            kind: MoveKind::Ack {
                token,
                claimed: None,
            },
        });
        Ok(())
    }

    /// Acknowledges lease `token` in a commit of its own.
    pub(crate) async fn complete(&self, proc: &Arc<Proc>, token: u64) -> Result<()> {
        if let Some(done) = self.complete_at_once(proc, token) {
            return done;
        }
        let mut work = Work::default();
        self.ack(proc, token, &mut work)?;
        let started = self.is_durable().then(Instant::now);
        let outcome = self.commit(&mut work).await;
        self.metrics.commit(outcome.is_ok(), 0, 1, started);
        outcome
    }

    /// Settles lease `token` as failed with `reason` (already checked): due again at the
    /// returned time after the backoff, or (`None`) moved to the dead letters once the item
    /// had its attempts.
    pub(crate) async fn fail(
        &self,
        proc: &Arc<Proc>,
        token: u64,
        reason: &str,
    ) -> Result<Option<u64>> {
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            self.check_open()?;
            return match Box::pin(rd.fail(&proc.core, token, reason)).await? {
                super::redis::calls::Failed::Ended => Err(self.lease_expired(proc, token)),
                super::redis::calls::Failed::Retry(at) => Ok(Some(at)),
                super::redis::calls::Failed::Dead => Ok(None),
            };
        }
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            self.check_open()?;
            return match Box::pin(pg.fail(&proc.core, token, reason)).await? {
                super::postgres::FailOutcome::Ended => Err(self.lease_expired(proc, token)),
                super::postgres::FailOutcome::Retry(at) => Ok(Some(at)),
                super::postgres::FailOutcome::Dead => Ok(None),
            };
        }
        let (mut work, due) = self.fail_work(proc, token, reason)?;
        self.commit(&mut work).await?;
        Ok(due)
    }

    /// Settles lease `token` by giving its item back, due after `delay` (at the head of the
    /// queue for zero). An invalid `delay` gives the item back at once and is refused.
    pub(crate) async fn release(
        &self,
        proc: &Arc<Proc>,
        token: u64,
        delay: Duration,
    ) -> Result<()> {
        let delay = match check_delay(delay) {
            Ok(delay) => delay,
            Err(e) => {
                self.drop_lease(proc, token);
                return Err(e);
            }
        };
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            self.check_open()?;
            return match Box::pin(pg.release(token, delay)).await? {
                true => Ok(()),
                false => Err(self.lease_expired(proc, token)),
            };
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            self.check_open()?;
            return match Box::pin(rd.release(&proc.core, token, delay)).await? {
                true => Ok(()),
                false => Err(self.lease_expired(proc, token)),
            };
        }
        match self.release_work(proc, token, delay)? {
            Some(mut work) => self.commit(&mut work).await,
            None => Ok(()),
        }
    }

    /// Moves the deadline of lease `token` to `ttl` ms from now; returns the new deadline.
    pub(crate) async fn extend(&self, proc: &Arc<Proc>, token: u64, ttl: u64) -> Result<u64> {
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            self.check_open()?;
            return match Box::pin(rd.extend(&proc.core, token, ttl)).await? {
                Some(deadline) => Ok(deadline),
                None => Err(self.lease_expired(proc, token)),
            };
        }
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            self.check_open()?;
            return match Box::pin(pg.extend(token, ttl)).await? {
                Some(deadline) => Ok(deadline),
                None => Err(self.lease_expired(proc, token)),
            };
        }
        self.extend_now(proc, token, ttl)
    }

    /// Buffers an enqueue of `entry` in `work` due after `delay` ms (or at `entry.not_before`
    /// when that is set), and with `key` one that a live item of the same key in the queue
    /// refuses: false then (the duplicate is not buffered). An item that this transaction
    /// dequeued does not refuse it (the commit consumes that item, an abort drops the enqueue),
    /// unless the transaction buffered an enqueue with the key already.
    pub(crate) fn enqueue_entry(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        mut entry: Entry,
        delay: u64,
        key: Option<&[u8]>,
    ) -> Result<bool> {
        work.check_live()?;
        if let Some(key) = key {
            if !queue.core.reserve_key(key) {
                if !succeeds_own(queue, work, key) {
                    return Ok(false);
                }
                queue.core.add_key(key.into());
            }
            entry.set_key(Some(key.into()));
        }
        work.moves.push(Move {
            proc: Arc::clone(&queue.proc),
            kind: MoveKind::Enqueue { entry, delay },
        });
        Ok(true)
    }

    /// Buffers an imported item in `work`: at the tail of the queue with its history, or
    /// with a `reason` among the dead letters.
    pub(crate) fn import(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        entry: Entry,
        reason: Option<String>,
    ) -> Result<()> {
        work.check_live()?;
        work.moves.push(Move {
            proc: Arc::clone(&queue.proc),
            kind: MoveKind::Import { entry, reason },
        });
        Ok(())
    }

    /// The figures of `proc`'s queue now.
    pub(crate) async fn stats(&self, proc: &Arc<Proc>) -> Result<QueueStats> {
        self.check_open()?;
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            let (stats, policy) = Box::pin(pg.stats(&proc.core)).await?;
            proc.set_policy(policy);
            return Ok(stats);
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            let (stats, policy) = Box::pin(rd.stats(&proc.core)).await?;
            proc.set_policy(policy);
            return Ok(stats);
        }
        Ok(QueueStats {
            visible: proc.core.count(),
            delayed: proc.delayed(),
            leased: proc.leased(),
            held: proc.core.held(),
            dead: proc.dead_count(),
            front_enqueued_at: known_time(proc.core.front_enqueued_at()),
        })
    }

    /// Up to `limit` items of `proc`'s queue, in id order, whose id (a lease's token for a
    /// leased item) is above `after`; with their state.
    pub(crate) async fn browse(
        &self,
        proc: &Arc<Proc>,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(Entry, ItemState)>> {
        self.check_open()?;
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            return Box::pin(pg.browse(&proc.core, after, limit)).await;
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            return Box::pin(rd.browse(&proc.core, after, limit)).await;
        }
        let above = |id: u64| after.is_none_or(|a| id > a);
        let mut found: Vec<(Entry, ItemState)> = Vec::new();
        for e in proc.core.ready_entries_above(after, limit) {
            found.push((e, ItemState::Ready));
        }
        for e in self.timers.delayed_entries(proc) {
            if above(e.id) {
                let until = system_time(e.not_before());
                found.push((e, ItemState::Delayed { until }));
            }
        }
        for (token, deadline, e) in proc.leased_entries() {
            if above(token) {
                let state = ItemState::Leased {
                    until: system_time(deadline),
                    attempt: e.attempts(),
                };
                found.push((e, state));
            }
        }
        found.sort_by_key(|(e, _)| e.id);
        found.truncate(limit);
        Ok(found)
    }

    /// Up to `limit` dead letters of `proc`'s queue whose id is above `after`, oldest first.
    pub(crate) async fn dead_letters(
        &self,
        proc: &Arc<Proc>,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadSlot>> {
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            return Box::pin(rd.dead_letters(&proc.core, after, limit)).await;
        }
        self.check_open()?;
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            return Box::pin(pg.dead_letters(&proc.core, after, limit)).await;
        }
        let mut slots = proc.dead_page(after, limit);
        self.dead_bytes(&mut slots).await?;
        Ok(slots)
    }

    /// Replays the dead letters `which` of `proc`'s queue to its tail (with `reset`, their
    /// attempts back to 0), or with `purge` deletes them; returns how many.
    pub(crate) async fn settle_dead(
        &self,
        proc: &Arc<Proc>,
        which: Replay,
        reset: bool,
        purge: bool,
    ) -> Result<usize> {
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            return Box::pin(rd.dead_work(&proc.core, which, reset, purge)).await;
        }
        self.check_open()?;
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            return Box::pin(pg.dead_work(&proc.core, which, reset, purge)).await;
        }
        let ids = match which {
            Replay::All => proc.dead_ids(None),
            Replay::First(n) => proc.dead_ids(Some(n)),
            Replay::Ids(ids) => ids,
        };
        let mut work = self.dead_work(proc, &ids, reset, purge)?;
        self.commit(&mut work).await?;
        Ok(ids.len())
    }

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

    /// The embedded engines' grant: turns the items dequeued into `work` from its `from`th on
    /// into leases of `ttl` ms: commits `work` (its other items, enqueues and moves too) with
    /// their next attempt, then returns the leases in the order the items were dequeued.
    async fn grant(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        from: usize,
        ttl: u64,
    ) -> Result<Vec<Granted>> {
        if let Some(granted) = self.grant_at_once(queue, work, from, ttl) {
            return granted;
        }
        let pending = self.lease_moves(queue, work, from, ttl);
        self.commit(work).await?;
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
            super::abort(std::mem::take(work), self.table());
            return Some(Err(e));
        }
        let now = self.now();
        let deadline = now.saturating_add(ttl);
        let n = len_u64(work.dequeued.len());
        let first = memory.take_ids(n);
        // Leased now, no longer held.
        queue.core.unhold(n);
        let mut granted = Vec::with_capacity(work.dequeued.len());
        let leased = work
            .dequeued
            .drain(..)
            .zip(first..)
            .map(|((at, mut entry), id)| {
                debug_assert!(
                    at == queue.core.index(),
                    "the items a grant leases were taken from its queue"
                );
                entry.id = id;
                count_attempt(&mut entry, now);
                granted.push(Granted {
                    token: id,
                    deadline,
                    attempt: entry.attempts(),
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
    fn lease_front_at_once<X>(
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
            attempt: entry.attempts(),
        };
        if let Some(deadline) = queue.proc.insert_lease(token, Leased { entry, deadline }) {
            self.timers.watch(&queue.proc, deadline);
        }
        Some(Ok((granted, item)))
    }

    /// The memory engine's completion of lease `token`: claimed and gone at once, as the
    /// commit of its `Ack` alone would do. `None` on disk (the ack needs a durable write).
    fn complete_at_once(&self, proc: &Arc<Proc>, token: u64) -> Option<Result<()>> {
        if !matches!(self.flavor, Flavor::Memory(_)) {
            return None;
        }
        let done = self.claim(proc, token, self.now()).map(|leased| {
            if let Some(key) = leased.entry.key() {
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
        let leased = work.dequeued.len().saturating_sub(from);
        // Leased at the commit, no longer held.
        queue.core.unhold(len_u64(leased));
        let mut grants = Vec::with_capacity(leased);
        for (at, mut entry) in work.dequeued.drain(from..) {
            debug_assert!(
                at == queue.core.index(),
                "the items a grant leases were taken from its queue"
            );
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
    fn fail_work(&self, proc: &Arc<Proc>, token: u64, reason: &str) -> Result<(Work, Option<u64>)> {
        let now = self.now();
        let leased = self.claim(proc, token, now)?;
        let mut entry = leased.entry;
        let policy = proc.policy();
        let mut work = Work::default();
        let due = if entry.attempts() >= policy.attempts_allowed() {
            work.moves.push(Move {
                proc: Arc::clone(proc),
                kind: MoveKind::Bury {
                    entry,
                    reason: cut_reason(reason),
                },
            });
            None
        } else {
            let due = now.saturating_add(policy.backoff_ms(entry.attempts(), entry.id));
            entry.set_not_before(due);
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
    fn release_work(&self, proc: &Arc<Proc>, token: u64, delay: u64) -> Result<Option<Work>> {
        let now = self.now();
        let leased = self.claim(proc, token, now)?;
        let mut entry = leased.entry;
        if delay == 0 {
            proc.core.restore(std::iter::once(entry));
            return Ok(None);
        }
        entry.set_not_before(now.saturating_add(delay));
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

    /// Gives back at once, as dropped leases, the leases that `moves` of a transaction that
    /// does not commit acknowledged, on the server engines (P5, P10, S4: what undoing an ack
    /// does on the embedded engines, whose undo does it).
    pub(crate) fn give_back_acked(&self, moves: &[Move]) {
        if !self.is_remote() {
            return;
        }
        for mv in moves {
            if let MoveKind::Ack { token, .. } = mv.kind {
                self.drop_lease(&mv.proc, token);
            }
        }
    }

    /// Gives back lease `token` at once (its `Lease` was dropped unsettled).
    pub(crate) fn drop_lease(&self, proc: &Arc<Proc>, token: u64) {
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            pg.drop_lease(token);
            return;
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            rd.drop_lease(&proc.core, token);
            return;
        }
        if let Some(leased) = proc.take_lease(token) {
            proc.core.restore(std::iter::once(leased.entry));
        }
    }

    /// The embedded engines' [`extend`](Self::extend).
    fn extend_now(&self, proc: &Arc<Proc>, token: u64, ttl: u64) -> Result<u64> {
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
    fn dead_work(&self, proc: &Arc<Proc>, ids: &[u64], reset: bool, purge: bool) -> Result<Work> {
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
    async fn dead_bytes(&self, slots: &mut [DeadSlot]) -> Result<()> {
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
        match &self.flavor {
            Flavor::Memory(_) => {}
            Flavor::Sled(sled) => sled.set_policy(proc.core.id(), policy).await?,
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => Box::pin(pg.set_policy(&proc.core, policy)).await?,
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => Box::pin(rd.set_policy(&proc.core, policy)).await?,
        }
        proc.set_policy(policy);
        Ok(())
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

/// Whether `work` dequeued an item of `queue` with `key`, or acknowledged a lease of one
/// (held in this process: the embedded engines), and has no enqueue with that key buffered:
/// an enqueue with the key then takes that item's place at commit (a job that schedules its
/// successor).
fn succeeds_own(queue: &QueueRef, work: &Work, key: &[u8]) -> bool {
    let this = queue.core.index();
    let mine = |core: &QueueCore| core.index() == this;
    let acked = || {
        work.moves.iter().any(|m| match m.kind {
            MoveKind::Ack { token, .. } => mine(&m.proc.core) && m.proc.lease_has_key(token, key),
            _ => false,
        })
    };
    (work
        .dequeued
        .iter()
        .any(|(at, e)| *at == this && e.key() == Some(key))
        || acked())
        && !work.moves.iter().any(|m| {
            mine(&m.proc.core)
                && matches!(&m.kind, MoveKind::Enqueue { entry, .. } if entry.key() == Some(key))
        })
}
