//! The engine seam: the one place where the handles meet the engine that keeps their queues.
//!
//! The handles (`Store`, `ReliableConcurrentQueue<T>`, `Transaction` and the futures) hold an
//! `Arc<Engine>` and call only the methods below; they never look inside an engine. Each engine
//! is a module of its own with the same method set (the flavors of crossbeam-channel are the
//! model):
//!
//! - [`memory`]: nothing on disk; a commit applies in the committing thread.
//! - [`sled`]: the embedded engine: a log in sled, written by one committer thread.
//! - a remote engine (PostgreSQL) fits the same set; ARCHITECTURE.md says how each call maps
//!   onto it.
//!
//! Both embedded engines keep their queues' items in the in-memory core
//! ([`crate::core`]): dequeues, waiting and aborts are core operations and cost no I/O; only
//! commits, new queues, fences and flushes reach the log.
//!
//! Calls that may wait come in two forms, `async fn name` and `fn blocking_name`; on the
//! embedded engines every call but a durable commit (and what waits for the committer:
//! `flush`, `close`, creating a queue) is ready at once in both forms.

pub(crate) mod catalog;
#[cfg(all(test, reliable_queue_loom))]
mod loom_models;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod processing;
mod processing_calls;
pub(crate) mod sled;
mod wait;
pub(crate) mod work;

use std::sync::Arc;
use std::task::{Poll, Waker};

use crossbeam_utils::CachePadded;

use std::collections::HashMap;

use self::catalog::Catalog;
#[cfg(feature = "postgres")]
use self::processing::MoveKind;
use self::processing::{Proc, Timers};
use crate::config::Config;
use crate::core::{QueueCore, QueueId, Request, Ticket};
use crate::processing::RetryPolicy;

pub(crate) use crate::core::Entry;
use crate::error::{Error, Result};
use crate::sync::process::{AtomicBool, Mutex, Ordering};

pub use self::catalog::SetAsideRecord;
pub(crate) use self::wait::{block_on, consume_budget, park_until, poll_budget, Unparker};
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

/// A dequeue request that may wait, as an engine keeps it. Dropping it withdraws it; an item
/// already handed to it goes back to the front of its queue (or to the next waiter). One that
/// is never dropped nor polled again (leaked) loses the item handed to it, and its place, to
/// the second dequeue attempt on the queue that finds nothing after the hand-over (see
/// `core/waiters.rs`); nothing else is needed from the engine.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    queue: &'a QueueRef,
    request: Request,
    /// The ticket noted in the transaction's [`Work`], so that the transaction can withdraw
    /// the request should this be leaked.
    noted: Option<Ticket>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queue.core.cancel(&mut self.request);
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
}

#[derive(Debug)]
enum Flavor {
    Memory(memory::Memory),
    Sled(sled::Sled),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Postgres),
}

impl Engine {
    /// Opens the engine the settings name: on disk in `config.path` (sled), else in memory.
    pub(crate) fn open(config: Config) -> Result<Arc<Engine>> {
        #[cfg(feature = "postgres")]
        if config.postgres.is_some() {
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
                        if let Some(key) = &entry.key {
                            proc.core.add_key(key.clone());
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

    /// Connects to the PostgreSQL store `config.postgres` names.
    #[cfg(feature = "postgres")]
    pub(crate) async fn connect(config: Config) -> Result<Arc<Engine>> {
        let Some(pg) = &config.postgres else {
            return Err(Error::Bug {
                invariant: "connect is called with a PostgreSQL configuration",
            });
        };
        let flavor = Flavor::Postgres(postgres::Postgres::connect(pg, config.clock.clone()).await?);
        let timers = Timers::new(config.clock.clone());
        Engine::assemble(config, flavor, timers, HashMap::new())
    }

    fn assemble(
        config: Config,
        flavor: Flavor,
        timers: Arc<Timers>,
        procs: HashMap<QueueId, Arc<Proc>>,
    ) -> Result<Arc<Engine>> {
        let engine = Arc::new(Engine {
            hot: CachePadded::new(Hot {
                closed: AtomicBool::new(false),
                max_item_size: config.max_item_size,
                max_transaction_size: config.max_transaction_size,
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
        work.expiry = Some(self.timers.expire_transaction(deadline, &work.dequeued));
        #[cfg(feature = "postgres")]
        self.arm_remote(work);
        Ok(())
    }

    /// On PostgreSQL, once `work` has a deadline and an open database transaction: arms the
    /// deadline to end the transaction's session when it passes (its rows are then visible
    /// again at once, P10). Called after every call that may begin the transaction.
    #[cfg(feature = "postgres")]
    pub(crate) fn arm_remote(&self, work: &Work) {
        let (Some(expiry), Some(pg)) = (&work.expiry, self.postgres()) else {
            return;
        };
        if let Some(pid) = work.pg.pid() {
            expiry.arm(pg.terminator(pid));
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
        match &self.flavor {
            Flavor::Memory(m) => m.catalog(),
            Flavor::Sled(s) => s.catalog(),
            #[cfg(feature = "postgres")]
            Flavor::Postgres(p) => p.catalog(),
        }
    }

    /// The PostgreSQL engine, if this store is on it.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(&self) -> Option<&postgres::Postgres> {
        match &self.flavor {
            Flavor::Postgres(p) => Some(p),
            _ => None,
        }
    }

    /// Does the engine write its commits somewhere (sled, PostgreSQL), so that their
    /// latency is worth measuring?
    #[inline]
    pub(crate) fn is_durable(&self) -> bool {
        !matches!(self.flavor, Flavor::Memory(_))
    }

    /// Is this store on a remote engine (every item operation a round trip)?
    #[inline]
    pub(crate) fn is_remote(&self) -> bool {
        #[cfg(feature = "postgres")]
        if matches!(self.flavor, Flavor::Postgres(_)) {
            return true;
        }
        false
    }

    /// Fails with [`Error::Unsupported`] on a remote engine, for what is built on the embedded
    /// engines only so far.
    pub(crate) fn check_embedded(&self, operation: &'static str) -> Result<()> {
        if self.is_remote() {
            return Err(Error::Unsupported {
                operation,
                engine: "postgres",
            });
        }
        Ok(())
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
            Flavor::Postgres(p) => return p.queue(name).await.map(|q| self.remote_queue_ref(q)),
        }
        .map(|core| self.queue_ref(core))
    }

    /// A PostgreSQL queue's handle, with its retry policy as the database has it.
    #[cfg(feature = "postgres")]
    fn remote_queue_ref(&self, (core, policy): (Arc<QueueCore>, Option<RetryPolicy>)) -> QueueRef {
        let queue = self.queue_ref(core);
        if let Some(policy) = policy {
            queue.proc.set_policy(policy);
        }
        queue
    }

    /// [`queue`](Self::queue) for threads.
    pub(crate) fn blocking_queue(&self, name: &str) -> Result<QueueRef> {
        self.check_open()?;
        match &self.flavor {
            Flavor::Memory(m) => m.queue(name),
            Flavor::Sled(s) => block_on(s.queue(name)),
            #[cfg(feature = "postgres")]
            Flavor::Postgres(p) => {
                return block_on(p.queue(name)).map(|q| self.remote_queue_ref(q))
            }
        }
        .map(|core| self.queue_ref(core))
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
        }
    }

    /// [`unfence`](Self::unfence) for threads.
    pub(crate) fn blocking_unfence(&self, name: &str) -> Result<()> {
        block_on(self.unfence(name))
    }

    /// Items visible in `queue` now.
    #[inline]
    pub(crate) fn count(&self, queue: &QueueRef) -> Result<u64> {
        self.check_open()?;
        Ok(queue.core.count())
    }

    /// Consumers waiting in `queue` now (of this store, on a remote engine).
    pub(crate) fn waiters(&self, queue: &QueueRef) -> usize {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.postgres() {
            return pg.waiters(&queue.core);
        }
        queue.core.waiters()
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
        work.enqueues.push((queue.core.clone(), bytes));
        Ok(())
    }

    // ---- dequeues -----------------------------------------------------------------------

    /// Takes the front item of `queue` into `work`, without waiting. Returns a reference to
    /// the held entry, to decode.
    #[inline]
    pub(crate) fn try_dequeue<'w>(
        &self,
        queue: &QueueRef,
        work: &'w mut Work,
    ) -> Result<Option<&'w Entry>> {
        work.withdraw_leaked();
        self.check_open()?;
        work.check_live()?;
        // The queue handles take the remote way before this; a queue set does not (yet).
        self.check_embedded("queue sets")?;
        Ok(queue.core.try_take().map(|entry| hold(work, queue, entry)))
    }

    /// A dequeue request on `queue`, not yet in line.
    pub(crate) fn waiting<'q>(&self, queue: &'q QueueRef) -> Waiting<'q> {
        Waiting {
            queue,
            request: Request::default(),
            noted: None,
        }
    }

    /// Takes an item for `waiting` into `work`, or puts the request in line to be woken
    /// through `waker`. A poll that finds nothing may take an item handed to another request
    /// that has not taken it in time (a leaked one); see [`Waiting`].
    pub(crate) fn poll_dequeue<'w>(
        &self,
        waiting: &mut Waiting<'_>,
        work: &'w mut Work,
        waker: &Waker,
    ) -> Poll<Result<&'w Entry>> {
        if let Err(e) = self
            .check_open()
            .and_then(|()| work.check_live())
            .and_then(|()| self.check_embedded("waiting dequeue"))
        {
            return Poll::Ready(Err(e));
        }
        let queue = waiting.queue;
        let polled = queue.core.poll_take(&mut waiting.request, waker);
        if polled.is_pending() {
            if let (None, Some(ticket)) = (waiting.noted, waiting.request.ticket()) {
                work.requests.push((Arc::clone(&queue.core), ticket));
                waiting.noted = Some(ticket);
            }
        } else if let Some(ticket) = waiting.noted.take() {
            work.requests.retain(|(_, t)| *t != ticket);
        }
        match polled {
            Poll::Ready(Ok(entry)) => Poll::Ready(Ok(hold(work, queue, entry))),
            Poll::Ready(Err(_closed)) => Poll::Ready(Err(Error::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Ends `waiting` at its deadline: an entry handed to it at the last moment is taken into
    /// `work` (it is the caller's to use); `None` otherwise.
    pub(crate) fn withdraw<'w>(
        &self,
        waiting: &mut Waiting<'_>,
        work: &'w mut Work,
    ) -> Option<&'w Entry> {
        let queue = waiting.queue;
        if let Some(ticket) = waiting.noted.take() {
            work.requests.retain(|(_, t)| *t != ticket);
        }
        let entry = queue.core.withdraw(&mut waiting.request)?;
        Some(hold(work, queue, entry))
    }

    // ---- transactions -------------------------------------------------------------------

    /// Applies `work` atomically and durably, leaving it empty. On failure its dequeued
    /// items are back in their queues.
    pub(crate) async fn commit(&self, work: &mut Work) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.postgres() {
            return self.commit_remote(pg, std::mem::take(work)).await;
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

    /// [`commit`](Self::commit) for threads.
    #[inline]
    pub(crate) fn blocking_commit(&self, work: &mut Work) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.postgres() {
            return block_on(self.commit_remote(pg, std::mem::take(work)));
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
            abort(std::mem::take(work));
            return Committing::Done(Err(e));
        }
        if work.is_empty() {
            return Committing::Done(Ok(()));
        }
        if !work.moves.is_empty() {
            if let Err(e) = self.prepare_moves(work) {
                abort(std::mem::take(work));
                return Committing::Done(Err(e));
            }
        }
        match &self.flavor {
            Flavor::Memory(m) => {
                m.commit(work, &self.timers);
                Committing::Done(Ok(()))
            }
            Flavor::Sled(s) => Committing::Waiting(s.submit(std::mem::take(work))),
            // `commit` and `blocking_commit` take the remote way before this.
            #[cfg(feature = "postgres")]
            Flavor::Postgres(_) => Committing::Done(Err(Error::Bug {
                invariant: "a remote commit does not start as an embedded one",
            })),
        }
    }

    /// A commit on PostgreSQL: the buffered enqueues and the open database transaction.
    #[cfg(feature = "postgres")]
    async fn commit_remote(&self, pg: &postgres::Postgres, work: Work) -> Result<()> {
        self.commit_remote_and_lease(pg, work, None).await.map(drop)
    }

    /// A commit on PostgreSQL, and with `lease = (queue, n, ttl)` the leases of up to `n`
    /// visible items of `queue` in the same database transaction.
    #[cfg(feature = "postgres")]
    pub(crate) async fn commit_remote_and_lease(
        &self,
        pg: &postgres::Postgres,
        mut work: Work,
        lease: Option<(&QueueRef, usize, u64)>,
    ) -> Result<Vec<postgres::Granted>> {
        work.withdraw_leaked();
        if let Err(e) = self.check_open() {
            abort(work);
            return Err(e);
        }
        if let Err(e) = self.settle_deadline(&mut work) {
            drop_expired(work);
            return Err(e);
        }
        let mut extra = postgres::Extra::default();
        let mut keys = Vec::new();
        for mv in std::mem::take(&mut work.moves) {
            match mv.kind {
                MoveKind::Enqueue { entry, delay } => {
                    let queue = pg.db_id(&mv.proc.core)?;
                    if let Some(key) = &entry.key {
                        keys.push((Arc::clone(&mv.proc.core), key.clone()));
                    }
                    extra.fresh.push(postgres::Fresh {
                        queue,
                        payload: entry.bytes.into_vec(),
                        delay: i64::try_from(delay).unwrap_or(i64::MAX),
                        at: i64::try_from(entry.not_before).unwrap_or(i64::MAX),
                        key: entry.key.map(|k| k.into_vec()),
                    });
                }
                MoveKind::Ack { token, .. } => extra.acks.push((
                    i64::try_from(token).unwrap_or(i64::MAX),
                    mv.proc.core.name().to_owned(),
                )),
                MoveKind::Import { entry, reason } => {
                    let at = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
                    extra.imported.push(postgres::Imported {
                        queue: pg.db_id(&mv.proc.core)?,
                        attempts: i32::try_from(entry.attempts).unwrap_or(i32::MAX),
                        due: at(entry.not_before),
                        enqueued: at(entry.times.enqueued_at),
                        first_attempt: at(entry.times.first_attempt),
                        last_attempt: at(entry.times.last_attempt),
                        payload: entry.bytes.into_vec(),
                        reason,
                    });
                }
                _ => {
                    return Err(Error::Bug {
                        invariant: "a PostgreSQL transaction holds only enqueues and acks",
                    })
                }
            }
        }
        if let Some((queue, n, ttl)) = lease {
            extra.lease = Some((
                pg.db_id(&queue.core)?,
                i64::try_from(n).unwrap_or(i64::MAX),
                i64::try_from(ttl).unwrap_or(i64::MAX),
            ));
        }
        let enqueues = std::mem::take(&mut work.enqueues).into_vec();
        let done = pg
            .commit(std::mem::take(&mut work.pg), enqueues, extra)
            .await;
        // The keys were reserved in this process only while the transaction was open; from
        // now on the database's unique index keeps them.
        for (core, key) in keys {
            core.release_key(&key);
        }
        done
    }

    /// On PostgreSQL: takes up to `n` items at the head of `queue` into `work`'s database
    /// transaction, in queue order.
    #[cfg(feature = "postgres")]
    pub(crate) async fn try_dequeue_remote(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
    ) -> Result<Vec<Entry>> {
        self.check_open()?;
        work.check_live()?;
        let pg = self.postgres().ok_or(Error::Bug {
            invariant: "a remote dequeue is on a remote engine",
        })?;
        let taken = pg.try_dequeue(&queue.core, &mut work.pg, n).await;
        self.arm_remote(work);
        taken
    }

    /// On PostgreSQL: the waiting dequeue. Looks for an item; if there is none, waits for a
    /// notification of a commit to `queue` (woken one at a time with this store's other
    /// consumers), or the fallback poll, or `deadline`, and looks again.
    #[cfg(feature = "postgres")]
    pub(crate) async fn dequeue_remote(
        &self,
        queue: &QueueRef,
        work: &mut Work,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<Entry>> {
        let pg = self.postgres().ok_or(Error::Bug {
            invariant: "a remote dequeue is on a remote engine",
        })?;
        let (watch, ack) = pg.watch(&queue.core)?;
        if let Some(ack) = ack {
            pg.watched(ack, pg.poll_interval()).await;
        }
        loop {
            if let Some(entry) = self.try_dequeue_remote(queue, work, 1).await?.pop() {
                watch.pass_on();
                return Ok(Some(entry));
            }
            let Some(wait) = self.remote_wait(pg, queue, deadline).await? else {
                return Ok(None);
            };
            pg.wait(&watch, wait).await;
        }
    }

    /// On PostgreSQL: leases up to `n` items of `queue` for `ttl` ms; with `wait`, waits
    /// for the first (woken like a waiting dequeue) until `deadline`, if any. Empty only
    /// without `wait` or past the deadline.
    #[cfg(feature = "postgres")]
    pub(crate) async fn lease_remote(
        &self,
        queue: &QueueRef,
        n: usize,
        ttl: u64,
        wait: bool,
        deadline: Option<std::time::Instant>,
    ) -> Result<Vec<postgres::Granted>> {
        self.check_open()?;
        let pg = self.postgres().ok_or(Error::Bug {
            invariant: "a remote lease is on a remote engine",
        })?;
        if !wait {
            return pg.lease(&queue.core, n, ttl).await;
        }
        let (watch, ack) = pg.watch(&queue.core)?;
        if let Some(ack) = ack {
            pg.watched(ack, pg.poll_interval()).await;
        }
        loop {
            self.check_open()?;
            let granted = pg.lease(&queue.core, n, ttl).await?;
            if !granted.is_empty() {
                watch.pass_on();
                return Ok(granted);
            }
            let Some(wait) = self.remote_wait(pg, queue, deadline).await? else {
                return Ok(Vec::new());
            };
            pg.wait(&watch, wait).await;
        }
    }

    /// On PostgreSQL: puts a consumer among the waiters of every queue of `queues` (a
    /// queue set), once the listener watches them.
    #[cfg(feature = "postgres")]
    pub(crate) async fn watch_set<'e>(&'e self, queues: Vec<&'e QueueRef>) -> Result<WatchSet<'e>> {
        let pg = self.postgres().ok_or(Error::Bug {
            invariant: "a remote wait is on a remote engine",
        })?;
        let mut watches = Vec::with_capacity(queues.len());
        for queue in &queues {
            let (watch, ack) = pg.watch(&queue.core)?;
            if let Some(ack) = ack {
                pg.watched(ack, pg.poll_interval()).await;
            }
            watches.push(watch);
        }
        Ok(WatchSet {
            engine: self,
            pg,
            queues,
            watches,
        })
    }

    /// How long a waiting consumer on PostgreSQL that found nothing waits for a
    /// notification before it looks again: until the next delayed item or lease of the
    /// queue falls due, at most the fallback poll, never past `deadline` (`None`: the
    /// deadline has passed).
    #[cfg(feature = "postgres")]
    async fn remote_wait(
        &self,
        pg: &postgres::Postgres,
        queue: &QueueRef,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<std::time::Duration>> {
        let mut wait = pg.poll_interval();
        if !self.config.clock.is_manual() {
            if let Some(due) = pg.next_due(&queue.core).await? {
                wait = wait.min(std::time::Duration::from_millis(due.max(1)));
            }
        }
        Ok(match deadline {
            None => Some(wait),
            Some(deadline) => match deadline.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => Some(left.min(wait)),
                _ => None,
            },
        })
    }

    /// On PostgreSQL: rolls `work`'s database transaction back and waits for it, so that its
    /// rows are visible again when this returns.
    #[cfg(feature = "postgres")]
    pub(crate) async fn abort_remote(&self, mut work: Work) -> Result<()> {
        let pg = self.postgres().ok_or(Error::Bug {
            invariant: "a remote abort is on a remote engine",
        })?;
        if self.settle_deadline(&mut work).is_err() {
            // Past its deadline: rolled back already (its session ended).
            drop_expired(work);
            return Ok(());
        }
        let held = std::mem::take(&mut work.pg);
        abort(work);
        pg.rollback(held).await
    }

    /// Items visible in `queue` now (a round trip on a remote engine).
    pub(crate) async fn count_async(&self, queue: &QueueRef) -> Result<u64> {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.postgres() {
            self.check_open()?;
            return pg.count(&queue.core).await;
        }
        self.count(queue)
    }

    /// Discards `work`: the enqueues are dropped, the dequeued items go back to the front of
    /// their queues, visible at once. On the embedded engines this never waits and cannot
    /// fail; it is also what dropping a transaction does.
    #[inline]
    pub(crate) fn abort(&self, mut work: Work) {
        match self.settle_deadline(&mut work) {
            Ok(()) => abort(work),
            Err(_) => drop_expired(work),
        }
    }

    /// The transaction of `work` commits or aborts: its deadline, if it has one, is settled
    /// and its timer removed. Fails with [`Error::TransactionExpired`] if the deadline passed
    /// first (its held items went back then).
    fn settle_deadline(&self, work: &mut Work) -> Result<()> {
        let Some(expiry) = work.expiry.take() else {
            return Ok(());
        };
        expiry.settle()?;
        self.timers.cancel_transaction(&expiry);
        Ok(())
    }

    // ---- the store ----------------------------------------------------------------------

    /// Makes every commit so far durable.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.check_open()?;
        match &self.flavor {
            Flavor::Memory(_) => Ok(()),
            Flavor::Sled(s) => s.flush().await,
            // Every commit is durable when it returns.
            #[cfg(feature = "postgres")]
            Flavor::Postgres(_) => Ok(()),
        }
    }

    /// [`flush`](Self::flush) for threads.
    pub(crate) fn blocking_flush(&self) -> Result<()> {
        block_on(self.flush())
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
                p.close();
                Ok(())
            }
        }
    }

    /// [`close`](Self::close) for threads.
    pub(crate) fn blocking_close(&self) -> Result<()> {
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

/// A consumer waiting on several PostgreSQL queues (a queue set).
#[cfg(feature = "postgres")]
pub(crate) struct WatchSet<'e> {
    engine: &'e Engine,
    pg: &'e postgres::Postgres,
    queues: Vec<&'e QueueRef>,
    watches: Vec<postgres::Watch>,
}

#[cfg(feature = "postgres")]
impl WatchSet<'_> {
    /// Waits for a notification on any of the queues, until the first of them has an item
    /// falling due, at most the fallback poll and never past `deadline`. False once the
    /// deadline has passed.
    pub(crate) async fn wait(&self, deadline: Option<std::time::Instant>) -> Result<bool> {
        self.engine.check_open()?;
        let mut wait = None;
        for queue in &self.queues {
            match self.engine.remote_wait(self.pg, queue, deadline).await? {
                None => return Ok(false),
                Some(w) => wait = Some(wait.map_or(w, |v: std::time::Duration| v.min(w))),
            }
        }
        self.pg
            .wait_any(&self.watches, wait.unwrap_or(self.pg.poll_interval()))
            .await;
        Ok(true)
    }

    /// An item was taken: the next waiters look too.
    pub(crate) fn pass_on(&self) {
        for watch in &self.watches {
            watch.pass_on();
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
    work.dequeued.push((queue.core.clone(), entry));
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
