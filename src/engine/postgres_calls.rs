//! How the seam's operations map onto the PostgreSQL engine (`impl Engine`): the commit
//! with its moves, leases that wait, and the watches of waiting consumers. The handles reach
//! these only through the engine's operations, which choose them by the store's engine.

use std::sync::Arc;

use super::moves::{Move, MoveKind};
use super::postgres::{int8, Extra, Fresh, Granted, Imported, Postgres};
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
            abort(work, self.table());
            return Err(e);
        }
        if let Err(e) = self.settle_deadline(&mut work) {
            self.give_back_acked(&work.moves);
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
            abort(work, self.table());
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
        let enqueues = self.table().counted(std::mem::take(&mut work.enqueues));

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
            MoveKind::Enqueue { mut entry, delay } => {
                let key = entry.take_key();
                // First: a failure below releases the keys noted so far.
                if let Some(key) = &key {
                    keys.push((Arc::clone(&mv.proc.core), key.clone()));
                }
                let queue = pg.db_id(&mv.proc.core)?;
                let at = entry.not_before();
                extra.fresh.push(Fresh {
                    queue,
                    payload: entry.bytes.into_vec(),
                    delay: int8(delay, "a delay is at most MAX_DELAY")?,
                    at: time(at)?,
                    key: key.map(Vec::from),
                });
            }
            MoveKind::Ack { token, .. } => extra.acks.push((
                int8(token, "a lease token is a PostgreSQL bigint")?,
                mv.proc.core.name().to_owned(),
            )),
            MoveKind::Import { entry, reason } => {
                extra.imported.push(Imported {
                    queue: pg.db_id(&mv.proc.core)?,
                    attempts: i32::try_from(entry.attempts()).map_err(|_| Error::Bug {
                        invariant: "an imported item has at most MAX_ATTEMPTS attempts",
                    })?,
                    due: time(entry.not_before())?,
                    enqueued: time(entry.enqueued_at)?,
                    first_attempt: time(entry.first_attempt())?,
                    last_attempt: time(entry.last_attempt())?,
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
}

/// A time of the store (ms since the epoch) as PostgreSQL's bigint: one past its range (a
/// time given by the caller, over 292 million years away) is refused.
fn time(ms: u64) -> Result<i64> {
    i64::try_from(ms).map_err(|_| Error::InvalidArgument {
        argument: "time",
        expected: "a time whose milliseconds since the Unix epoch fit in 63 bits (PostgreSQL)",
    })
}
