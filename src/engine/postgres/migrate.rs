//! The schema's version and its migrations: the tables of version 3 created, or an older
//! schema brought up to it, under an advisory lock; a schema at this build's version is only
//! read.

use deadpool_postgres::Object;

use super::failure::pg;
use super::pool::Pool;
use crate::error::{Error, Result};

/// The schema version this build reads and writes.
const SCHEMA_VERSION: i64 = 3;

/// The schema's tables, version 3 (see ARCHITECTURE.md, "The PostgreSQL engine"): built
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
         {v2}{v3}",
        v2 = to_v2(schema, false),
        v3 = to_v3(schema)
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
                1 => Some(format!("{}{}", to_v2(schema, true), to_v3(schema))),
                2 => Some(to_v3(schema)),
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
