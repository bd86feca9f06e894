//! How the seam's operations map onto the PostgreSQL engine (`impl Engine`): the commit
//! with its moves, leases that wait, and the watches of waiting consumers. The handles reach
//! these only through the engine's operations, which choose them by the store's engine.

use std::sync::Arc;

use super::moves::{Move, MoveKind};
use super::postgres::{int8, Extra, Fresh, Granted, Imported, Postgres, Seats, Turn};
use super::{abort, drop_expired, Engine, QueueRef, Work};
use crate::core::QueueCore;
use crate::error::{Error, Result};

impl Engine {
    /// PostgreSQL's commit: the buffered enqueues, the moves and the open database
    /// transaction; and with `lease = (queue, n, ttl)` the leases of up to `n`
    /// visible items of `queue` in the same database transaction.
    #[cfg(feature = "postgres")]
    pub(crate) async fn commit_on_postgres(
        &self,
        pg: &Postgres,
        mut work: Work,
        lease: Option<(&QueueRef, usize, u64)>,
    ) -> Result<Vec<Granted>> {
        work.withdraw_leaked();
        if let Err(e) = self.check_open() {
            abort(work);
            return Err(e);
        }
        if let Err(e) = self.settle_deadline(&mut work) {
            give_back_acked(pg, &work.moves);
            drop_expired(work);
            return Err(e);
        }
        let mut extra = Extra::default();
        let mut keys = Vec::new();
        let moves = std::mem::take(&mut work.moves);
        let acked: Vec<u64> = moves
            .iter()
            .filter_map(|mv| match mv.kind {
                MoveKind::Ack { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        if let Err(e) = self.moves_on_postgres(pg, moves, &mut extra, &mut keys) {
            for &token in &acked {
                pg.drop_lease(token);
            }
            abort(work);
            return Err(e);
        }
        if let Some((queue, n, ttl)) = lease {
            extra.lease = Some((
                pg.db_id(&queue.core)?,
                // "Up to n": a count past i64 asks for every row, as i64::MAX does.
                i64::try_from(n).unwrap_or(i64::MAX),
                int8(ttl, "a lease's ttl is at most MAX_TTL")?,
            ));
        }
        let enqueues = std::mem::take(&mut work.enqueues).into_vec();

        let done = pg
            .commit(std::mem::take(&mut work.pg), enqueues, extra)
            .await;
        if done.is_err() {
            // Not committed, or not known to be: the acked leases are given back as dropped
            // leases are. Fenced by their tokens, this does nothing to a lease whose ack was
            // applied after all.
            for token in acked {
                pg.drop_lease(token);
            }
        }
        // The keys were reserved in this process only while the transaction was open; from
        // now on the database's unique index keeps them.
        for (core, key) in keys {
            core.release_key(&key);
        }
        done
    }

    /// The rows and statements of a PostgreSQL commit's moves: enqueues with a delay or a
    /// key, acks and imports.
    fn moves_on_postgres(
        &self,
        pg: &Postgres,
        moves: Vec<Move>,
        extra: &mut Extra,
        keys: &mut Vec<(Arc<QueueCore>, Box<[u8]>)>,
    ) -> Result<()> {
        let mut moves = moves.into_iter();
        while let Some(mv) = moves.next() {
            if let Err(e) = self.move_on_postgres(pg, mv, extra, keys) {
                // Nothing of the commit was sent: its keys are free again.
                for rest in moves {
                    rest.undo();
                }
                for (core, key) in keys.drain(..) {
                    core.release_key(&key);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// One move of [`moves_on_postgres`](Self::moves_on_postgres).
    fn move_on_postgres(
        &self,
        pg: &Postgres,
        mv: Move,
        extra: &mut Extra,
        keys: &mut Vec<(Arc<QueueCore>, Box<[u8]>)>,
    ) -> Result<()> {
        match mv.kind {
            MoveKind::Enqueue { entry, delay } => {
                // First: a failure below releases the keys noted so far.
                if let Some(key) = &entry.key {
                    keys.push((Arc::clone(&mv.proc.core), key.clone()));
                }
                let queue = pg.db_id(&mv.proc.core)?;
                extra.fresh.push(Fresh {
                    queue,
                    payload: entry.bytes.into_vec(),
                    delay: int8(delay, "a delay is at most MAX_DELAY")?,
                    at: time(entry.not_before)?,
                    key: entry.key.map(|k| k.into_vec()),
                });
            }
            MoveKind::Ack { token, .. } => extra.acks.push((
                int8(token, "a lease token is a PostgreSQL bigint")?,
                mv.proc.core.name().to_owned(),
            )),
            MoveKind::Import { entry, reason } => {
                extra.imported.push(Imported {
                    queue: pg.db_id(&mv.proc.core)?,
                    attempts: i32::try_from(entry.attempts).map_err(|_| Error::Bug {
                        invariant: "an imported item has at most MAX_ATTEMPTS attempts",
                    })?,
                    due: time(entry.not_before)?,
                    enqueued: time(entry.times.enqueued_at)?,
                    first_attempt: time(entry.times.first_attempt)?,
                    last_attempt: time(entry.times.last_attempt)?,
                    payload: entry.bytes.into_vec(),
                    reason,
                });
            }
            // Leases, retries, burials, replays and purges are statements of their own
            // on PostgreSQL, never moves of a transaction.
            kind => {
                Move {
                    proc: mv.proc,
                    kind,
                }
                .undo();
                debug_assert!(
                    false,
                    "a PostgreSQL transaction holds only enqueues, acks and imports"
                );
                return Err(self.unsupported("this move in a transaction"));
            }
        }
        Ok(())
    }

    /// PostgreSQL's lease of up to `n` items of the first of `queues` (in their order) that
    /// has any, for `ttl` ms; with `wait`, waits for the first (woken like a waiting take)
    /// until `deadline`, if any. `None` only without `wait` or past the deadline.
    pub(crate) async fn lease_on_postgres<'q>(
        &self,
        pg: &Postgres,
        queues: &[(usize, &'q QueueRef)],
        n: usize,
        ttl: u64,
        wait: bool,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<(usize, &'q QueueRef, Vec<Granted>)>> {
        if !wait {
            self.check_open()?;
            for &(index, queue) in queues {
                let id = pg.db_id(&queue.core)?;
                let turn = pg.line().try_turn(id);
                if turn == Turn::Wait {
                    continue;
                }
                let granted = pg.lease(&queue.core, n, ttl, None).await?;
                if !granted.is_empty() {
                    if turn == (Turn::Taken { sure: false }) {
                        pg.line().pass_on(id);
                    }
                    return Ok(Some((index, queue, granted)));
                }
            }
            return Ok(None);
        }
        let mut line = self.join_lines(pg, queues.iter().map(|(_, q)| *q).collect())?;
        loop {
            self.check_open()?;
            for (i, &(index, queue)) in queues.iter().enumerate() {
                if !line.may_look(i) {
                    continue;
                }
                let granted = pg
                    .lease(&queue.core, n, ttl, Some(line.seats().ticket()))
                    .await?;
                if !granted.is_empty() {
                    line.took(i);
                    return Ok(Some((index, queue, granted)));
                }
            }
            if line.watched().await {
                continue;
            }
            if !line.sleep(deadline).await? {
                return Ok(None);
            }
        }
    }

    /// Puts a consumer in the line of each of `queues` (one queue, or a queue set), with
    /// one ticket: its place in every line. Where it is the first, the listener is asked
    /// to watch the queue (see [`InLine::watched`]).
    #[cfg(feature = "postgres")]
    pub(crate) fn join_lines<'e>(
        &'e self,
        pg: &'e Postgres,
        queues: Vec<&'e QueueRef>,
    ) -> Result<InLine<'e>> {
        let (ticket, wake) = pg.line().ticket();
        let mut seats = Seats::new(pg.line(), ticket);
        let mut ids = Vec::with_capacity(queues.len());
        let mut acks = Vec::new();
        for queue in queues {
            let id = pg.db_id(&queue.core)?;
            seats.note(id);
            acks.extend(pg.line().join(id, ticket, &wake));
            ids.push((queue, id));
        }
        Ok(InLine {
            engine: self,
            pg,
            queues: ids,
            seats,
            wake,
            acks,
        })
    }

    /// How long a waiting consumer on PostgreSQL that found nothing waits for a
    /// notification before it looks again: until the next delayed item or lease of the
    /// queue falls due, at most the fallback poll, never past `deadline` (`None`: the
    /// deadline has passed).
    #[cfg(feature = "postgres")]
    async fn next_look(
        &self,
        pg: &Postgres,
        queue: &QueueRef,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<std::time::Duration>> {
        let mut wait = pg.poll_interval();
        if !self.config.clock.is_manual() {
            if let Some(due) = pg.next_due(&queue.core).await? {
                wait = wait.min(std::time::Duration::from_millis(due.max(1)));
            }
        }
        Ok(match deadline {
            None => Some(wait),
            Some(deadline) => match deadline.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => Some(left.min(wait)),
                _ => None,
            },
        })
    }
}

/// A consumer waiting on PostgreSQL: its place in the line of each of its queues (one
/// queue, or a queue set), left when it is dropped or takes an item.
pub(crate) struct InLine<'e> {
    engine: &'e Engine,
    pg: &'e Postgres,
    queues: Vec<(&'e QueueRef, i32)>,
    seats: Seats,
    wake: Arc<tokio::sync::Notify>,
    /// The listener's answers still to come for the queues whose line this consumer
    /// started.
    acks: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl InLine<'_> {
    /// The consumer's places, for its transaction to note: a wait whose future is leaked
    /// leaves the lines when its transaction ends or is used again.
    pub(crate) fn seats(&self) -> &Seats {
        &self.seats
    }

    /// May the consumer look in its `i`th queue now (no waiter woken before it is still to
    /// look)? A consumer whose turn was taken (it did not look in time) joins again at its
    /// place first.
    pub(crate) fn may_look(&self, i: usize) -> bool {
        let (id, ticket) = (self.queues[i].1, self.seats.ticket());
        for _ in 0..2 {
            match self.pg.line().turn(id, ticket) {
                Turn::Look | Turn::Taken { .. } => return true,
                Turn::Wait => {
                    // Waiting behind one that holds the line up: counted as waiting.
                    self.pg.line().waits(id, ticket);
                    return false;
                }
                Turn::Gone => {
                    // The listener's lock is taken again if this made the line non-empty;
                    // until then the fallback poll stands in for a missed notification.
                    drop(self.pg.line().join(id, ticket, &self.wake));
                }
            }
        }
        true
    }

    /// Waits for the listener to watch the queues whose line this consumer started (at
    /// most the fallback poll): true if it had to, and the consumer looks again then, as a
    /// commit of another store between its look and the listener's lock notified nobody.
    pub(crate) async fn watched(&mut self) -> bool {
        if self.acks.is_empty() {
            return false;
        }
        for ack in std::mem::take(&mut self.acks) {
            self.pg.watched(ack, self.pg.poll_interval()).await;
        }
        true
    }

    /// The consumer took an item from its `i`th queue: it leaves every line, and the next
    /// waiter of that queue looks too (the commit may have brought more).
    pub(crate) fn took(mut self, i: usize) {
        let id = self.queues[i].1;
        self.seats.leave_all(Some(id));
    }

    /// Sleeps until a commit to one of the queues wakes the consumer, the first of them has
    /// an item falling due, the fallback poll, or `deadline`. False once the deadline has
    /// passed.
    pub(crate) async fn sleep(&self, deadline: Option<std::time::Instant>) -> Result<bool> {
        self.engine.check_open()?;
        let mut wait = None;
        for (queue, _) in &self.queues {
            match self.engine.next_look(self.pg, queue, deadline).await? {
                None => return Ok(false),
                Some(w) => wait = Some(wait.map_or(w, |v: std::time::Duration| v.min(w))),
            }
        }
        self.pg
            .wait_for(&self.wake, wait.unwrap_or(self.pg.poll_interval()))
            .await;
        Ok(true)
    }
}

impl Engine {
    /// Gives back at once, as dropped leases, the leases that `moves` of a transaction that
    /// does not commit acknowledged (P5, P10, S4: what undoing an ack does on the embedded
    /// engines). Nothing on the embedded engines, whose undo does it.
    pub(crate) fn give_back_acked(&self, moves: &[Move]) {
        if let super::Flavor::Postgres(pg) = &self.flavor {
            give_back_acked(pg, moves);
        }
    }
}

/// [`Engine::give_back_acked`] on PostgreSQL.
fn give_back_acked(pg: &Postgres, moves: &[Move]) {
    for mv in moves {
        if let MoveKind::Ack { token, .. } = mv.kind {
            pg.drop_lease(token);
        }
    }
}

/// A time of the store (ms since the epoch) as PostgreSQL's bigint: one past its range (a
/// time given by the caller, over 292 million years away) is refused.
fn time(ms: u64) -> Result<i64> {
    i64::try_from(ms).map_err(|_| Error::InvalidArgument {
        argument: "time",
        expected: "a time whose milliseconds since the Unix epoch fit in 63 bits (PostgreSQL)",
    })
}
