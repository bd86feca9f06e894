//! The SQL text: every statement the engine sends, with the schema's name and its advisory
//! lock keys spliced in, built once per store; and the values its `int8` parameters take and
//! its `int8` columns give.
//!
//! ARCHITECTURE.md ("The PostgreSQL engine") describes the schema and the statements.

use std::collections::HashMap;

use crate::engine::proc::EXPIRED;
use crate::error::{Error, Result};
use crate::processing::{max_delay_ms, MAX_ATTEMPTS};
use crate::sync::process::Mutex;

/// The database's clock in milliseconds since the epoch: the time of every statement unless
/// the store runs on an injected clock (tests), whose time is then passed instead.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// A setting that is `on` only inside a database transaction begun by the store ([`BEGIN`]
/// sets it `LOCAL`ly): the dequeue statement takes nothing without it, so a dequeue sent
/// together with its `BEGIN` can never delete rows outside a transaction, whatever happened
/// to the `BEGIN`.
const IN_TRANSACTION: &str = "reliable_queue.in_transaction";

/// The first keys of the schema's advisory locks (two-key form, objsubid 2 in `pg_locks`):
/// `item` marks a row held by an open transaction (second key: the low 32 bits of its id),
/// `watch` says "a store has consumers waiting on queue `objid`". Both come from the schema's
/// name, so that stores in other schemas of the same database (whose ids and queue ids
/// overlap with this one's) do not see each other's locks.
#[derive(Debug, Clone, Copy)]
pub(super) struct LockKeys {
    pub(super) item: i32,
    pub(super) watch: i32,
}

impl LockKeys {
    fn of(schema: &str) -> LockKeys {
        // FNV-1a: stable across builds and platforms.
        let mut hash: u32 = 0x811c_9dc5;
        for b in schema.bytes() {
            hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        // Non-negative, so that the keys compare equal to `pg_locks`' unsigned `classid`.
        let item = i32::try_from(hash & 0x3fff_ffff).unwrap_or(0);
        LockKeys {
            item,
            watch: item | 0x4000_0000,
        }
    }
}

/// A queue's row as the handles need it: its id and retry policy.
const QUEUE_COLUMNS: &str =
    "id, max_attempts, initial_backoff_ms, max_backoff_ms, jitter_per_mille";

/// The channel every store of `schema` listens on: `rq_<schema>`, or where that is longer
/// than the 63 bytes of a PostgreSQL identifier (`pg_notify` refuses it; `LISTEN` would
/// truncate it) `rq_` and a 64-bit hash of the schema's name in hex.
fn channel_of(schema: &str) -> String {
    const MAX_IDENTIFIER: usize = 63;
    let plain = format!("rq_{schema}");
    if plain.len() <= MAX_IDENTIFIER {
        return plain;
    }
    // FNV-1a, 64 bits: stable across builds and platforms.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in schema.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("rq_{hash:016x}")
}

/// The statements, with the schema spliced in.
#[derive(Debug)]
pub(super) struct Sql {
    pub(super) schema: String,
    pub(super) keys: LockKeys,
    /// `$1` the queue's id, `$2` how many, `$3` now: deletes up to that many rows at the head
    /// that no other transaction holds, takes the advisory locks that mark them held, returns
    /// `(id, payload)` of each (in no particular order).
    pub(super) take: String,
    /// [`take`](Self::take) for one row (`$2` ignored).
    pub(super) take_one: String,
    /// `$1` queue id, `$2` payload, `$3` now: one item (the commonest commit).
    pub(super) insert_one: String,
    /// `$1` queue ids, `$2` payloads, in commit order.
    pub(super) insert: String,
    /// `$1` the queue's id, `$2` now: visible rows, not counting those held by open
    /// transactions; and how many rows of `counts` the queue has (see
    /// [`fold`](Self::fold)). Reads the queue's counts, not its rows (see [`counted`]).
    pub(super) count: String,
    /// `$1` the queue's id, `$2` now: the queue's rows of `counts` written by server
    /// processes that are gone, and those of delayed rows whose bucket has passed, added
    /// into rows of process 0 (the sums stay; the rows to read become few). One store at a
    /// time per queue (an advisory lock tried, not waited for); rows a transaction holds are
    /// skipped.
    pub(super) fold: String,
    /// `$1` the queue's name: its id and retry policy, the row created if need be. Always
    /// one row: `DO UPDATE` (of nothing) returns the row another session created while the
    /// statement ran, which a read in the statement's snapshot would miss.
    pub(super) queue: String,
    /// `$1` the queue's name: the columns of [`queue`](Self::queue), if its row exists.
    pub(super) queue_read: String,
    /// `$1` the channel, `$2` queue ids a commit enqueued to: notifies those that some store
    /// has consumers waiting on. Sent after the commit, never inside it. "Someone waits" is
    /// a listener's shared advisory lock on the queue's watch key: the statement tries the
    /// exclusive lock (released at once, with the statement's own transaction) and notifies
    /// where that fails. Two committers trying at the same moment may both notify, which
    /// only costs a spurious wake-up; it never reads `pg_locks` (which takes every partition
    /// of the server's lock table).
    pub(super) notify: String,
    /// The channel every store of the schema listens on; the payload is a queue id.
    pub(super) channel: String,
    /// The processing layer's statements.
    pub(super) proc: ProcSql,
    /// The server process of each pooled connection, once learnt.
    pub(super) pids: Mutex<HashMap<deadpool_postgres::ObjectId, i32>>,
}

impl Sql {
    pub(super) fn new(schema: &str) -> Sql {
        let s = format!("\"{schema}\"");
        let keys = LockKeys::of(schema);
        let (item_key, watch_key) = (keys.item, keys.watch);
        Sql {
            schema: schema.to_owned(),
            keys,
            take: take_statement(&s, item_key, "$2::int8"),
            take_one: take_statement(&s, item_key, "1"),
            insert_one: format!(
                "INSERT INTO {s}.items (queue, payload, enqueued_ms, ready_ms) \
                 SELECT $1, $2, c.now, c.now FROM (SELECT coalesce($3::int8, {DB_NOW}) AS now) c"
            ),
            insert: format!(
                "INSERT INTO {s}.items (queue, payload, enqueued_ms, ready_ms) \
                 SELECT q, p, c.now, c.now \
                 FROM unnest($1::int4[], $2::bytea[]) WITH ORDINALITY AS t(q, p, n), \
                   (SELECT coalesce($3::int8, {DB_NOW}) AS now) c \
                 ORDER BY n"
            ),
            count: format!(
                "WITH {counted} SELECT greatest({visible}, 0)::int8, (SELECT rows FROM k_rows) \
                 FROM c",
                counted = counted(&s, item_key),
                visible = VISIBLE,
            ),
            fold: format!(
                "WITH t AS (SELECT coalesce($2::int8, {DB_NOW}) AS now), \
                 cur AS (SELECT ((SELECT now FROM t) >> 16) + 1 AS class), \
                 l AS (SELECT pg_try_advisory_xact_lock({watch_key}, -$1) AS got), \
                 gone AS (DELETE FROM {s}.counts c WHERE c.ctid IN (\
                   SELECT x.ctid FROM {s}.counts x WHERE x.queue = $1 AND x.backend <> 0 \
                   AND (SELECT got FROM l) \
                   AND (x.backend NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL) \
                     OR (x.class > 0 AND x.class < (SELECT class FROM cur))) \
                   FOR UPDATE SKIP LOCKED) \
                 RETURNING c.queue, c.class, c.n) \
                 INSERT INTO {s}.counts AS c (queue, class, backend, n) \
                 SELECT queue, CASE WHEN class > 0 AND class < (SELECT class FROM cur) THEN 0 \
                   ELSE class END, 0, sum(n)::int8 FROM gone GROUP BY 1, 2 \
                 ON CONFLICT (queue, class, backend) DO UPDATE SET n = c.n + EXCLUDED.n"
            ),
            notify: format!(
                "SELECT pg_notify($1, t.q::text) FROM (SELECT DISTINCT unnest($2::int4[]) AS q) t \
                 WHERE NOT pg_try_advisory_xact_lock({watch_key}, t.q)"
            ),
            channel: channel_of(schema),
            proc: ProcSql::new(schema, item_key),
            pids: Mutex::new(HashMap::new()),
            queue: format!(
                "INSERT INTO {s}.queues (name) VALUES ($1) \
                 ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name \
                 RETURNING {QUEUE_COLUMNS}"
            ),
            queue_read: format!("SELECT {QUEUE_COLUMNS} FROM {s}.queues WHERE name = $1"),
        }
    }
}

/// The ids of up to `n` visible rows at the head of queue `queue` (SQL expressions), locked
/// `FOR UPDATE SKIP LOCKED`: first rows whose lease expired below the queue's maximum
/// attempts (back at the head, by deadline), then ready rows in `(ready_ms, id)` order. Each
/// part is an index range scan that stops at its first `n` rows. Needs the CTE `t(now)`.
fn visible_rows(s: &str, queue: &str, n: &str) -> String {
    format!(
        "SELECT ctid FROM (\
           SELECT ctid FROM (SELECT i.ctid FROM {s}.items i \
             WHERE i.queue = {queue} AND i.leased_until <= (SELECT now FROM t) \
             AND i.attempts < (SELECT max_attempts FROM {s}.queues WHERE id = {queue}) \
             ORDER BY i.leased_until LIMIT {n} FOR UPDATE OF i SKIP LOCKED) a \
           UNION ALL \
           SELECT ctid FROM (SELECT i.ctid FROM {s}.items i \
             WHERE i.queue = {queue} AND i.leased_until IS NULL \
             AND i.ready_ms <= (SELECT now FROM t) \
             ORDER BY i.ready_ms, i.id LIMIT {n} FOR UPDATE OF i SKIP LOCKED) b \
         ) u LIMIT {n}"
    )
}

/// Which rows a statement on the visible head changes: `n` of them, or for `n` = `"1"` the
/// one (a scalar subquery, which the planner always turns into a TID scan; an array of
/// them may get a scan of the whole table on a small one). By physical address: the rows
/// are locked, so their addresses cannot change under the statement.
fn head_rows(s: &str, queue: &str, n: &str) -> String {
    if n == "1" {
        format!("ctid = ({})", visible_rows(s, queue, n))
    } else {
        format!("ctid = ANY (ARRAY({}))", visible_rows(s, queue, n))
    }
}

/// The dequeue statement for `n` rows (see `Sql::take`).
fn take_statement(s: &str, item_key: i32, n: &str) -> String {
    let rows = head_rows(s, "$1", n);
    // `$2` appears in the statement either way, so both forms take the same parameters.
    let unused = if n == "1" { " AND $2::int8 > 0" } else { "" };
    format!(
        "WITH t AS (SELECT coalesce($3::int8, {DB_NOW}) AS now \
           WHERE current_setting('{IN_TRANSACTION}', true) = 'on'{unused}) \
         DELETE FROM {s}.items WHERE {rows} \
         RETURNING id, payload, \
           pg_try_advisory_xact_lock({item_key}, id::bit(32)::int4) AS marked"
    )
}

/// The low 32 bits of the ids of rows held by open transactions (their advisory locks).
fn held_ids(item_key: i32) -> String {
    format!(
        "SELECT l.objid::int8 FROM pg_locks l \
         WHERE l.locktype = 'advisory' AND l.classid = {item_key}::oid \
         AND l.objsubid = 2 AND l.granted \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
}

/// `counts` rows above this many for a queue (their sum is read by every `stats()` and
/// `count()`) are folded after the read ([`Sql::fold`]).
pub(super) const FOLD_AT: i64 = 64;

/// The CTEs `stats()` and `count()` share (`$1` the queue, `$2` now), ending in `c`, one row
/// of the queue's figures (see migrate.rs, `to_v4`, for `counts` and its classes):
/// `unleased` (rows not leased: the sums of classes 0 and up), `delayed` (the sums of the
/// buckets after the current one, and the rows of the current bucket counted, an index
/// range of at most 65.536 s of due times), `live` and `expired` (leases, counted on their
/// index: as many as are in flight), `held` (rows of the queue whose id an open
/// transaction's advisory lock marks, looked up by key), `dead`. Visible is
/// `unleased - delayed + expired - held` ([`VISIBLE`]). Nothing here reads a row per
/// queued item: the cost is that of the leases, the held items and the items falling due
/// within the current bucket, whatever the backlog. `k_rows`: how many `counts` rows were
/// summed.
fn counted(s: &str, item_key: i32) -> String {
    format!(
        "t AS (SELECT coalesce($2::int8, {DB_NOW}) AS now), \
         pol AS (SELECT max_attempts FROM {s}.queues WHERE id = $1), \
         k AS (SELECT class, sum(n)::int8 AS n, count(*) AS rows FROM {s}.counts \
           WHERE queue = $1 GROUP BY class), \
         k_rows AS (SELECT coalesce(sum(rows), 0)::int8 AS rows FROM k), \
         h AS ({held}), \
         held AS (SELECT i.id FROM {s}.items i WHERE i.queue = $1 AND i.id IN (\
           SELECT h.objid + (g.g << 32) FROM h, \
             generate_series(0::int8, coalesce((SELECT max(id) FROM {s}.items), 0) >> 32) \
             AS g(g))), \
         lz AS (SELECT i.id, i.leased_until, i.attempts, i.ready_ms, i.enqueued_ms \
           FROM {s}.items i WHERE i.queue = $1 AND i.leased_until IS NOT NULL), \
         c AS (SELECT \
           (SELECT coalesce(sum(n), 0) FROM k WHERE class >= 0)::int8 AS unleased, \
           ((SELECT coalesce(sum(n), 0) FROM k WHERE class > ({NOW_T} >> 16) + 1) \
             + (SELECT count(*) FROM {s}.items i WHERE i.queue = $1 \
               AND i.leased_until IS NULL AND i.ready_ms > {NOW_T} \
               AND i.ready_ms < ((({NOW_T} >> 16) + 1) << 16)))::int8 AS delayed, \
           (SELECT count(*) FROM lz WHERE leased_until > {NOW_T}) AS live, \
           (SELECT count(*) FROM lz WHERE leased_until <= {NOW_T} \
             AND attempts < (SELECT max_attempts FROM pol)) AS expired, \
           (SELECT count(*) FROM held) AS held, \
           (SELECT coalesce(sum(n), 0) FROM k WHERE class = -2)::int8 AS dead)",
        held = held_ids(item_key),
    )
}

/// After a `stats()` or `count()` that summed `rows` rows of `counts` for `queue`: folds
/// them ([`Sql::fold`]) when they are more than [`FOLD_AT`]. Housekeeping, best effort: the
/// caller has its figures, and a role that may only read (an operator's `rq stats`, a
/// standby) cannot fold; a failure is logged and the next call tries again.
pub(super) async fn fold_if_due(
    client: &deadpool_postgres::Object,
    sql: &Sql,
    queue: i32,
    now: Option<i64>,
    rows: i64,
) {
    if rows > FOLD_AT {
        if let Err(e) = client.execute(&sql.fold, &[&queue, &now]).await {
            tracing::debug!(error = %e, queue, rows, "the queue's counts were not folded");
        }
    }
}

/// Visible items, from [`counted`]'s `c`.
const VISIBLE: &str = "(unleased - delayed + expired - held)";

/// What begins a transaction: `BEGIN`, and the server process's id (one row, one column)
/// in the same message.
pub(super) const BEGIN: &str =
    "BEGIN; SET LOCAL reliable_queue.in_transaction = 'on'; SELECT pg_backend_pid()";

/// [`BEGIN`] on a connection whose server process is known already.
pub(super) const BEGIN_KNOWN: &str = "BEGIN; SET LOCAL reliable_queue.in_transaction = 'on'";

/// The processing layer's statements, with the schema spliced in. Every one takes the time
/// as a nullable `int8` parameter (`NULL`: the database's clock).
#[derive(Debug)]
pub(super) struct ProcSql {
    /// `$1` queue, `$2` n, `$3` now, `$4` ttl: leases up to n visible rows at the head
    /// (burying on the way up to 100 expired at the maximum attempts). One row per lease,
    /// or one of NULLs when none; each row also has how many were buried, and the queue's
    /// name when some were (for the metrics).
    pub(super) lease: String,
    /// `$1` tokens: leases handed to nobody (an item that did not decode) given back as
    /// they were, their attempt not counted.
    pub(super) unlease: String,
    /// `$1` tokens, `$2` now: acknowledged leases deleted; returns the tokens found live.
    pub(super) ack: String,
    /// `$1` queue, `$2` token, `$3` now, `$4` reason: a failed lease retried after the
    /// queue's backoff or buried. Returns whether the lease was live, and the retry time.
    pub(super) fail: String,
    /// `$1` token, `$2` now, `$3` delay: a lease given back (at the head for no delay).
    pub(super) release: String,
    /// `$1` token, `$2` now, `$3` ttl: a new deadline for a live lease.
    pub(super) extend: String,
    /// `$1` queue, `$2` now, `$3` retention (NULL: none): every expired lease at the
    /// maximum attempts to dead letters, and dead letters past the retention deleted.
    pub(super) bury: String,
    /// `$1` queue, `$2` now, `$3` retention (NULL: none): counts, the queue's policy, and
    /// how many rows of `counts` the queue has (see [`Sql::fold`]). Reads the queue's counts,
    /// not its rows (see [`counted`]). Writes nothing: what [`ProcSql::bury`] would do now
    /// is counted as done (an expired lease at the maximum attempts is dead, a dead letter
    /// past the retention is gone), so an operator's role that may only read gets the same
    /// figures.
    pub(super) stats: String,
    /// `$1` queue, `$2` after, `$3` limit, `$4` now.
    pub(super) browse: String,
    /// `$1` queue, `$2` after, `$3` limit.
    pub(super) dead: String,
    /// `$1` queue, `$2` ids or NULL, `$3` limit or NULL, `$4` reset attempts, `$5` now:
    /// dead letters back at the tail; returns their ids.
    pub(super) replay: String,
    /// `$1` queue, `$2` ids or NULL, `$3` limit or NULL: dead letters deleted.
    pub(super) purge: String,
    /// `$1` queue, policy columns `$2..$5`.
    pub(super) set_policy: String,
    /// Delayed and keyed enqueues: `$1` queues, `$2` payloads, `$3` delays, `$4` due
    /// times, `$5` keys, `$6` now. A key already in its queue makes that row a no-op.
    pub(super) insert: String,
    /// `$1` queue, `$2` now: when the next delayed item or lease of the queue falls due.
    pub(super) next_due: String,
    /// Imported items: `$1` queues, `$2` payloads, `$3` attempts, `$4` due times, `$5`
    /// enqueue times, `$6` first and `$7` latest attempt times (0: unknown), `$8` now.
    pub(super) import_items: String,
    /// Imported dead letters: as [`import_items`](Self::import_items) without the due
    /// times, `$4` reasons.
    pub(super) import_dead: String,
}

const NOW_T: &str = "(SELECT now FROM t)";

impl ProcSql {
    fn new(schema: &str, item_key: i32) -> ProcSql {
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
                "WITH {counted} \
                 SELECT greatest({VISIBLE}, 0)::int8, greatest(delayed, 0)::int8, live, held, \
                   greatest(dead \
                     + (SELECT count(*) FROM lz WHERE leased_until <= {NOW_T} \
                       AND attempts >= (SELECT max_attempts FROM pol)) \
                     - (SELECT count(*) FROM {s}.dead_letters WHERE queue = $1 \
                       AND died_ms < {NOW_T} - $3::int8), 0)::int8, \
                   coalesce(\
                     (SELECT enqueued_ms FROM lz WHERE leased_until <= {NOW_T} \
                       AND attempts < (SELECT max_attempts FROM pol) \
                       AND id NOT IN (SELECT id FROM held) ORDER BY ready_ms, id LIMIT 1), \
                     (SELECT i.enqueued_ms FROM {s}.items i WHERE i.queue = $1 \
                       AND i.leased_until IS NULL AND i.ready_ms <= {NOW_T} \
                       AND i.id NOT IN (SELECT id FROM held) ORDER BY i.ready_ms, i.id LIMIT 1)), \
                   (SELECT max_attempts FROM {s}.queues WHERE id = $1), \
                   (SELECT initial_backoff_ms FROM {s}.queues WHERE id = $1), \
                   (SELECT max_backoff_ms FROM {s}.queues WHERE id = $1), \
                   (SELECT jitter_per_mille FROM {s}.queues WHERE id = $1), \
                   (SELECT rows FROM k_rows) \
                 FROM c",
                counted = counted(&s, item_key),
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

// ---- values of the statements' `int8` parameters and columns ----

/// An `int8` column the engine writes only non-negative (an id, a lease token, a time in ms,
/// a count) as a `u64`. A negative one, which only a row written by hand can hold, reads as 0.
pub(super) fn ms(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// [`ms`] of a column that may be `NULL` (0).
pub(super) fn opt_ms(v: Option<i64>) -> u64 {
    v.map_or(0, ms)
}

/// A `LIMIT` of "up to `n`". Saturating on purpose: no table holds more than `i64::MAX`
/// rows, so a larger `n` asks for the same rows as `i64::MAX` does.
pub(super) fn up_to(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An id to list from ("ids above `after`"). Saturating on purpose: ids are `int8`, so none
/// is above `i64::MAX`, and a larger `after` finds what `i64::MAX` does: nothing.
pub(super) fn after_id(after: u64) -> i64 {
    i64::try_from(after).unwrap_or(i64::MAX)
}

/// The injected clock's time for a statement's `now`. Saturating on purpose: a manual clock
/// saturates itself (`ManualClock::advance`), and past `i64::MAX` ms it reads as the last
/// time an `int8` holds (where the statements' deadlines overflow and fail, never wrap).
pub(super) fn clock_ms(now: u64) -> i64 {
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// A value passed back to an `int8` parameter that is in range unless this crate has a bug:
/// one read from an `int8` column (a lease token), or checked by the caller against a
/// maximum far below `i64::MAX` (a lease time, a delay). Out of range it is [`Error::Bug`]
/// with `invariant`, and nothing is sent.
pub(crate) fn int8(v: u64, invariant: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::Bug { invariant })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_per_schema_non_negative_and_apart() {
        let (a, b) = (LockKeys::of("reliable_queue"), LockKeys::of("other"));
        assert_ne!(a.item, b.item);
        for keys in [a, b] {
            assert!(keys.item >= 0 && keys.watch >= 0);
            assert_ne!(keys.item, keys.watch);
        }
    }

    #[test]
    fn channels_fit_an_identifier_and_differ_per_schema() {
        let long_a = "a".repeat(63);
        let long_b = format!("{}b", "a".repeat(62));
        assert_eq!(channel_of("jobs"), "rq_jobs");
        assert_eq!(channel_of(&"s".repeat(60)).len(), 63);
        for schema in [&long_a, &long_b, &"x".repeat(61)] {
            assert!(channel_of(schema).len() <= 63, "{schema}");
        }
        assert_ne!(channel_of(&long_a), channel_of(&long_b));
    }

    #[test]
    fn the_dequeue_statement_needs_a_transaction_begun_by_the_store() {
        let sql = Sql::new("s");
        assert!(sql.take.contains(IN_TRANSACTION), "{}", sql.take);
        assert!(BEGIN.contains(IN_TRANSACTION) && BEGIN.contains("SET LOCAL"));
    }

    #[test]
    fn an_int8_out_of_range_is_a_bug_and_limits_saturate() {
        assert_eq!(int8(7, "x").ok(), Some(7));
        assert!(matches!(
            int8(u64::MAX, "x"),
            Err(Error::Bug { invariant: "x" })
        ));
        assert_eq!(up_to(usize::MAX), i64::MAX);
        assert_eq!(after_id(u64::MAX), i64::MAX);
    }
}
