//! The processing layer's calls on PostgreSQL (`impl Postgres`): leases, retries, delayed
//! items, dead letters, browse and stats as statements on the schema's rows.
//!
//! A lease is columns of its row (`attempts`, `leased_until`, `lease_token`), set by one
//! autocommitted `UPDATE` (durable before the `Lease` is returned, P1) and checked by token
//! by every settlement (fencing, P3). Deadlines are the database's clock (or the store's
//! injected clock, passed as a parameter), so a lease outlives its holder and the server
//! and ends at its deadline whoever watches (P2): an expired lease is visible again to every
//! dequeue at once, at the head; one at the maximum attempts is moved to the dead letters by
//! the next lease, stats, browse or dead-letter call on its queue (until then it is neither
//! visible nor leased). ARCHITECTURE.md ("The PostgreSQL engine") lists the statements.
//!
//! The statements (`ProcSql`) are in `statements.rs`, what the commit path and the
//! maintenance pass run of them in `leases.rs` and `commit.rs`: this file imports `mod.rs`
//! (for `Postgres`) and nothing imports this file.

use std::sync::Arc;

use tokio_postgres::Row;

use super::failure::pg;
use super::leases::{bury, lease_on, FailOutcome, Granted};
use super::statements::{after_id, fold_if_due, int8, ms, opt_ms, up_to};
use super::Postgres;
use crate::core::{Entry, QueueCore};
use crate::engine::proc::{cut_reason, DeadSlot};
use crate::error::{Error, Result};
use crate::processing::{ItemState, QueueStats, Replay, RetryPolicy};

/// What a lease token passed back to the database is: one it gave, an `int8` (see [`int8`]).
const TOKEN: &str = "a lease token is one the database gave, an int8";
/// What a lease time is: checked against `MAX_TTL` by the caller.
const TTL: &str = "a lease time passed to the engine is at most MAX_TTL";
/// What a delay is: checked against `MAX_DELAY` by the caller.
const DELAY: &str = "a delay passed to the engine is at most MAX_DELAY";

impl Postgres {
    /// Leases up to `n` visible items of `core`'s queue for `ttl` ms, in one autocommitted
    /// statement (durable when this returns); none if nothing is visible.
    pub(crate) async fn lease(
        &self,
        core: &QueueCore,
        n: usize,
        ttl: u64,
        waiter: Option<u64>,
    ) -> Result<Vec<Granted>> {
        let queue = self.db_id(core)?;
        let (n, now, ttl) = (up_to(n), self.now_param(), int8(ttl, TTL)?);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        let waiters = Arc::clone(&self.waiters);
        self.run(async move {
            let granted = async {
                let client = pool.get().await.map_err(|e| pg("lease", e))?;
                lease_on(&client, &sql, queue, n, now, ttl).await
            }
            .await;
            // The waiter's look ended (noted here: see `Waiters::looked`).
            if let Some(ticket) = waiter {
                let took = granted.as_ref().is_ok_and(|g| !g.is_empty());
                waiters.looked(queue, ticket, took);
            }
            granted
        })
        .await
    }

    /// Gives back leases that were handed to nobody (their items did not decode), their
    /// attempts not counted, and wakes a waiter.
    pub(crate) async fn unlease(&self, core: &QueueCore, tokens: Vec<u64>) -> Result<()> {
        let queue = self.db_id(core)?;
        let tokens = tokens
            .into_iter()
            .map(|token| int8(token, TOKEN))
            .collect::<Result<Vec<i64>>>()?;
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("lease", e))?;
            let given_back = client
                .execute(&sql.proc.unlease, &[&tokens])
                .await
                .map_err(|e| pg("lease", e))?;
            // Fewer when a lease ended meanwhile (its row re-leased or gone); never more.
            debug_assert!(
                usize::try_from(given_back).is_ok_and(|n| n <= tokens.len()),
                "a lease token is on at most one row"
            );
            Ok(())
        })
        .await?;
        self.notify(vec![queue]);
        Ok(())
    }

    /// Settles lease `token` as failed with `reason`.
    pub(crate) async fn fail(
        &self,
        core: &QueueCore,
        token: u64,
        reason: &str,
    ) -> Result<FailOutcome> {
        let queue = self.db_id(core)?;
        let (now, token, reason) = (self.now_param(), int8(token, TOKEN)?, cut_reason(reason));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("fail", e))?;
            let row = client
                .query_one(&sql.proc.fail, &[&queue, &token, &now, &reason])
                .await
                .map_err(|e| pg("fail", e))?;
            let found: i64 = row.try_get(0).map_err(|e| pg("fail", e))?;
            let at: Option<i64> = row.try_get(1).map_err(|e| pg("fail", e))?;
            debug_assert!(
                found == 0 || found == 1,
                "a lease token is on at most one row"
            );
            Ok(match (found, at) {
                (0, _) => FailOutcome::Ended,
                (_, Some(at)) => FailOutcome::Retry(ms(at)),
                (_, None) => FailOutcome::Dead,
            })
        })
        .await
    }

    /// Gives lease `token` back, due after `delay` ms (at the head for 0). False if the
    /// lease had ended.
    pub(crate) async fn release(&self, token: u64, delay: u64) -> Result<bool> {
        let (now, token, delay) = (self.now_param(), int8(token, TOKEN)?, int8(delay, DELAY)?);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        let released = self
            .run(async move {
                let client = pool.get().await.map_err(|e| pg("release", e))?;
                let rows = client
                    .query(&sql.proc.release, &[&token, &now, &delay])
                    .await
                    .map_err(|e| pg("release", e))?;
                debug_assert!(rows.len() <= 1, "a lease token is on at most one row");
                let Some(row) = rows.first() else {
                    return Ok(None);
                };
                Ok(Some(row.try_get::<_, i32>(0).ok()))
            })
            .await?;
        match released {
            None => Ok(false),
            Some(queue) => {
                if delay == 0 {
                    self.notify(queue.into_iter().collect());
                }
                Ok(true)
            }
        }
    }

    /// A lease dropped unsettled: given back at once, in the background (the holder is
    /// gone; should this fail, the lease ends at its deadline).
    pub(crate) fn drop_lease(&self, token: u64) {
        let token = match int8(token, TOKEN) {
            Ok(token) => token,
            Err(e) => {
                // Nobody to tell: the lease ends at its deadline.
                tracing::error!(error = %e, "a dropped lease was not given back");
                return;
            }
        };
        let now = self.now_param();
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        let waiters = Arc::clone(&self.waiters);
        self.rt.spawn(async move {
            let Ok(client) = pool.get().await else {
                return;
            };
            let zero = 0i64;
            if let Ok(rows) = client
                .query(&sql.proc.release, &[&token, &now, &zero])
                .await
            {
                if let Some(queue) = rows.first().and_then(|r| r.try_get::<_, i32>(0).ok()) {
                    waiters.notify(vec![queue]);
                }
            }
        });
    }

    /// Moves lease `token`'s deadline to `ttl` ms from now; `None` if it had ended.
    pub(crate) async fn extend(&self, token: u64, ttl: u64) -> Result<Option<u64>> {
        let (now, token, ttl) = (self.now_param(), int8(token, TOKEN)?, int8(ttl, TTL)?);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("extend", e))?;
            let rows = client
                .query(&sql.proc.extend, &[&token, &now, &ttl])
                .await
                .map_err(|e| pg("extend", e))?;
            debug_assert!(rows.len() <= 1, "a lease token is on at most one row");
            match rows.first() {
                None => Ok(None),
                Some(row) => Ok(Some(ms(row.try_get(0).map_err(|e| pg("extend", e))?))),
            }
        })
        .await
    }

    /// The queue's counts, and its policy as stored.
    pub(crate) async fn stats(&self, core: &QueueCore) -> Result<(QueueStats, RetryPolicy)> {
        let queue = self.db_id(core)?;
        let (now, retention) = (self.now_param(), self.retention);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("stats", e))?;
            let statement = client
                .prepare_cached(&sql.proc.stats)
                .await
                .map_err(|e| pg("stats", e))?;
            let row = client
                .query_one(&statement, &[&queue, &now, &retention])
                .await
                .map_err(|e| pg("stats", e))?;
            let read =
                || -> std::result::Result<(QueueStats, RetryPolicy), tokio_postgres::Error> {
                    let count = |i: usize| row.try_get::<_, i64>(i).map(ms);
                    let stats = QueueStats {
                        visible: count(0)?,
                        delayed: count(1)?,
                        leased: count(2)?,
                        held: count(3)?,
                        dead: count(4)?,
                        front_enqueued_at: row
                            .try_get::<_, Option<i64>>(5)?
                            .filter(|&t| t > 0)
                            .map(|t| crate::clock::system_time(ms(t))),
                    };
                    let policy = RetryPolicy::from_columns(
                        row.try_get::<_, Option<i32>>(6)?.unwrap_or(5),
                        row.try_get::<_, Option<i64>>(7)?.unwrap_or(1000),
                        row.try_get::<_, Option<i64>>(8)?.unwrap_or(600_000),
                        row.try_get::<_, Option<i32>>(9)?.unwrap_or(200),
                    );
                    Ok((stats, policy))
                };
            let (stats, policy) = read().map_err(|e| pg("stats", e))?;
            let rows: i64 = row.try_get(10).map_err(|e| pg("stats", e))?;
            fold_if_due(&client, &sql, queue, now, rows).await;
            Ok((stats, policy))
        })
        .await
    }

    /// Stores the queue's retry policy.
    pub(crate) async fn set_policy(&self, core: &QueueCore, policy: RetryPolicy) -> Result<()> {
        let queue = self.db_id(core)?;
        let (max, initial, most, jitter) = policy.to_columns();
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("set_retry_policy", e))?;
            client
                .execute(
                    &sql.proc.set_policy,
                    &[&queue, &max, &initial, &most, &jitter],
                )
                .await
                .map_err(|e| pg("set_retry_policy", e))?;
            Ok(())
        })
        .await
    }

    /// Up to `limit` items with ids above `after`, in id order, with their states.
    pub(crate) async fn browse(
        &self,
        core: &QueueCore,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(Entry, ItemState)>> {
        let queue = self.db_id(core)?;
        let (now, retention) = (self.now_param(), self.retention);
        let (after, limit) = (after.map_or(0, after_id), up_to(limit));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("browse", e))?;
            bury(&client, &sql, queue, now, retention).await?;
            let rows = client
                .query(&sql.proc.browse, &[&queue, &after, &limit, &now])
                .await
                .map_err(|e| pg("browse", e))?;
            let time = match now {
                Some(t) => ms(t),
                None => crate::clock::wall_ms(std::time::SystemTime::now()).unwrap_or(0),
            };
            let read =
                |row: &Row| -> std::result::Result<(Entry, ItemState), tokio_postgres::Error> {
                    let mut entry = Entry::new(
                        ms(row.try_get(0)?),
                        row.try_get::<_, Vec<u8>>(1)?.into_boxed_slice(),
                        ms(row.try_get(5)?),
                    );
                    entry.set_attempts(u32::try_from(row.try_get::<_, i32>(4)?).unwrap_or(0));
                    let ready = ms(row.try_get(2)?);
                    let state = match row.try_get::<_, Option<i64>>(3)?.map(ms) {
                        Some(until) if until > time => ItemState::Leased {
                            until: crate::clock::system_time(until),
                            attempt: entry.attempts(),
                        },
                        _ if ready > time => ItemState::Delayed {
                            until: crate::clock::system_time(ready),
                        },
                        _ => ItemState::Ready,
                    };
                    Ok((entry, state))
                };
            rows.iter()
                .map(|r| read(r).map_err(|e| pg("browse", e)))
                .collect()
        })
        .await
    }

    /// Up to `limit` dead letters with ids above `after`.
    pub(crate) async fn dead_letters(
        &self,
        core: &QueueCore,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadSlot>> {
        let queue = self.db_id(core)?;
        let (now, retention) = (self.now_param(), self.retention);
        let (after, limit) = (after.map_or(0, after_id), up_to(limit));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("dead_letters", e))?;
            bury(&client, &sql, queue, now, retention).await?;
            let rows = client
                .query(&sql.proc.dead, &[&queue, &after, &limit])
                .await
                .map_err(|e| pg("dead_letters", e))?;
            let read = |row: &Row| -> std::result::Result<DeadSlot, tokio_postgres::Error> {
                let mut entry = Entry::new(
                    ms(row.try_get(0)?),
                    row.try_get::<_, Vec<u8>>(1)?.into_boxed_slice(),
                    ms(row.try_get(6)?),
                );
                entry.set_attempts(u32::try_from(row.try_get::<_, i32>(3)?).unwrap_or(0));
                entry.set_first_attempt(opt_ms(row.try_get(4)?));
                entry.set_last_attempt(opt_ms(row.try_get(5)?));
                Ok(DeadSlot {
                    entry,
                    reason: row.try_get(2)?,
                    has_bytes: true,
                })
            };
            rows.iter()
                .map(|r| read(r).map_err(|e| pg("dead_letters", e)))
                .collect()
        })
        .await
    }

    /// Replays (back to the tail) or purges the chosen dead letters, atomically: with
    /// [`Replay::Ids`], an id that is not a dead letter of the queue fails the whole call.
    /// Returns how many.
    pub(crate) async fn dead_work(
        &self,
        core: &QueueCore,
        which: Replay,
        reset: bool,
        purge: bool,
    ) -> Result<usize> {
        let queue = self.db_id(core)?;
        let name = core.name().to_owned();
        let (now, retention) = (self.now_param(), self.retention);
        // An id past `i64::MAX` is no dead letter (ids are `int8`): not looked for, and the
        // call fails on it unless it fails on an id in range first, as for any other id
        // that is not a dead letter.
        let mut beyond = None;
        let (ids, limit): (Option<Vec<i64>>, Option<i64>) = match &which {
            Replay::All => (None, None),
            Replay::First(n) => (None, Some(up_to(*n))),
            Replay::Ids(ids) => {
                beyond = ids
                    .iter()
                    .copied()
                    .filter(|&id| i64::try_from(id).is_err())
                    .min();
                let mut ids: Vec<i64> = ids
                    .iter()
                    .filter_map(|&id| i64::try_from(id).ok())
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                (Some(ids), None)
            }
        };
        let operation = if purge { "purge" } else { "replay" };
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let mut client = pool.get().await.map_err(|e| pg(operation, e))?;
            bury(&client, &sql, queue, now, retention).await?;
            let tx = client.transaction().await.map_err(|e| pg(operation, e))?;
            let rows = if purge {
                tx.query(&sql.proc.purge, &[&queue, &ids, &limit]).await
            } else {
                tx.query(&sql.proc.replay, &[&queue, &ids, &limit, &reset, &now])
                    .await
            }
            .map_err(|e| pg(operation, e))?;
            let done: Vec<i64> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            debug_assert!(
                ids.as_ref()
                    .is_none_or(|ids| done.iter().all(|id| ids.binary_search(id).is_ok())),
                "a replay or purge by ids moves only the dead letters it names"
            );
            debug_assert!(
                limit.is_none_or(|n| i64::try_from(done.len()).is_ok_and(|done| done <= n)),
                "a replay or purge of the first n moves at most n"
            );
            if let Some(ids) = &ids {
                let missing = ids.iter().find(|id| !done.contains(id)).map(|&id| ms(id));
                if let Some(id) = missing.or(beyond) {
                    // Dropping `tx` rolls back.
                    return Err(Error::NotDeadLetter { queue: name, id });
                }
            }
            tx.commit().await.map_err(|e| pg(operation, e))?;
            Ok(done.len())
        })
        .await
        .inspect(|&done| {
            if !purge && done > 0 {
                self.notify(vec![queue]);
            }
        })
    }

    /// How long until the next delayed item or lease of the queue falls due, if any.
    pub(crate) async fn next_due(&self, core: &QueueCore) -> Result<Option<u64>> {
        let queue = self.db_id(core)?;
        let now = self.now_param();
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            // Only a hint: a waiting consumer may itself hold the last pooled connection
            // (its transaction's), so it does not wait for one.
            let Ok(Ok(client)) =
                tokio::time::timeout(std::time::Duration::from_millis(20), pool.get()).await
            else {
                return Ok(None);
            };
            let row = client
                .query_one(&sql.proc.next_due, &[&queue, &now])
                .await
                .map_err(|e| pg("dequeue", e))?;
            let left: Option<i64> = row.try_get(0).map_err(|e| pg("dequeue", e))?;
            Ok(left.map(ms))
        })
        .await
    }
}
