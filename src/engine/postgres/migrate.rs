//! The schema's version and its migrations: the tables of version 3 created, or an older
//! schema brought up to it, under an advisory lock; a schema at this build's version is only
//! read.

use deadpool_postgres::Object;

use super::failure::pg;
use super::pool::Pool;
use crate::error::{Error, Result};

/// The schema version this build reads and writes.
const SCHEMA_VERSION: i64 = 4;

/// The schema's tables, version 4 (see ARCHITECTURE.md, "The PostgreSQL engine"): built
/// by the same steps a migrated schema went through, so both end the same.
fn create_tables(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "CREATE TABLE {s}.queues (\
           id serial PRIMARY KEY, \
           name text NOT NULL UNIQUE); \
         CREATE TABLE {s}.items (\
           id bigserial PRIMARY KEY, \
           queue int4 NOT NULL REFERENCES {s}.queues (id), \
           payload bytea NOT NULL, \
           attempts int4 NOT NULL DEFAULT 0, \
           lease_token int8, \
           dedup_key bytea); \
         {v2}{v3}{v4}",
        v2 = to_v2(schema, false),
        v3 = to_v3(schema),
        v4 = to_v4(schema)
    )
}

/// The class of an `items` row in `counts` (SQL, of the row's columns): `-1` leased; `0`
/// not leased and due when written (its due time not after its enqueue time); else not
/// leased with a due time in the 65.536 s bucket `(ready_ms >> 16) + 1` (at least 1).
/// `-2` is the dead letters'. The statements of `stats()` and `count()` read the classes.
const CLASS_OF: &str = "CASE WHEN leased_until IS NOT NULL THEN -1::int8 \
     WHEN ready_ms <= enqueued_ms THEN 0::int8 \
     ELSE greatest((ready_ms >> 16) + 1, 1) END";

/// From version 3 to version 4: per-queue counts kept by the database, and the vacuum
/// settings of a queue's tables.
///
/// `counts(queue, class, backend, n)`: how many rows of each class (see [`CLASS_OF`]) the
/// queue has, as sums over rows kept per server process (`backend`: the writer's
/// `pg_backend_pid()`, 0 for rows folded together), so that concurrent transactions never
/// update the same row (no waits, no deadlocks between them). Statement-level triggers on
/// `items` and `dead_letters` add each statement's changes in the statement's own
/// transaction: the counts commit or roll back with the rows, whoever writes them (this
/// engine, an older build still connected, the user's own SQL). `stats()` and `count()`
/// read the sums and look at rows only where time alone changes a row's state (delayed
/// rows coming due within the current bucket, leases), so their cost does not grow with
/// the backlog.
///
/// Vacuum: a queue's rows are deleted at the head and inserted at the tail all day, and the
/// default thresholds (20% of the table) let a 1,000,000-row table gather 200,000 dead rows
/// before a vacuum, which every dequeue then walks over. `items` is vacuumed from 1% of
/// its rows plus 1,000 dead, unthrottled; `counts`, a few rows rewritten at every commit,
/// from 200. `items` keeps 10% of each page free (fillfactor 90) so that an update of a
/// row that changes no indexed column (extending a lease) stays on its page.
fn to_v4(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    let sum = |rows: &str, sign: &str| {
        format!("SELECT queue, {CLASS_OF} AS class, {sign}1 AS d FROM {rows}")
    };
    let upsert = |select: &str| {
        format!(
            "INSERT INTO {s}.counts AS c (queue, class, backend, n) \
               SELECT queue, class, pg_backend_pid(), sum(d) FROM ({select}) x \
               GROUP BY queue, class HAVING sum(d) <> 0 \
             ON CONFLICT (queue, class, backend) DO UPDATE SET n = c.n + EXCLUDED.n; \
             RETURN NULL;"
        )
    };
    let function = |name: &str, body: &str| {
        format!(
            "CREATE FUNCTION {s}.{name}() RETURNS trigger LANGUAGE plpgsql AS $rq$ \
             BEGIN {body} END $rq$; "
        )
    };
    let dead = |rows: &str, sign: &str| {
        format!("SELECT queue, -2::int8 AS class, {sign}1 AS d FROM {rows}")
    };
    format!(
        "CREATE TABLE {s}.counts (\
           queue int4 NOT NULL, \
           class int8 NOT NULL, \
           backend int4 NOT NULL, \
           n int8 NOT NULL, \
           PRIMARY KEY (queue, class, backend)) \
         WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, \
           autovacuum_vacuum_threshold = 200, autovacuum_vacuum_cost_delay = 0); \
         {items_in}{items_out}{items_moved}{dead_in}{dead_out}\
         CREATE TRIGGER items_in AFTER INSERT ON {s}.items REFERENCING NEW TABLE AS fresh \
           FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_items_in(); \
         CREATE TRIGGER items_out AFTER DELETE ON {s}.items REFERENCING OLD TABLE AS gone \
           FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_items_out(); \
         CREATE TRIGGER items_moved AFTER UPDATE ON {s}.items \
           REFERENCING OLD TABLE AS gone NEW TABLE AS fresh \
           FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_items_moved(); \
         CREATE TRIGGER dead_in AFTER INSERT ON {s}.dead_letters REFERENCING NEW TABLE AS fresh \
           FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_dead_in(); \
         CREATE TRIGGER dead_out AFTER DELETE ON {s}.dead_letters \
           REFERENCING OLD TABLE AS gone \
           FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_dead_out(); \
         INSERT INTO {s}.counts (queue, class, backend, n) \
           SELECT queue, class, 0, count(*) FROM (\
             SELECT queue, {CLASS_OF} AS class FROM {s}.items \
             UNION ALL SELECT queue, -2 FROM {s}.dead_letters) x \
           GROUP BY queue, class; \
         ALTER TABLE {s}.items SET (fillfactor = 90, \
           autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, \
           autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02, \
           autovacuum_vacuum_cost_delay = 0); \
         ALTER TABLE {s}.dead_letters SET (autovacuum_vacuum_scale_factor = 0.05); \
         INSERT INTO {s}.meta (key, value) VALUES ('schema_version', '4') \
           ON CONFLICT (key) DO UPDATE SET value = '4';",
        items_in = function("count_items_in", &upsert(&sum("fresh", ""))),
        items_out = function("count_items_out", &upsert(&sum("gone", "-"))),
        items_moved = function(
            "count_items_moved",
            &upsert(&format!(
                "{} UNION ALL {}",
                sum("fresh", ""),
                sum("gone", "-")
            ))
        ),
        dead_in = function("count_dead_in", &upsert(&dead("fresh", ""))),
        dead_out = function("count_dead_out", &upsert(&dead("gone", "-"))),
    )
}

/// From version 2 to version 3: no foreign keys from `items` and `dead_letters` to
/// `queues`. The check of one takes a `FOR KEY SHARE` lock on the queue's row in every
/// inserting transaction; concurrent committers to one queue share that lock through a
/// multixact, written to the queue's row (and logged) at each commit, and every dequeue
/// that reads the queue's row resolves it. Queues are never deleted, and the engine only
/// writes queue ids it read from `queues`, so the keys hold without them.
fn to_v3(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "ALTER TABLE {s}.items DROP CONSTRAINT IF EXISTS items_queue_fkey; \
         ALTER TABLE {s}.dead_letters DROP CONSTRAINT IF EXISTS dead_letters_queue_fkey; \
         INSERT INTO {s}.meta (key, value) VALUES ('schema_version', '3') \
           ON CONFLICT (key) DO UPDATE SET value = '3';"
    )
}

/// From version 1 (no processing layer: its time columns were never used but for
/// `enqueued_at`) to version 2; `from_v1` converts existing rows, else the tables were
/// just created in version 1's shape.
fn to_v2(schema: &str, from_v1: bool) -> String {
    let s = format!("\"{schema}\"");
    let convert = if from_v1 {
        format!(
            "UPDATE {s}.items SET \
               enqueued_ms = (extract(epoch FROM enqueued_at) * 1000)::int8, \
               ready_ms = (extract(epoch FROM coalesce(not_before, enqueued_at)) * 1000)::int8; \
             ALTER TABLE {s}.items DROP COLUMN enqueued_at, DROP COLUMN not_before, \
               DROP COLUMN leased_until, DROP COLUMN first_attempt, DROP COLUMN last_attempt; \
             ALTER TABLE {s}.queues DROP COLUMN retry_policy; \
             DROP INDEX {s}.items_queue_id; "
        )
    } else {
        String::new()
    };
    format!(
        "ALTER TABLE {s}.items ADD COLUMN enqueued_ms int8, ADD COLUMN ready_ms int8; \
         {convert}\
         ALTER TABLE {s}.items ALTER COLUMN enqueued_ms SET NOT NULL, \
           ALTER COLUMN ready_ms SET NOT NULL, \
           ADD COLUMN leased_until int8, \
           ADD COLUMN first_attempt_ms int8, \
           ADD COLUMN last_attempt_ms int8; \
         ALTER TABLE {s}.queues \
           ADD COLUMN max_attempts int4 NOT NULL DEFAULT 5, \
           ADD COLUMN initial_backoff_ms int8 NOT NULL DEFAULT 1000, \
           ADD COLUMN max_backoff_ms int8 NOT NULL DEFAULT 600000, \
           ADD COLUMN jitter_per_mille int4 NOT NULL DEFAULT 200; \
         CREATE INDEX items_ready ON {s}.items (queue, ready_ms, id) \
           WHERE leased_until IS NULL; \
         CREATE INDEX items_leased ON {s}.items (queue, leased_until) \
           WHERE leased_until IS NOT NULL; \
         CREATE UNIQUE INDEX items_token ON {s}.items (lease_token) \
           WHERE lease_token IS NOT NULL; \
         CREATE UNIQUE INDEX items_key ON {s}.items (queue, dedup_key) \
           WHERE dedup_key IS NOT NULL; \
         CREATE SEQUENCE {s}.lease_tokens; \
         CREATE TABLE {s}.dead_letters (\
           id bigserial PRIMARY KEY, \
           queue int4 NOT NULL REFERENCES {s}.queues (id), \
           payload bytea NOT NULL, \
           reason text NOT NULL, \
           attempts int4 NOT NULL, \
           enqueued_ms int8 NOT NULL, \
           first_attempt_ms int8, \
           last_attempt_ms int8, \
           dedup_key bytea, \
           died_ms int8 NOT NULL); \
         CREATE INDEX dead_letters_queue ON {s}.dead_letters (queue, id); \
         CREATE INDEX dead_letters_died ON {s}.dead_letters (queue, died_ms); \
         INSERT INTO {s}.meta (key, value) VALUES ('schema_version', '2') \
           ON CONFLICT (key) DO UPDATE SET value = '2';"
    )
}

/// The version of the store's schema in the database, read without a lock and without
/// DDL; `None` when the schema or its `meta` table is not there.
async fn schema_version(client: &Object, schema: &str) -> Result<Option<i64>> {
    let s = format!("\"{schema}\"");
    let exists = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{s}.meta")],
        )
        .await
        .map_err(|e| pg("migrate", e))?;
    if !exists.try_get::<_, bool>(0).map_err(|e| pg("migrate", e))? {
        return Ok(None);
    }
    let found = client
        .query_opt(
            &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .map_err(|e| pg("migrate", e))?;
    Ok(match found {
        None => None,
        Some(row) => {
            let text: String = row.try_get(0).map_err(|e| pg("migrate", e))?;
            Some(text.trim().parse::<i64>().unwrap_or(-1))
        }
    })
}

/// Checks the schema's version and, when `create` allows, creates the schema's tables or
/// migrates them under an advisory lock. A schema at this build's version is only read: a
/// role without the privilege to create (a worker's, an operator's) connects to it.
pub(super) async fn migrate(pool: &Pool, schema: &str, create: bool) -> Result<()> {
    let mut client = pool.get().await.map_err(|e| pg("connect", e))?;
    let version = schema_version(&client, schema).await?;
    match version {
        Some(SCHEMA_VERSION) => return Ok(()),
        Some(found) if !create || !(1..SCHEMA_VERSION).contains(&found) => {
            return Err(Error::SchemaVersion {
                schema: schema.to_owned(),
                found,
                supported: SCHEMA_VERSION,
            })
        }
        None if !create => {
            return Err(Error::SchemaMissing {
                schema: schema.to_owned(),
            })
        }
        _ => {}
    }
    let tx = client.transaction().await.map_err(|e| pg("migrate", e))?;
    // Two int4 keys (objsubid 2 in pg_locks): apart from the items' int8 keys.
    tx.execute(
        "SELECT pg_advisory_xact_lock(2107, hashtext($1))",
        &[&schema],
    )
    .await
    .map_err(|e| pg("migrate", e))?;
    let s = format!("\"{schema}\"");
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s}; \
         CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL);"
    ))
    .await
    .map_err(|e| pg("migrate", e))?;
    let found = tx
        .query_opt(
            &format!("SELECT value FROM {s}.meta WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .map_err(|e| pg("migrate", e))?;
    match found {
        None => tx
            .batch_execute(&create_tables(schema))
            .await
            .map_err(|e| pg("migrate", e))?,
        Some(row) => {
            let text: String = row.get(0);
            let version = text.trim().parse::<i64>().unwrap_or(-1);
            let steps = match version {
                SCHEMA_VERSION => None,
                1 => Some(format!(
                    "{}{}{}",
                    to_v2(schema, true),
                    to_v3(schema),
                    to_v4(schema)
                )),
                2 => Some(format!("{}{}", to_v3(schema), to_v4(schema))),
                3 => Some(to_v4(schema)),
                found => {
                    return Err(Error::SchemaVersion {
                        schema: schema.to_owned(),
                        found,
                        supported: SCHEMA_VERSION,
                    })
                }
            };
            if let Some(steps) = steps {
                tx.batch_execute(&steps)
                    .await
                    .map_err(|e| pg("migrate", e))?;
            }
        }
    }
    tx.commit().await.map_err(|e| pg("migrate", e))
}
