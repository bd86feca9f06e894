//! The PostgreSQL engine (feature `postgres`): queues as rows of one table, shared by every
//! process and machine that connects to the same database and schema.
//!
//! A transaction is one database transaction on a pooled connection, begun by its first
//! dequeue. A dequeue deletes the head row that no other transaction holds (`FOR UPDATE SKIP
//! LOCKED`) inside that transaction and takes a transaction-scoped advisory lock on the row's
//! id, so that `count` can tell held rows from visible ones (`pg_locks`); a rollback (abort,
//! drop, a lost connection, a crashed process) puts every row back at once. Enqueues are
//! buffered by the handle and written at commit by one `INSERT` of every item.
//!
//! The client is tokio-postgres with a deadpool pool. Both run on a current-thread tokio
//! runtime of the store's own, on a thread of its own (`reliable-queue-postgres`): every
//! database call is a task spawned there, so the async forms work under any executor and the
//! blocking forms wait on the task's handle. A connection inside an open database transaction
//! is always owned by a [`PgTx`], whose drop rolls back (in a task, without blocking the
//! caller) before the connection goes back to the pool, also when the caller's future was
//! dropped half way.
//!
//! ARCHITECTURE.md ("The PostgreSQL engine") has the schema and the statements.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, PoolError, RecyclingMethod, TimeoutType};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Row, Socket};

mod processing;

use super::catalog::Catalog;
use super::Entry;
use crate::clock::Clock;
use crate::config::PgConfig;
use crate::core::{QueueCore, QueueId};
use crate::engine::proc::EXPIRED;
use crate::error::{Error, Result};
use crate::processing::{max_delay_ms, RetryPolicy, MAX_ATTEMPTS};
use crate::sync::process::Mutex;

/// The schema version this build reads and writes.
pub(crate) const SCHEMA_VERSION: i64 = 3;

/// The database's clock in milliseconds since the epoch: the time of every statement unless
/// the store runs on an injected clock (tests), whose time is then passed instead.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// A setting that is `on` only inside a database transaction begun by the store ([`BEGIN`]
/// sets it `LOCAL`ly): the dequeue statement takes nothing without it, so a dequeue sent
/// together with its `BEGIN` can never delete rows outside a transaction, whatever happened
/// to the `BEGIN`.
const IN_TRANSACTION: &str = "reliable_queue.in_transaction";

/// How long a call waits for a pooled connection when every one is in use.
pub(crate) const POOL_WAIT: Duration = Duration::from_secs(30);

/// How long one connection attempt to one host may take, TCP connect, TLS and the
/// server's startup included, when the URL sets no `connect_timeout`: a port that accepts
/// connections but never answers as PostgreSQL would otherwise hold the caller for ever.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The first keys of the schema's advisory locks (two-key form, objsubid 2 in `pg_locks`):
/// `item` marks a row held by an open transaction (second key: the low 32 bits of its id),
/// `watch` says "a store has consumers waiting on queue `objid`". Both come from the schema's
/// name, so that stores in other schemas of the same database (whose ids and queue ids
/// overlap with this one's) do not see each other's locks.
#[derive(Debug, Clone, Copy)]
struct LockKeys {
    item: i32,
    watch: i32,
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
struct Sql {
    schema: String,
    keys: LockKeys,
    /// `$1` the queue's id, `$2` how many, `$3` now: deletes up to that many rows at the head
    /// that no other transaction holds, takes the advisory locks that mark them held, returns
    /// `(id, payload)` of each (in no particular order).
    take: String,
    /// [`take`](Self::take) for one row (`$2` ignored).
    take_one: String,
    /// `$1` queue id, `$2` payload, `$3` now: one item (the commonest commit).
    insert_one: String,
    /// `$1` queue ids, `$2` payloads, in commit order.
    insert: String,
    /// `$1` the queue's id: visible rows, not counting those held by open transactions.
    count: String,
    /// `$1` the queue's name: its id and retry policy, the row created if need be. Always
    /// one row: `DO UPDATE` (of nothing) returns the row another session created while the
    /// statement ran, which a read in the statement's snapshot would miss.
    queue: String,
    /// `$1` the queue's name: the columns of [`queue`](Self::queue), if its row exists.
    queue_read: String,
    /// `$1` the channel, `$2` queue ids a commit enqueued to: notifies those that some store
    /// has consumers waiting on. Sent after the commit, never inside it. "Someone waits" is
    /// a listener's shared advisory lock on the queue's watch key: the statement tries the
    /// exclusive lock (released at once, with the statement's own transaction) and notifies
    /// where that fails. Two committers trying at the same moment may both notify, which
    /// only costs a spurious wake-up; it never reads `pg_locks` (which takes every partition
    /// of the server's lock table).
    notify: String,
    /// The channel every store of the schema listens on; the payload is a queue id.
    channel: String,
    /// The processing layer's statements.
    proc: ProcSql,
    /// The server process of each pooled connection, once learnt.
    pids: Mutex<HashMap<deadpool_postgres::ObjectId, i32>>,
}

impl Sql {
    fn new(schema: &str) -> Sql {
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
                "WITH t AS (SELECT coalesce($2::int8, {DB_NOW}) AS now) \
                 SELECT count(*) FROM {s}.items i \
                 WHERE i.queue = $1 AND {is_visible} \
                 AND (i.id & 4294967295) NOT IN ({held})",
                is_visible = is_visible(&s, "$1"),
                held = held_ids(item_key)
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

    /// The schema's tables, version 3 (see ARCHITECTURE.md, "The PostgreSQL engine"): built
    /// by the same steps a migrated schema went through, so both end the same.
    fn create(&self) -> String {
        let s = format!("\"{}\"", self.schema);
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
            v2 = self.to_v2(false),
            v3 = self.to_v3()
        )
    }

    /// From version 2 to version 3: no foreign keys from `items` and `dead_letters` to
    /// `queues`. The check of one takes a `FOR KEY SHARE` lock on the queue's row in every
    /// inserting transaction; concurrent committers to one queue share that lock through a
    /// multixact, written to the queue's row (and logged) at each commit, and every dequeue
    /// that reads the queue's row resolves it. Queues are never deleted, and the engine only
    /// writes queue ids it read from `queues`, so the keys hold without them.
    fn to_v3(&self) -> String {
        let s = format!("\"{}\"", self.schema);
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
    fn to_v2(&self, from_v1: bool) -> String {
        let s = format!("\"{}\"", self.schema);
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

/// Is row `i` visible (due, not leased or its lease expired below the maximum attempts)?
/// Does not look at whether a transaction holds it. Needs the CTE `t(now)`.
fn is_visible(s: &str, queue: &str) -> String {
    format!(
        "((i.leased_until IS NULL AND i.ready_ms <= (SELECT now FROM t)) \
          OR (i.leased_until <= (SELECT now FROM t) \
              AND i.attempts < (SELECT max_attempts FROM {s}.queues WHERE id = {queue})))"
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

/// What the caller's own SQL gave.
#[derive(Debug)]
pub(crate) enum SqlOutcome {
    /// Rows a statement affected.
    Affected(u64),
    /// A query's rows.
    Rows(Vec<tokio_postgres::Row>),
}

/// A transaction's hold on PostgreSQL, as its `Work` keeps it: nothing yet (no dequeue: an
/// enqueue-only transaction needs no connection before its commit), or its [`PgTx`]. One
/// pointer wide, so the embedded engines' `Work` grows by no more than that.
#[derive(Debug, Default)]
pub(crate) struct PgSlot(Option<Box<PgTx>>);

/// Why a transaction was rolled back before its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aborted {
    /// A call's future was dropped while its task had the connection.
    Cancelled,
    /// A statement failed inside the database transaction.
    Failed,
}

impl Aborted {
    fn error(self) -> Error {
        Error::TransactionAborted {
            reason: match self {
                Aborted::Cancelled => {
                    "a call on the transaction was cancelled while the database worked on it"
                }
                Aborted::Failed => "a statement failed inside the database transaction",
            },
        }
    }
}

impl PgSlot {
    /// Rows dequeued in the open database transaction.
    pub(crate) fn held(&self) -> usize {
        self.0.as_ref().map_or(0, |tx| tx.held)
    }

    /// Has the transaction taken a connection (or been aborted)?
    pub(crate) fn is_idle(&self) -> bool {
        self.0.is_none()
    }

    /// The server process of the open database transaction, if one is open.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.0.as_ref().filter(|tx| tx.open).and_then(|tx| tx.pid)
    }

    /// The transaction's deadline passed: its connection is closed when dropped, never
    /// reused (see [`PgTx::discard`]).
    pub(crate) fn discard(&mut self) {
        if let Some(tx) = &mut self.0 {
            tx.discard = true;
        }
    }

    /// Takes the connection out for a call, leaving an aborted marker until
    /// [`end_call`](Self::end_call) puts it back: a call whose future is dropped half way
    /// leaves the transaction aborted, never silently without its database transaction.
    fn begin_call(&mut self, rt: &Handle) -> Result<Box<PgTx>> {
        let marker = Box::new(PgTx::aborted(rt.clone(), Aborted::Cancelled));
        match self.0.replace(marker) {
            None => Ok(Box::new(PgTx::new(rt.clone()))),
            Some(tx) => match tx.aborted {
                None => Ok(tx),
                Some(why) => {
                    self.0 = Some(tx);
                    Err(why.error())
                }
            },
        }
    }

    fn end_call(&mut self, mut tx: Box<PgTx>) {
        if tx.failed {
            // Kept with its connection, so that the commit or abort that ends the
            // transaction returns only once the server has rolled back and the items are
            // back (S4); dropped instead, it rolls back as it drops.
            tx.aborted = Some(Aborted::Failed);
        }
        self.0 = Some(tx);
    }

    /// The transaction's `PgTx` for its commit or abort (`None` if it has none; its
    /// `aborted` says whether a call aborted it).
    fn take(self) -> Option<Box<PgTx>> {
        self.0
    }
}

/// A connection in a transaction's hands, with or without an open database transaction.
/// Dropped with one open, it rolls back in a task of the store's runtime and only then goes
/// back to the pool; a connection that cannot roll back is dropped from the pool.
pub(crate) struct PgTx {
    client: Option<Object>,
    /// `BEGIN` was sent and neither `COMMIT` nor `ROLLBACK` since.
    open: bool,
    /// Rows dequeued (deleted) in the open database transaction.
    held: usize,
    /// A statement failed inside the open database transaction: it can only roll back.
    failed: bool,
    /// Set on a marker that stands for a transaction rolled back before its commit.
    aborted: Option<Aborted>,
    /// The server process of the connection, learnt with `BEGIN`: a transaction deadline
    /// ends the transaction by ending it (P10).
    pid: Option<i32>,
    /// The transaction's deadline has passed (its session is being ended): the connection
    /// must never go back to the pool.
    discard: bool,
    rt: Handle,
}

impl fmt::Debug for PgTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTx").field("open", &self.open).finish()
    }
}

impl PgTx {
    fn new(rt: Handle) -> PgTx {
        PgTx {
            client: None,
            open: false,
            held: 0,
            failed: false,
            aborted: None,
            pid: None,
            discard: false,
            rt,
        }
    }

    fn aborted(rt: Handle, why: Aborted) -> PgTx {
        let mut tx = PgTx::new(rt);
        tx.aborted = Some(why);
        tx
    }

    /// Is a database transaction open that this side must end? Not past its deadline: that
    /// connection is closed as it drops, and its server process is being ended, which rolls
    /// back.
    fn must_roll_back(&self) -> bool {
        self.open && !self.discard
    }

    fn client(&self) -> Result<&Object> {
        self.client.as_ref().ok_or(Error::Bug {
            invariant: "a PgTx holds its connection until dropped",
        })
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.discard {
            // Closed, never reused: its server process is being ended by the deadline.
            drop(Object::take(client));
            return;
        }
        if !self.open {
            return;
        }
        // The rollback must not block whoever drops the transaction; the connection is
        // reused only once it is out of the transaction.
        self.rt.spawn(async move {
            if client.batch_execute("ROLLBACK").await.is_err() {
                // Broken: out of the pool, closed when dropped (the server rolls back).
                drop(Object::take(client));
            }
        });
    }
}

/// A PostgreSQL failure during `operation`.
fn pg(operation: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Postgres {
        operation,
        source: Arc::new(e),
    }
}

/// The store's pooled connections, with where they go (named in the errors of a
/// connection that could not be made).
#[derive(Clone)]
pub(crate) struct Pool {
    inner: deadpool_postgres::Pool,
    /// The hosts and ports of the URL, for people.
    target: Arc<str>,
    /// How long a new connection may take, all hosts tried.
    bound: Duration,
}

impl Pool {
    /// A connection: an idle one, or a new one made within the connect bound.
    pub(crate) async fn get(&self) -> std::result::Result<Object, ConnectFailed> {
        self.inner.get().await.map_err(|e| match e {
            PoolError::Timeout(TimeoutType::Create) => ConnectFailed::NoAnswer {
                target: Arc::clone(&self.target),
                after: self.bound,
            },
            PoolError::Backend(source) => ConnectFailed::Refused {
                target: Arc::clone(&self.target),
                source,
            },
            other => ConnectFailed::Pool(other),
        })
    }

    fn close(&self) {
        self.inner.close();
    }
}

/// Why the store got no connection.
#[derive(Debug)]
pub(crate) enum ConnectFailed {
    /// Nothing answered as PostgreSQL within the connect bound: a silent or foreign
    /// listener, or a host that drops packets.
    NoAnswer { target: Arc<str>, after: Duration },
    /// The connection was refused or failed (by the network, TLS or the server).
    Refused {
        target: Arc<str>,
        source: tokio_postgres::Error,
    },
    /// The pool's own failure (every connection busy past the wait, or closed).
    Pool(PoolError),
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectFailed::NoAnswer { target, after } => write!(
                f,
                "no answer as PostgreSQL from {target} within {} ms (is it a PostgreSQL \
                 server? the URL's connect_timeout sets the wait per host)",
                after.as_millis()
            ),
            ConnectFailed::Refused { target, .. } => {
                write!(f, "could not connect to {target}")
            }
            ConnectFailed::Pool(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectFailed::NoAnswer { .. } => None,
            ConnectFailed::Refused { source, .. } => Some(source),
            ConnectFailed::Pool(e) => e.source(),
        }
    }
}

/// The hosts and ports a connection string names, for people: `db1:5432,db2:5433`, or a
/// socket directory and port.
fn target_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            tokio_postgres::config::Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(dir) => {
                format!("{}/.s.PGSQL.{}", dir.display(), port(i))
            }
        })
        .collect();
    if !hosts.is_empty() {
        return hosts.join(",");
    }
    let addresses: Vec<String> = config
        .get_hostaddrs()
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{addr}:{}", port(i)))
        .collect();
    if addresses.is_empty() {
        // tokio-postgres refuses to connect without a host: never what a connection used.
        "(no host)".to_owned()
    } else {
        addresses.join(",")
    }
}

/// One connected PostgreSQL store.
pub(crate) struct Postgres {
    rt: Handle,
    /// Ends the runtime's thread (at close).
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The maintenance pass and the listener: ended at close (on the caller's runtime
    /// nothing else would end them).
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pool: Pool,
    sql: Arc<Sql>,
    /// The queues this process has opened: their local cores (for the handles and, later,
    /// the line of local waiters) and their ids in the database.
    catalog: Catalog,
    ids: Mutex<HashMap<QueueId, i32>>,
    /// This store's waiting consumers, woken by the listener.
    waiters: Arc<Waiters>,
    /// The store's clock: only an injected one is used (its time passed to the
    /// statements); otherwise every time is the database's.
    clock: Clock,
    /// How to connect, for the connection that ends an expired transaction's session.
    pg_config: Arc<tokio_postgres::Config>,
    tls: Tls,
    /// `PgConfig::dead_letter_retention`, in ms.
    retention: Option<i64>,
    /// `PgConfig::poll_interval`.
    poll_interval: Duration,
    /// The database ids of the queues this store has opened, for the maintenance pass.
    maintained: Arc<Mutex<Vec<i32>>>,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("schema", &self.sql.schema)
            .finish_non_exhaustive()
    }
}

impl Postgres {
    /// Starts the store's runtime, checks that the server answers, and creates or checks the
    /// schema (under an advisory lock, so that processes starting together migrate once).
    pub(crate) async fn connect(config: &PgConfig, clock: Clock) -> Result<Postgres> {
        config.validate()?;
        let mut pg_config =
            tokio_postgres::Config::from_str(&config.url).map_err(|_| Error::InvalidConfig {
                setting: "postgres_url",
                expected: "a PostgreSQL connection URL or key-value string (libpq syntax)",
            })?;
        // A peer that vanished (a partitioned or powered-off machine) is noticed by TCP
        // keepalives instead of after the kernel's two hours (ignored on Unix sockets).
        pg_config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if let Some(timeout) = config.idle_transaction_timeout {
            let ms = timeout.as_millis().max(1);
            let options = format!(
                "{} -c idle_in_transaction_session_timeout={ms}",
                pg_config.get_options().unwrap_or("")
            );
            pg_config.options(options.trim());
        }
        // libpq's `connect_timeout` bounds a whole attempt on each host; tokio-postgres's
        // only its TCP connect. Each host gets its timeout for the TCP connect, and every
        // connection the whole of them for its startup.
        let per_host = pg_config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        pg_config.connect_timeout(per_host);
        let hosts = pg_config
            .get_hosts()
            .len()
            .max(pg_config.get_hostaddrs().len())
            .max(1);
        let connect_bound = per_host.saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX));
        let target: Arc<str> = Arc::from(target_of(&pg_config));
        let (stop, stopped) = oneshot::channel::<()>();
        let (rt, thread) = match &config.runtime {
            // Checked by `validate`: a multi-thread runtime, whose workers run the tasks
            // whoever polls what.
            Some(handle) => (handle.clone(), None),
            None => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(Error::storage)?;
                let rt = runtime.handle().clone();
                let thread = std::thread::Builder::new()
                    .name("reliable-queue-postgres".into())
                    .spawn(move || {
                        // Ends when `stop` fires or is dropped; tasks still running are
                        // dropped.
                        let _ = runtime.block_on(stopped);
                    })
                    .map_err(Error::storage)?;
                (rt, Some(thread))
            }
        };
        let (commands, listened) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters {
            queues: Mutex::new(HashMap::new()),
            commands,
        });
        let tls = Tls::of(config, &pg_config)?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::Off => Manager::from_config(pg_config.clone(), NoTls, manager_config),
            Tls::On(tls) => Manager::from_config(pg_config.clone(), tls.clone(), manager_config),
        };
        let pool = {
            let _in_runtime = rt.enter();
            // A call that finds every connection busy (held by open transactions) waits at
            // most this long for one, then fails with `Error::Postgres`: never a hang. A new
            // connection gets `connect_bound` for all of its hosts, startup included.
            let inner = deadpool_postgres::Pool::builder(manager)
                .max_size(config.pool_size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .wait_timeout(Some(POOL_WAIT))
                .create_timeout(Some(connect_bound))
                .build()
                .map_err(|e| pg("connect", e))?;
            Pool {
                inner,
                target: target.clone(),
                bound: connect_bound,
            }
        };
        let store = Postgres {
            rt,
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(thread),
            background: Mutex::new(Vec::new()),
            pool,
            sql: Arc::new(Sql::new(&config.schema)),
            catalog: Catalog::default(),
            ids: Mutex::new(HashMap::new()),
            waiters: Arc::clone(&waiters),
            clock,
            pg_config: Arc::new(pg_config.clone()),
            tls: tls.clone(),
            maintained: Arc::new(Mutex::new(Vec::new())),
            poll_interval: config.poll_interval,
            retention: config
                .dead_letter_retention
                .map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX)),
        };
        let pool = store.pool.clone();
        let sql = Arc::clone(&store.sql);
        let create = config.migrate;
        store
            .run(async move { migrate(&pool, &sql, create).await })
            .await?;
        let maintain = store.rt.spawn(maintain(
            store.pool.clone(),
            Arc::clone(&store.sql),
            Arc::clone(&store.maintained),
            store.now_source(),
            store.retention,
        ));
        let listen = store.rt.spawn(listen(
            pg_config,
            connect_bound,
            tls,
            Arc::clone(&store.sql),
            waiters,
            listened,
        ));
        store.background.lock().extend([maintain, listen]);
        Ok(store)
    }

    /// Puts a consumer of `core`'s queue among this store's waiters. Before it first looks
    /// for an item, the consumer waits for the returned receiver (when there is one): then
    /// the listener holds the advisory lock that makes committers notify this queue, so a
    /// commit after that look is never missed.
    pub(crate) fn watch(&self, core: &QueueCore) -> Result<(Watch, Option<oneshot::Receiver<()>>)> {
        let queue = self.db_id(core)?;
        let (notify, first) = {
            let mut queues = self.waiters.queues.lock();
            let waited = queues.entry(queue).or_insert_with(|| Waited {
                count: 0,
                notify: Arc::new(Notify::new()),
            });
            waited.count += 1;
            (Arc::clone(&waited.notify), waited.count == 1)
        };
        let ack = first.then(|| {
            let (ack, acked) = oneshot::channel();
            // A listener gone (store closing) leaves the receiver closed: no wait.
            let _ = self.waiters.commands.send(Command::Watch(queue, ack));
            acked
        });
        let watch = Watch {
            waiters: Arc::clone(&self.waiters),
            queue,
            notify,
        };
        Ok((watch, ack))
    }

    /// How long a waiting consumer waits for a notification before it looks anyway.
    pub(crate) fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// This store's consumers waiting on `core`'s queue now.
    pub(crate) fn waiters(&self, core: &QueueCore) -> usize {
        let Ok(queue) = self.db_id(core) else {
            return 0;
        };
        self.waiters
            .queues
            .lock()
            .get(&queue)
            .map_or(0, |w| w.count)
    }

    /// Waits for a notification for `watch`'s queue, or `timeout`, whichever comes first.
    pub(crate) async fn wait(&self, watch: &Watch, timeout: Duration) {
        let timer = self
            .rt
            .spawn(async move { tokio::time::sleep(timeout).await });
        let notified = watch.notify.notified();
        tokio::pin!(timer, notified);
        tokio::select! {
            () = &mut notified => {}
            _ = &mut timer => {}
        }
        timer.abort();
    }

    /// Has the listener tell the stores waiting on `queues` that items became visible there
    /// (coalesced with the other notifications asked for meanwhile, checked for waiters
    /// after the change committed: see `Sql::notify`). Never inside the transaction: a
    /// `NOTIFY` there holds the server's notification lock through the commit's WAL flush,
    /// serialising committers.
    pub(crate) fn notify(&self, queues: Vec<i32>) {
        self.waiters.notify(queues);
    }

    /// What a transaction deadline does on PostgreSQL: ends the server process `pid` of the
    /// transaction's connection (`pg_terminate_backend`, waiting up to 5 s for it to exit),
    /// which rolls the transaction back: its rows are visible again when this returns. On a
    /// connection of its own, so that a full pool cannot hold it up.
    pub(crate) fn terminator(&self, pid: i32) -> Box<dyn FnOnce() + Send> {
        let (rt, config, tls) = (
            self.rt.clone(),
            Arc::clone(&self.pg_config),
            self.tls.clone(),
        );
        Box::new(move || {
            let ended = rt.spawn(async move {
                let work = async {
                    match tls {
                        Tls::Off => terminate(&config, NoTls, pid).await,
                        Tls::On(tls) => terminate(&config, tls, pid).await,
                    }
                };
                if tokio::time::timeout(Duration::from_secs(10), work)
                    .await
                    .ok()
                    .flatten()
                    .is_none()
                {
                    tracing::warn!(pid, "could not end the session of an expired transaction; the server ends it at its idle timeout");
                }
            });
            // The store's runtime runs it; this thread (the timer's, or the one moving a
            // manual clock) only waits.
            let _ = crate::engine::block_on(ended);
        })
    }

    /// Waits for a notification for any of `watches`' queues, or `timeout`.
    pub(crate) async fn wait_any(&self, watches: &[Watch], timeout: Duration) {
        let timer = self
            .rt
            .spawn(async move { tokio::time::sleep(timeout).await });
        let mut notified: Vec<_> = watches
            .iter()
            .map(|w| Box::pin(w.notify.notified()))
            .collect();
        tokio::pin!(timer);
        std::future::poll_fn(|cx| {
            if timer.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
            for n in &mut notified {
                if n.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(());
                }
            }
            std::task::Poll::Pending
        })
        .await;
        timer.abort();
    }

    /// Waits for `ack` (the listener's lock), at most `timeout`: a listener that is
    /// reconnecting must not hold the consumer up longer than its fallback poll would.
    pub(crate) async fn watched(&self, ack: oneshot::Receiver<()>, timeout: Duration) {
        let timer = self
            .rt
            .spawn(async move { tokio::time::sleep(timeout).await });
        tokio::pin!(timer, ack);
        tokio::select! {
            _ = &mut ack => {}
            _ = &mut timer => {}
        }
        timer.abort();
    }

    /// Runs `task` on the store's runtime.
    async fn run<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.rt.spawn(task).await.map_err(|e| Error::Postgres {
            operation: "run",
            source: Arc::new(e),
        })?
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Opens queue `name`, creating its row if need be; with its retry policy as stored
    /// (`None` when this process had opened it already).
    pub(crate) async fn queue(&self, name: &str) -> Result<(Arc<QueueCore>, Option<RetryPolicy>)> {
        crate::engine::catalog::check_name(name)?;
        if let Some(id) = self.catalog.id_of(name) {
            if self.ids.lock().contains_key(&id) {
                return self
                    .catalog
                    .open_queue(name, |_| Ok(()))
                    .map(|(c, _)| (c, None));
            }
        }
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        let owned = name.to_owned();
        let (db_id, policy) = self
            .run(async move {
                let client = pool.get().await.map_err(|e| pg("queue", e))?;
                // Read first: opening a queue that exists writes nothing (a role that may
                // only read opens it).
                let found = client
                    .query_opt(&sql.queue_read, &[&owned])
                    .await
                    .map_err(|e| pg("queue", e))?;
                let row = match found {
                    Some(row) => row,
                    None => client
                        .query_one(&sql.queue, &[&owned])
                        .await
                        .map_err(|e| pg("queue", e))?,
                };
                let read = || -> std::result::Result<(i32, RetryPolicy), tokio_postgres::Error> {
                    Ok((
                        row.try_get(0)?,
                        RetryPolicy::from_columns(
                            row.try_get(1)?,
                            row.try_get(2)?,
                            row.try_get(3)?,
                            row.try_get(4)?,
                        ),
                    ))
                };
                read().map_err(|e| pg("queue", e))
            })
            .await?;
        let (core, _) = self.catalog.open_queue(name, |_| Ok(()))?;
        self.ids.lock().insert(core.id(), db_id);
        {
            let mut maintained = self.maintained.lock();
            if !maintained.contains(&db_id) {
                maintained.push(db_id);
            }
        }
        Ok((core, Some(policy)))
    }

    pub(crate) fn db_id(&self, core: &QueueCore) -> Result<i32> {
        self.ids.lock().get(&core.id()).copied().ok_or(Error::Bug {
            invariant: "a queue handle's queue has its database id",
        })
    }

    /// Takes up to `n` items at the head of `core`'s queue into the transaction of `slot`
    /// (begun now if need be), in queue order: none if every row is held by another
    /// transaction or the queue is empty. One round trip (two for a transaction's first).
    pub(crate) async fn try_dequeue(
        &self,
        core: &QueueCore,
        slot: &mut PgSlot,
        n: usize,
    ) -> Result<Vec<Entry>> {
        let queue = self.db_id(core)?;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut held = slot.begin_call(&self.rt)?;
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        let now = self.now_param();
        let (held, taken) = self
            .run(async move {
                let taken = take(&pool, &sql, &mut held, queue, n, now).await;
                Ok((held, taken))
            })
            .await?;
        slot.end_call(held);
        taken
    }

    /// Commits: the buffered enqueues in one `INSERT`, then `COMMIT` if a database
    /// transaction is open (else the `INSERT` alone, atomic as one statement).
    pub(crate) async fn commit(
        &self,
        slot: PgSlot,
        enqueues: Vec<(Arc<QueueCore>, Box<[u8]>)>,
        extra: Extra,
    ) -> Result<Vec<Granted>> {
        let tx = slot.take();
        if let Some(why) = tx.as_ref().and_then(|held| held.aborted) {
            // Whatever the rollback gives, the commit's answer is that it did not commit.
            let _rolled_back = self.end(tx).await;
            return Err(why.error());
        }
        let mut queues = Vec::with_capacity(enqueues.len());
        let mut payloads = Vec::with_capacity(enqueues.len());
        for (core, bytes) in enqueues {
            queues.push(self.db_id(&core)?);
            payloads.push(bytes.into_vec());
        }
        if tx.as_ref().is_none_or(|t| !t.open) && queues.is_empty() && extra.is_empty() {
            return Ok(Vec::new());
        }
        let held = tx.unwrap_or_else(|| Box::new(PgTx::new(self.rt.clone())));
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        let now = self.now_param();
        let (granted, notified) = self
            .run(async move {
                let mut held = held;
                let finished = finish(&pool, &sql, &mut held, queues, payloads, extra, now).await;
                if finished.is_err() {
                    // Failed before its `COMMIT` (else nothing is open): rolled back before
                    // the error is returned, so that the items are back when the caller
                    // sees it (S4).
                    let _rolled_back = roll_back(&mut held).await;
                }
                finished
            })
            .await?;
        self.notify(notified);
        Ok(granted)
    }

    /// Runs the caller's `sql` in the transaction of `slot` (begun now if need be). A failing
    /// statement aborts the transaction, as PostgreSQL does.
    pub(crate) async fn sql(
        &self,
        slot: &mut PgSlot,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        rows: bool,
    ) -> Result<SqlOutcome> {
        let mut held = slot.begin_call(&self.rt)?;
        let ran = self.sql_in(&mut held, sql, params, rows).await;
        if ran.is_err() {
            held.failed = true;
        }
        slot.end_call(held);
        ran
    }

    /// [`sql`](Self::sql) once the connection is out of the slot. The statement runs in the
    /// caller's future (the client's requests go to the connection's task on the store's
    /// runtime): a future dropped half way drops `held`, which rolls back.
    async fn sql_in(
        &self,
        held: &mut PgTx,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        rows: bool,
    ) -> Result<SqlOutcome> {
        if held.client.is_none() {
            let pool = self.pool.clone();
            let client = self
                .run(async move { pool.get().await.map_err(|e| pg("sql", e)) })
                .await?;
            held.client = Some(client);
        }
        if !held.open {
            let messages = held
                .client()?
                .simple_query(BEGIN)
                .await
                .map_err(|e| pg("begin", e))?;
            held.pid = backend_pid(&messages);
            held.open = true;
        }
        let client = held.client()?;
        let outcome = if rows {
            client.query(sql, params).await.map(SqlOutcome::Rows)
        } else {
            client.execute(sql, params).await.map(SqlOutcome::Affected)
        };
        outcome.map_err(|e| pg("sql", e))
    }

    /// Rolls back `tx`'s database transaction, if one is open, and waits for the server.
    pub(crate) async fn rollback(&self, slot: PgSlot) -> Result<()> {
        self.end(slot.take()).await
    }

    /// [`roll_back`] of `held`, if it has a database transaction to end (else without a
    /// task).
    async fn end(&self, held: Option<Box<PgTx>>) -> Result<()> {
        match held {
            Some(mut held) if held.must_roll_back() => {
                self.run(async move { roll_back(&mut held).await }).await
            }
            _ => Ok(()),
        }
    }

    /// Items visible in `core`'s queue now: rows not held by an open transaction.
    pub(crate) async fn count(&self, core: &QueueCore) -> Result<u64> {
        let queue = self.db_id(core)?;
        let now = self.now_param();
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("count", e))?;
            let row = client
                .query_one(&sql.count, &[&queue, &now])
                .await
                .map_err(|e| pg("count", e))?;
            let n: i64 = row.get(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    /// Names of every queue in the schema, sorted (those other stores made too).
    pub(crate) async fn list_queues(&self) -> Result<Vec<String>> {
        let pool = self.pool.clone();
        let text = format!(
            "SELECT name FROM \"{}\".queues ORDER BY name",
            self.sql.schema
        );
        self.run(async move {
            let client = pool.get().await.map_err(|e| pg("list queues", e))?;
            let rows = client
                .query(&text, &[])
                .await
                .map_err(|e| pg("list queues", e))?;
            rows.iter()
                .map(|row| row.try_get(0).map_err(|e| pg("list queues", e)))
                .collect()
        })
        .await
    }

    /// Closes the pool and ends the runtime's thread. Transactions still open are rolled back
    /// by the server when their connections close.
    pub(crate) fn close(&self) {
        self.pool.close();
        for task in self.background.lock().drain(..) {
            task.abort();
        }
        self.waiters.wake_all();
        drop(self.stop.lock().take());
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!("the PostgreSQL runtime thread panicked");
            }
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.close();
    }
}

/// This store's consumers waiting on each queue (by database id), and the line to the
/// listener task.
#[derive(Debug)]
struct Waiters {
    queues: Mutex<HashMap<i32, Waited>>,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Debug)]
struct Waited {
    count: usize,
    /// One notification wakes one consumer (a stored permit if none waits right now); a
    /// consumer that then takes an item wakes the next (see [`Watch::pass_on`]).
    notify: Arc<Notify>,
}

/// What the listener is asked to do: bring its advisory lock on a queue in line with the
/// number of consumers waiting on it (and answer once it holds it).
#[derive(Debug)]
enum Command {
    Watch(i32, oneshot::Sender<()>),
    Unwatch(i32),
    /// Items became visible in these queues (a commit, a release): notify the stores with
    /// consumers waiting on them. Sent after the change is committed.
    Notify(Vec<i32>),
}

impl Waiters {
    /// See [`Postgres::notify`].
    fn notify(&self, queues: Vec<i32>) {
        if queues.is_empty() {
            return;
        }
        // This store's own waiters at once: the notification the listener sends is for the
        // other stores (its own lock on a queue this store waits on hides this store from
        // the "anyone waiting?" check, and the listener drops what it sent itself).
        {
            let waited = self.queues.lock();
            for queue in &queues {
                if let Some(waited) = waited.get(queue) {
                    waited.notify.notify_one();
                }
            }
        }
        // A listener gone (store closing) has nobody left to wake.
        let _ = self.commands.send(Command::Notify(queues));
    }

    fn wake_one(&self, queue: i32) {
        if let Some(waited) = self.queues.lock().get(&queue) {
            waited.notify.notify_one();
        }
    }

    /// Wakes every consumer (the listener reconnected, or the store is closing): each looks
    /// for an item once more.
    fn wake_all(&self) {
        for waited in self.queues.lock().values() {
            waited.notify.notify_waiters();
        }
    }

    fn waiting(&self, queue: i32) -> bool {
        self.queues.lock().get(&queue).is_some_and(|w| w.count > 0)
    }

    fn waited_queues(&self) -> Vec<i32> {
        self.queues
            .lock()
            .iter()
            .filter(|(_, w)| w.count > 0)
            .map(|(q, _)| *q)
            .collect()
    }
}

/// A consumer among its store's waiters on one queue; leaves them when dropped.
#[derive(Debug)]
pub(crate) struct Watch {
    waiters: Arc<Waiters>,
    queue: i32,
    notify: Arc<Notify>,
}

impl Watch {
    /// This consumer took an item: the next waiter looks too, as the commit that woke this
    /// one may have brought more (FoundationDB's staging: waiters are woken one at a time,
    /// each by the one before, never all at once).
    pub(crate) fn pass_on(&self) {
        let others = self
            .waiters
            .queues
            .lock()
            .get(&self.queue)
            .is_some_and(|w| w.count > 1);
        if others {
            self.notify.notify_one();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let last = {
            let mut queues = self.waiters.queues.lock();
            match queues.get_mut(&self.queue) {
                Some(waited) => {
                    waited.count = waited.count.saturating_sub(1);
                    waited.count == 0
                }
                None => false,
            }
        };
        if last {
            let _ = self.waiters.commands.send(Command::Unwatch(self.queue));
        }
    }
}

/// The listener: one connection of its own (not pooled) that `LISTEN`s on the schema's channel
/// and holds a shared advisory lock per queue this store has consumers waiting on, so that a
/// committer notifies only queues someone waits on. A notification wakes one local waiter of
/// its queue. Lost connection: every waiter is woken (notifications may have been missed),
/// and the listener reconnects with a backoff, taking its locks again. Ends when the store
/// closes (its command line closes).
async fn listen(
    config: tokio_postgres::Config,
    bound: Duration,
    tls: Tls,
    sql: Arc<Sql>,
    waiters: Arc<Waiters>,
    commands: mpsc::UnboundedReceiver<Command>,
) {
    match tls {
        Tls::Off => listen_with(config, bound, NoTls, sql, waiters, commands).await,
        Tls::On(tls) => listen_with(config, bound, tls, sql, waiters, commands).await,
    }
}

/// [`listen`] with one kind of connection.
async fn listen_with<T>(
    config: tokio_postgres::Config,
    bound: Duration,
    tls: T,
    sql: Arc<Sql>,
    waiters: Arc<Waiters>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) where
    T: MakeTlsConnect<Socket> + Clone + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (channel, watch_key, notify) = (&sql.channel, sql.keys.watch, &sql.notify);
    let mut backoff = Duration::from_millis(50);
    loop {
        // A server that accepts the connection and never answers is given up on at the
        // bound, and tried again after the backoff like one that refused.
        let connected = tokio::time::timeout(bound, config.connect(tls.clone())).await;
        if let Ok(Ok((client, mut connection))) = connected {
            backoff = Duration::from_millis(50);
            let (noted, mut notes) = mpsc::unbounded_channel::<(i32, Option<i32>)>();
            let driver = tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    match message {
                        Ok(AsyncMessage::Notification(n)) => {
                            let note = (n.process_id(), n.payload().parse().ok());
                            if noted.send(note).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
            let mut locked = HashSet::new();
            let listening = client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await
                .is_ok();
            // Its own notifications come back to it; this store woke its waiters already.
            let own_pid = match client.query_one("SELECT pg_backend_pid()", &[]).await {
                Ok(row) => row.try_get::<_, i32>(0).ok(),
                Err(_) => None,
            };
            // Prepared once per connection: the listener sends every store's notifications.
            let notify_statement = client.prepare(notify).await.ok();
            if listening && notify_statement.is_some() && own_pid.is_some() {
                let mut up = true;
                for queue in waiters.waited_queues() {
                    up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                }
                // Whatever was committed while nobody listened.
                waiters.wake_all();
                while up {
                    tokio::select! {
                        note = notes.recv() => match note {
                            Some((from, Some(queue))) if Some(from) != own_pid => {
                                waiters.wake_one(queue);
                            }
                            Some(_) => {}
                            None => up = false,
                        },
                        command = commands.recv() => match command {
                            Some(Command::Watch(queue, ack)) => {
                                up = reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                let _ = ack.send(());
                            }
                            Some(Command::Unwatch(queue)) => {
                                up = reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                            }
                            Some(Command::Notify(mut queues)) => {
                                // Every notification asked for meanwhile, in one statement.
                                let mut later = Vec::new();
                                while let Ok(command) = commands.try_recv() {
                                    match command {
                                        Command::Notify(more) => queues.extend(more),
                                        other => later.push(other),
                                    }
                                }
                                queues.sort_unstable();
                                queues.dedup();
                                // A failure only delays the waiters until their fallback poll.
                                if let Some(statement) = &notify_statement {
                                    let _ = client.execute(statement, &[channel, &queues]).await;
                                }
                                for command in later {
                                    match command {
                                        Command::Watch(queue, ack) => {
                                            up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                            let _ = ack.send(());
                                        }
                                        Command::Unwatch(queue) => {
                                            up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                        }
                                        Command::Notify(_) => {}
                                    }
                                }
                            }
                            None => {
                                driver.abort();
                                return;
                            }
                        },
                    }
                }
            }
            driver.abort();
        }
        waiters.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Ends server process `pid` on a connection of its own.
async fn terminate<T>(config: &tokio_postgres::Config, tls: T, pid: i32) -> Option<u64>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await.ok()?;
    let driver = tokio::spawn(connection);
    let ended = client
        .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .await;
    drop(client);
    let _ = driver.await;
    ended.ok()
}

/// How the store's connections are made: plain, or TLS with rustls when the URL asks for it
/// (`sslmode=require`). Certificates are always verified (the server's name against its
/// certificate, the chain against the system's roots or `PgConfig::tls_roots`).
#[derive(Clone)]
enum Tls {
    Off,
    On(tokio_postgres_rustls::MakeRustlsConnect),
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tls::Off => "Tls::Off",
            Tls::On(_) => "Tls::On",
        })
    }
}

impl Tls {
    fn of(config: &PgConfig, pg_config: &tokio_postgres::Config) -> Result<Tls> {
        if pg_config.get_ssl_mode() != SslMode::Require {
            return Ok(Tls::Off);
        }
        use rustls::pki_types::pem::PemObject;
        let bad_roots = || Error::InvalidConfig {
            setting: "postgres_tls_root_certificates",
            expected: "one or more PEM certificates",
        };
        let mut roots = rustls::RootCertStore::empty();
        match &config.tls_roots {
            Some(pem) => {
                for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
                    roots
                        .add(cert.map_err(|_| bad_roots())?)
                        .map_err(|_| bad_roots())?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    // One bad system certificate does not make the others unusable.
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(match config.tls_roots {
                Some(_) => bad_roots(),
                None => Error::InvalidConfig {
                    setting: "postgres_tls_root_certificates",
                    expected: "certificates to trust: none were found in the system's store",
                },
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| pg("connect", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::On(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
    }
}

/// Takes or releases the listener's lock on `queue` so that it is held exactly while this
/// store has consumers waiting on it. False if the connection failed.
async fn reconcile(
    client: &tokio_postgres::Client,
    key: i32,
    waiters: &Waiters,
    locked: &mut HashSet<i32>,
    queue: i32,
) -> bool {
    let waiting = waiters.waiting(queue);
    if waiting == locked.contains(&queue) {
        return true;
    }
    let statement = if waiting {
        "SELECT pg_advisory_lock_shared($1, $2)"
    } else {
        "SELECT pg_advisory_unlock_shared($1, $2)"
    };
    if client.execute(statement, &[&key, &queue]).await.is_err() {
        return false;
    }
    if waiting {
        locked.insert(queue);
    } else {
        locked.remove(&queue);
    }
    true
}

/// The version of the store's schema in the database, read without a lock and without
/// DDL; `None` when the schema or its `meta` table is not there.
async fn schema_version(client: &Object, sql: &Sql) -> Result<Option<i64>> {
    let s = format!("\"{}\"", sql.schema);
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
async fn migrate(pool: &Pool, sql: &Sql, create: bool) -> Result<()> {
    let mut client = pool.get().await.map_err(|e| pg("connect", e))?;
    let version = schema_version(&client, sql).await?;
    match version {
        Some(SCHEMA_VERSION) => return Ok(()),
        Some(found) if !create || !(1..SCHEMA_VERSION).contains(&found) => {
            return Err(Error::SchemaVersion {
                schema: sql.schema.clone(),
                found,
                supported: SCHEMA_VERSION,
            })
        }
        None if !create => {
            return Err(Error::SchemaMissing {
                schema: sql.schema.clone(),
            })
        }
        _ => {}
    }
    let tx = client.transaction().await.map_err(|e| pg("migrate", e))?;
    // Two int4 keys (objsubid 2 in pg_locks): apart from the items' int8 keys.
    tx.execute(
        "SELECT pg_advisory_xact_lock(2107, hashtext($1))",
        &[&sql.schema],
    )
    .await
    .map_err(|e| pg("migrate", e))?;
    let s = format!("\"{}\"", sql.schema);
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
            .batch_execute(&sql.create())
            .await
            .map_err(|e| pg("migrate", e))?,
        Some(row) => {
            let text: String = row.get(0);
            let version = text.trim().parse::<i64>().unwrap_or(-1);
            let steps = match version {
                SCHEMA_VERSION => None,
                1 => Some(format!("{}{}", sql.to_v2(true), sql.to_v3())),
                2 => Some(sql.to_v3()),
                found => {
                    return Err(Error::SchemaVersion {
                        schema: sql.schema.clone(),
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

/// The dequeue statement in `held`'s transaction (a connection taken and `BEGIN` sent first
/// if need be).
async fn take(
    pool: &Pool,
    sql: &Sql,
    held: &mut PgTx,
    queue: i32,
    n: i64,
    now: Option<i64>,
) -> Result<Vec<Entry>> {
    if held.client.is_none() {
        held.client = Some(pool.get().await.map_err(|e| pg("dequeue", e))?);
    }
    let client = held.client()?;
    // Prepared once per connection (deadpool's statement cache).
    let statement = client
        .prepare_cached(if n == 1 { &sql.take_one } else { &sql.take })
        .await
        .map_err(|e| pg("dequeue", e))?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&queue, &n, &now];
    let rows = if held.open {
        client.query(&statement, &params).await
    } else {
        // `BEGIN` and the first dequeue pipelined (one round trip), the dequeue prepared. If
        // the `BEGIN` failed, the dequeue finds its setting off and takes nothing.
        let (begin, known) = begin_text(sql, client);
        let (begun, rows) = tokio::join!(
            client.simple_query(begin),
            client.query(&statement, &params)
        );
        let begun = begun.map_err(|e| pg("dequeue", e))?;
        let pid = begun_pid(sql, client, known, &begun);
        held.open = true;
        held.pid = pid;
        rows
    };
    let mut taken = match rows {
        Ok(rows) => rows
            .iter()
            .map(|row| entry(row.get(0), row.get(1)))
            .collect::<Vec<Entry>>(),
        Err(e) => {
            held.failed = true;
            return Err(pg("dequeue", e));
        }
    };
    held.held += taken.len();
    taken.sort_unstable_by_key(|e| e.id);
    Ok(taken)
}

/// What begins a transaction: `BEGIN`, and the server process's id (one row, one column)
/// in the same message.
const BEGIN: &str =
    "BEGIN; SET LOCAL reliable_queue.in_transaction = 'on'; SELECT pg_backend_pid()";

/// [`BEGIN`] on a connection whose server process is known already.
const BEGIN_KNOWN: &str = "BEGIN; SET LOCAL reliable_queue.in_transaction = 'on'";

/// Begins a transaction on `client` (see [`BEGIN`]); its server process's id, asked for
/// only the first time a connection is used.
fn begin_text(sql: &Sql, client: &Object) -> (&'static str, Option<i32>) {
    match sql.pids.lock().get(&Object::id(client)) {
        Some(&pid) => (BEGIN_KNOWN, Some(pid)),
        None => (BEGIN, None),
    }
}

/// The server process of `client` from the replies to its `BEGIN`, remembered.
fn begun_pid(
    sql: &Sql,
    client: &Object,
    known: Option<i32>,
    messages: &[tokio_postgres::SimpleQueryMessage],
) -> Option<i32> {
    if known.is_some() {
        return known;
    }
    let pid = backend_pid(messages)?;
    let mut pids = sql.pids.lock();
    if pids.len() > 4096 {
        // Connections come and go; their ids are never reused, so forget them all now and
        // then (each costs one more `SELECT` to learn again).
        pids.clear();
    }
    pids.insert(Object::id(client), pid);
    Some(pid)
}

/// The server process's id among the replies to [`BEGIN`].
fn backend_pid(messages: &[tokio_postgres::SimpleQueryMessage]) -> Option<i32> {
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.len() == 1 => {
            row.get(0).and_then(|pid| pid.parse().ok())
        }
        _ => None,
    })
}

/// An item as the dequeue statement returns it.
fn entry(id: i64, payload: Vec<u8>) -> Entry {
    Entry::new(
        u64::try_from(id).unwrap_or(0),
        payload.into_boxed_slice(),
        0,
    )
}

/// `ROLLBACK` on `held`'s connection, awaited, if it has a database transaction to end. A
/// connection that cannot roll back is broken: it leaves the pool (closed, so the server
/// rolls back when it notices).
async fn roll_back(held: &mut PgTx) -> Result<()> {
    if !held.must_roll_back() {
        return Ok(());
    }
    let rolled_back = held.client()?.batch_execute("ROLLBACK").await;
    held.open = false;
    if let Err(e) = rolled_back {
        if let Some(client) = held.client.take() {
            drop(Object::take(client));
        }
        return Err(pg("abort", e));
    }
    Ok(())
}

/// The end of a commit: the `INSERT` and the `COMMIT`. After a failure before `COMMIT` the
/// database transaction is still open (`held.open`), for the caller to roll back; a
/// connection lost during `COMMIT` is [`Error::CommitOutcomeUnknown`].
async fn finish(
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
            Some(insert) => client.execute(insert, params).await.map(drop),
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
                Some(insert) => client.execute(insert, params).await.map(drop),
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
        client
            .execute(insert, params)
            .await
            .map_err(|e| pg("commit", e))?;
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

/// A failed `COMMIT`: without an answer from the server (the connection went away) the
/// outcome is unknown; with one, it did not commit.
fn commit_error(e: tokio_postgres::Error) -> Error {
    if e.is_closed() || e.code().is_none() {
        Error::CommitOutcomeUnknown {
            source: Arc::new(e),
        }
    } else {
        pg("commit", e)
    }
}

// ---- the processing layer's statements and rows, and what the commit path and the
// maintenance task run of it (the calls, `impl Postgres`, are in `processing.rs`) ----

/// The processing layer's statements, with the schema spliced in. Every one takes the time
/// as a nullable `int8` parameter (`NULL`: the database's clock).
#[derive(Debug)]
struct ProcSql {
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
async fn lease_on(
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
async fn write_extra(client: &Object, sql: &Sql, extra: &Extra, now: Option<i64>) -> Result<()> {
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

/// How often each store runs its maintenance pass.
const MAINTENANCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The store's maintenance task: every [`MAINTENANCE`], on each queue the store has opened,
/// moves expired leases at their maximum attempts to the dead letters and applies the
/// dead-letter retention. Runs until the store's runtime stops. Failures are logged and
/// retried at the next pass.
async fn maintain(
    pool: Pool,
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
}
