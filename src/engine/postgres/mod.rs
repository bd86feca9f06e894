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
//!
//! The files, each importing only files listed before it (so `lease_calls.rs`, which adds
//! the processing layer's calls to [`Postgres`], imports this one, and this one not it):
//!
//! - `failure.rs`: the client's failures as the crate's `Error`;
//! - `statements.rs`: the SQL text (`Sql`, `ProcSql`) and its `int8` values;
//! - `tls.rs`: plain or TLS connections;
//! - `pool.rs`: the client's settings, the connect bound, the pool;
//! - `migrate.rs`: the schema's version and its migrations;
//! - `leases.rs`: the lease statement run, burial of expired leases, the maintenance pass;
//! - `connection.rs`: a transaction's connection (`PgSlot`, `PgTx`), `BEGIN`, the dequeue,
//!   `ROLLBACK`;
//! - `commit.rs`: the commit (`Extra`);
//! - `listener.rs`: this store's waiting consumers and the `LISTEN`ing connection;
//! - `mod.rs`: the engine, `Postgres`: connect, queues, dequeue, commit, count, close;
//! - `lease_calls.rs`: the processing layer's calls (`impl Postgres`).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_postgres::NoTls;

mod commit;
mod connection;
mod failure;
mod lease_calls;
mod leases;
mod listener;
mod migrate;
mod pool;
mod statements;
mod tls;

use self::commit::finish;
pub(crate) use self::commit::{Extra, Fresh, Imported};
pub(crate) use self::connection::PgSlot;
use self::connection::{backend_pid, roll_back, take, terminate, PgTx};
use self::failure::pg;
use self::leases::maintain;
pub(crate) use self::leases::{FailOutcome, Granted};
use self::listener::listen;
use self::migrate::migrate;
use self::pool::{client_config, Pool};
pub(crate) use self::statements::int8;
use self::statements::{clock_ms, fold_if_due, ms, up_to, Sql, BEGIN};
use self::tls::Tls;
use super::catalog::Catalog;
use super::Entry;
use crate::clock::Clock;
use crate::config::PgConfig;
use crate::core::{QueueCore, QueueId};
use crate::engine::line::{BoxFuture, Calls, Host, OwnThread, Waiters};
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;
use crate::sync::process::Mutex;

/// What the caller's own SQL gave.
#[derive(Debug)]
pub(crate) enum SqlOutcome {
    /// Rows a statement affected.
    Affected(u64),
    /// A query's rows.
    Rows(Vec<tokio_postgres::Row>),
}

/// One connected PostgreSQL store.
pub(crate) struct Postgres {
    rt: Handle,
    /// The runtime's thread, unless on the caller's runtime: ended at close.
    own: OwnThread,
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
    /// The calls running on the store's runtime, which a close lets finish.
    calls: Arc<Calls>,
}

/// How long a close waits for the calls in flight to finish before it stops the runtime
/// (they are cancelled then).
const CLOSE_DRAIN: Duration = Duration::from_secs(30);

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
        let (pg_config, connect_bound) = client_config(config)?;
        let (rt, own) = OwnThread::start(config.runtime.as_ref(), "reliable-queue-postgres")?;
        let (waiters, listened) = Waiters::new();
        let tls = Tls::of(config, &pg_config)?;
        let pool = Pool::new(&rt, &pg_config, &tls, config.pool_size, connect_bound)?;
        let store = Postgres {
            rt,
            own,
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
            calls: Arc::new(Calls::default()),
            poll_interval: config.poll_interval,
            // Saturating on purpose: a retention past `i64::MAX` ms (292 million years)
            // deletes nothing, as `i64::MAX` ms does.
            retention: config
                .dead_letter_retention
                .map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX)),
        };
        let pool = store.pool.clone();
        let sql = Arc::clone(&store.sql);
        let create = config.migrate;
        store
            .run(async move { migrate(&pool, &sql.schema, create).await })
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

    /// This store's consumers waiting on `core`'s queue now.
    pub(crate) fn waiters(&self, core: &QueueCore) -> usize {
        let Ok(queue) = self.db_id(core) else {
            return 0;
        };
        self.waiters.count(queue)
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

    /// Runs `task` on the store's runtime. A task whose caller's future is dropped runs on
    /// to its end.
    async fn run<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let handle = self.spawn_call(task)?;
        self.joined(handle.await)
    }

    /// Spawns `task` on the store's runtime, counted among its calls (see [`Calls`]).
    fn spawn_call<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<Result<T>>> {
        let call = self.calls.start()?;
        Ok(self.rt.spawn(async move {
            let done = task.await;
            drop(call);
            done
        }))
    }

    /// What a call's task gave, or why it gave nothing.
    fn joined<T>(
        &self,
        joined: std::result::Result<Result<T>, tokio::task::JoinError>,
    ) -> Result<T> {
        joined.map_err(|e| match self.calls.closing.load(Ordering::Acquire) {
            // Cancelled by a close that waited for it in vain.
            true => Error::Closed,
            false => Error::Postgres {
                operation: "run",
                source: Arc::new(e),
            },
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
        waiter: Option<u64>,
    ) -> Result<Vec<Entry>> {
        let queue = self.db_id(core)?;
        let n = up_to(n);
        slot.reclaim().await;
        let (mut held, back, returning) = slot.begin_returning_call(&self.rt)?;
        let waiters = Arc::clone(&self.waiters);
        let began = !held.open;
        let pool = self.pool.clone();
        let sql = Arc::clone(&self.sql);
        let now = self.now_param();
        let taken = self
            .run(async move {
                // A look whose caller has given up (its future dropped, not leaked) before
                // the statement is sent is not made: a consumer that gives up often leaves
                // no statements behind to hold connections. (Not cancelled outright: a
                // connection being opened for it would be cut off half way.)
                let gone = || back.is_closed();
                let taken = take(&pool, &sql, &mut held, queue, n, now, &gone).await;
                if began
                    && held.held == 0
                    && !held.failed
                    && taken.as_ref().is_ok_and(Vec::is_empty)
                {
                    // Nothing taken in a database transaction this call began: ended, and
                    // its connection back in the pool, so that a consumer waiting for an
                    // item holds none while it sleeps.
                    if roll_back(&mut held).await.is_ok() {
                        held.client = None;
                        held.pid = None;
                    }
                }
                // Through the transaction: if it is gone, dropped here (rolled back).
                drop(back.send(held));
                if let Some(ticket) = waiter {
                    let took = taken.as_ref().is_ok_and(|t| !t.is_empty());
                    waiters.looked(queue, ticket, took);
                }
                Ok(taken)
            })
            .await;
        returning.back().await;
        taken?
    }

    /// Commits: the buffered enqueues in one `INSERT`, then `COMMIT` if a database
    /// transaction is open (else the `INSERT` alone, atomic as one statement).
    pub(crate) async fn commit(
        &self,
        slot: PgSlot,
        enqueues: Vec<(Arc<QueueCore>, Box<[u8]>)>,
        extra: Extra,
    ) -> Result<Vec<Granted>> {
        let mut slot = slot;
        slot.reclaim().await;
        let tx = slot.take();
        if let Some(why) = tx.as_ref().and_then(|held| held.aborted) {
            // Whatever the rollback gives, the commit's answer is that it did not commit.
            let _rolled_back = self.end(tx).await;
            return Err(why.error());
        }
        // What it dequeued is held by its database transaction alone: were that ended
        // already, the commit would not consume the items.
        debug_assert!(
            tx.as_ref().is_none_or(|t| t.held == 0 || t.open),
            "a transaction that dequeued rows keeps its database transaction open to its end"
        );
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
        slot.reclaim().await;
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
    async fn end(&self, mut held: Option<Box<PgTx>>) -> Result<()> {
        // A call of the transaction still in flight (its future leaked): its connection,
        // once it comes back, is the one to roll back.
        if let Some(returned) = held.as_mut().and_then(|h| h.returning.take()) {
            if let Ok(back) = returned.await {
                held = Some(back);
            }
        }
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
            let statement = client
                .prepare_cached(&sql.count)
                .await
                .map_err(|e| pg("count", e))?;
            let row = client
                .query_one(&statement, &[&queue, &now])
                .await
                .map_err(|e| pg("count", e))?;
            let (n, rows): (i64, i64) = (
                row.try_get(0).map_err(|e| pg("count", e))?,
                row.try_get(1).map_err(|e| pg("count", e))?,
            );
            fold_if_due(&client, &sql, queue, now, rows).await;
            Ok(ms(n))
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

    /// The time to pass to the statements: the injected clock's, or `None` for the
    /// database's.
    pub(crate) fn now_param(&self) -> Option<i64> {
        self.clock.is_manual().then(|| clock_ms(self.clock.now()))
    }

    /// The store's time source for tasks that outlive a call: the injected clock, if any.
    fn now_source(&self) -> Option<Clock> {
        self.clock.is_manual().then(|| self.clock.clone())
    }

    /// Closes the store: new calls are refused with `Closed`, waiting consumers wake (and
    /// find it closed), the calls in flight may finish (at most [`CLOSE_DRAIN`]), then the
    /// pool closes and the runtime's thread ends.
    pub(crate) async fn close(&self) {
        self.calls.closing.store(true, Ordering::Release);
        self.waiters.wake_all();
        if self.own.is_current() {
            // Closed from a task of its own runtime (the last handle dropped there): the
            // calls cannot be waited for from this thread.
            self.stop();
            return;
        }
        let calls = Arc::clone(&self.calls);
        let drained = self.rt.spawn(async move {
            let _ = tokio::time::timeout(CLOSE_DRAIN, calls.drain()).await;
        });
        if drained.await.is_err() {
            tracing::warn!("the PostgreSQL store closed without waiting for its calls in flight");
        }
        self.stop();
    }

    /// Closes the pool and ends the runtime's thread. Transactions still open are rolled back
    /// by the server when their connections close.
    fn stop(&self) {
        self.pool.close();
        for task in self.background.lock().drain(..) {
            task.abort();
        }
        self.waiters.wake_all();
        self.own.end();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Host for Postgres {
    fn line(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    fn key(&self, core: &QueueCore) -> Result<i32> {
        self.db_id(core)
    }

    fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn runtime(&self) -> &Handle {
        &self.rt
    }

    fn next_due<'a>(&'a self, core: &'a QueueCore) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(self.next_due(core))
    }

    fn lease<'a>(
        &'a self,
        core: &'a QueueCore,
        n: usize,
        ttl: u64,
        waiter: Option<u64>,
    ) -> BoxFuture<'a, Result<Vec<Granted>>> {
        Box::pin(self.lease(core, n, ttl, waiter))
    }

    fn unlease<'a>(&'a self, core: &'a QueueCore, tokens: Vec<u64>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.unlease(core, tokens))
    }
}
