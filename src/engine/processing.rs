//! The processing layer on the embedded engines: leases, delayed items, dead letters, and the
//! timers that end leases and make delayed items due.
//!
//! Every processing-layer change of an item is a [`Move`] in a transaction's
//! [`Work`](super::Work): it retires the item's current id and (but for an ack or a purge)
//! gives the item a new version under a fresh id, assigned at commit like an enqueue's. A
//! commit applies its moves after its enqueues, with the same durability: on the sled engine
//! each move is one op of the group's record (see `sled::record`), so a lease's attempt count,
//! a retry's due time and a dead-letter move are as durable as any commit. What is not logged:
//!
//! - a lease itself (its holder and deadline): a restart ends every lease of the previous
//!   process, whose holders died with it, so only the attempt count must survive;
//! - `extend`, and a release without delay: they change nothing that a restart keeps.
//!
//! Per queue, a [`Proc`] holds the leased items (by fencing token: the id of the leased
//! version), the count of delayed items, the dead letters (on the sled engine without their
//! bytes, which stay in the log) and the retry policy. The store's [`Timers`] hold every
//! delayed item and every lease deadline, in time order.
//!
//! PostgreSQL (issue 11) maps each of these onto rows: a lease is an `UPDATE .. SET
//! leased_until, attempts = attempts + 1, token = nextval(..)` of a row taken with `FOR UPDATE
//! SKIP LOCKED`, expiry is the database clock passing `leased_until` (consumers take expired
//! rows like visible ones), fencing compares the token in the `WHERE` clause, delayed items
//! are rows with `not_before` in the future, and dead letters are rows of a table of their own.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;

use rustc_hash::FxHashMap;
use std::time::Duration;

use crate::clock::{Clock, OnAdvance};
use crate::core::{Entry, QueueCore};
use crate::error::{Error, Result};
use crate::processing::{RetryPolicy, MAX_ATTEMPTS};
use crate::sync::process::{AtomicU64, Condvar, Mutex, Ordering};

/// Reason given to a dead letter whose last lease expired.
pub(crate) const EXPIRED: &str = "lease expired";

/// Longest dead-letter reason kept, in bytes; a longer one is cut at a character boundary.
pub(crate) const MAX_REASON: usize = 4096;

/// A leased item.
#[derive(Debug)]
pub(crate) struct Leased {
    pub(crate) entry: Entry,
    pub(crate) deadline: u64,
}

/// A dead letter as the engine keeps it. On the sled engine `bytes` is `None`: the item's
/// bytes stay in its `Bury` record in the log, read when asked for.
#[derive(Debug, Clone)]
pub(crate) struct DeadSlot {
    pub(crate) entry: Entry,
    pub(crate) reason: String,
    /// False when `entry.bytes` is a placeholder (sled: read from the log).
    pub(crate) has_bytes: bool,
}

/// The running leases of one queue and their deadlines.
///
/// The deadlines are a heap cleaned lazily: settling a lease leaves its deadline behind, and an
/// extension adds one; entries whose lease no longer runs to that deadline are dropped when
/// they reach the top, or all at once when they outnumber the running leases (so the heap
/// stays within a constant factor of them). The store's timers hold one entry per queue, at
/// the earliest deadline registered, rather than one per lease: granting a lease later than
/// that, or settling one, never touches them.
#[derive(Debug, Default)]
struct LeaseTable {
    /// By token. (Tokens are ids handed out in sequence: a multiplicative hash spreads them at
    /// a fraction of the default hasher's cost.)
    running: FxHashMap<u64, Leased>,
    /// `(deadline, token)`, earliest first; some stale (see above).
    deadlines: BinaryHeap<Reverse<(u64, u64)>>,
    /// The earliest time the store's timers will look at this table (`u64::MAX`: never).
    watched: u64,
}

impl LeaseTable {
    fn new() -> Self {
        LeaseTable {
            watched: u64::MAX,
            ..LeaseTable::default()
        }
    }

    /// Adds `deadline` for lease `token`; returns it if the store's timers must be told
    /// (it is earlier than any time they look at the table already).
    fn add_deadline(&mut self, token: u64, deadline: u64) -> Option<u64> {
        if self.deadlines.len() > 2 * self.running.len() + 64 {
            self.compact();
        }
        self.deadlines.push(Reverse((deadline, token)));
        (deadline < self.watched).then(|| {
            self.watched = deadline;
            deadline
        })
    }

    /// Keeps only the deadlines of running leases.
    fn compact(&mut self) {
        let mut all = std::mem::take(&mut self.deadlines).into_vec();
        all.clear();
        all.extend(self.running.iter().map(|(t, l)| Reverse((l.deadline, *t))));
        self.deadlines = BinaryHeap::from(all);
    }

    fn is_current(&self, deadline: u64, token: u64) -> bool {
        self.running
            .get(&token)
            .is_some_and(|l| l.deadline == deadline)
    }
}

/// The processing-layer state of one queue.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) core: Arc<QueueCore>,
    /// Running leases. Its lock decides every race between a settlement, an extension and an
    /// expiry (loom-modelled: `engine::loom_models`).
    leases: crate::sync::Mutex<LeaseTable>,
    delayed: AtomicU64,
    dead: Mutex<BTreeMap<u64, DeadSlot>>,
    policy: Mutex<RetryPolicy>,
}

impl Proc {
    pub(crate) fn new(core: Arc<QueueCore>, policy: RetryPolicy) -> Self {
        Proc {
            core,
            leases: crate::sync::Mutex::new(LeaseTable::new()),
            delayed: AtomicU64::new(0),
            dead: Mutex::new(BTreeMap::new()),
            policy: Mutex::new(policy),
        }
    }

    pub(crate) fn policy(&self) -> RetryPolicy {
        *self.policy.lock()
    }

    pub(crate) fn set_policy(&self, policy: RetryPolicy) {
        *self.policy.lock() = policy;
    }

    pub(crate) fn leased(&self) -> u64 {
        u64::try_from(self.leases.lock().running.len()).unwrap_or(u64::MAX)
    }

    pub(crate) fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Acquire)
    }

    pub(crate) fn dead_count(&self) -> u64 {
        u64::try_from(self.dead.lock().len()).unwrap_or(u64::MAX)
    }

    /// The lease `token` if it is still running at `now`: its deadline and attempt.
    pub(crate) fn lease_state(&self, token: u64, now: u64) -> Option<(u64, u32)> {
        self.leases
            .lock()
            .running
            .get(&token)
            .filter(|l| l.deadline > now)
            .map(|l| (l.deadline, l.entry.attempts))
    }

    /// Moves the deadline of lease `token`, if it is still running at `now`: `None` if it is
    /// not, else whether the store's timers must be told of the new deadline (see
    /// [`Timers::watch`]).
    pub(crate) fn extend(&self, token: u64, now: u64, deadline: u64) -> Option<Option<u64>> {
        let mut table = self.leases.lock();
        match table.running.get_mut(&token) {
            Some(l) if l.deadline > now => {
                if l.deadline == deadline {
                    return Some(None);
                }
                l.deadline = deadline;
                Some(table.add_deadline(token, deadline))
            }
            _ => None,
        }
    }

    /// Ends lease `token` for its holder, if it is still running at `now`.
    pub(crate) fn claim(&self, token: u64, now: u64) -> Option<Leased> {
        let mut table = self.leases.lock();
        match table.running.get(&token) {
            Some(l) if l.deadline > now => table.running.remove(&token),
            _ => None,
        }
    }

    /// Ends every lease whose deadline has passed at `now`, for the timer. Also returns the
    /// next time the store's timers must look at the table, if they do not already.
    pub(crate) fn expire_due(&self, now: u64) -> (Vec<Leased>, Option<u64>) {
        let mut table = self.leases.lock();
        let mut expired = Vec::new();
        while let Some(&Reverse((deadline, token))) = table.deadlines.peek() {
            if deadline <= now {
                table.deadlines.pop();
                if table.is_current(deadline, token) {
                    expired.extend(table.running.remove(&token));
                }
            } else if !table.is_current(deadline, token) {
                table.deadlines.pop();
            } else {
                break;
            }
        }
        if table.watched <= now {
            table.watched = u64::MAX;
        }
        let next = table.deadlines.peek().map(|&Reverse((d, _))| d);
        let watch = next.filter(|&d| d < table.watched);
        if let Some(d) = watch {
            table.watched = d;
        }
        (expired, watch)
    }

    /// Ends lease `token` whatever its deadline (its holder gave it up).
    pub(crate) fn take_lease(&self, token: u64) -> Option<Leased> {
        self.leases.lock().running.remove(&token)
    }

    /// Adds a running lease; returns its deadline if the store's timers must be told of it
    /// (see [`Timers::watch`]).
    #[must_use = "the store's timers must watch the deadline returned"]
    pub(crate) fn insert_lease(&self, token: u64, leased: Leased) -> Option<u64> {
        let deadline = leased.deadline;
        let mut table = self.leases.lock();
        table.running.insert(token, leased);
        table.add_deadline(token, deadline)
    }

    /// [`insert_lease`](Self::insert_lease) for several leases under one lock.
    #[must_use = "the store's timers must watch the deadline returned"]
    pub(super) fn insert_leases(&self, leased: impl Iterator<Item = (u64, Leased)>) -> Option<u64> {
        let mut table = self.leases.lock();
        let mut watch = None;
        for (token, lease) in leased {
            let deadline = lease.deadline;
            table.running.insert(token, lease);
            watch = table.add_deadline(token, deadline).or(watch);
        }
        watch
    }

    /// Leased items, for browsing: (token, deadline, entry clone), ids from `after`.
    pub(crate) fn leased_entries(&self) -> Vec<(u64, u64, Entry)> {
        self.leases
            .lock()
            .running
            .iter()
            .map(|(t, l)| (*t, l.deadline, l.entry.clone()))
            .collect()
    }

    /// Dead letters with ids above `after`, oldest first, at most `limit`.
    pub(crate) fn dead_page(&self, after: Option<u64>, limit: usize) -> Vec<DeadSlot> {
        let dead = self.dead.lock();
        let start = after.map_or(0, |a| a.saturating_add(1));
        dead.range(start..)
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Ids of dead letters, oldest first: all of them, or the first `n`.
    pub(crate) fn dead_ids(&self, n: Option<usize>) -> Vec<u64> {
        let dead = self.dead.lock();
        dead.keys().take(n.unwrap_or(usize::MAX)).copied().collect()
    }

    /// Takes dead letter `id` out (for a replay or purge about to commit).
    pub(crate) fn take_dead(&self, id: u64) -> Option<DeadSlot> {
        self.dead.lock().remove(&id)
    }

    /// Puts a dead letter (back) in.
    pub(crate) fn put_dead(&self, slot: DeadSlot) {
        self.dead.lock().insert(slot.entry.id, slot);
    }
}

/// The answer to a lease request: filled in by the commit that records the attempt.
#[derive(Debug, Default)]
pub(crate) struct Grant(Mutex<GrantState>);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantState {
    #[default]
    Waiting,
    /// The lease runs under this token until this deadline, as this attempt.
    Granted {
        token: u64,
        deadline: u64,
        attempt: u32,
    },
    /// Whoever asked is gone: the item goes back at once.
    Abandoned,
}

impl Grant {
    pub(crate) fn state(&self) -> GrantState {
        *self.0.lock()
    }

    /// The asker is gone. Returns the lease to give back, if it was granted already.
    pub(crate) fn abandon(&self) -> Option<u64> {
        let mut state = self.0.lock();
        let token = match *state {
            GrantState::Granted { token, .. } => Some(token),
            _ => None,
        };
        *state = GrantState::Abandoned;
        token
    }
}

/// One processing-layer change of an item, applied by a commit (see the module docs).
#[derive(Debug)]
pub(crate) struct Move {
    pub(crate) proc: Arc<Proc>,
    pub(crate) kind: MoveKind,
}

#[derive(Debug)]
pub(crate) enum MoveKind {
    /// A fresh item that is delayed or has a deduplication key (reserved in its queue when it
    /// was buffered); its id is assigned at commit. It is due `delay` ms after the commit,
    /// or at `entry.not_before` when `delay` is 0.
    Enqueue { entry: Entry, delay: u64 },
    /// A lease: `entry` is the item taken from the queue (its id the old one) with its next
    /// attempt counted.
    Lease {
        entry: Entry,
        ttl: u64,
        grant: Arc<Grant>,
    },
    /// A settled lease (token `entry.id`) due again at `entry.not_before`.
    Retry { entry: Entry },
    /// To the dead letters (from a settled lease, token `entry.id`, or an expired one).
    Bury { entry: Entry, reason: String },
    /// A dead letter back to the queue (at its tail): claimed at commit start; on the sled
    /// engine its bytes are read from the log by the committer.
    Replay { slot: DeadSlot, reset: bool },
    /// An acknowledged lease: claimed at commit start (`claimed`), then gone.
    Ack { token: u64, claimed: Option<Leased> },
    /// A dead letter deleted.
    Purge { slot: DeadSlot },
    /// An item imported as it stood in another store (`rq import`): its attempts, due
    /// time and times kept, a fresh id assigned at commit; with `reason`, a dead letter.
    Import {
        entry: Entry,
        reason: Option<String>,
    },
}

impl Move {
    /// Does the move give the item a new version (and so take a fresh id)?
    pub(crate) fn makes_version(&self) -> bool {
        !matches!(self.kind, MoveKind::Ack { .. } | MoveKind::Purge { .. })
    }

    /// Undoes the move after an abort or a failed commit. Whatever item it took goes back to
    /// the front of its queue, as a dequeued item would: the one taken for a lease (its
    /// attempt not counted), a settled lease (nobody holds its `Lease` any more), a lease
    /// acknowledged in the transaction; a dead letter goes back to the dead letters.
    pub(crate) fn undo(self) {
        let Move { proc, kind } = self;
        let back = match kind {
            MoveKind::Enqueue { entry, .. } => {
                if let Some(key) = &entry.key {
                    proc.core.release_key(key);
                }
                None
            }
            MoveKind::Lease {
                mut entry, grant, ..
            } => {
                grant.abandon();
                entry.attempts = entry.attempts.saturating_sub(1);
                Some(entry)
            }
            MoveKind::Retry { entry } | MoveKind::Bury { entry, .. } => Some(entry),
            MoveKind::Replay { slot, .. } | MoveKind::Purge { slot } => {
                proc.put_dead(slot);
                None
            }
            MoveKind::Ack { token, claimed } => {
                claimed.or_else(|| proc.take_lease(token)).map(|l| l.entry)
            }
            MoveKind::Import { .. } => None,
        };
        if let Some(entry) = back {
            proc.core.restore(std::iter::once(entry));
        }
    }
}

/// What a committed move becomes, given its new id (if it takes one) and the commit time.
/// With `dead_on_disk` a dead letter keeps no bytes in memory (the sled engine reads them
/// from its log).
pub(crate) fn apply(mv: Move, id: u64, now: u64, timers: &Timers, dead_on_disk: bool) {
    let Move { proc, kind } = mv;
    match kind {
        MoveKind::Enqueue { mut entry, delay } => {
            entry.id = id;
            entry.times.enqueued_at = now;
            entry.not_before = due_after(&entry, delay, now);
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Retry { mut entry } => {
            entry.id = id;
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Replay { slot, reset } => {
            let mut entry = slot.entry;
            entry.id = id;
            entry.not_before = 0;
            if reset {
                entry.attempts = 0;
            }
            if let Some(key) = &entry.key {
                proc.core.add_key(key.clone());
            }
            proc.core.publish(std::iter::once(entry));
        }
        MoveKind::Lease {
            mut entry,
            ttl,
            grant,
        } => {
            entry.id = id;
            let deadline = now.saturating_add(ttl);
            let mut state = grant.0.lock();
            if *state == GrantState::Abandoned {
                drop(state);
                proc.core.restore(std::iter::once(entry));
                return;
            }
            let attempt = entry.attempts;
            let watch = proc.insert_lease(id, Leased { entry, deadline });
            *state = GrantState::Granted {
                token: id,
                deadline,
                attempt,
            };
            drop(state);
            if let Some(deadline) = watch {
                timers.watch(&proc, deadline);
            }
        }
        MoveKind::Bury { entry, reason } => bury(&proc, entry, id, reason, dead_on_disk),
        MoveKind::Ack { claimed, .. } => {
            if let Some(key) = claimed.as_ref().and_then(|l| l.entry.key.as_ref()) {
                proc.core.release_key(key);
            }
        }
        MoveKind::Purge { .. } => {}
        MoveKind::Import {
            mut entry,
            reason: None,
        } => {
            entry.id = id;
            if entry.times.enqueued_at == 0 {
                entry.times.enqueued_at = now;
            }
            timers.due_at(&proc, entry, now);
        }
        MoveKind::Import {
            mut entry,
            reason: Some(reason),
        } => {
            if entry.times.enqueued_at == 0 {
                entry.times.enqueued_at = now;
            }
            bury(&proc, entry, id, reason, dead_on_disk);
        }
    }
}

/// `entry` (its new version `id`) into the dead letters of `proc`. With `dead_on_disk` its
/// bytes are not kept in memory (the sled engine reads them from its log).
fn bury(proc: &Arc<Proc>, mut entry: Entry, id: u64, reason: String, dead_on_disk: bool) {
    entry.id = id;
    entry.not_before = 0;
    // A dead letter is not in its queue: its key is free.
    if let Some(key) = &entry.key {
        proc.core.release_key(key);
    }
    if dead_on_disk {
        entry.bytes = Box::default();
    }
    proc.put_dead(DeadSlot {
        entry,
        reason,
        has_bytes: !dead_on_disk,
    });
}

/// Counts a lease granted at `now` as the item's next attempt: no further than
/// [`MAX_ATTEMPTS`], as on PostgreSQL (a count above it, written before the maximum was
/// enforced, is kept as it is: attempts never go down).
pub(super) fn count_attempt(entry: &mut Entry, now: u64) {
    if entry.attempts < MAX_ATTEMPTS {
        entry.attempts = entry.attempts.saturating_add(1);
    }
    if entry.times.first_attempt == 0 {
        entry.times.first_attempt = now;
    }
    entry.times.last_attempt = now;
}

/// When a fresh item committed at `now` is due: `delay` after the commit, or at the time it
/// was given (`entry.not_before`).
pub(crate) fn due_after(entry: &Entry, delay: u64, now: u64) -> u64 {
    if delay > 0 {
        now.saturating_add(delay)
    } else {
        entry.not_before
    }
}

/// Refuses a failure or dead-letter reason with a NUL character: no engine stores one
/// (PostgreSQL's text cannot hold it), so every engine refuses it before anything changes.
pub(crate) fn check_reason(reason: &str) -> Result<()> {
    if reason.contains('\0') {
        return Err(Error::InvalidArgument {
            argument: "reason",
            expected: "text without NUL characters",
        });
    }
    Ok(())
}

/// Cuts a reason to [`MAX_REASON`] bytes at a character boundary.
pub(crate) fn cut_reason(reason: &str) -> String {
    if reason.len() <= MAX_REASON {
        return reason.to_owned();
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

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
    state: Mutex<TxState>,
}

#[derive(Default)]
struct TxState {
    copies: Vec<(Arc<QueueCore>, Entry)>,
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
    fn new(deadline: u64, key: u64, held: &[(Arc<QueueCore>, Entry)]) -> Arc<TxExpiry> {
        Arc::new(TxExpiry {
            deadline,
            key,
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
    pub(crate) fn note(&self, core: &Arc<QueueCore>, entry: &Entry) {
        let mut state = self.state.lock();
        if state.expired {
            drop(state);
            core.unhold(1);
            core.restore(std::iter::once(entry.clone()));
            return;
        }
        state.copies.push((Arc::clone(core), entry.clone()));
    }

    /// The transaction gives back entry `id` of `core` itself: the timer must not. False if
    /// the timer has run already (it gave the entry back).
    pub(crate) fn forget(&self, core: &Arc<QueueCore>, id: u64) -> bool {
        let mut state = self.state.lock();
        if state.expired {
            return false;
        }
        state
            .copies
            .retain(|(c, e)| !(e.id == id && Arc::ptr_eq(c, core)));
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
    #[cfg(feature = "postgres")]
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
        for (core, _) in &copies {
            core.unhold(1);
        }
        crate::core::restore_all(copies);
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
        held: &[(Arc<QueueCore>, Entry)],
    ) -> Arc<TxExpiry> {
        let key = self.next_tx_key.fetch_sub(1, Ordering::Relaxed);
        let expiry = TxExpiry::new(deadline, key, held);
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
        if entry.not_before <= now {
            proc.core.publish(std::iter::once(entry));
            return;
        }
        proc.delayed.fetch_add(1, Ordering::AcqRel);
        self.add(
            entry.not_before,
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
                    proc.delayed.fetch_sub(n, Ordering::AcqRel);
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
            attempts = entry.attempts
        );
        let _entered = span.enter();
        tracing::debug!("a lease expired");
        if entry.attempts < proc.policy().attempts_allowed() {
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

/// A lease as granted: what the handle needs to settle it.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) token: u64,
    pub(crate) deadline: u64,
    pub(crate) attempt: u32,
}

/// Lease grants a lease call waits for; dropped before they are read (the call's future was
/// dropped), the leases they grant go back at once.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(super) proc: Arc<Proc>,
    pub(super) grants: Vec<Arc<Grant>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        for grant in &self.grants {
            if let Some(token) = grant.abandon() {
                if let Some(leased) = self.proc.take_lease(token) {
                    self.proc.core.restore(std::iter::once(leased.entry));
                }
            }
        }
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
        let heap = || q.queue_ref().proc.leases.lock().deadlines.len();
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
