//! The processing layer on PostgreSQL: leases, retries, delayed items, dead letters, browse
//! and stats as statements on the schema's rows.
//!
//! A lease is columns of its row (`attempts`, `leased_until`, `lease_token`), set by one
//! autocommitted `UPDATE` (durable before the `Lease` is returned, P1) and checked by token
//! by every settlement (fencing, P3). Deadlines are the database's clock (or the store's
//! injected clock, passed as a parameter), so a lease outlives its holder and the server
//! and ends at its deadline whoever watches (P2): an expired lease is visible again to every
//! dequeue at once, at the head; one at the maximum attempts is moved to the dead letters by
//! the next lease, stats, browse or dead-letter call on its queue (until then it is neither
//! visible nor leased). ARCHITECTURE.md ("The PostgreSQL engine") lists the statements.

use std::sync::Arc;

use deadpool_postgres::Object;
use tokio_postgres::Row;

use super::{head_rows, held_ids, is_visible, pg, Postgres, Sql, DB_NOW};
use crate::clock::Clock;
use crate::core::{Entry, QueueCore};
use crate::engine::processing::{cut_reason, DeadSlot, EXPIRED};
use crate::error::{Error, Result};
use crate::processing::{max_delay_ms, ItemState, QueueStats, Replay, RetryPolicy, MAX_ATTEMPTS};
use crate::sync::process::Mutex;

/// The processing layer's statements, with the schema spliced in. Every one takes the time
/// as a nullable `int8` parameter (`NULL`: the database's clock).
#[derive(Debug)]
pub(super) struct ProcSql {
    /// `$1` queue, `$2` n, `$3` now, `$4` ttl: leases up to n visible rows at the head
    /// (burying on the way up to 100 expired at the maximum attempts). One row per lease,
    /// or one of NULLs when none; each row also has how many were buried, and the queue's
    /// name when some were (for the metrics).
    lease: String,
    /// `$1` tokens: leases handed to nobody (an item that did not decode) given back as
    /// they were, their attempt not counted.
    unlease: String,
    /// `$1` tokens, `$2` now: acknowledged leases deleted; returns the tokens found live.
    ack: String,
    /// `$1` queue, `$2` token, `$3` now, `$4` reason: a failed lease retried after the
    /// queue's backoff or buried. Returns whether the lease was live, and the retry time.
    fail: String,
    /// `$1` token, `$2` now, `$3` delay: a lease given back (at the head for no delay).
    release: String,
    /// `$1` token, `$2` now, `$3` ttl: a new deadline for a live lease.
    extend: String,
    /// `$1` queue, `$2` now, `$3` retention (NULL: none): every expired lease at the
    /// maximum attempts to dead letters, and dead letters past the retention deleted.
    bury: String,
    /// `$1` queue, `$2` now: counts, and the queue's policy.
    stats: String,
    /// `$1` queue, `$2` after, `$3` limit, `$4` now.
    browse: String,
    /// `$1` queue, `$2` after, `$3` limit.
    dead: String,
    /// `$1` queue, `$2` ids or NULL, `$3` limit or NULL, `$4` reset attempts, `$5` now:
    /// dead letters back at the tail; returns their ids.
    replay: String,
    /// `$1` queue, `$2` ids or NULL, `$3` limit or NULL: dead letters deleted.
    purge: String,
    /// `$1` queue, policy columns `$2..$5`.
    set_policy: String,
    /// Delayed and keyed enqueues: `$1` queues, `$2` payloads, `$3` delays, `$4` due
    /// times, `$5` keys, `$6` now. A key already in its queue makes that row a no-op.
    insert: String,
    /// `$1` queue, `$2` now: when the next delayed item or lease of the queue falls due.
    next_due: String,
    /// Imported items: `$1` queues, `$2` payloads, `$3` attempts, `$4` due times, `$5`
    /// enqueue times, `$6` first and `$7` latest attempt times (0: unknown), `$8` now.
    import_items: String,
    /// Imported dead letters: as [`import_items`](Self::import_items) without the due
    /// times, `$4` reasons.
    import_dead: String,
}

const NOW_T: &str = "(SELECT now FROM t)";

impl ProcSql {
    pub(super) fn new(schema: &str, item_key: i32) -> ProcSql {
        let s = format!("\"{schema}\"");
        let t = |param: &str| format!("t AS (SELECT coalesce({param}::int8, {DB_NOW}) AS now)");
        let bury_cte = |limit: &str| {
            format!(
                "dead AS (DELETE FROM {s}.items i WHERE i.id IN (\
                   SELECT x.id FROM {s}.items x WHERE x.queue = $1 \
                   AND x.leased_until <= {NOW_T} \
                   AND x.attempts >= (SELECT max_attempts FROM {s}.queues WHERE id = $1) \
                   ORDER BY x.leased_until {limit} FOR UPDATE SKIP LOCKED) \
                 RETURNING i.*), \
                 buried AS (INSERT INTO {s}.dead_letters (queue, payload, reason, attempts, \
                   enqueued_ms, first_attempt_ms, last_attempt_ms, dedup_key, died_ms) \
                   SELECT queue, payload, '{EXPIRED}', attempts, enqueued_ms, first_attempt_ms, \
                   last_attempt_ms, dedup_key, {NOW_T} FROM dead RETURNING id)"
            )
        };
        let dead_filter = "SELECT id FROM {s}.dead_letters WHERE queue = $1 \
             AND ($2::int8[] IS NULL OR id = ANY($2::int8[])) ORDER BY id LIMIT $3::int8 FOR UPDATE"
            .replace("{s}", &s);
        ProcSql {
            lease: format!(
                "WITH {t}, {bury}, \
                 got AS (UPDATE {s}.items i SET attempts = CASE \
                   WHEN i.attempts < {MAX_ATTEMPTS} THEN i.attempts + 1 ELSE i.attempts END, \
                   leased_until = {NOW_T} + $4::int8, \
                   lease_token = nextval('{s}.lease_tokens'), \
                   first_attempt_ms = coalesce(i.first_attempt_ms, {NOW_T}), \
                   last_attempt_ms = {NOW_T} \
                 WHERE i.{rows} \
                 RETURNING i.id, i.payload, i.attempts, i.lease_token, i.leased_until, \
                   i.enqueued_ms, i.first_attempt_ms, i.last_attempt_ms, i.ready_ms, \
                   i.dedup_key), \
                 dead_count AS (SELECT count(*) AS buried FROM buried) \
                 SELECT got.*, dead_count.buried, \
                   CASE WHEN dead_count.buried > 0 \
                     THEN (SELECT name FROM {s}.queues WHERE id = $1) END \
                 FROM dead_count LEFT JOIN got ON true",
                t = t("$3"),
                bury = bury_cte("LIMIT 100"),
                rows = head_rows(&s, "$1", "$2::int8"),
            ),
            unlease: format!(
                "UPDATE {s}.items SET leased_until = NULL, lease_token = NULL, \
                   attempts = attempts - 1, \
                   first_attempt_ms = CASE WHEN attempts = 1 THEN NULL ELSE first_attempt_ms END \
                 WHERE lease_token = ANY($1::int8[])"
            ),
            ack: format!(
                "WITH {t} DELETE FROM {s}.items \
                 WHERE lease_token = ANY($1::int8[]) AND leased_until > {NOW_T} \
                 RETURNING lease_token",
                t = t("$2"),
            ),
            fail: format!(
                "WITH {t}, \
                 pol AS (SELECT max_attempts, initial_backoff_ms, max_backoff_ms, jitter_per_mille \
                   FROM {s}.queues WHERE id = $1), \
                 cur AS (SELECT i.id, i.attempts FROM {s}.items i \
                   WHERE i.lease_token = $2 AND i.leased_until > {NOW_T} FOR UPDATE), \
                 dead AS (DELETE FROM {s}.items i USING cur, pol \
                   WHERE i.id = cur.id AND cur.attempts >= pol.max_attempts RETURNING i.*), \
                 buried AS (INSERT INTO {s}.dead_letters (queue, payload, reason, attempts, \
                   enqueued_ms, first_attempt_ms, last_attempt_ms, dedup_key, died_ms) \
                   SELECT queue, payload, $4, attempts, enqueued_ms, first_attempt_ms, \
                   last_attempt_ms, dedup_key, {NOW_T} FROM dead RETURNING id), \
                 back AS (SELECT cur.id, cur.attempts, \
                   least(pol.initial_backoff_ms::numeric \
                     * power(2::numeric, least(greatest(cur.attempts - 1, 0), 63)), \
                     pol.max_backoff_ms, {max_backoff})::int8 AS base, \
                   least(greatest(pol.jitter_per_mille, 0), 1000) AS j \
                   FROM cur, pol WHERE cur.attempts < pol.max_attempts), \
                 spread AS (SELECT id, attempts, base, base * j / 1000 AS s FROM back), \
                 retried AS (UPDATE {s}.items i SET leased_until = NULL, lease_token = NULL, \
                   ready_ms = {NOW_T} + sp.base - sp.s \
                     + (hashint8extended(sp.id, sp.attempts) & 9223372036854775807) \
                       % (2 * sp.s + 1) \
                   FROM spread sp WHERE i.id = sp.id RETURNING i.ready_ms) \
                 SELECT (SELECT count(*) FROM cur), (SELECT ready_ms FROM retried)",
                t = t("$3"),
                max_backoff = max_delay_ms(),
            ),
            release: format!(
                "WITH {t} UPDATE {s}.items SET leased_until = NULL, lease_token = NULL, \
                   ready_ms = CASE WHEN $3::int8 = 0 THEN ready_ms ELSE {NOW_T} + $3::int8 END \
                 WHERE lease_token = $1 AND leased_until > {NOW_T} RETURNING queue",
                t = t("$2"),
            ),
            extend: format!(
                "WITH {t} UPDATE {s}.items SET leased_until = {NOW_T} + $3::int8 \
                 WHERE lease_token = $1 AND leased_until > {NOW_T} RETURNING leased_until",
                t = t("$2"),
            ),
            bury: format!(
                "WITH {t}, {bury}, \
                 old AS (DELETE FROM {s}.dead_letters WHERE queue = $1 \
                   AND died_ms < {NOW_T} - $3::int8 RETURNING id) \
                 SELECT (SELECT count(*) FROM buried), (SELECT count(*) FROM old), \
                   (SELECT name FROM {s}.queues WHERE id = $1)",
                t = t("$2"),
                bury = bury_cte(""),
            ),
            stats: format!(
                "WITH {t}, h AS ({held}), \
                 r AS (SELECT i.*, ((i.id & 4294967295) IN (SELECT * FROM h)) AS held, \
                   {visible} AS visible FROM {s}.items i WHERE i.queue = $1) \
                 SELECT \
                   count(*) FILTER (WHERE visible AND NOT held), \
                   count(*) FILTER (WHERE leased_until IS NULL AND ready_ms > {NOW_T} \
                     AND NOT held), \
                   count(*) FILTER (WHERE leased_until > {NOW_T} AND NOT held), \
                   count(*) FILTER (WHERE held), \
                   (SELECT count(*) FROM {s}.dead_letters WHERE queue = $1), \
                   (SELECT enqueued_ms FROM r WHERE visible AND NOT held \
                     ORDER BY leased_until IS NULL, ready_ms, id LIMIT 1), \
                   (SELECT max_attempts FROM {s}.queues WHERE id = $1), \
                   (SELECT initial_backoff_ms FROM {s}.queues WHERE id = $1), \
                   (SELECT max_backoff_ms FROM {s}.queues WHERE id = $1), \
                   (SELECT jitter_per_mille FROM {s}.queues WHERE id = $1) \
                 FROM r",
                t = t("$2"),
                held = held_ids(item_key),
                visible = is_visible(&s, "$1"),
            ),
            browse: format!(
                "WITH {t} SELECT i.id, i.payload, i.ready_ms, i.leased_until, i.attempts, \
                   i.enqueued_ms \
                 FROM {s}.items i WHERE i.queue = $1 AND i.id > $2 \
                 AND (i.id & 4294967295) NOT IN ({held}) \
                 ORDER BY i.id LIMIT $3",
                t = t("$4"),
                held = held_ids(item_key),
            ),
            dead: format!(
                "SELECT id, payload, reason, attempts, first_attempt_ms, last_attempt_ms, \
                   enqueued_ms \
                 FROM {s}.dead_letters WHERE queue = $1 AND id > $2 ORDER BY id LIMIT $3"
            ),
            replay: format!(
                "WITH {t}, \
                 moved AS (DELETE FROM {s}.dead_letters d WHERE d.id IN ({dead_filter}) \
                   RETURNING d.*), \
                 ins AS (INSERT INTO {s}.items (queue, payload, enqueued_ms, ready_ms, attempts, \
                   first_attempt_ms, last_attempt_ms, dedup_key) \
                   SELECT m.queue, m.payload, m.enqueued_ms, {NOW_T}, \
                     CASE WHEN $4 THEN 0 ELSE m.attempts END, \
                     CASE WHEN $4 THEN NULL ELSE m.first_attempt_ms END, \
                     CASE WHEN $4 THEN NULL ELSE m.last_attempt_ms END, \
                     CASE WHEN m.dedup_key IS NOT NULL \
                       AND row_number() OVER (PARTITION BY m.dedup_key ORDER BY m.id) = 1 \
                       AND NOT EXISTS (SELECT 1 FROM {s}.items x \
                         WHERE x.queue = $1 AND x.dedup_key = m.dedup_key) \
                     THEN m.dedup_key END \
                   FROM moved m ORDER BY m.id RETURNING 1) \
                 SELECT id FROM moved",
                t = t("$5"),
            ),
            purge: format!(
                "DELETE FROM {s}.dead_letters d WHERE d.id IN ({dead_filter}) RETURNING d.id"
            ),
            set_policy: format!(
                "UPDATE {s}.queues SET max_attempts = $2, initial_backoff_ms = $3, \
                   max_backoff_ms = $4, jitter_per_mille = $5 WHERE id = $1"
            ),
            insert: format!(
                "INSERT INTO {s}.items (queue, payload, enqueued_ms, ready_ms, dedup_key) \
                 SELECT q, p, c.now, \
                   CASE WHEN d > 0 THEN c.now + d WHEN a > 0 THEN a ELSE c.now END, k \
                 FROM unnest($1::int4[], $2::bytea[], $3::int8[], $4::int8[], $5::bytea[]) \
                   WITH ORDINALITY AS u(q, p, d, a, k, n), \
                   (SELECT coalesce($6::int8, {DB_NOW}) AS now) c \
                 ORDER BY n ON CONFLICT DO NOTHING"
            ),
            next_due: format!(
                "WITH {t} SELECT least(\
                   (SELECT min(ready_ms) FROM {s}.items WHERE queue = $1 \
                     AND leased_until IS NULL AND ready_ms > {NOW_T}), \
                   (SELECT min(leased_until) FROM {s}.items WHERE queue = $1 \
                     AND leased_until > {NOW_T})) - {NOW_T}",
                t = t("$2"),
            ),
            import_items: format!(
                "WITH {t} INSERT INTO {s}.items (queue, payload, attempts, ready_ms, enqueued_ms, \
                   first_attempt_ms, last_attempt_ms) \
                 SELECT q, p, a, CASE WHEN d > 0 THEN d ELSE {NOW_T} END, \
                   CASE WHEN e > 0 THEN e ELSE {NOW_T} END, nullif(f, 0), nullif(l, 0) \
                 FROM unnest($1::int4[], $2::bytea[], $3::int4[], $4::int8[], $5::int8[], \
                   $6::int8[], $7::int8[]) WITH ORDINALITY AS u(q, p, a, d, e, f, l, n) \
                 ORDER BY n",
                t = t("$8"),
            ),
            import_dead: format!(
                "WITH {t} INSERT INTO {s}.dead_letters (queue, payload, attempts, reason, \
                   enqueued_ms, first_attempt_ms, last_attempt_ms, died_ms) \
                 SELECT q, p, a, r, CASE WHEN e > 0 THEN e ELSE {NOW_T} END, nullif(f, 0), \
                   nullif(l, 0), {NOW_T} \
                 FROM unnest($1::int4[], $2::bytea[], $3::int4[], $4::text[], $5::int8[], \
                   $6::int8[], $7::int8[]) WITH ORDINALITY AS u(q, p, a, r, e, f, l, n) \
                 ORDER BY n",
                t = t("$8"),
            ),
        }
    }
}

/// A lease as a statement granted it.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) entry: Entry,
    pub(crate) token: u64,
    pub(crate) deadline: u64,
}

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

fn ms(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn opt_ms(v: Option<i64>) -> u64 {
    v.map_or(0, ms)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A row of the lease statement.
fn granted(row: &Row) -> Result<Granted> {
    let read = || -> std::result::Result<Granted, tokio_postgres::Error> {
        let mut entry = Entry::new(
            ms(row.try_get(0)?),
            row.try_get::<_, Vec<u8>>(1)?.into_boxed_slice(),
            ms(row.try_get(5)?),
        );
        entry.attempts = u32::try_from(row.try_get::<_, i32>(2)?).unwrap_or(0);
        entry.times.first_attempt = opt_ms(row.try_get(6)?);
        entry.times.last_attempt = opt_ms(row.try_get(7)?);
        entry.not_before = ms(row.try_get(8)?);
        entry.key = row
            .try_get::<_, Option<Vec<u8>>>(9)?
            .map(Vec::into_boxed_slice);
        Ok(Granted {
            entry,
            token: ms(row.try_get(3)?),
            deadline: ms(row.try_get(4)?),
        })
    };
    read().map_err(|e| pg("lease", e))
}

/// Counts and traces `buried` items of queue `name` moved to the dead letters because their
/// last lease expired (by the lease statement or the maintenance pass).
fn buried_expired(name: &str, buried: i64) {
    crate::metrics::buried(name, true, u64::try_from(buried).unwrap_or(0));
    let span = tracing::debug_span!("dead_letter_moves", queue = name, buried);
    let _entered = span.enter();
    tracing::debug!("items whose last lease expired moved to the dead letters");
}

/// Leases up to `n` rows of `queue` on `client` (in its open transaction, if any).
pub(super) async fn lease_on(
    client: &Object,
    sql: &Sql,
    queue: i32,
    n: i64,
    now: Option<i64>,
    ttl: i64,
) -> Result<Vec<Granted>> {
    let statement = client
        .prepare_cached(&sql.proc.lease)
        .await
        .map_err(|e| pg("lease", e))?;
    let rows = client
        .query(&statement, &[&queue, &n, &now, &ttl])
        .await
        .map_err(|e| pg("lease", e))?;
    if let Some(first) = rows.first() {
        let buried: i64 = first.try_get(10).unwrap_or(0);
        if buried > 0 {
            let name: String = first
                .try_get::<_, Option<String>>(11)
                .ok()
                .flatten()
                .unwrap_or_default();
            buried_expired(&name, buried);
        }
    }
    // A lease of nothing is one row of NULLs (it carries the count above).
    let mut granted = rows
        .iter()
        .filter(|row| matches!(row.try_get::<_, Option<i64>>(0), Ok(Some(_))))
        .map(granted)
        .collect::<Result<Vec<_>>>()?;
    // Queue order: readiness, then id (an expired lease kept its place at the head).
    granted.sort_unstable_by_key(|g| (g.entry.not_before, g.entry.id));
    for g in &mut granted {
        g.entry.not_before = 0;
    }
    Ok(granted)
}

/// Writes a commit's delayed and keyed enqueues and its acks on `client`, inside its open
/// transaction: an ack of a lease no longer live fails with [`Error::LeaseExpired`].
pub(super) async fn write_extra(
    client: &Object,
    sql: &Sql,
    extra: &Extra,
    now: Option<i64>,
) -> Result<()> {
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
        client
            .execute(
                &statement,
                &[
                    &queues, &payloads, &attempts, fourth, &enqueued, &firsts, &lasts, &now,
                ],
            )
            .await
            .map_err(|e| pg("commit", e))?;
    }
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
        if rows.len() != tokens.len() {
            let live: Vec<i64> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            let (token, queue) = extra
                .acks
                .iter()
                .find(|(t, _)| !live.contains(t))
                .cloned()
                .unwrap_or_else(|| extra.acks[0].clone());
            return Err(Error::LeaseExpired {
                queue,
                token: ms(token),
            });
        }
    }
    Ok(())
}

/// What `fail` did.
#[derive(Debug)]
pub(crate) enum FailOutcome {
    /// The lease had ended: nothing was done.
    Ended,
    /// Due again at this time.
    Retry(u64),
    /// Buried.
    Dead,
}

impl Postgres {
    /// The time to pass to the statements: the injected clock's, or `None` for the
    /// database's.
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.clock.is_manual().then(|| i64_of(self.clock.now()))
    }

    /// Leases up to `n` visible items of `core`'s queue for `ttl` ms, in one autocommitted
    /// statement (durable when this returns); none if nothing is visible.
    pub(crate) async fn lease(&self, core: &QueueCore, n: usize, ttl: u64) -> Result<Vec<Granted>> {
        let queue = self.db_id(core)?;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let (now, ttl) = (self.now_param(), i64_of(ttl));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("lease", e))?;
            lease_on(&client, &sql, queue, n, now, ttl).await
        })
        .await
    }

    /// Gives back leases that were handed to nobody (their items did not decode), their
    /// attempts not counted, and wakes a waiter.
    pub(crate) async fn unlease(&self, core: &QueueCore, tokens: Vec<u64>) -> Result<()> {
        let queue = self.db_id(core)?;
        let tokens: Vec<i64> = tokens.into_iter().map(i64_of).collect();
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("lease", e))?;
            client
                .execute(&sql.proc.unlease, &[&tokens])
                .await
                .map_err(|e| pg("lease", e))?;
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
        let (now, token, reason) = (self.now_param(), i64_of(token), cut_reason(reason));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("fail", e))?;
            let row = client
                .query_one(&sql.proc.fail, &[&queue, &token, &now, &reason])
                .await
                .map_err(|e| pg("fail", e))?;
            let found: i64 = row.try_get(0).map_err(|e| pg("fail", e))?;
            let at: Option<i64> = row.try_get(1).map_err(|e| pg("fail", e))?;
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
        let (now, token, delay) = (self.now_param(), i64_of(token), i64_of(delay));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        let released = self
            .run(async move {
                let client = pool.get().await.map_err(|e| pg("release", e))?;
                let rows = client
                    .query(&sql.proc.release, &[&token, &now, &delay])
                    .await
                    .map_err(|e| pg("release", e))?;
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
        let (now, token) = (self.now_param(), i64_of(token));
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
        let (now, token, ttl) = (self.now_param(), i64_of(token), i64_of(ttl));
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("extend", e))?;
            let rows = client
                .query(&sql.proc.extend, &[&token, &now, &ttl])
                .await
                .map_err(|e| pg("extend", e))?;
            match rows.first() {
                None => Ok(None),
                Some(row) => Ok(Some(ms(row.try_get(0).map_err(|e| pg("extend", e))?))),
            }
        })
        .await
    }

    /// The store's time source for tasks that outlive a call: the injected clock, if any.
    pub(super) fn now_source(&self) -> Option<Clock> {
        self.clock.is_manual().then(|| self.clock.clone())
    }

    /// Moves every expired lease of the queue at its maximum attempts to the dead letters,
    /// and deletes dead letters past the retention.
    async fn bury(
        client: &Object,
        sql: &Sql,
        queue: i32,
        now: Option<i64>,
        retention: Option<i64>,
    ) -> Result<()> {
        let row = client
            .query_one(&sql.proc.bury, &[&queue, &now, &retention])
            .await
            .map_err(|e| pg("bury", e))?;
        let buried: i64 = row.try_get(0).unwrap_or(0);
        if buried > 0 {
            let name: String = row.try_get(2).unwrap_or_default();
            buried_expired(&name, buried);
        }
        Ok(())
    }

    /// The queue's counts, and its policy as stored.
    pub(crate) async fn stats(&self, core: &QueueCore) -> Result<(QueueStats, RetryPolicy)> {
        let queue = self.db_id(core)?;
        let (now, retention) = (self.now_param(), self.retention);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("stats", e))?;
            Self::bury(&client, &sql, queue, now, retention).await?;
            let row = client
                .query_one(&sql.proc.stats, &[&queue, &now])
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
            read().map_err(|e| pg("stats", e))
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
        let after = after.map_or(0, i64_of);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("browse", e))?;
            Self::bury(&client, &sql, queue, now, retention).await?;
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
                    entry.attempts = u32::try_from(row.try_get::<_, i32>(4)?).unwrap_or(0);
                    let ready = ms(row.try_get(2)?);
                    let state = match row.try_get::<_, Option<i64>>(3)?.map(ms) {
                        Some(until) if until > time => ItemState::Leased {
                            until: crate::clock::system_time(until),
                            attempt: entry.attempts,
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
        let after = after.map_or(0, i64_of);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("dead_letters", e))?;
            Self::bury(&client, &sql, queue, now, retention).await?;
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
                entry.attempts = u32::try_from(row.try_get::<_, i32>(3)?).unwrap_or(0);
                entry.times.first_attempt = opt_ms(row.try_get(4)?);
                entry.times.last_attempt = opt_ms(row.try_get(5)?);
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
        let (ids, limit): (Option<Vec<i64>>, Option<i64>) = match &which {
            Replay::All => (None, None),
            Replay::First(n) => (None, Some(i64::try_from(*n).unwrap_or(i64::MAX))),
            Replay::Ids(ids) => {
                let mut ids: Vec<i64> = ids.iter().map(|&id| i64_of(id)).collect();
                ids.sort_unstable();
                ids.dedup();
                (Some(ids), None)
            }
        };
        let operation = if purge { "purge" } else { "replay" };
        let (pool, sql) = (self.pool.clone(), Arc::clone(&self.sql));
        self.run(async move {
            let mut client = pool.get().await.map_err(|e| pg(operation, e))?;
            Self::bury(&client, &sql, queue, now, retention).await?;
            let tx = client.transaction().await.map_err(|e| pg(operation, e))?;
            let rows = if purge {
                tx.query(&sql.proc.purge, &[&queue, &ids, &limit]).await
            } else {
                tx.query(&sql.proc.replay, &[&queue, &ids, &limit, &reset, &now])
                    .await
            }
            .map_err(|e| pg(operation, e))?;
            let done: Vec<i64> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
            if let Some(ids) = &ids {
                if let Some(&missing) = ids.iter().find(|id| !done.contains(id)) {
                    // Dropping `tx` rolls back.
                    return Err(Error::NotDeadLetter {
                        queue: name,
                        id: ms(missing),
                    });
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

/// How often each store runs its maintenance pass.
const MAINTENANCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The store's maintenance task: every [`MAINTENANCE`], on each queue the store has opened,
/// moves expired leases at their maximum attempts to the dead letters and applies the
/// dead-letter retention. Runs until the store's runtime stops. Failures are logged and
/// retried at the next pass.
pub(super) async fn maintain(
    pool: super::Pool,
    sql: Arc<Sql>,
    queues: Arc<Mutex<Vec<i32>>>,
    clock: Option<Clock>,
    retention: Option<i64>,
) {
    loop {
        tokio::time::sleep(MAINTENANCE).await;
        let list = queues.lock().clone();
        let Ok(client) = pool.get().await else {
            continue;
        };
        for queue in list {
            let now = clock.as_ref().map(|c| i64_of(c.now()));
            if let Err(e) = Postgres::bury(&client, &sql, queue, now, retention).await {
                tracing::warn!(error = %e, queue, "the maintenance pass failed");
                break;
            }
        }
    }
}
