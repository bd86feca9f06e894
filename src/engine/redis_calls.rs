//! How the seam's operations map onto the Redis engine (`impl Engine`): the commit, and the
//! take the server engines' shared takes call (`server_calls.rs`). The handles reach these only through the engine's
//! operations, which choose them by the store's engine.

use std::sync::Arc;

use super::line::Granted;
use super::moves::{Move, MoveKind};
use super::redis::calls::Change;
use super::redis::Redis;
use super::{abort, drop_expired, Engine, Entry, QueueRef, Work};
use crate::error::Result;

impl Engine {
    /// Redis's commit: the buffered enqueues, the moves (enqueues with a delay or a key,
    /// acks, imports) and the items the transaction holds, in one script; and with `lease =
    /// (queue, n, ttl)` the leases of up to `n` visible items of `queue` in the same script.
    pub(crate) async fn commit_on_redis(
        &self,
        rd: &Redis,
        mut work: Work,
        lease: Option<(&QueueRef, usize, u64)>,
    ) -> Result<Vec<Granted>> {
        work.withdraw_leaked();
        if let Err(e) = self.check_open() {
            // Its slot's drop gives its items back.
            abort(work, self.table());
            return Err(e);
        }
        if let Err(e) = self.settle_deadline(&mut work) {
            // Its items were given back at the deadline (or are at its hold's end).
            self.give_back_acked(&work.moves);
            drop_expired(work);
            return Err(e);
        }
        let mut changes = Vec::with_capacity(work.moves.len());
        let mut keys = Vec::new();
        let mut acked = Vec::new();
        for mv in std::mem::take(&mut work.moves) {
            let queue = Arc::clone(&mv.proc.core);
            match mv.kind {
                MoveKind::Enqueue { mut entry, delay } => {
                    let key = entry.take_key();
                    if let Some(key) = &key {
                        keys.push((Arc::clone(&queue), key.clone()));
                    }
                    changes.push(Change::Fresh {
                        queue,
                        entry,
                        delay,
                        key,
                    });
                }
                MoveKind::Ack { token, .. } => {
                    acked.push((Arc::clone(&mv.proc), token));
                    changes.push(Change::Ack { queue, token });
                }
                MoveKind::Import { entry, reason } => changes.push(Change::Import {
                    queue,
                    entry,
                    reason,
                }),
                // Leases, retries, burials, replays and purges are scripts of their own on
                // Redis, never moves of a transaction.
                kind => {
                    Move {
                        proc: mv.proc,
                        kind,
                    }
                    .undo();
                    debug_assert!(
                        false,
                        "a Redis transaction holds only enqueues, acks and imports"
                    );
                    for (core, key) in keys {
                        core.release_key(&key);
                    }
                    abort(work, self.table());
                    return Err(self.unsupported("this move in a transaction"));
                }
            }
        }
        let enqueues = self.table().counted(std::mem::take(&mut work.enqueues));
        let slot = std::mem::take(&mut work.rd);
        let lease = lease.map(|(q, n, ttl)| (&*q.core, n, ttl));
        let done = if enqueues.is_empty() && changes.is_empty() && slot.token().is_none() {
            match lease {
                Some((core, n, ttl)) => rd.lease_for(core, n, ttl).await,
                None => Ok(Vec::new()),
            }
        } else {
            rd.commit(slot, enqueues, changes, lease).await
        };
        if done.is_err() {
            // Not committed, or not known to be: the acked leases are given back as dropped
            // leases are (fenced by their tokens, this does nothing to a lease whose ack was
            // applied after all).
            for (proc, token) in acked {
                rd.drop_lease(&proc.core, token);
            }
        }
        // The keys were reserved in this process only while the transaction was open; from
        // now on the server keeps them.
        for (core, key) in keys {
            core.release_key(&key);
        }
        done
    }
}

impl super::server_calls::TakeInto for Redis {
    fn take_into<'l>(
        &'l self,
        core: &'l crate::core::QueueCore,
        work: &'l mut Work,
        n: usize,
        waiter: Option<u64>,
    ) -> impl std::future::Future<Output = Result<Vec<Entry>>> + Send + 'l {
        self.take(core, &mut work.rd, n, waiter)
    }
}
