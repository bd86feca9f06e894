//! The processing-layer state of one queue on the embedded engines, a [`Proc`]: its leased
//! items (by fencing token: the id of the leased version), the count of its delayed items,
//! its dead letters (on the sled engine without their bytes, which stay in the log) and its
//! retry policy; and what a grant answers with.
//!
//! Every processing-layer change of an item is a move (`moves.rs`) in a transaction's
//! [`Work`](super::Work). What is not logged: a lease itself (its holder and deadline: a
//! restart ends every lease of the previous process, whose holders died with it, so only the
//! attempt count must survive), `extend`, and a release without delay (they change nothing
//! that a restart keeps). The store's timers (`timers.rs`) hold every delayed item and every
//! lease deadline, in time order.
//!
//! PostgreSQL maps each of these onto rows: a lease is an `UPDATE .. SET leased_until,
//! attempts = attempts + 1, token = nextval(..)` of a row taken with `FOR UPDATE SKIP
//! LOCKED`, expiry is the database clock passing `leased_until`, fencing compares the token in
//! the `WHERE` clause, delayed items are rows with `not_before` in the future, and dead letters
//! are rows of a table of their own. It keeps a `Proc` per queue for the retry policy only.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::core::{Entry, QueueCore};
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;
use crate::sync::process::{AtomicU64, Mutex, Ordering};

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
    pub(super) delayed: AtomicU64,
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

    /// The entries of the lease table's deadline heap (for the test of its bound).
    #[cfg(all(test, not(reliable_queue_loom)))]
    pub(super) fn deadlines_kept(&self) -> usize {
        self.leases.lock().deadlines.len()
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
            .map(|l| (l.deadline, l.entry.attempts()))
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
            Some(l) if l.deadline > now => {
                debug_assert_eq!(
                    l.entry.id, token,
                    "a lease's token is its item's version id"
                );
                table.running.remove(&token)
            }
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

    /// Whether lease `token` is running (whatever its deadline) on an item with `key`.
    pub(crate) fn lease_has_key(&self, token: u64, key: &[u8]) -> bool {
        self.leases
            .lock()
            .running
            .get(&token)
            .is_some_and(|l| l.entry.key() == Some(key))
    }

    /// Ends lease `token` whatever its deadline (its holder gave it up).
    pub(crate) fn take_lease(&self, token: u64) -> Option<Leased> {
        self.leases.lock().running.remove(&token)
    }

    /// Adds a running lease; returns its deadline if the store's timers must be told of it
    /// (see [`Timers::watch`]).
    #[must_use = "the store's timers must watch the deadline returned"]
    pub(crate) fn insert_lease(&self, token: u64, leased: Leased) -> Option<u64> {
        debug_assert_eq!(
            leased.entry.id, token,
            "a lease's token is its item's version id"
        );
        let deadline = leased.deadline;
        let mut table = self.leases.lock();
        let earlier = table.running.insert(token, leased);
        debug_assert!(earlier.is_none(), "a fencing token is never reused");
        table.add_deadline(token, deadline)
    }

    /// [`insert_lease`](Self::insert_lease) for several leases under one lock.
    #[must_use = "the store's timers must watch the deadline returned"]
    pub(super) fn insert_leases(&self, leased: impl Iterator<Item = (u64, Leased)>) -> Option<u64> {
        let mut table = self.leases.lock();
        let mut watch = None;
        for (token, lease) in leased {
            debug_assert_eq!(
                lease.entry.id, token,
                "a lease's token is its item's version id"
            );
            let deadline = lease.deadline;
            let earlier = table.running.insert(token, lease);
            debug_assert!(earlier.is_none(), "a fencing token is never reused");
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
pub(crate) struct Grant(pub(super) Mutex<GrantState>);

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
