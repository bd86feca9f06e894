//! How the seam's operations map onto the PostgreSQL engine (`impl Engine`): the commit
//! with its moves, leases that wait, and the watches of waiting consumers. The handles reach
//! these only through the engine's operations, which choose them by the store's engine.

use std::sync::Arc;

use super::moves::{Move, MoveKind};
use super::postgres::{int8, Extra, Fresh, Granted, Imported, Postgres, Watch};
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
            drop_expired(work);
            return Err(e);
        }
        let mut extra = Extra::default();
        let mut keys = Vec::new();
        let moves = std::mem::take(&mut work.moves);
        if let Err(e) = self.moves_on_postgres(pg, moves, &mut extra, &mut keys) {
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
        let watches = match wait {
            true => Some(
                self.watch_set(pg, queues.iter().map(|(_, q)| *q).collect())
                    .await?,
            ),
            false => None,
        };
        loop {
            self.check_open()?;
            for &(index, queue) in queues {
                let granted = pg.lease(&queue.core, n, ttl).await?;
                if !granted.is_empty() {
                    if let Some(watches) = &watches {
                        watches.pass_on();
                    }
                    return Ok(Some((index, queue, granted)));
                }
            }
            let Some(watches) = &watches else {
                return Ok(None);
            };
            if !watches.wait(deadline).await? {
                return Ok(None);
            }
        }
    }

    /// Puts a consumer among the waiters of every queue of `queues` (a
    /// queue set), once the listener watches them.
    #[cfg(feature = "postgres")]
    pub(crate) async fn watch_set<'e>(
        &'e self,
        pg: &'e Postgres,
        queues: Vec<&'e QueueRef>,
    ) -> Result<WatchSet<'e>> {
        let mut watches = Vec::with_capacity(queues.len());
        for queue in &queues {
            let (watch, ack) = pg.watch(&queue.core)?;
            if let Some(ack) = ack {
                pg.watched(ack, pg.poll_interval()).await;
            }
            watches.push(watch);
        }
        Ok(WatchSet {
            engine: self,
            pg,
            queues,
            watches,
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

/// A consumer waiting on several PostgreSQL queues (a queue set).
pub(crate) struct WatchSet<'e> {
    engine: &'e Engine,
    pg: &'e Postgres,
    queues: Vec<&'e QueueRef>,
    watches: Vec<Watch>,
}

impl WatchSet<'_> {
    /// Waits for a notification on any of the queues, until the first of them has an item
    /// falling due, at most the fallback poll and never past `deadline`. False once the
    /// deadline has passed.
    pub(crate) async fn wait(&self, deadline: Option<std::time::Instant>) -> Result<bool> {
        self.engine.check_open()?;
        let mut wait = None;
        for queue in &self.queues {
            match self.engine.next_look(self.pg, queue, deadline).await? {
                None => return Ok(false),
                Some(w) => wait = Some(wait.map_or(w, |v: std::time::Duration| v.min(w))),
            }
        }
        self.pg
            .wait_any(&self.watches, wait.unwrap_or(self.pg.poll_interval()))
            .await;
        Ok(true)
    }

    /// An item was taken: the next waiters look too.
    pub(crate) fn pass_on(&self) {
        for watch in &self.watches {
            watch.pass_on();
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
