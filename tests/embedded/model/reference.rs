//! The reference model of `tests/embedded/model.rs`: a plain, single-threaded implementation of
//! the contract, item by item. Items are told apart by value (every value is enqueued once, or
//! moved whole from one queue to another), never by id: ids change with every version.
//!
//! What it keeps:
//!
//! - every live item: its queue, its place (ready, held by an open transaction, delayed until
//!   a time, leased under a token until a deadline, dead with a reason), its attempts and its
//!   times (enqueue, first and last lease);
//! - `seq`, the relative order of the id of each item's current version. Ids are assigned in
//!   commit order (a commit's plain enqueues first, then its moves, in order; see
//!   ARCHITECTURE.md, "The processing layer"), so the model can replay the order without
//!   knowing the ids: browse and the dead letters list in id order, timers that fall due
//!   together fire in id order, and a restart rebuilds each queue in id order, except that
//!   the items whose current version a lease wrote come first (a restart ends every lease,
//!   and an ended lease puts its item back at the head);
//! - the ready order of each queue as a row of blocks, front first: a dequeue or lease must
//!   take an item of the first block, in any order within it. Items given back together (by
//!   one abort, a failed commit) form one block at the front, whose inner order the contract
//!   leaves open; an item given back alone (a release without delay, a dropped lease, an
//!   expiry) is a block of its own at the front; an item appended (commit, due, replay) is a
//!   block of its own at the tail;
//! - per open transaction: its plain and delayed enqueues, the leases it acknowledges and the
//!   items it holds;
//! - the lease handles the test holds, in the order of the store-side `Vec`, and the lease
//!   timers (due, token): an extend replaces the lease's timer, so leases expire in
//!   (deadline, token) order (the store's timers behave so: see `Timers::fire`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

pub(crate) const QUEUES: usize = 3;
pub(crate) const SLOTS: usize = 3;

/// Why an item is dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its last lease expired at the maximum attempts.
    Expired,
    /// `fail` with the reason `boom <n>`.
    Failed(u64),
}

impl Reason {
    pub(crate) fn text(&self) -> String {
        match self {
            Reason::Expired => "lease expired".to_owned(),
            Reason::Failed(n) => format!("boom {n}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    Ready,
    /// Dequeued by the open transaction of this slot.
    Held(usize),
    Delayed {
        due: u64,
    },
    Leased {
        token: u64,
        deadline: u64,
    },
    Dead(Reason),
}

#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) queue: usize,
    /// The order of the current version's id.
    pub(crate) seq: u64,
    /// Its current version was written by a lease (the lease may have ended since: an
    /// expiry, a release without delay, a dropped lease write nothing). A restart puts these
    /// items at the head of their queue.
    pub(crate) lease_version: bool,
    pub(crate) attempts: u32,
    pub(crate) place: Place,
    /// Commit time of the enqueue (0: unknown).
    pub(crate) enqueued_at: u64,
    pub(crate) first_attempt: u64,
    pub(crate) last_attempt: u64,
}

/// When a delayed enqueue falls due.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Due {
    /// `enqueue_at`: this time.
    At(u64),
    /// `enqueue_after`: `delay` after the commit.
    After { delay: u64 },
}

impl Due {
    /// The due time of an enqueue committed at `now`.
    fn at(self, now: u64) -> u64 {
        match self {
            Due::At(t) => t,
            Due::After { delay } => now + delay,
        }
    }
}

/// An open transaction.
#[derive(Debug, Default)]
pub(crate) struct Tx {
    /// Plain enqueues (a zero delay is one): (queue, value).
    pub(crate) enq: Vec<(usize, u64)>,
    /// Delayed enqueues: (queue, value, due).
    pub(crate) delayed: Vec<(usize, u64, Due)>,
    /// Acknowledged leases, by token.
    pub(crate) acks: Vec<u64>,
    /// Values of the items it holds.
    pub(crate) deq: Vec<u64>,
}

/// A lease the test holds (and has not settled).
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    pub(crate) token: u64,
    pub(crate) value: u64,
    /// Granted by a store since closed (a restart).
    pub(crate) stale: bool,
}

/// What a lease handle can do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandleState {
    /// Its lease runs: settling it works.
    Live,
    /// Its lease ended (expired, or given back by an abort): `LeaseExpired`.
    Ended,
    /// Its store was closed.
    Stale,
}

/// One queue's retry policy, as the model needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub(crate) max_attempts: u32,
    pub(crate) initial_ms: u64,
    pub(crate) max_ms: u64,
}

impl Policy {
    /// The backoff after failed attempt `attempt`, without jitter.
    pub(crate) fn base_backoff(&self, attempt: u32) -> u64 {
        let doublings = attempt.saturating_sub(1).min(63);
        self.initial_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms)
    }
}

/// An expected browse row: value, state, attempts, enqueue time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) value: u64,
    pub(crate) state: RowState,
    pub(crate) attempts: u32,
    pub(crate) enqueued_at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowState {
    Ready,
    Delayed { until: u64 },
    Leased { until: u64, attempt: u32 },
}

/// An expected dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadRow {
    pub(crate) value: u64,
    pub(crate) reason: String,
    pub(crate) attempts: u32,
    pub(crate) first_attempt: u64,
    pub(crate) last_attempt: u64,
    pub(crate) enqueued_at: u64,
}

/// Expected counts of one queue, in the order of `QueueStats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub(crate) visible: u64,
    pub(crate) delayed: u64,
    pub(crate) leased: u64,
    pub(crate) held: u64,
    pub(crate) dead: u64,
}

#[derive(Debug)]
pub(crate) struct Model {
    /// The clock at the start of the case, and now (ms since the epoch).
    start: u64,
    pub(crate) now: u64,
    pub(crate) items: BTreeMap<u64, Item>,
    /// Ready order per queue: blocks, front first (see the module docs).
    pub(crate) ready: [VecDeque<Vec<u64>>; QUEUES],
    pub(crate) txs: [Option<Tx>; SLOTS],
    pub(crate) handles: Vec<Handle>,
    /// Pending lease timers: (due, token).
    pub(crate) lease_timers: BTreeSet<(u64, u64)>,
    pub(crate) policy: [Policy; QUEUES],
    /// How often each interesting event happened (coverage, printed by the test).
    pub(crate) coverage: BTreeMap<&'static str, u64>,
    next_seq: u64,
    next_value: u64,
    next_reason: u64,
}

impl Model {
    pub(crate) fn new(now: u64, policy: [Policy; QUEUES]) -> Model {
        Model {
            start: now,
            now,
            items: BTreeMap::new(),
            ready: Default::default(),
            txs: Default::default(),
            handles: Vec::new(),
            lease_timers: BTreeSet::new(),
            policy,
            coverage: BTreeMap::new(),
            next_seq: 0,
            next_value: 0,
            next_reason: 0,
        }
    }

    /// Counts an event.
    pub(crate) fn note(&mut self, event: &'static str) {
        *self.coverage.entry(event).or_default() += 1;
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// A value never used before.
    pub(crate) fn value(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value
    }

    /// The reason of the next failure.
    pub(crate) fn reason(&mut self) -> Reason {
        self.next_reason += 1;
        Reason::Failed(self.next_reason)
    }

    fn item(&mut self, value: u64) -> &mut Item {
        self.items
            .get_mut(&value)
            .expect("the model knows the item")
    }

    pub(crate) fn tx(&mut self, slot: usize) -> &mut Tx {
        self.txs[slot].get_or_insert_with(Tx::default)
    }

    // ---- ready order ---------------------------------------------------------------------

    pub(crate) fn visible(&self, q: usize) -> usize {
        self.ready[q].iter().map(Vec::len).sum()
    }

    fn push_back(&mut self, q: usize, value: u64) {
        self.item(value).place = Place::Ready;
        self.ready[q].push_back(vec![value]);
    }

    /// Gives `values` back to the front of their queues, one block per queue.
    fn give_back(&mut self, values: &[u64]) {
        let mut per_queue: [Vec<u64>; QUEUES] = Default::default();
        for &v in values {
            let item = self.item(v);
            item.place = Place::Ready;
            per_queue[item.queue].push(v);
        }
        for (q, block) in per_queue.into_iter().enumerate() {
            if !block.is_empty() {
                self.ready[q].push_front(block);
            }
        }
    }

    /// Takes `value` from the front of `q`: it must be in the first block.
    pub(crate) fn take(&mut self, q: usize, value: u64) -> Result<(), String> {
        let Some(front) = self.ready[q].front_mut() else {
            return Err(format!(
                "took {value} from q{q}, which the model shows empty"
            ));
        };
        match front.iter().position(|&v| v == value) {
            Some(i) => {
                front.swap_remove(i);
                if front.is_empty() {
                    self.ready[q].pop_front();
                }
                Ok(())
            }
            None => {
                let front = front.clone();
                let place = self.items.get(&value).map(|i| (i.queue, i.place.clone()));
                Err(format!(
                    "took {value} from q{q}; the model expects one of {front:?} first \
                     (ready order {:?}); the model has {value} at {place:?}",
                    self.ready[q]
                ))
            }
        }
    }

    /// Checks `observed` (everything ready in `q`, front first) against the blocks, then
    /// pins the order down (a dequeue-and-abort peek keeps it: items come back in the order
    /// they were dequeued).
    pub(crate) fn observe_order(&mut self, q: usize, observed: &[u64]) -> Result<(), String> {
        let mut rest = observed;
        for block in &self.ready[q] {
            if rest.len() < block.len() {
                return Err(format!(
                    "q{q} holds {observed:?}, the model's ready order is {:?}",
                    self.ready[q]
                ));
            }
            let (head, tail) = rest.split_at(block.len());
            let mut a = head.to_vec();
            let mut b = block.clone();
            a.sort_unstable();
            b.sort_unstable();
            if a != b {
                return Err(format!(
                    "q{q} holds {observed:?}, the model's ready order is {:?}",
                    self.ready[q]
                ));
            }
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(format!(
                "q{q} holds {observed:?}, the model's ready order is {:?}",
                self.ready[q]
            ));
        }
        self.ready[q] = observed.iter().map(|&v| vec![v]).collect();
        Ok(())
    }

    // ---- transactions --------------------------------------------------------------------

    /// `slot` dequeued `value` from `q`.
    pub(crate) fn dequeued(&mut self, slot: usize, q: usize, value: u64) -> Result<(), String> {
        self.take(q, value)?;
        self.item(value).place = Place::Held(slot);
        self.tx(slot).deq.push(value);
        Ok(())
    }

    /// Aborts the transaction of `slot`: its enqueues are dropped; its held items and the
    /// items of the leases it acknowledged (if still running) go back to the front.
    pub(crate) fn abort(&mut self, slot: usize) {
        let Some(tx) = self.txs[slot].take() else {
            return;
        };
        let mut back = tx.deq;
        for token in tx.acks {
            if let Some(v) = self.leased_by(token) {
                self.note("ack undone by an abort: item back at the front");
                back.push(v);
            }
        }
        if back.len() > 1 {
            self.note("abort giving back several items");
        }
        self.give_back(&back);
    }

    /// The value leased under `token`, if that lease runs.
    pub(crate) fn leased_by(&self, token: u64) -> Option<u64> {
        self.items
            .iter()
            .find(|(_, i)| matches!(i.place, Place::Leased { token: t, .. } if t == token))
            .map(|(&v, _)| v)
    }

    /// Commits the transaction of `slot`. Returns false (and aborts it) when an acknowledged
    /// lease has ended: the commit must fail with `LeaseExpired`.
    pub(crate) fn commit(&mut self, slot: usize) -> bool {
        let Some(tx) = self.txs[slot].as_ref() else {
            return true;
        };
        if tx.acks.iter().any(|&t| self.leased_by(t).is_none()) {
            self.note("commit failed: an acked lease ended");
            self.abort(slot);
            return false;
        }
        let tx = self.txs[slot].take().expect("checked above");
        let now = self.now;
        for v in &tx.deq {
            self.items.remove(v);
        }
        for token in &tx.acks {
            let v = self.leased_by(*token).expect("checked above");
            self.items.remove(&v);
        }
        if !tx.acks.is_empty() {
            self.note("commit with acks");
            if !tx.enq.is_empty() || !tx.deq.is_empty() || !tx.delayed.is_empty() {
                self.note("commit with acks and other work");
            }
        }
        for &(q, v) in &tx.enq {
            let seq = self.seq();
            self.insert(q, v, seq, Place::Ready, now);
            self.ready[q].push_back(vec![v]);
        }
        for &(q, v, due) in &tx.delayed {
            let due = due.at(now);
            let seq = self.seq();
            if due <= now {
                self.note("delayed enqueue due by its commit");
                self.insert(q, v, seq, Place::Ready, now);
                self.ready[q].push_back(vec![v]);
            } else {
                self.insert(q, v, seq, Place::Delayed { due }, now);
            }
        }
        true
    }

    /// `values` enqueued into `q` and committed in a transaction of their own.
    pub(crate) fn produce(&mut self, q: usize, values: &[u64]) {
        for &v in values {
            let seq = self.seq();
            self.insert(q, v, seq, Place::Ready, self.now);
            self.ready[q].push_back(vec![v]);
        }
    }

    fn insert(&mut self, q: usize, value: u64, seq: u64, place: Place, now: u64) {
        let old = self.items.insert(
            value,
            Item {
                queue: q,
                seq,
                lease_version: false,
                attempts: 0,
                place,
                enqueued_at: now,
                first_attempt: 0,
                last_attempt: 0,
            },
        );
        assert!(old.is_none(), "values are unique");
    }

    // ---- leases --------------------------------------------------------------------------

    /// A lease of `ttl` ms on `value`, taken from the front of `q` (after [`take`]); the
    /// leases of one call are granted in the order taken. Returns the attempt.
    pub(crate) fn grant(&mut self, value: u64, ttl: u64) -> u32 {
        let token = self.seq();
        let now = self.now;
        let deadline = now + ttl;
        let item = self.item(value);
        item.seq = token;
        item.lease_version = true;
        item.attempts += 1;
        if item.first_attempt == 0 {
            item.first_attempt = now;
        }
        item.last_attempt = now;
        item.place = Place::Leased { token, deadline };
        let attempt = item.attempts;
        let over = attempt > self.policy[item.queue].max_attempts;
        self.note("lease granted");
        if over {
            self.note("lease granted past the maximum attempts");
        }
        self.lease_timers.insert((deadline, token));
        self.handles.push(Handle {
            token,
            value,
            stale: false,
        });
        attempt
    }

    pub(crate) fn handle_state(&self, h: &Handle) -> HandleState {
        if h.stale {
            HandleState::Stale
        } else if self.leased_by(h.token).is_some() {
            HandleState::Live
        } else {
            HandleState::Ended
        }
    }

    /// The running lease of `h`: (value, deadline, attempts).
    pub(crate) fn lease_of(&self, h: &Handle) -> Option<(u64, u64, u32)> {
        if h.stale {
            return None;
        }
        let item = self.items.get(&h.value)?;
        match item.place {
            Place::Leased { token, deadline } if token == h.token => {
                Some((h.value, deadline, item.attempts))
            }
            _ => None,
        }
    }

    /// `ack` of a running lease into the transaction of `slot`.
    pub(crate) fn ack(&mut self, slot: usize, token: u64) {
        self.tx(slot).acks.push(token);
    }

    /// A running lease completed on its own.
    pub(crate) fn complete(&mut self, value: u64) {
        self.items.remove(&value);
    }

    /// Moves `value` to the dead letters (a new version).
    fn bury(&mut self, value: u64, reason: Reason) {
        let seq = self.seq();
        let item = self.item(value);
        item.seq = seq;
        item.lease_version = false;
        item.place = Place::Dead(reason);
    }

    /// Delays `value` until `due` (a new version).
    fn delay(&mut self, value: u64, due: u64) {
        let seq = self.seq();
        let item = self.item(value);
        item.seq = seq;
        item.lease_version = false;
        item.place = Place::Delayed { due };
    }

    /// A running lease failed with `reason`; `backoff` is the retry's wait. Returns the due
    /// time of the retry, or `None` for the dead letters.
    pub(crate) fn fail(&mut self, value: u64, reason: Reason, backoff: u64) -> Option<u64> {
        let item = &self.items[&value];
        if item.attempts >= self.policy[item.queue].max_attempts {
            self.note("fail: dead letter");
            self.bury(value, reason);
            None
        } else {
            self.note("fail: retry");
            let due = self.now + backoff;
            self.delay(value, due);
            Some(due)
        }
    }

    /// A running lease released, due again after `delay` ms.
    pub(crate) fn release(&mut self, value: u64, delay: u64) {
        if delay == 0 {
            self.note("release at once (or drop)");
            self.give_back(&[value]);
        } else {
            self.note("release delayed");
            let due = self.now + delay;
            self.delay(value, due);
        }
    }

    /// A running lease's deadline moved to `ttl` from now.
    pub(crate) fn extend(&mut self, value: u64, ttl: u64) -> u64 {
        let deadline = self.now + ttl;
        let item = self.item(value);
        let Place::Leased {
            token,
            deadline: old,
        } = item.place
        else {
            panic!("extend of a lease that does not run")
        };
        item.place = Place::Leased { token, deadline };
        self.lease_timers.remove(&(old, token));
        self.lease_timers.insert((deadline, token));
        self.note("extend");
        deadline
    }

    // ---- dead letters --------------------------------------------------------------------

    /// Values of the dead letters of `q`, oldest (lowest id) first.
    pub(crate) fn dead_values(&self, q: usize) -> Vec<u64> {
        let mut dead: Vec<(u64, u64)> = self
            .items
            .iter()
            .filter(|(_, i)| i.queue == q && matches!(i.place, Place::Dead(_)))
            .map(|(&v, i)| (i.seq, v))
            .collect();
        dead.sort_unstable();
        dead.into_iter().map(|(_, v)| v).collect()
    }

    /// Dead letters `values` back at the tail, in order.
    pub(crate) fn replay(&mut self, values: &[u64], reset: bool) {
        for &v in values {
            let seq = self.seq();
            let item = self.item(v);
            item.seq = seq;
            item.lease_version = false;
            if reset {
                item.attempts = 0;
            }
            let q = item.queue;
            self.push_back(q, v);
            self.note("dead letter replayed");
        }
    }

    pub(crate) fn purge(&mut self, values: &[u64]) {
        for v in values {
            self.items.remove(v);
            self.note("dead letter purged");
        }
    }

    // ---- time and restarts ---------------------------------------------------------------

    /// The clock moves to `now`: every timer due by then fires, in (due, id) order.
    pub(crate) fn advance(&mut self, now: u64) {
        self.now = now;
        #[derive(Debug)]
        enum Event {
            Due(u64),
            Expire(u64),
        }
        let mut events: Vec<((u64, u64), Event)> = Vec::new();
        for (&v, item) in &self.items {
            if let Place::Delayed { due } = item.place {
                if due <= now {
                    events.push(((due, item.seq), Event::Due(v)));
                }
            }
        }
        let later = self.lease_timers.split_off(&(now + 1, 0));
        for (due, token) in std::mem::replace(&mut self.lease_timers, later) {
            events.push(((due, token), Event::Expire(token)));
        }
        events.sort_unstable_by_key(|(key, _)| *key);
        for (_, event) in events {
            match event {
                Event::Due(v) => {
                    self.note("delayed item due");
                    let q = self.items[&v].queue;
                    self.push_back(q, v);
                }
                Event::Expire(token) => {
                    let Some(v) = self.leased_by(token) else {
                        continue;
                    };
                    let item = &self.items[&v];
                    let Place::Leased { deadline, .. } = item.place else {
                        unreachable!()
                    };
                    if deadline > now {
                        self.note("expiry timer of an extended lease");
                        continue; // extended: a later timer ends it
                    }
                    if item.attempts >= self.policy[item.queue].max_attempts {
                        self.note("expiry: dead letter");
                        self.bury(v, Reason::Expired);
                    } else {
                        self.note("expiry: back at the front");
                        self.give_back(&[v]);
                    }
                }
            }
        }
    }

    /// The store is closed, the clock moves to `now` while it is, and the store is reopened:
    /// open transactions are gone (what they held is back in its queue), every lease ends
    /// (its item is ready, its attempts kept), delayed items that fell due meanwhile are
    /// ready, each queue comes back with the items whose current version a lease wrote first
    /// (the restart ended their leases, or one ended before: either puts the item back at the
    /// head), then the others, each part in id order; other delayed items and dead letters
    /// stay. Handles go stale.
    pub(crate) fn restart(&mut self, now: u64) {
        self.note("restart");
        if now > self.now {
            self.note("restart after downtime");
        }
        self.now = now;
        if self
            .items
            .values()
            .any(|i| matches!(i.place, Place::Leased { .. }))
        {
            self.note("restart ending leases");
        }
        if self.txs.iter().any(Option::is_some) {
            self.note("restart with open transactions");
        }
        if self
            .items
            .values()
            .any(|i| matches!(i.place, Place::Delayed { .. }))
        {
            self.note("restart keeping delayed items");
        }
        if self
            .items
            .values()
            .any(|i| matches!(i.place, Place::Dead(_)))
        {
            self.note("restart keeping dead letters");
        }
        self.txs = Default::default();
        self.lease_timers.clear();
        for h in &mut self.handles {
            h.stale = true;
        }
        // (after the items of ended leases, id order, value) per queue.
        let mut ready: [Vec<(bool, u64, u64)>; QUEUES] = Default::default();
        for (&v, item) in &mut self.items {
            match item.place {
                Place::Ready | Place::Held(_) | Place::Leased { .. } => {
                    item.place = Place::Ready;
                    ready[item.queue].push((!item.lease_version, item.seq, v));
                }
                Place::Delayed { due } if due <= now => {
                    item.place = Place::Ready;
                    ready[item.queue].push((!item.lease_version, item.seq, v));
                    self.coverage
                        .entry("delayed item due while the store was closed")
                        .and_modify(|n| *n += 1)
                        .or_insert(1);
                }
                Place::Delayed { .. } | Place::Dead(_) => {}
            }
        }
        for (q, mut items) in ready.into_iter().enumerate() {
            items.sort_unstable();
            let oldest_queued = items.iter().filter(|i| i.0).map(|i| i.1).min();
            if items
                .iter()
                .any(|&(queued, seq, _)| !queued && oldest_queued.is_some_and(|o| o < seq))
            {
                self.note("restart: an item of an ended lease ahead of older queued items");
            }
            self.ready[q] = items.into_iter().map(|(_, _, v)| vec![v]).collect();
        }
    }

    // ---- expectations --------------------------------------------------------------------

    pub(crate) fn counts(&self, q: usize) -> Counts {
        let mut c = Counts {
            visible: self.visible(q) as u64,
            ..Counts::default()
        };
        for item in self.items.values().filter(|i| i.queue == q) {
            match item.place {
                Place::Ready => {}
                Place::Held(_) => c.held += 1,
                Place::Delayed { .. } => c.delayed += 1,
                Place::Leased { .. } => c.leased += 1,
                Place::Dead(_) => c.dead += 1,
            }
        }
        c
    }

    /// What `browse(None, ..)` of `q` must list, in id order.
    pub(crate) fn browse(&self, q: usize) -> Vec<Row> {
        let mut rows: Vec<(u64, Row)> = Vec::new();
        for (&value, item) in self.items.iter().filter(|(_, i)| i.queue == q) {
            let state = match item.place {
                Place::Ready => RowState::Ready,
                Place::Delayed { due } => RowState::Delayed { until: due },
                Place::Leased { deadline, .. } => RowState::Leased {
                    until: deadline,
                    attempt: item.attempts,
                },
                Place::Held(_) | Place::Dead(_) => continue,
            };
            rows.push((
                item.seq,
                Row {
                    value,
                    state,
                    attempts: item.attempts,
                    enqueued_at: item.enqueued_at,
                },
            ));
        }
        rows.sort_unstable_by_key(|(seq, _)| *seq);
        rows.into_iter().map(|(_, r)| r).collect()
    }

    /// What `dead_letters(None, ..)` of `q` must list, oldest first.
    pub(crate) fn dead(&self, q: usize) -> Vec<DeadRow> {
        self.dead_values(q)
            .into_iter()
            .map(|v| {
                let item = &self.items[&v];
                let Place::Dead(reason) = &item.place else {
                    unreachable!()
                };
                DeadRow {
                    value: v,
                    reason: reason.text(),
                    attempts: item.attempts,
                    first_attempt: item.first_attempt,
                    last_attempt: item.last_attempt,
                    enqueued_at: item.enqueued_at,
                }
            })
            .collect()
    }

    /// A short description of the whole model, for failure messages.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("clock at start + {} ms; ", self.now - self.start);
        for q in 0..QUEUES {
            let _ = write!(s, "q{q} ready {:?}; ", self.ready[q]);
        }
        for (v, i) in &self.items {
            if i.place != Place::Ready {
                let _ = write!(s, "{v}@q{}:{:?}(a{}) ", i.queue, i.place, i.attempts);
            }
        }
        s
    }
}
