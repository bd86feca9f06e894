//! The engine seam: the one place where the handles meet the engine that keeps their queues.
//!
//! The handles (`Store`, `ReliableConcurrentQueue<T>`, `Transaction` and the futures) hold an
//! `Arc<Engine>` and call only the methods below; they never look inside an engine. Each engine
//! is a module of its own with the same method set (the flavors of crossbeam-channel are the
//! model):
//!
//! - [`memory`]: nothing on disk; a commit applies in the committing thread.
//! - [`sled`]: the embedded engine: a log in sled, written by one committer thread.
//! - [`postgres`]: items as rows in PostgreSQL; ARCHITECTURE.md says how each call maps
//!   onto it.
//! - [`redis`]: items as records under a key prefix on a Redis server, each change one Lua
//!   script.
//!
//! Both embedded engines keep their queues' items in the in-memory core
//! ([`crate::core`]): dequeues, waiting and aborts are core operations and cost no I/O; only
//! commits, new queues, fences and flushes reach the log.
//!
//! The operations are async; the handles' blocking forms are `block_on` of them. On the
//! embedded engines every operation but a durable commit (and what waits for the committer:
//! `flush`, `close`, creating a queue) is ready at its first poll.

pub(crate) mod catalog;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) mod line;
#[cfg(all(test, reliable_queue_loom))]
mod loom_leases;
pub(crate) mod memory;
pub(crate) mod moves;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "postgres")]
mod postgres_calls;
pub(crate) mod proc;
mod processing_calls;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
mod redis_calls;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod server_calls;
pub(crate) mod sled;
pub(crate) mod take;
pub(crate) mod timers;
mod wait;
pub(crate) mod work;

use std::sync::Arc;

use crossbeam_utils::CachePadded;

use std::collections::HashMap;

use self::catalog::Catalog;
use self::proc::Proc;
use self::timers::Timers;
use crate::config::Config;
use crate::core::{QueueCore, QueueId, QueueTable};
use crate::processing::RetryPolicy;

pub(crate) use crate::core::Entry;
use crate::error::{Error, Result};
use crate::sync::process::{AtomicBool, Mutex, Ordering};

pub use self::catalog::SetAsideRecord;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::SqlOutcome;
pub(crate) use self::wait::{block_on, block_on_until, consume_budget, poll_budget};
use self::work::ITEM_OVERHEAD;
pub(crate) use self::work::{abort, Work};

/// An engine's handle on one named queue.
#[derive(Debug, Clone)]
pub(crate) struct QueueRef {
    core: Arc<QueueCore>,
    pub(crate) proc: Arc<Proc>,
}

impl QueueRef {
    pub(crate) fn name(&self) -> &str {
        self.core.name()
    }
}

/// One open store: its validated settings and the engine that keeps its queues.
#[derive(Debug)]
pub(crate) struct Engine {
    config: Config,
    /// What every call reads: padded so that the counters written on every commit (the
    /// `Arc`'s, the memory engine's ids) do not share its cache line.
    hot: CachePadded<Hot>,
    flavor: Flavor,
    /// Lease deadlines and delayed items.
    pub(crate) timers: Arc<Timers>,
    /// The processing-layer state of each queue opened or recovered, by queue id.
    procs: Mutex<HashMap<QueueId, Arc<Proc>>>,
    /// The per-commit metrics, registered when the store opened.
    pub(crate) metrics: crate::metrics::Handles,
}

/// The engine's state read on every call and (almost) never written.
#[derive(Debug)]
struct Hot {
    /// Set by the first `close`: every later call fails with [`Error::Closed`].
    closed: AtomicBool,
    /// `Config::max_item_size`.
    max_item_size: usize,
    /// `Config::max_transaction_size`.
    max_transaction_size: usize,
    /// The store's queues by index (its catalog's table), which transactions' work names them by.
    table: Arc<QueueTable>,
}

#[derive(Debug)]
enum Flavor {
    Memory(memory::Memory),
    Sled(sled::Sled),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Postgres),
    #[cfg(feature = "redis")]
    Redis(redis::Redis),
}

impl Flavor {
    fn catalog(&self) -> &Catalog {
        match self {
            Flavor::Memory(m) => m.catalog(),
            Flavor::Sled(s) => s.catalog(),
            #[cfg(feature = "postgres")]
            Flavor::Postgres(p) => p.catalog(),
            #[cfg(feature = "redis")]
            Flavor::Redis(r) => r.catalog(),
        }
    }
}

impl Engine {
    /// Opens the engine the settings name: on disk in `config.path` (sled), else in memory.
    pub(crate) fn open(config: Config) -> Result<Arc<Engine>> {
        if config.is_remote() {
            return block_on(Engine::connect(config));
        }
        let timers = Timers::new(config.clock.clone());
        let mut procs = HashMap::new();
        let flavor = match &config.path {
            Some(path) => {
                let (sled, recovered) = sled::Sled::open(path, &config, Arc::clone(&timers))?;
                let now = timers.clock().now();
                for queue in recovered {
                    let proc = Arc::new(Proc::new(queue.core, queue.policy));
                    for entry in queue.delayed {
                        if let Some(key) = entry.key() {
                            proc.core.add_key(key.into());
                        }
                        timers.due_at(&proc, entry, now);
                    }
                    for slot in queue.dead {
                        proc.put_dead(slot);
                    }
                    procs.insert(proc.core.id(), proc);
                }
                Flavor::Sled(sled)
            }
            None => Flavor::Memory(memory::Memory::new()),
        };
        Engine::assemble(config, flavor, timers, procs)
    }

    /// Connects to the store on the server the settings name (PostgreSQL, Redis); opens the
    /// embedded store they name otherwise, as [`open`](Self::open) does.
    pub(crate) async fn connect(config: Config) -> Result<Arc<Engine>> {
        let Some(flavor) = Engine::server(&config).await? else {
            // An embedded store: opening it waits for no server.
            return Engine::open(config);
        };
        let timers = Timers::new(config.clock.clone());
        Engine::assemble(config, flavor, timers, HashMap::new())
    }

    /// The server engine the settings name, connected; `None` for an embedded store.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "redis")),
        allow(unused_variables, clippy::unused_async)
    )]
    async fn server(config: &Config) -> Result<Option<Flavor>> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = &config.postgres {
            let pg = postgres::Postgres::connect(pg, config.clock.clone()).await?;
            return Ok(Some(Flavor::Postgres(pg)));
        }
        #[cfg(feature = "redis")]
        if let Some(rd) = &config.redis {
            let rd = redis::Redis::connect(rd, config.clock.clone()).await?;
            return Ok(Some(Flavor::Redis(rd)));
        }
        Ok(None)
    }

    fn assemble(
        config: Config,
        flavor: Flavor,
        timers: Arc<Timers>,
        procs: HashMap<QueueId, Arc<Proc>>,
    ) -> Result<Arc<Engine>> {
        let table = Arc::clone(flavor.catalog().table());
        let engine = Arc::new(Engine {
            hot: CachePadded::new(Hot {
                closed: AtomicBool::new(false),
                max_item_size: config.max_item_size,
                max_transaction_size: config.max_transaction_size,
                table,
            }),
            config,
            flavor,
            timers,
            procs: Mutex::new(procs),
            metrics: crate::metrics::Handles::register(),
        });
        engine.timers.start(Arc::<Engine>::downgrade(&engine))?;
        Ok(engine)
    }

    /// The processing-layer state of `core`'s queue, created on first use.
    fn proc_of(&self, core: Arc<QueueCore>) -> Arc<Proc> {
        let mut procs = self.procs.lock();
        Arc::clone(
            procs
                .entry(core.id())
                .or_insert_with(|| Arc::new(Proc::new(core, RetryPolicy::default()))),
        )
    }

    fn queue_ref(&self, core: Arc<QueueCore>) -> QueueRef {
        let proc = self.proc_of(Arc::clone(&core));
        QueueRef { core, proc }
    }

    /// Gives `work` a deadline `timeout` ms from now (replacing any it had).
    pub(crate) fn set_timeout(&self, work: &mut Work, timeout: u64) -> Result<()> {
        work.check_live()?;
        if let Some(old) = &work.expiry {
            // Settled: its timer does nothing now.
            old.settle()?;
            self.timers.cancel_transaction(old);
        }
        let deadline = self.now().saturating_add(timeout);
        work.expiry = Some(self.timers.expire_transaction(
            deadline,
            &work.dequeued,
            &self.hot.table,
        ));
        self.arm_deadline(work);
        Ok(())
    }

    /// On PostgreSQL, once `work` has a deadline and an open database transaction: arms the
    /// deadline to end the transaction's session when it passes (its rows are then visible
    /// again at once, P10). Called after every call that may begin the transaction.
    ///
    /// On Redis, once `work` has a deadline and holds items: arms the deadline to give them
    /// back when it passes.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "redis")),
        allow(unused_variables)
    )]
    fn arm_deadline(&self, work: &Work) {
        let Some(expiry) = &work.expiry else {
            return;
        };
        match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => {
                if let Some(pid) = work.pg.pid() {
                    expiry.arm(pg.terminator(pid));
                }
            }
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => {
                if let Some(token) = work.rd.token() {
                    expiry.arm(rd.expirer(token));
                }
            }
            _ => {}
        }
    }

    /// The store's default transaction timeout, in ms.
    pub(crate) fn transaction_timeout(&self) -> Option<u64> {
        self.config.transaction_timeout
    }

    /// The store's clock, in milliseconds since the epoch.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.timers.clock().now()
    }

    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    fn catalog(&self) -> &Catalog {
        self.flavor.catalog()
    }

    /// The store's queues by index.
    #[inline]
    pub(crate) fn table(&self) -> &QueueTable {
        &self.hot.table
    }

    /// The server engine's part of the seam (PostgreSQL, Redis): `None` on the embedded
    /// engines.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn host(&self) -> Option<&dyn line::Host> {
        match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => Some(pg),
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => Some(rd),
            _ => None,
        }
    }

    /// Is the store on a server (PostgreSQL, Redis): every operation a call to it?
    #[inline]
    pub(crate) fn is_remote(&self) -> bool {
        !matches!(self.flavor, Flavor::Memory(_) | Flavor::Sled(_))
    }

    /// Does the engine write its commits somewhere (sled, PostgreSQL), so that their
    /// latency is worth measuring?
    #[inline]
    pub(crate) fn is_durable(&self) -> bool {
        !matches!(self.flavor, Flavor::Memory(_))
    }

    /// The engine's name, as errors give it.
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn name(&self) -> &'static str {
        match &self.flavor {
            Flavor::Memory(_) => "memory",
            Flavor::Sled(_) => "sled",
            #[cfg(feature = "postgres")]
            Flavor::Postgres(_) => "postgres",
            #[cfg(feature = "redis")]
            Flavor::Redis(_) => "redis",
        }
    }

    /// The refusal of an operation this engine does not serve (SQL on the engines other
    /// than PostgreSQL).
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported {
            operation,
            engine: self.name(),
        }
    }

    /// The item size limit (`Config::max_item_size`): encoders stop past it.
    #[inline]
    pub(crate) fn max_item_size(&self) -> usize {
        self.hot.max_item_size
    }

    /// Fails with [`Error::Closed`] once the store is closed.
    #[inline]
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.hot.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    // ---- queues -------------------------------------------------------------------------

    /// Opens the queue `name`, creating it (durably, on disk) if it does not exist yet.
    pub(crate) async fn queue(&self, name: &str) -> Result<QueueRef> {
        self.check_open()?;
        match &self.flavor {
            Flavor::Memory(m) => m.queue(name),
            Flavor::Sled(s) => s.queue(name).await,
            #[cfg(feature = "postgres")]
            Flavor::Postgres(p) => return p.queue(name).await.map(|q| self.server_queue_ref(q)),
            #[cfg(feature = "redis")]
            Flavor::Redis(r) => {
                return Box::pin(r.queue(name))
                    .await
                    .map(|q| self.server_queue_ref(q))
            }
        }
        .map(|core| self.queue_ref(core))
    }

    /// A server engine's queue handle, with its retry policy as the server has it.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    fn server_queue_ref(&self, (core, policy): (Arc<QueueCore>, Option<RetryPolicy>)) -> QueueRef {
        let queue = self.queue_ref(core);
        if let Some(policy) = policy {
            queue.proc.set_policy(policy);
        }
        queue
    }

    /// Names of every queue, sorted.
    pub(crate) fn queue_names(&self) -> Vec<String> {
        self.catalog().names()
    }

    /// Names of every queue in the store, sorted: on PostgreSQL those of the schema, which
    /// other stores may have made.
    pub(crate) async fn list_queues(&self) -> Result<Vec<String>> {
        self.check_open()?;
        match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => pg.list_queues().await,
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => Box::pin(rd.list_queues()).await,
            _ => Ok(self.queue_names()),
        }
    }

    /// Records set aside at this or an earlier open.
    pub(crate) fn set_aside_records(&self) -> Vec<SetAsideRecord> {
        self.catalog().set_aside_records()
    }

    /// Ranges of records found missing by a salvaging open.
    pub(crate) fn missing_records(&self) -> Vec<std::ops::RangeInclusive<u64>> {
        self.catalog().missing_records()
    }

    /// Lifts the fences on queue `name`, durably.
    pub(crate) async fn unfence(&self, name: &str) -> Result<()> {
        self.check_open()?;
        match &self.flavor {
            Flavor::Memory(_) => Ok(()),
            Flavor::Sled(s) => s.unfence(name).await,
            #[cfg(feature = "postgres")]
            Flavor::Postgres(_) => Ok(()),
            #[cfg(feature = "redis")]
            Flavor::Redis(_) => Ok(()),
        }
    }

    /// Consumers waiting in `queue` now (of this store only, on PostgreSQL).
    pub(crate) fn waiters(&self, queue: &QueueRef) -> usize {
        match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => pg.waiters(&queue.core),
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => rd.waiters(&queue.core),
            _ => queue.core.waiters(),
        }
    }

    // ---- enqueues and dequeues ----

    /// Buffers an encoded item in `work`, within the transaction size limit (`codec::encode`
    /// already kept it within the item size limit).
    ///
    /// The transaction limit counts each item as its encoded size plus [`ITEM_OVERHEAD`]. A
    /// transaction's first item is never refused by it: the item is within the item limit,
    /// which is at most the transaction limit, and a lone item must always fit.
    #[inline]
    pub(crate) fn enqueue(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        bytes: Box<[u8]>,
    ) -> Result<()> {
        work.withdraw_leaked();
        work.check_live()?;
        let limits = &*self.hot;
        debug_assert!(
            bytes.len() <= limits.max_item_size,
            "the encoder stops at the item size limit"
        );
        let size = work
            .enqueued_bytes
            .saturating_add(bytes.len())
            .saturating_add(ITEM_OVERHEAD);
        if size > limits.max_transaction_size && !work.enqueues.is_empty() {
            return Err(Error::TransactionTooLarge {
                size,
                limit: limits.max_transaction_size,
            });
        }
        work.enqueued_bytes = size;
        work.enqueues.push((queue.core.index(), bytes));
        Ok(())
    }

    // ---- transactions -------------------------------------------------------------------

    /// Applies `work` atomically and durably, leaving it empty. On failure its dequeued
    /// items are back in their queues.
    pub(crate) async fn commit(&self, work: &mut Work) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            let work = std::mem::take(work);
            return Box::pin(self.commit_on_postgres(pg, work, None))
                .await
                .map(drop);
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            let work = std::mem::take(work);
            return Box::pin(self.commit_on_redis(rd, work, None))
                .await
                .map(drop);
        }
        // Everything but the wait happens before the first await, so the future keeps only
        // the reply's receiver across it, not the work.
        match self.start_commit(work) {
            // Applied already: the budget is taken after, so a commit polled once is applied
            // even when the spent budget makes it yield (its documented cancel safety).
            Committing::Done(outcome) => {
                consume_budget().await;
                outcome
            }
            // tokio's oneshot receiver takes part in the budget itself.
            Committing::Waiting(reply) => sled::answer(reply).await,
        }
    }

    /// [`commit`](Self::commit) for threads (a transaction's blocking form, the timers'):
    /// on the embedded engines without a future where nothing needs waiting for.
    pub(crate) fn blocking_commit(&self, work: &mut Work) -> Result<()> {
        if self.is_remote() {
            return block_on(self.commit(work));
        }
        match self.start_commit(work) {
            Committing::Done(outcome) => outcome,
            Committing::Waiting(reply) => block_on(sled::answer(reply)),
        }
    }

    /// Applies `work` where that needs no waiting, or hands it to the engine.
    #[inline]
    fn start_commit(&self, work: &mut Work) -> Committing {
        work.withdraw_leaked();
        if let Err(e) = self.settle_deadline(work) {
            drop_expired(std::mem::take(work));
            return Committing::Done(Err(e));
        }
        if let Err(e) = self.check_open() {
            abort(std::mem::take(work), self.table());
            return Committing::Done(Err(e));
        }
        if work.is_empty() {
            return Committing::Done(Ok(()));
        }
        if !work.moves.is_empty() {
            if let Err(e) = self.prepare_moves(work) {
                abort(std::mem::take(work), self.table());
                return Committing::Done(Err(e));
            }
        }
        match &self.flavor {
            Flavor::Memory(m) => {
                m.commit(work, &self.timers);
                Committing::Done(Ok(()))
            }
            Flavor::Sled(s) => Committing::Waiting(s.submit(std::mem::take(work))),
            // `commit` takes the server engines' ways before this.
            #[cfg(any(feature = "postgres", feature = "redis"))]
            _ => {
                abort(std::mem::take(work), self.table());
                Committing::Done(Err(self.unsupported("an embedded commit")))
            }
        }
    }

    /// Items visible in `queue` now: ready at once on the embedded engines, a round trip on
    /// PostgreSQL.
    pub(crate) async fn count(&self, queue: &QueueRef) -> Result<u64> {
        self.check_open()?;
        match &self.flavor {
            #[cfg(feature = "postgres")]
            Flavor::Postgres(pg) => Box::pin(pg.count(&queue.core)).await,
            #[cfg(feature = "redis")]
            Flavor::Redis(rd) => Box::pin(rd.count(&queue.core)).await,
            _ => Ok(queue.core.count()),
        }
    }

    /// Aborts `work`: the enqueues are dropped, the dequeued items go back to the front of
    /// their queues, visible when this returns. Ready at once on the embedded engines; on
    /// PostgreSQL it waits for the rollback.
    pub(crate) async fn abort(&self, work: Work) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Flavor::Postgres(pg) = &self.flavor {
            let mut work = work;
            self.give_back_acked(&work.moves);
            if self.settle_deadline(&mut work).is_err() {
                // Past its deadline: rolled back already (its session ended).
                drop_expired(work);
                return Ok(());
            }
            let held = std::mem::take(&mut work.pg);
            abort(work, self.table());
            return Box::pin(pg.rollback(held)).await;
        }
        #[cfg(feature = "redis")]
        if let Flavor::Redis(rd) = &self.flavor {
            let mut work = work;
            self.give_back_acked(&work.moves);
            let expired = self.settle_deadline(&mut work).is_err();
            let held = std::mem::take(&mut work.rd);
            abort(work, self.table());
            // Past its deadline its items were given back already (or are at its hold's end).
            return match expired {
                true => Ok(()),
                false => Box::pin(rd.give_back(held)).await,
            };
        }
        self.discard(work);
        Ok(())
    }

    /// Discards `work` without waiting: what dropping a transaction does. The enqueues are
    /// dropped, the dequeued items go back to the front of their queues (on PostgreSQL once
    /// the connection has rolled back, in the background).
    #[inline]
    pub(crate) fn discard(&self, mut work: Work) {
        if !work.moves.is_empty() {
            self.give_back_acked(&work.moves);
        }
        match self.settle_deadline(&mut work) {
            Ok(()) => abort(work, self.table()),
            Err(_) => drop_expired(work),
        }
    }

    /// The transaction of `work` commits or aborts: its deadline, if it has one, is settled
    /// and its timer removed. Fails with [`Error::TransactionExpired`] if the deadline passed
    /// first (its held items went back then).
    #[inline]
    fn settle_deadline(&self, work: &mut Work) -> Result<()> {
        match work.expiry.take() {
            None => Ok(()),
            Some(expiry) => self.settle_expiry(&expiry),
        }
    }

    /// See [`settle_deadline`](Self::settle_deadline).
    fn settle_expiry(&self, expiry: &Arc<timers::TxExpiry>) -> Result<()> {
        expiry.settle()?;
        self.timers.cancel_transaction(expiry);
        Ok(())
    }

    /// Runs a statement of the caller's in `work`'s database transaction: rows with `rows`,
    /// else the count of rows affected. Refused by the engines that have no SQL.
    #[cfg(feature = "postgres")]
    pub(crate) async fn sql(
        &self,
        work: &mut Work,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        rows: bool,
    ) -> Result<SqlOutcome> {
        self.check_open()?;
        let Flavor::Postgres(pg) = &self.flavor else {
            return Err(self.unsupported("SQL in a transaction"));
        };
        work.check_live()?;
        let ran = pg.sql(&mut work.pg, sql, params, rows).await;
        self.arm_deadline(work);
        ran
    }

    // ---- the store ----------------------------------------------------------------------

    /// Makes every commit so far durable.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.check_open()?;
        match &self.flavor {
            Flavor::Memory(_) => Ok(()),
            Flavor::Sled(s) => s.flush().await,
            // Every commit is durable when it returns (on Redis as durable as the server's
            // append-only file makes it).
            #[cfg(any(feature = "postgres", feature = "redis"))]
            _ => Ok(()),
        }
    }

    /// Closes the store for every handle: waiting consumers are woken with
    /// [`Error::Closed`], commits already submitted finish, the log is flushed and its
    /// directory released. Returns the final flush's outcome; a second close gets
    /// [`Error::Closed`].
    pub(crate) async fn close(&self) -> Result<()> {
        if self.hot.closed.swap(true, Ordering::AcqRel) {
            return Err(Error::Closed);
        }
        self.timers.stop();
        self.catalog().close_queues();
        match &self.flavor {
            Flavor::Memory(_) => Ok(()),
            Flavor::Sled(s) => s.close().await,
            #[cfg(feature = "postgres")]
            Flavor::Postgres(p) => {
                Box::pin(p.close()).await;
                Ok(())
            }
            #[cfg(feature = "redis")]
            Flavor::Redis(r) => {
                r.close().await;
                Ok(())
            }
        }
    }

    /// [`close`](Self::close) for the last handle's drop.
    fn blocking_close(&self) -> Result<()> {
        block_on(self.close())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The last handle is gone: close, if nobody did. There is nobody left to tell about a
        // failed final flush but the log.
        if !self.hot.closed.load(Ordering::Acquire) {
            if let Err(e) = self.blocking_close() {
                tracing::error!(error = %e, "closing the store failed");
            }
        }
    }
}

/// A commit on its way.
#[derive(Debug)]
enum Committing {
    /// Applied (or refused) already.
    Done(Result<()>),
    /// Submitted to the sled engine's committer: its answer comes on this receiver.
    Waiting(sled::Answer),
}

/// Moves a dequeued entry into `work` and returns it there.
#[inline]
fn hold<'w>(work: &'w mut Work, queue: &QueueRef, entry: Entry) -> &'w Entry {
    queue.core.hold();
    if let Some(expiry) = &work.expiry {
        expiry.note(&queue.core, &entry);
    }
    work.dequeued.push((queue.core.index(), entry));
    &work.dequeued[work.dequeued.len() - 1].1
}

/// Drops the work of a transaction whose deadline passed: its held items went back already
/// (the timer put back copies), so they are not restored again; its moves are undone.
fn drop_expired(mut work: Work) {
    work.undo_moves();
    work.dequeued.clear();
    // Its session is being ended: the connection must not be reused.
    #[cfg(feature = "postgres")]
    work.pg.discard();
}
