//! The store's timers on the embedded engines: one thread that ends leases at their deadlines
//! (back to the queue's head, or to the dead letters at the maximum attempts, through
//! [`BuryExpired`]), makes delayed items due, and ends transactions at their deadlines
//! ([`TxExpiry`], P10).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::proc::Proc;
use crate::clock::{Clock, OnAdvance};
use crate::core::{Entry, QueueCore, QueueIndex, QueueTable};
use crate::error::{Error, Result};
use crate::sync::process::{AtomicU64, Condvar, Mutex, Ordering};

/// The deadline of a transaction (P10): past it the items it holds go back at once and its
/// later calls and its commit fail with [`Error::TransactionExpired`].
///
/// The transaction keeps its held entries in its `Work` as usual; this keeps a copy of each
/// (made when it is taken: a cost only transactions with a deadline pay) for the timer to put
/// back. Exactly one of "the timer fires" and "the transaction settles (commits or aborts)"
/// happens first, under this lock: after an expiry the transaction's own entries are dropped
/// unrestored, after a settlement the copies are.
#[derive(Debug)]
pub(crate) struct TxExpiry {
    pub(crate) deadline: u64,
    /// Its key among the timers (with `deadline`), to cancel it once settled.
    key: u64,
    /// The store's queues, which the copies name by index.
    table: Arc<QueueTable>,
    state: Mutex<TxState>,
}

#[derive(Default)]
struct TxState {
    copies: Vec<(QueueIndex, Entry)>,
    expired: bool,
    settled: bool,
    /// What else the deadline does (on PostgreSQL: ends the transaction's database session),
    /// once armed.
    on_fire: Option<Box<dyn FnOnce() + Send>>,
    armed: bool,
}

impl std::fmt::Debug for TxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxState")
            .field("held", &self.copies.len())
            .field("expired", &self.expired)
            .field("settled", &self.settled)
            .field("armed", &self.armed)
            .finish()
    }
}

impl TxExpiry {
    fn new(
        deadline: u64,
        key: u64,
        held: &[(QueueIndex, Entry)],
        table: &Arc<QueueTable>,
    ) -> Arc<TxExpiry> {
        Arc::new(TxExpiry {
            deadline,
            key,
            table: Arc::clone(table),
            state: Mutex::new(TxState {
                copies: held.to_vec(),
                expired: false,
                settled: false,
                on_fire: None,
                armed: false,
            }),
        })
    }

    pub(crate) fn is_expired(&self) -> bool {
        self.state.lock().expired
    }

    /// Notes an entry the transaction took. If the deadline passed meanwhile, the copy goes
    /// back at once (the timer has run already).
    pub(crate) fn note(&self, core: &QueueCore, entry: &Entry) {
        let mut state = self.state.lock();
        if state.expired {
            drop(state);
            crate::core::give_back_all(&self.table, [(core.index(), entry.clone())]);
            return;
        }
        state.copies.push((core.index(), entry.clone()));
    }

    /// The transaction gives back entry `id` of `core` itself: the timer must not. False if
    /// the timer has run already (it gave the entry back).
    pub(crate) fn forget(&self, queue: QueueIndex, id: u64) -> bool {
        let mut state = self.state.lock();
        if state.expired {
            return false;
        }
        state.copies.retain(|(q, e)| !(e.id == id && *q == queue));
        true
    }

    /// The transaction commits or aborts: the timer will do nothing. Fails if it ran first.
    pub(crate) fn settle(&self) -> Result<()> {
        let mut state = self.state.lock();
        if state.expired {
            return Err(Error::TransactionExpired);
        }
        state.settled = true;
        state.copies = Vec::new();
        Ok(())
    }

    /// Gives the deadline something more to do when it passes, once: `hook` runs then (at
    /// once, in this thread, if it has passed already). False if it was armed before, or the
    /// transaction has settled.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn arm(&self, hook: Box<dyn FnOnce() + Send>) -> bool {
        let mut state = self.state.lock();
        if state.armed || state.settled {
            return false;
        }
        state.armed = true;
        if state.expired {
            drop(state);
            hook();
        } else {
            state.on_fire = Some(hook);
        }
        true
    }

    /// The deadline passed: the copies go back, unless the transaction settled first, and
    /// the armed hook runs.
    fn fire(&self) {
        let (copies, hook) = {
            let mut state = self.state.lock();
            if state.settled || state.expired {
                return;
            }
            state.expired = true;
            (std::mem::take(&mut state.copies), state.on_fire.take())
        };
        crate::core::give_back_all(&self.table, copies);
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// What a timer does when it fires.
#[derive(Debug)]
enum Timer {
    /// A delayed item becomes visible.
    Due(Arc<Proc>, Entry),
    /// The leases of this queue due by then end (see `LeaseTable`).
    Expire(Arc<Proc>),
    /// A transaction's deadline.
    Transaction(Arc<TxExpiry>),
}

#[derive(Debug, Default)]
struct TimerState {
    /// By (due time, item id or lease token): unique, in time order.
    timers: BTreeMap<(u64, u64), Timer>,
    /// When the timer thread wakes by itself: the due time it sleeps until, `u64::MAX` while
    /// it sleeps with nothing due, 0 while it is awake (it looks at the map again before it
    /// sleeps). A new timer wakes it only when it is due earlier, so a lease granted and
    /// settled before its deadline costs no wake-up of the thread.
    wakes_at: u64,
    stopped: bool,
}

/// What a timer asks of the engine it runs for: a commit that moves an item whose last lease
/// expired at the maximum attempts to the dead letters. The engine implements it (in
/// `processing_calls.rs`); the timers hold it weakly, as the clock holds them ([`OnAdvance`]).
pub(crate) trait BuryExpired: Send + Sync {
    /// A lease expired at the maximum attempts: its item moves to the dead letters.
    fn bury_expired(&self, proc: &Arc<Proc>, entry: Entry);
}

/// The store's timers: lease deadlines and delayed items, in time order. With the real clock
/// a thread of their own sleeps until the next one; with a [`ManualClock`](crate::ManualClock)
/// they run in the thread that advances it.
#[derive(Debug)]
pub(crate) struct Timers {
    clock: Clock,
    state: Mutex<TimerState>,
    wake: Condvar,
    /// The engine, for the commits a timer makes (an expiry at the maximum attempts buries).
    engine: OnceLock<Weak<dyn BuryExpired>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Keys of transaction and lease timers count down from `u64::MAX`, far from any item id.
    next_tx_key: AtomicU64,
}

impl Timers {
    pub(crate) fn new(clock: Clock) -> Arc<Timers> {
        Arc::new(Timers {
            clock,
            state: Mutex::new(TimerState::default()),
            wake: Condvar::new(),
            engine: OnceLock::new(),
            thread: Mutex::new(None),
            next_tx_key: AtomicU64::new(u64::MAX),
        })
    }

    /// A deadline at `deadline` for a transaction holding `held`, registered to run then.
    pub(crate) fn expire_transaction(
        &self,
        deadline: u64,
        held: &[(QueueIndex, Entry)],
        table: &Arc<QueueTable>,
    ) -> Arc<TxExpiry> {
        let key = self.next_tx_key.fetch_sub(1, Ordering::Relaxed);
        let expiry = TxExpiry::new(deadline, key, held, table);
        self.add(deadline, key, Timer::Transaction(Arc::clone(&expiry)));
        expiry
    }

    /// Forgets the timer of a settled transaction (so that a store-wide deadline does not
    /// keep one timer per finished transaction until it passes).
    pub(crate) fn cancel_transaction(&self, expiry: &TxExpiry) {
        self.state
            .lock()
            .timers
            .remove(&(expiry.deadline, expiry.key));
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Starts running timers for `engine`: a thread for the real clock, the clock's
    /// `advance` for a manual one.
    pub(crate) fn start(self: &Arc<Self>, engine: Weak<dyn BuryExpired>) -> std::io::Result<()> {
        if self.engine.set(engine).is_err() {
            return Ok(());
        }
        if self.clock.is_manual() {
            let me: Arc<dyn OnAdvance> = self.clone();
            self.clock.listen(Arc::downgrade(&me));
            return Ok(());
        }
        let me = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name("reliable-queue-timers".into())
            .spawn(move || me.run())?;
        *self.thread.lock() = Some(thread);
        Ok(())
    }

    /// Stops the timer thread (timers not yet due stay unfired; the store is closing).
    pub(crate) fn stop(&self) {
        self.state.lock().stopped = true;
        self.wake.notify_all();
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!("the timer thread panicked");
            }
        }
    }

    fn add(&self, due: u64, key: u64, timer: Timer) {
        let mut state = self.state.lock();
        if state.stopped {
            return;
        }
        let sooner = due < state.wakes_at;
        state.timers.insert((due, key), timer);
        drop(state);
        if sooner {
            self.wake.notify_all();
        }
    }

    /// Makes `entry` visible at its due time (at the tail of its queue), or now if it is due.
    pub(crate) fn due_at(&self, proc: &Arc<Proc>, entry: Entry, now: u64) {
        if entry.not_before() <= now {
            proc.core.publish_one(entry);
            return;
        }
        proc.delayed.fetch_add(1, Ordering::AcqRel);
        self.add(
            entry.not_before(),
            entry.id,
            Timer::Due(Arc::clone(proc), entry),
        );
    }

    /// Looks at the leases of `proc` at `deadline` (what `Proc::insert_lease` and its like
    /// return): those due by then end.
    pub(crate) fn watch(&self, proc: &Arc<Proc>, deadline: u64) {
        let key = self.next_tx_key.fetch_sub(1, Ordering::Relaxed);
        self.add(deadline, key, Timer::Expire(Arc::clone(proc)));
    }

    /// Delayed items of `proc`, for browsing.
    pub(crate) fn delayed_entries(&self, proc: &Arc<Proc>) -> Vec<Entry> {
        self.state
            .lock()
            .timers
            .values()
            .filter_map(|t| match t {
                Timer::Due(p, e) if Arc::ptr_eq(p, proc) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    fn run(self: Arc<Self>) {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return;
            }
            let now = self.clock.now();
            match state.timers.keys().next() {
                Some(&(due, _)) if due <= now => {
                    let fired = take_due(&mut state, now);
                    drop(state);
                    self.fire(fired, now);
                    state = self.state.lock();
                }
                Some(&(due, _)) => {
                    state.wakes_at = due;
                    let wait = Duration::from_millis(due - now);
                    self.wake.wait_for(&mut state, wait);
                    state.wakes_at = 0;
                }
                None => {
                    state.wakes_at = u64::MAX;
                    self.wake.wait(&mut state);
                    state.wakes_at = 0;
                }
            }
        }
    }

    /// Runs the timers in `fired`, in time order.
    fn fire(&self, fired: Vec<((u64, u64), Timer)>, now: u64) {
        let mut due: Vec<Entry> = Vec::new();
        let mut due_proc: Option<Arc<Proc>> = None;
        let flush = |proc: &Option<Arc<Proc>>, due: &mut Vec<Entry>| {
            if let Some(proc) = proc {
                if !due.is_empty() {
                    let n = u64::try_from(due.len()).unwrap_or(u64::MAX);
                    let before = proc.delayed.fetch_sub(n, Ordering::AcqRel);
                    debug_assert!(before >= n, "the count of delayed items never goes below 0");
                    proc.core.publish(std::mem::take(due));
                }
            }
        };
        for (_, timer) in fired {
            match timer {
                Timer::Due(proc, entry) => {
                    if !due_proc.as_ref().is_some_and(|p| Arc::ptr_eq(p, &proc)) {
                        flush(&due_proc, &mut due);
                        due_proc = Some(proc);
                    }
                    due.push(entry);
                }
                Timer::Expire(proc) => {
                    flush(&due_proc, &mut due);
                    let (expired, next) = proc.expire_due(now);
                    if let Some(deadline) = next {
                        self.watch(&proc, deadline);
                    }
                    for leased in expired {
                        self.expired(&proc, leased.entry);
                    }
                }
                Timer::Transaction(expiry) => expiry.fire(),
            }
        }
        flush(&due_proc, &mut due);
    }

    /// An expired lease: the item goes back to the front, or to the dead letters once it has
    /// had its attempts.
    fn expired(&self, proc: &Arc<Proc>, entry: Entry) {
        crate::metrics::lease_expired(proc.core.name());
        let span = tracing::debug_span!(
            "lease_expiry",
            queue = proc.core.name(),
            item = entry.id,
            attempts = entry.attempts()
        );
        let _entered = span.enter();
        tracing::debug!("a lease expired");
        if entry.attempts() < proc.policy().attempts_allowed() {
            proc.core.restore(std::iter::once(entry));
            return;
        }
        match self.engine.get().and_then(Weak::upgrade) {
            Some(engine) => engine.bury_expired(proc, entry),
            None => proc.core.restore(std::iter::once(entry)),
        }
    }
}

fn take_due(state: &mut TimerState, now: u64) -> Vec<((u64, u64), Timer)> {
    let later = state.timers.split_off(&(now.saturating_add(1), 0));
    let due = std::mem::replace(&mut state.timers, later);
    due.into_iter().collect()
}

impl OnAdvance for Timers {
    fn advanced(&self, now: u64) {
        let fired = {
            let mut state = self.state.lock();
            if state.stopped {
                return;
            }
            take_due(&mut state, now)
        };
        self.fire(fired, now);
    }
}

#[cfg(all(test, not(reliable_queue_loom)))]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use crate::{ManualClock, Store};

    /// With the real clock: a timer thread asleep until a lease's deadline a minute away is
    /// woken for a delayed item due sooner (a new timer notifies it only when it is due
    /// before the thread would wake by itself). A wait with a long timeout, not a sleep: the
    /// item arrives about 20 ms after the commit, and only a missed wake-up makes it late.
    #[test]
    fn a_timer_due_before_the_timer_thread_wakes_wakes_it() {
        let store = Store::in_memory().unwrap();
        let q = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 1).unwrap();
        tx.blocking_commit().unwrap();
        let _lease = q.blocking_lease(Duration::from_secs(60)).unwrap();
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 2, Duration::from_millis(20))
            .unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        let got = q
            .blocking_dequeue_timeout(&mut tx, Duration::from_secs(30))
            .unwrap();
        assert_eq!(got, Some(2));
    }

    /// Settled and extended leases leave a bounded trace, settled transactions none: the
    /// store's timers hold one entry for the queue's leases (a watch at the first deadline),
    /// and the queue's deadline heap stays within its bound of the running leases.
    #[test]
    fn settled_leases_and_transactions_leave_bounded_timers() {
        let clock = ManualClock::new(UNIX_EPOCH).unwrap();
        let store = Store::builder().clock(clock.clone()).open().unwrap();
        let q = store.blocking_queue::<u32>("q").unwrap();
        let ttl = Duration::from_secs(60);
        let heap = || q.queue_ref().proc.deadlines_kept();
        let timers = || q.engine().timers.state.lock().timers.len();
        for i in 0..100 {
            let mut tx = store.begin();
            tx.set_timeout(ttl).unwrap();
            q.enqueue(&mut tx, i).unwrap();
            tx.blocking_commit().unwrap();
            let mut lease = q.blocking_lease(ttl).unwrap();
            lease.blocking_extend(ttl * 2).unwrap();
            match i % 4 {
                0 => lease.blocking_complete().unwrap(),
                1 => drop(lease),
                2 => lease.blocking_release(Duration::ZERO).unwrap(),
                _ => {
                    let mut tx = store.begin();
                    lease.ack(&mut tx).unwrap();
                    tx.blocking_commit().unwrap();
                }
            }
            assert_eq!(timers(), 1, "round {i}");
            // One lease at a time: `add_deadline` keeps at most 2 × 1 + 64 before a push.
            assert!(heap() <= 2 + 64 + 1, "round {i}: {} deadlines", heap());
            clock.advance(Duration::from_millis(1));
        }
    }
}
