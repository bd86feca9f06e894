//! The commit: the buffered plain enqueues in one `INSERT`, what a commit does beyond them
//! ([`Extra`]: delayed and keyed enqueues, imports, acks, a lease in the same transaction),
//! and the `COMMIT`, pipelined where nothing else is to be done.

use deadpool_postgres::Object;

use super::connection::PgTx;
use super::failure::{commit_error, pg};
use super::leases::{lease_on, Granted};
use super::pool::Pool;
use super::statements::{ms, Sql};
use crate::error::{Error, Result};

/// A delayed or keyed enqueue, as a commit writes it.
#[derive(Debug)]
pub(crate) struct Fresh {
    pub(crate) queue: i32,
    pub(crate) payload: Vec<u8>,
    /// Due this many ms after the commit (0: see `at`).
    pub(crate) delay: i64,
    /// Due at this time (0: at once).
    pub(crate) at: i64,
    pub(crate) key: Option<Vec<u8>>,
}

/// An item imported as it stood in another store (see `MoveKind::Import`). Times are ms
/// since the epoch, 0 for unknown (the commit's time for `enqueued`, none for the attempts).
#[derive(Debug)]
pub(crate) struct Imported {
    pub(crate) queue: i32,
    pub(crate) payload: Vec<u8>,
    pub(crate) attempts: i32,
    /// Due at this time (0: at once).
    pub(crate) due: i64,
    pub(crate) enqueued: i64,
    pub(crate) first_attempt: i64,
    pub(crate) last_attempt: i64,
    /// A dead letter, with this reason.
    pub(crate) reason: Option<String>,
}

/// What a commit does beyond the plain enqueues and dequeues.
#[derive(Debug, Default)]
pub(crate) struct Extra {
    pub(crate) fresh: Vec<Fresh>,
    /// Imported items and dead letters.
    pub(crate) imported: Vec<Imported>,
    /// Acknowledged leases: token, and the queue's name for the error.
    pub(crate) acks: Vec<(i64, String)>,
    /// Lease up to `n` visible items of `queue` in the same database transaction, for
    /// `ttl` ms (`commit_and_lease`).
    pub(crate) lease: Option<(i32, i64, i64)>,
}

impl Extra {
    pub(crate) fn is_empty(&self) -> bool {
        self.fresh.is_empty()
            && self.imported.is_empty()
            && self.acks.is_empty()
            && self.lease.is_none()
    }
}

/// The end of a commit: the `INSERT` and the `COMMIT`. After a failure before `COMMIT` the
/// database transaction is still open (`held.open`), for the caller to roll back; a
/// connection lost during `COMMIT` is [`Error::CommitOutcomeUnknown`].
pub(super) async fn finish(
    pool: &Pool,
    sql: &Sql,
    held: &mut PgTx,
    queues: Vec<i32>,
    payloads: Vec<Vec<u8>>,
    extra: Extra,
    now: Option<i64>,
) -> Result<(Vec<Granted>, Vec<i32>)> {
    if held.client.is_none() {
        held.client = Some(pool.get().await.map_err(|e| pg("commit", e))?);
    }
    if !held.open && !extra.is_empty() {
        held.client()?
            .batch_execute("BEGIN")
            .await
            .map_err(|e| pg("commit", e))?;
        held.open = true;
    }
    let plain = !queues.is_empty();
    // Who to notify: every queue that gets an item (a delayed one wakes a waiter that finds
    // nothing yet, harmlessly).
    let mut notified = queues.clone();
    notified.extend(extra.fresh.iter().map(|f| f.queue));
    notified.extend(
        extra
            .imported
            .iter()
            .filter(|i| i.reason.is_none())
            .map(|i| i.queue),
    );
    let client = held.client()?;
    let one = queues.len() == 1;
    let insert = if plain {
        Some(
            client
                .prepare_cached(if one { &sql.insert_one } else { &sql.insert })
                .await
                .map_err(|e| pg("commit", e))?,
        )
    } else {
        None
    };
    // The `INSERT`'s parameters: every item in arrays, or the one item.
    let (queue_one, payload_one): (i32, &[u8]) = match (queues.first(), payloads.first()) {
        (Some(q), Some(p)) => (*q, p),
        _ => (0, &[]),
    };
    let many: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&queues, &payloads, &now];
    let single: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&queue_one, &payload_one, &now];
    let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = if one { &single } else { &many };
    if !held.open && extra.is_empty() {
        // One statement, atomic on its own: it commits as it completes, so a connection lost
        // once it was sent leaves the outcome unknown, as a lost `COMMIT` does.
        let inserted = match &insert {
            Some(insert) => client
                .execute(insert, params)
                .await
                .map(|rows| check_inserted(rows, queues.len())),
            None => Ok(()),
        };
        return inserted
            .map(|()| (Vec::new(), notified))
            .map_err(commit_error);
    }
    if extra.is_empty() {
        // The `INSERT` and `COMMIT` in one round trip. Should the `INSERT` fail, the server
        // turns the `COMMIT` after it into a rollback.
        let inserted = async {
            match &insert {
                Some(insert) => client
                    .execute(insert, params)
                    .await
                    .map(|rows| check_inserted(rows, queues.len())),
                None => Ok(()),
            }
        };
        let (inserted, committed) = tokio::join!(inserted, client.batch_execute("COMMIT"));
        held.open = false;
        return match inserted {
            Ok(()) => committed
                .map(|()| (Vec::new(), notified))
                .map_err(commit_error),
            // No answer: the `COMMIT` may have been applied.
            Err(e) if e.is_closed() || e.code().is_none() => Err(commit_error(e)),
            Err(e) => Err(pg("commit", e)),
        };
    }
    // On any failure below the caller rolls back (`held.open` is still set).
    if let Some(insert) = &insert {
        let rows = client
            .execute(insert, params)
            .await
            .map_err(|e| pg("commit", e))?;
        check_inserted(rows, queues.len());
    }
    write_extra(client, sql, &extra, now).await?;
    let granted = match extra.lease {
        Some((queue, n, ttl)) => lease_on(client, sql, queue, n, now, ttl).await?,
        None => Vec::new(),
    };
    let committed = client.batch_execute("COMMIT").await;
    held.open = false;
    committed
        .map(|()| (granted, notified))
        .map_err(commit_error)
}

/// Writes a commit's acks and its delayed and keyed enqueues on `client`, inside its open
/// transaction: an ack of a lease no longer live fails with [`Error::LeaseExpired`].
async fn write_extra(client: &Object, sql: &Sql, extra: &Extra, now: Option<i64>) -> Result<()> {
    // Acks first: a keyed enqueue after them may take the key of an item they remove (a job
    // that schedules its successor), as on every engine.
    if !extra.acks.is_empty() {
        let tokens: Vec<i64> = extra.acks.iter().map(|(t, _)| *t).collect();
        let statement = client
            .prepare_cached(&sql.proc.ack)
            .await
            .map_err(|e| pg("commit", e))?;
        let rows = client
            .query(&statement, &[&tokens, &now])
            .await
            .map_err(|e| pg("commit", e))?;
        debug_assert!(
            rows.iter()
                .all(|r| r.try_get::<_, i64>(0).is_ok_and(|t| tokens.contains(&t))),
            "an ack deletes only the leases it names"
        );
        if rows.len() != tokens.len() {
            let live: Vec<i64> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            let expired = extra.acks.iter().find(|(t, _)| !live.contains(t));
            // Else a token was named twice, and the live lease would be reported as ended.
            debug_assert!(expired.is_some(), "a commit acknowledges each lease once");
            let (token, queue) = expired.cloned().unwrap_or_else(|| extra.acks[0].clone());
            return Err(Error::LeaseExpired {
                queue,
                token: ms(token),
            });
        }
    }
    if !extra.fresh.is_empty() {
        let mut queues = Vec::with_capacity(extra.fresh.len());
        let mut payloads = Vec::with_capacity(extra.fresh.len());
        let mut delays = Vec::with_capacity(extra.fresh.len());
        let mut ats = Vec::with_capacity(extra.fresh.len());
        let mut keys = Vec::with_capacity(extra.fresh.len());
        for f in &extra.fresh {
            queues.push(f.queue);
            payloads.push(f.payload.as_slice());
            delays.push(f.delay);
            ats.push(f.at);
            keys.push(f.key.as_deref());
        }
        let statement = client
            .prepare_cached(&sql.proc.insert)
            .await
            .map_err(|e| pg("commit", e))?;
        client
            .execute(
                &statement,
                &[&queues, &payloads, &delays, &ats, &keys, &now],
            )
            .await
            .map_err(|e| pg("commit", e))?;
    }
    for dead in [false, true] {
        let rows: Vec<&Imported> = extra
            .imported
            .iter()
            .filter(|i| i.reason.is_some() == dead)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let queues: Vec<i32> = rows.iter().map(|i| i.queue).collect();
        let payloads: Vec<&[u8]> = rows.iter().map(|i| i.payload.as_slice()).collect();
        let attempts: Vec<i32> = rows.iter().map(|i| i.attempts).collect();
        let dues: Vec<i64> = rows.iter().map(|i| i.due).collect();
        let reasons: Vec<&str> = rows.iter().filter_map(|i| i.reason.as_deref()).collect();
        let enqueued: Vec<i64> = rows.iter().map(|i| i.enqueued).collect();
        let firsts: Vec<i64> = rows.iter().map(|i| i.first_attempt).collect();
        let lasts: Vec<i64> = rows.iter().map(|i| i.last_attempt).collect();
        let text = if dead {
            &sql.proc.import_dead
        } else {
            &sql.proc.import_items
        };
        let statement = client
            .prepare_cached(text)
            .await
            .map_err(|e| pg("commit", e))?;
        let fourth: &(dyn tokio_postgres::types::ToSql + Sync) =
            if dead { &reasons } else { &dues };
        let written = client
            .execute(
                &statement,
                &[
                    &queues, &payloads, &attempts, fourth, &enqueued, &firsts, &lasts, &now,
                ],
            )
            .await
            .map_err(|e| pg("commit", e))?;
        // No `ON CONFLICT` (an import carries no deduplication key): one row per item.
        debug_assert!(
            usize::try_from(written).is_ok_and(|written| written == rows.len()),
            "an import writes one row per item"
        );
    }
    Ok(())
}

/// The plain `INSERT` of a commit writes one row per item: it has no `ON CONFLICT`, and its
/// `unnest` gives one row per element of arrays of one length.
fn check_inserted(rows: u64, items: usize) {
    debug_assert!(
        u64::try_from(items).is_ok_and(|items| rows == items),
        "the commit's INSERT wrote {rows} rows for {items} items"
    );
}
