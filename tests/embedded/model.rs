//! Model-based property test: random interleavings of up to three open transactions over
//! three queues, with the processing layer and restarts, run against a store and against a
//! reference model (`tests/embedded/model/reference.rs`).
//!
//! Steps: begin, enqueue, try_dequeue, move (dequeue from one queue and enqueue the same item
//! into another, in one transaction), commit, abort; produce (enqueue and commit at once);
//! `enqueue_after` and `enqueue_at` in a transaction; lease (`try_lease`, `lease_many`) with
//! a lease time; ack of a held lease into a transaction (committed later, maybe with other
//! work, maybe after the lease ended), complete, fail, release with or without delay, drop,
//! extend; clock steps on a `ManualClock`; replay and purge of dead letters (all, the first
//! n, one by id, or a list naming an id that is not a dead letter of the queue); changes of
//! the maximum attempts; checkpoints; on disk, restarts (the store closed with transactions
//! and leases open, the clock maybe moved on while it is closed, the store reopened). Each
//! case draws each queue's maximum attempts (1 to 3) and, one case in four, a jittered
//! backoff.
//!
//! The model keeps every item by value: its queue and place (ready, held by an open
//! transaction, delayed until a time, leased until a deadline, dead with a reason), its
//! attempts and its times; the ready order of each queue as far as the contract fixes it
//! (items given back go to the front, items committed, due or replayed to the tail); the
//! relative order of the items' ids (commit order), which browse, the dead letters, timers
//! falling due together and a restart follow; per open transaction its enqueues, acks and
//! held items; the lease handles and lease timers. After every step:
//!
//! - `stats()` of every queue (visible, delayed, leased, held, dead) and `count()` equal the
//!   model's, and so do each transaction's `enqueued()`/`dequeued()` (S5);
//! - `browse` lists exactly the model's ready, delayed and leased items, in id order, with
//!   their states, due times, deadlines, attempts and enqueue times, a running lease under
//!   its fencing token; `dead_letters` lists the model's dead letters, oldest first, with
//!   reason, attempts and times; each queue's retry policy is the one last set;
//! - `try_dequeue` and leases return an item the model allows at the front (never one still
//!   pending in a transaction) and `None` only when the model shows nothing visible (S1, S2,
//!   S6); a lease's attempt and deadline (also after `extend`), `fail`'s retry time or
//!   `Dead`, replay and purge counts, and the errors (`LeaseExpired` for a lease that ended,
//!   `NotDeadLetter`, and for a lease of a store since closed `Closed`, `WrongStore` or
//!   `LeaseExpired`) are the model's; no fencing token comes twice;
//! - commits and aborts move items as the model does (S3, S4); an ack whose lease ended fails
//!   its whole commit, and an aborted ack gives the item back at once.
//!
//! At checkpoints (a `Check` step, every restart, the end of a case) each queue is also read
//! whole by dequeue-then-abort and its order compared with the model's. After a restart
//! every queue holds exactly the model's items (S7, S8): leases are over with their attempts
//! kept and their items at the head, items delayed past the reopening stay delayed, dead
//! letters stay. Each case ends by
//! dropping what is open, restarting (on disk) and moving the clock on 10 s: then every item
//! committed and not consumed is visible or dead.
//!
//! Two kinds of case: "transactions" (the steps of the original model only: begin, enqueue,
//! try_dequeue, move, commit, abort, restart) and "processing" (all of them), each on the
//! memory engine and on sled (processing: under `Sync` with compaction at every chance, and
//! under `Buffered`). Default counts: transactions 3000 in memory, 500 `Sync`, 300
//! `Buffered`; processing 5000 in memory (1000 in debug builds), 300 and 300 on disk; about
//! 20 s in release on two cores, the tests running in parallel. `PROPTEST_CASES` sets the
//! count of every test. Each test prints how often each interesting event happened (run with
//! `--nocapture`), so that a change of weights that starves a path shows.

use crate::common;
#[path = "model/reference.rs"]
mod reference;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reliable_queue::{
    Durability, Error, Failed, ItemState, Lease, ManualClock, ReliableConcurrentQueue, Replay,
    RetryPolicy, Store, Transaction,
};

use reference::{Counts, DeadRow, Due, HandleState, Model, Policy, Row, RowState, QUEUES, SLOTS};

/// The manual clock's start (ms since the epoch).
const START: u64 = 1_700_000_000_000;
/// Lease times, delays and clock steps (ms): multiples of 50 so that deadlines, due times
/// and backoffs often coincide, plus off-by-one steps.
const TTLS: [u64; 3] = [100, 200, 350];
const DELAYS: [u64; 4] = [0, 50, 100, 300];
const ADVANCES: [u64; 5] = [1, 49, 50, 100, 400];
const INITIAL_BACKOFF: u64 = 100;
const MAX_BACKOFF: u64 = 400;
/// The jitter of the cases that have one.
const JITTER: f64 = 0.25;
type Queue = ReliableConcurrentQueue<u64>;

/// Which dead letters a replay or purge names.
#[derive(Debug, Clone, Copy)]
enum Which {
    All,
    First(usize),
    /// The id of the n-th dead letter (modulo their number).
    Nth(usize),
    /// A dead letter's id with one that is not a dead letter of the queue: nothing happens.
    Bogus(usize),
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Opens a transaction in a slot (nothing if one is open there already).
    Begin(usize),
    Enqueue(usize, usize),
    /// slot, queue, delay (ms).
    EnqueueAfter(usize, usize, u64),
    /// slot, queue, due time relative to now (ms; not in the future: a plain enqueue).
    EnqueueAt(usize, usize, i64),
    /// Enqueues `n` items into a queue in a transaction of its own, and commits.
    Produce(usize, usize),
    TryDequeue(usize, usize),
    /// Dequeues from one queue and enqueues the same item into another, in one transaction.
    Move(usize, usize, usize),
    Commit(usize),
    Abort(usize),
    /// Leases up to `n` items (`try_lease` for 1, else `lease_many` if any is visible).
    Lease {
        q: usize,
        n: usize,
        ttl: u64,
    },
    /// Acks a held lease (the index is taken modulo their number) in a slot's transaction.
    Ack(usize, usize),
    Complete(usize),
    Fail(usize),
    /// Releases a held lease with a delay (ms).
    Release(usize, u64),
    DropLease(usize),
    Extend(usize, u64),
    /// Moves the clock on (ms).
    Advance(u64),
    Replay(usize, Which, bool),
    Purge(usize, Which),
    SetMaxAttempts(usize, u32),
    /// Reads every queue whole and checks its order.
    Check,
    /// Closes the store with its transactions and leases open, moves the clock on by this
    /// much (ms) while it is closed, then reopens it.
    Restart(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The steps of the original model only.
    Transactions,
    /// Every step.
    Processing,
}

fn op(mode: Mode, restarts: bool) -> BoxedStrategy<Op> {
    let slot = || 0..SLOTS;
    let queue = || 0..QUEUES;
    // Weights of begin, enqueue, try_dequeue, commit, abort, move: processing cases commit
    // more often (their transactions carry acks too).
    let [begin, enqueue, dequeue, commit, abort, move_] = match mode {
        Mode::Transactions => [1, 4, 4, 2, 1, 2],
        Mode::Processing => [1, 3, 3, 4, 1, 1],
    };
    let transactions = prop_oneof![
        begin => slot().prop_map(Op::Begin),
        enqueue => (slot(), queue()).prop_map(|(s, q)| Op::Enqueue(s, q)),
        dequeue => (slot(), queue()).prop_map(|(s, q)| Op::TryDequeue(s, q)),
        commit => slot().prop_map(Op::Commit),
        abort => slot().prop_map(Op::Abort),
        move_ => (slot(), queue(), queue()).prop_map(|(s, f, t)| Op::Move(s, f, t)),
    ];
    let work = match mode {
        Mode::Transactions => transactions.boxed(),
        Mode::Processing => {
            let handle = || 0..4usize;
            let ttl = || prop::sample::select(&TTLS[..]);
            let delay = || prop::sample::select(&DELAYS[..]);
            let which = || {
                prop_oneof![
                    2 => Just(Which::All),
                    2 => (0..3usize).prop_map(Which::First),
                    2 => (0..4usize).prop_map(Which::Nth),
                    1 => (0..4usize).prop_map(Which::Bogus),
                ]
            };
            prop_oneof![
                12 => transactions,
                4 => (queue(), 1..4usize).prop_map(|(q, n)| Op::Produce(q, n)),
                3 => (slot(), queue(), delay()).prop_map(|(s, q, d)| Op::EnqueueAfter(s, q, d)),
                1 => (slot(), queue(), prop::sample::select(&[-50i64, 0, 50, 150][..]))
                    .prop_map(|(s, q, at)| Op::EnqueueAt(s, q, at)),
                7 => (queue(), prop_oneof![3 => Just(1usize), 1 => 2..4usize], ttl())
                    .prop_map(|(q, n, ttl)| Op::Lease { q, n, ttl }),
                3 => (handle(), slot()).prop_map(|(h, s)| Op::Ack(h, s)),
                1 => handle().prop_map(Op::Complete),
                3 => handle().prop_map(Op::Fail),
                2 => (handle(), delay()).prop_map(|(h, d)| Op::Release(h, d)),
                1 => handle().prop_map(Op::DropLease),
                1 => (handle(), ttl()).prop_map(|(h, t)| Op::Extend(h, t)),
                5 => prop::sample::select(&ADVANCES[..]).prop_map(Op::Advance),
                1 => (queue(), which(), any::<bool>()).prop_map(|(q, w, r)| Op::Replay(q, w, r)),
                1 => (queue(), which()).prop_map(|(q, w)| Op::Purge(q, w)),
                1 => (queue(), 1..4u32).prop_map(|(q, n)| Op::SetMaxAttempts(q, n)),
                1 => Just(Op::Check),
            ]
            .boxed()
        }
    };
    if restarts {
        let weight = match mode {
            Mode::Transactions => 14,
            Mode::Processing => 40,
        };
        let down = prop::sample::select(&[0u64, 0, 100, 400][..]);
        prop_oneof![weight => work, 1 => down.prop_map(Op::Restart)].boxed()
    } else {
        work.boxed()
    }
}

/// Per case: each queue's maximum attempts, and whether backoffs have jitter.
#[derive(Debug, Clone, Copy)]
struct Setup {
    max_attempts: [u32; QUEUES],
    jitter: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (prop::array::uniform3(1..4u32), prop::bool::weighted(0.25)).prop_map(
        |(max_attempts, jitter)| Setup {
            max_attempts,
            jitter,
        },
    )
}

fn retry_policy(max_attempts: u32, jitter: bool) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(max_attempts)
        .initial_backoff(Duration::from_millis(INITIAL_BACKOFF))
        .max_backoff(Duration::from_millis(MAX_BACKOFF))
        .jitter(if jitter { JITTER } else { 0.0 })
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn millis(t: Option<SystemTime>) -> u64 {
    t.map_or(0, |t| {
        t.duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as u64
    })
}

/// How the store under test is opened.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Disk {
        durability: Durability,
        /// `Builder::compaction_floor`, when not the default.
        compaction_floor: Option<u64>,
    },
}

struct Real {
    backend: Backend,
    clock: ManualClock,
    _dir: Option<tempfile::TempDir>,
    path: Option<std::path::PathBuf>,
    store: Option<Store>,
    queues: Vec<Queue>,
    txs: [Option<Transaction>; SLOTS],
    /// Leases held, in the order of `Model::handles`.
    leases: Vec<Lease<u64>>,
    /// Every fencing token handed out in the case (since the last restart, unless
    /// restarts included): none may come twice.
    tokens: std::collections::HashSet<u64>,
    policies: [RetryPolicy; QUEUES],
    /// Whether the backoffs have jitter.
    jitter: bool,
}

impl Real {
    fn new(backend: Backend, setup: Setup) -> Real {
        let (dir, path) = match backend {
            Backend::Memory => (None, None),
            Backend::Disk { .. } => {
                let (dir, path) = common::temp_dir();
                (Some(dir), Some(path))
            }
        };
        let mut real = Real {
            backend,
            clock: ManualClock::new(time(START)).expect("a manual clock"),
            _dir: dir,
            path,
            store: None,
            queues: Vec::new(),
            txs: Default::default(),
            leases: Vec::new(),
            tokens: Default::default(),
            policies: setup
                .max_attempts
                .map(|max| retry_policy(max, setup.jitter)),
            jitter: setup.jitter,
        };
        real.open();
        for (queue, policy) in real.queues.iter().zip(real.policies) {
            queue
                .blocking_set_retry_policy(policy)
                .expect("set the retry policy");
        }
        real
    }

    fn open(&mut self) {
        let builder = Store::builder().clock(self.clock.clone());
        let store = match (self.backend, &self.path) {
            (
                Backend::Disk {
                    durability,
                    compaction_floor,
                },
                Some(path),
            ) => {
                let builder = builder.path(path).durability(durability);
                match compaction_floor {
                    Some(floor) => builder.compaction_floor(floor),
                    None => builder,
                }
            }
            _ => builder,
        }
        .open()
        .expect("open the store");
        self.queues = (0..QUEUES)
            .map(|q| {
                store
                    .blocking_queue::<u64>(&format!("q{q}"))
                    .expect("queue")
            })
            .collect();
        self.store = Some(store);
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("the store is open")
    }

    /// Closes the store with whatever is open, then reopens it. The leases held stay with
    /// the closed store.
    fn restart(&mut self, down: u64) -> Result<(), Error> {
        let store = self.store.take().expect("the store is open");
        let closed = store.blocking_close();
        self.txs = Default::default();
        self.queues.clear();
        closed?;
        self.clock.advance(ms(down));
        self.open();
        Ok(())
    }

    fn tx(&mut self, slot: usize) -> &mut Transaction {
        if self.txs[slot].is_none() {
            self.txs[slot] = Some(self.store().begin());
        }
        self.txs[slot].as_mut().expect("just opened")
    }
}

fn fail(step: usize, op: Op, what: String) -> TestCaseError {
    TestCaseError::fail(format!("step {step} ({op:?}): {what}"))
}

/// Checks the result of settling (or extending) a lease against what the model expects of
/// its handle in `state`: `Ok` for a running lease, `LeaseExpired` for one that ended, an
/// error `stale` accepts for one of a closed store. Counts the refusals.
fn settle<R: std::fmt::Debug>(
    model: &mut Model,
    state: HandleState,
    got: &Result<R, Error>,
    stale: fn(&Error) -> bool,
) -> Result<(), String> {
    let ok = match (state, got) {
        (HandleState::Live, Ok(_)) => true,
        (HandleState::Ended, Err(Error::LeaseExpired { .. })) => true,
        (HandleState::Stale, Err(e)) => stale(e),
        _ => false,
    };
    match state {
        HandleState::Live => {}
        HandleState::Ended => model.note("settling a lease that ended: LeaseExpired"),
        HandleState::Stale => model.note("settling a lease of a closed store"),
    }
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the model expects a lease that is {state:?}, got {got:?}"
        ))
    }
}

fn closed(e: &Error) -> bool {
    matches!(e, Error::Closed)
}

/// A lease of a closed store completed: its own transaction fails to commit (`Closed`), or,
/// once its deadline has passed by the clock, the ack is refused first (`LeaseExpired`).
fn closed_or_expired(e: &Error) -> bool {
    matches!(e, Error::Closed | Error::LeaseExpired { .. })
}

fn wrong_store(e: &Error) -> bool {
    matches!(e, Error::WrongStore { .. })
}

/// Takes an item from queue `q` for `slot`, checking it against the model.
fn dequeue(
    real: &mut Real,
    model: &mut Model,
    slot: usize,
    q: usize,
) -> Result<Option<u64>, String> {
    let queue = real.queues[q].clone();
    let got = queue
        .blocking_try_dequeue(real.tx(slot))
        .map_err(|e| format!("try_dequeue failed: {e:?}"))?;
    model.tx(slot);
    match got {
        // Fails for an item not ready at the front of `q`: one pending in a transaction
        // (the caller's included), held, leased, delayed, dead, or behind others.
        Some(v) => model.dequeued(slot, q, v)?,
        None if model.visible(q) > 0 => {
            return Err(format!(
                "try_dequeue on q{q} found nothing, the model shows {:?}",
                model.ready[q]
            ));
        }
        None => {}
    }
    Ok(got)
}

/// The real ids of dead letters of `q`, by value.
fn dead_ids(queue: &Queue) -> Result<Vec<(u64, u64)>, String> {
    Ok(queue
        .blocking_dead_letters(None, usize::MAX)
        .map_err(|e| format!("dead_letters failed: {e:?}"))?
        .into_iter()
        .map(|d| (d.item, d.id))
        .collect())
}

/// The `Replay` argument for `which` on `q`, and the values it names (or the id it must be
/// refused for).
fn choose(
    real: &Real,
    model: &Model,
    q: usize,
    which: Which,
) -> Result<(Replay, Result<Vec<u64>, u64>), String> {
    let dead = model.dead_values(q);
    let id_of = |v: u64| -> Result<u64, String> {
        dead_ids(&real.queues[q])?
            .into_iter()
            .find(|&(item, _)| item == v)
            .map(|(_, id)| id)
            .ok_or_else(|| format!("dead letter {v} of q{q} is not listed"))
    };
    Ok(match which {
        Which::All => (Replay::All, Ok(dead)),
        Which::First(n) => (Replay::First(n), Ok(dead.into_iter().take(n).collect())),
        Which::Nth(_) if dead.is_empty() => (Replay::Ids(Vec::new()), Ok(Vec::new())),
        Which::Nth(n) => {
            let v = dead[n % dead.len()];
            (Replay::Ids(vec![id_of(v)?]), Ok(vec![v]))
        }
        Which::Bogus(n) => {
            // Not dead letters of `q`: dead letters of the other queues, items of `q`.
            let mut candidates = Vec::new();
            for (other, queue) in real.queues.iter().enumerate() {
                if other != q {
                    candidates.extend(dead_ids(queue)?.into_iter().map(|(_, id)| id));
                }
            }
            let browsed = real.queues[q]
                .blocking_browse(None, usize::MAX)
                .map_err(|e| format!("browse failed: {e:?}"))?;
            candidates.extend(browsed.iter().map(|b| b.id));
            candidates.push(u64::MAX);
            let bogus = candidates[n % candidates.len()];
            let mut ids = Vec::new();
            if let Some(&v) = dead.first() {
                ids.push(id_of(v)?);
            }
            ids.push(bogus);
            (Replay::Ids(ids), Err(bogus))
        }
    })
}

fn step(real: &mut Real, model: &mut Model, op: Op) -> Result<(), String> {
    match op {
        Op::Begin(s) => {
            real.tx(s);
            model.tx(s);
        }
        Op::Enqueue(s, q) => {
            let v = model.value();
            let queue = real.queues[q].clone();
            queue
                .enqueue(real.tx(s), v)
                .map_err(|e| format!("enqueue failed: {e:?}"))?;
            model.tx(s).enq.push((q, v));
        }
        Op::EnqueueAfter(s, q, delay) => {
            let v = model.value();
            let queue = real.queues[q].clone();
            queue
                .enqueue_after(real.tx(s), v, ms(delay))
                .map_err(|e| format!("enqueue_after failed: {e:?}"))?;
            let tx = model.tx(s);
            if delay == 0 {
                tx.enq.push((q, v));
            } else {
                tx.delayed.push((q, v, Due::After { delay }));
            }
        }
        Op::EnqueueAt(s, q, offset) => {
            let v = model.value();
            let at = model.now.saturating_add_signed(offset);
            let queue = real.queues[q].clone();
            queue
                .enqueue_at(real.tx(s), v, time(at))
                .map_err(|e| format!("enqueue_at failed: {e:?}"))?;
            let now = model.now;
            let tx = model.tx(s);
            if at <= now {
                tx.enq.push((q, v));
            } else {
                tx.delayed.push((q, v, Due::At(at)));
            }
        }
        Op::Produce(q, n) => {
            let mut tx = real.store().begin();
            let values: Vec<u64> = (0..n).map(|_| model.value()).collect();
            for &v in &values {
                real.queues[q]
                    .enqueue(&mut tx, v)
                    .map_err(|e| format!("enqueue failed: {e:?}"))?;
            }
            tx.blocking_commit()
                .map_err(|e| format!("commit failed: {e:?}"))?;
            model.produce(q, &values);
        }
        Op::TryDequeue(s, q) => {
            dequeue(real, model, s, q)?;
        }
        Op::Move(s, from, to) => {
            if let Some(v) = dequeue(real, model, s, from)? {
                let queue = real.queues[to].clone();
                queue
                    .enqueue(real.tx(s), v)
                    .map_err(|e| format!("enqueue (move) failed: {e:?}"))?;
                model.tx(s).enq.push((to, v));
            }
        }
        Op::Commit(s) => {
            let got = match real.txs[s].take() {
                Some(tx) => tx.blocking_commit(),
                None => Ok(()),
            };
            let expected = model.commit(s);
            match (&got, expected) {
                (Ok(()), true) | (Err(Error::LeaseExpired { .. }), false) => {}
                _ => {
                    return Err(format!(
                        "commit returned {got:?}, the model expects {}",
                        if expected { "Ok" } else { "LeaseExpired" }
                    ))
                }
            }
        }
        Op::Abort(s) => {
            if let Some(tx) = real.txs[s].take() {
                tx.blocking_abort().expect("abort");
            }
            model.abort(s);
        }
        Op::Lease { q, n, ttl } => {
            let queue = real.queues[q].clone();
            let visible = model.visible(q);
            let leases = if n == 1 || visible == 0 {
                let got = queue
                    .blocking_try_lease(ms(ttl))
                    .map_err(|e| format!("try_lease failed: {e:?}"))?;
                got.into_iter().collect::<Vec<_>>()
            } else {
                model.note("lease_many");
                queue
                    .blocking_lease_many(n, ms(ttl))
                    .map_err(|e| format!("lease_many failed: {e:?}"))?
            };
            let expected = n.min(visible);
            let got: Vec<u64> = leases.iter().map(|l| *l.item()).collect();
            if got.len() != expected {
                return Err(format!(
                    "leased {got:?} from q{q}, the model expects {expected} of {:?}",
                    model.ready[q]
                ));
            }
            for &v in &got {
                model.take(q, v)?;
            }
            for lease in leases {
                let v = *lease.item();
                let attempt = model.grant(v, ttl);
                let deadline = time(model.now + ttl);
                if (lease.attempt(), lease.deadline()) != (attempt, deadline) {
                    return Err(format!(
                        "lease of {v}: attempt {} until {:?}, the model expects attempt \
                         {attempt} until {deadline:?}",
                        lease.attempt(),
                        lease.deadline()
                    ));
                }
                if !real.tokens.insert(lease.token()) {
                    return Err(format!(
                        "lease of {v} has token {}, handed out before",
                        lease.token()
                    ));
                }
                real.leases.push(lease);
            }
        }
        Op::Ack(h, s) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            let lease = real.leases.remove(i);
            let handle = model.handles.remove(i);
            let state = model.handle_state(&handle);
            let got = lease.ack(real.tx(s));
            model.tx(s);
            settle(model, state, &got, wrong_store)?;
            if state == HandleState::Live {
                model.note("ack buffered in a transaction");
                model.ack(s, handle.token);
            }
        }
        Op::Complete(h) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            let lease = real.leases.remove(i);
            let handle = model.handles.remove(i);
            let state = model.handle_state(&handle);
            let got = lease.blocking_complete();
            settle(model, state, &got, closed_or_expired)?;
            if state == HandleState::Live {
                model.complete(handle.value);
            }
        }
        Op::Fail(h) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            let lease = real.leases.remove(i);
            let handle = model.handles.remove(i);
            let state = model.handle_state(&handle);
            let token = lease.token();
            let reason = model.reason();
            let got = lease.blocking_fail(&reason.text());
            settle(model, state, &got, closed)?;
            if let Some((v, _, attempts)) = model.lease_of(&handle) {
                let q = model.items[&v].queue;
                let base = model.policy[q].base_backoff(attempts);
                let backoff = real.policies[q].backoff(attempts, token).as_millis() as u64;
                let spread = if real.jitter {
                    (base as f64 * JITTER) as u64
                } else {
                    0
                };
                if backoff + spread < base || backoff > base + spread {
                    return Err(format!(
                        "backoff after attempt {attempts} is {backoff} ms, the model expects \
                         {base} ms, give or take {spread}"
                    ));
                }
                let expected = match model.fail(v, reason, backoff) {
                    Some(due) => Failed::Retry { at: time(due) },
                    None => Failed::Dead,
                };
                if got.as_ref().ok() != Some(&expected) {
                    return Err(format!(
                        "fail of {v} gave {got:?}, the model expects {expected:?}"
                    ));
                }
            }
        }
        Op::Release(h, delay) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            let lease = real.leases.remove(i);
            let handle = model.handles.remove(i);
            let state = model.handle_state(&handle);
            let got = lease.blocking_release(ms(delay));
            settle(model, state, &got, closed)?;
            if state == HandleState::Live {
                model.release(handle.value, delay);
            }
        }
        Op::DropLease(h) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            drop(real.leases.remove(i));
            let handle = model.handles.remove(i);
            if model.handle_state(&handle) == HandleState::Live {
                model.release(handle.value, 0);
            }
        }
        Op::Extend(h, ttl) => {
            if real.leases.is_empty() {
                return Ok(());
            }
            let i = h % real.leases.len();
            let handle = model.handles[i].clone();
            let state = model.handle_state(&handle);
            let got = real.leases[i].blocking_extend(ms(ttl));
            settle(model, state, &got, closed)?;
            if state == HandleState::Live {
                let deadline = time(model.extend(handle.value, ttl));
                if real.leases[i].deadline() != deadline {
                    return Err(format!(
                        "extended lease of {} ends at {:?}, the model expects {deadline:?}",
                        handle.value,
                        real.leases[i].deadline()
                    ));
                }
            }
        }
        Op::Advance(by) => {
            model.advance(model.now + by);
            real.clock.advance(ms(by));
        }
        Op::Replay(q, which, reset) => {
            let (arg, chosen) = choose(real, model, q, which)?;
            let got = real.queues[q].blocking_replay(arg.clone(), reset);
            dead_outcome(model, &got, &chosen, &arg)?;
            if let Ok(values) = chosen {
                model.replay(&values, reset);
            }
        }
        Op::Purge(q, which) => {
            let (arg, chosen) = choose(real, model, q, which)?;
            let got = real.queues[q].blocking_purge(arg.clone());
            dead_outcome(model, &got, &chosen, &arg)?;
            if let Ok(values) = chosen {
                model.purge(&values);
            }
        }
        Op::SetMaxAttempts(q, n) => {
            let policy = retry_policy(n, real.jitter);
            real.queues[q]
                .blocking_set_retry_policy(policy)
                .map_err(|e| format!("set_retry_policy failed: {e:?}"))?;
            real.policies[q] = policy;
            model.policy[q].max_attempts = n;
        }
        Op::Check => check_order(real, model)?,
        Op::Restart(down) => {
            real.restart(down)
                .map_err(|e| format!("closing the store failed: {e:?}"))?;
            model.restart(model.now + down);
            check_order(real, model)?;
        }
    }
    Ok(())
}

/// Checks the outcome of a replay or purge: the count of the values chosen, or
/// `NotDeadLetter` for the bogus id.
fn dead_outcome(
    model: &mut Model,
    got: &Result<usize, Error>,
    chosen: &Result<Vec<u64>, u64>,
    arg: &Replay,
) -> Result<(), String> {
    let ok = match (got, chosen) {
        (Ok(n), Ok(values)) => *n == values.len(),
        (Err(Error::NotDeadLetter { id, .. }), Err(bogus)) => {
            model.note("replay or purge refused: NotDeadLetter");
            id == bogus
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{arg:?} returned {got:?}, the model expects {chosen:?} (Err: NotDeadLetter)"
        ))
    }
}

/// Reads every queue whole (dequeue, then abort) and checks its order against the model.
fn check_order(real: &Real, model: &mut Model) -> Result<(), String> {
    for (q, queue) in real.queues.iter().enumerate() {
        let items = common::peek_all(real.store(), queue);
        model.observe_order(q, &items)?;
    }
    Ok(())
}

fn row(b: &reliable_queue::BrowsedItem<u64>) -> Result<Row, String> {
    let state = match b.state {
        ItemState::Ready => RowState::Ready,
        ItemState::Delayed { until } => RowState::Delayed {
            until: millis(Some(until)),
        },
        ItemState::Leased { until, attempt } => RowState::Leased {
            until: millis(Some(until)),
            attempt,
        },
        other => return Err(format!("browse: unknown state {other:?}")),
    };
    Ok(Row {
        value: b.item,
        state,
        attempts: b.attempts,
        enqueued_at: millis(b.enqueued_at),
    })
}

fn increasing(ids: impl IntoIterator<Item = u64>) -> bool {
    let ids: Vec<u64> = ids.into_iter().collect();
    ids.windows(2).all(|w| w[0] < w[1])
}

/// Everything but the ready order: stats, counts, transactions, browse, dead letters.
fn check_all(real: &Real, model: &Model) -> Result<(), String> {
    for (q, queue) in real.queues.iter().enumerate() {
        let stats = queue
            .blocking_stats()
            .map_err(|e| format!("stats of q{q} failed: {e:?}"))?;
        let got = Counts {
            visible: stats.visible,
            delayed: stats.delayed,
            leased: stats.leased,
            held: stats.held,
            dead: stats.dead,
        };
        let expected = model.counts(q);
        if got != expected {
            return Err(format!(
                "stats of q{q} are {got:?}, the model's {expected:?}"
            ));
        }
        let count = queue
            .blocking_count()
            .map_err(|e| format!("count of q{q} failed: {e:?}"))?;
        if count != expected.visible {
            return Err(format!(
                "count of q{q} is {count}, the model's {}",
                expected.visible
            ));
        }
        let browsed = queue
            .blocking_browse(None, usize::MAX)
            .map_err(|e| format!("browse of q{q} failed: {e:?}"))?;
        let rows = browsed.iter().map(row).collect::<Result<Vec<_>, _>>()?;
        let expected = model.browse(q);
        // A running lease is listed under its fencing token.
        for (handle, lease) in model.handles.iter().zip(&real.leases) {
            if model.lease_of(handle).is_some() && model.items[&handle.value].queue == q {
                let listed = browsed
                    .iter()
                    .find(|b| b.item == handle.value)
                    .map(|b| b.id);
                if listed != Some(lease.token()) {
                    return Err(format!(
                        "lease of {} has token {}, browse lists it as {listed:?}",
                        handle.value,
                        lease.token()
                    ));
                }
            }
        }
        if queue.retry_policy() != real.policies[q] {
            return Err(format!(
                "q{q}'s retry policy is {:?}, set {:?}",
                queue.retry_policy(),
                real.policies[q]
            ));
        }
        if rows != expected || !increasing(browsed.iter().map(|b| b.id)) {
            return Err(format!(
                "browse of q{q}:\n    got      {rows:?}\n    expected {expected:?}\n    ids {:?}",
                browsed.iter().map(|b| b.id).collect::<Vec<_>>()
            ));
        }
        if got.dead > 0 {
            let dead = queue
                .blocking_dead_letters(None, usize::MAX)
                .map_err(|e| format!("dead_letters of q{q} failed: {e:?}"))?;
            let rows: Vec<DeadRow> = dead
                .iter()
                .map(|d| DeadRow {
                    value: d.item,
                    reason: d.reason.clone(),
                    attempts: d.attempts,
                    first_attempt: millis(d.first_attempt),
                    last_attempt: millis(d.last_attempt),
                    enqueued_at: millis(d.enqueued_at),
                })
                .collect();
            let expected = model.dead(q);
            if rows != expected || !increasing(dead.iter().map(|d| d.id)) {
                return Err(format!(
                    "dead letters of q{q}:\n    got      {rows:?}\n    expected {expected:?}"
                ));
            }
        }
    }
    for s in 0..SLOTS {
        let real_tx = real.txs[s]
            .as_ref()
            .map(|tx| (tx.enqueued(), tx.dequeued()));
        let model_tx = model.txs[s].as_ref().map(|tx| (tx.enq.len(), tx.deq.len()));
        if real_tx.unwrap_or_default() != model_tx.unwrap_or_default() {
            return Err(format!(
                "transaction {s} holds {real_tx:?}, the model {model_tx:?}"
            ));
        }
    }
    Ok(())
}

fn run_case(
    backend: Backend,
    setup: Setup,
    ops: &[Op],
    coverage: &RefCell<BTreeMap<&'static str, u64>>,
) -> Result<(), TestCaseError> {
    let mut real = Real::new(backend, setup);
    let policy = setup.max_attempts.map(|max_attempts| Policy {
        max_attempts,
        initial_ms: INITIAL_BACKOFF,
        max_ms: MAX_BACKOFF,
    });
    let mut model = Model::new(START, policy);
    let result = run_steps(&mut real, &mut model, backend, ops);
    let mut total = coverage.borrow_mut();
    for (event, n) in std::mem::take(&mut model.coverage) {
        *total.entry(event).or_default() += n;
    }
    *total.entry("steps").or_default() += ops.len() as u64;
    result
}

fn run_steps(
    real: &mut Real,
    model: &mut Model,
    backend: Backend,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let at = |i: usize, op: Op, result: Result<(), String>, model: &Model| {
        result.map_err(|what| fail(i, op, format!("{what}\n  model: {}", model.describe())))
    };
    for (i, &op) in ops.iter().enumerate() {
        let done = step(real, model, op).and_then(|()| check_all(real, model));
        at(i, op, done, model)?;
    }
    // The end: open transactions abort, the leases held are dropped (each goes back to the
    // front in turn), then everything is where the model says.
    let end = ops.len();
    real.txs = Default::default();
    for s in 0..SLOTS {
        model.abort(s);
    }
    real.leases.clear();
    for handle in std::mem::take(&mut model.handles) {
        if model.handle_state(&handle) == HandleState::Live {
            model.release(handle.value, 0);
        }
    }
    let done = check_all(real, model).and_then(|()| check_order(real, model));
    at(end, Op::Check, done, model)?;
    if matches!(backend, Backend::Disk { .. }) {
        let done = real
            .restart(0)
            .map_err(|e| format!("closing the store failed: {e:?}"));
        model.restart(model.now);
        let done = done
            .and_then(|()| check_all(real, model))
            .and_then(|()| check_order(real, model));
        at(end, Op::Restart(0), done, model)?;
    }
    // Nothing committed is lost: once every delay has passed, every item is visible or dead.
    let by = 10_000;
    model.advance(model.now + by);
    real.clock.advance(ms(by));
    let done = check_all(real, model).and_then(|()| check_order(real, model));
    at(end, Op::Advance(by), done, model)
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run(backend: Backend, mode: Mode, max_len: usize, default_cases: u32) {
    let cases = cases(default_cases);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let restarts = matches!(backend, Backend::Disk { .. });
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let strategy = (
        setup(),
        proptest::collection::vec(op(mode, restarts), 1..max_len),
    );
    let coverage = RefCell::new(BTreeMap::new());
    let result = runner.run(&strategy, |(setup, ops)| {
        run_case(backend, setup, &ops, &coverage)
    });
    let coverage: Vec<String> = coverage
        .into_inner()
        .into_iter()
        .map(|(event, n)| format!("\n    {n:>7}  {event}"))
        .collect();
    println!(
        "model test, {mode:?}, {backend:?}: {cases} cases in {:.1?}; events:{}",
        started.elapsed(),
        coverage.concat()
    );
    if let Err(e) = result {
        panic!("{mode:?}, {backend:?}: {e}");
    }
}

const SYNC: Backend = Backend::Disk {
    durability: Durability::Sync,
    compaction_floor: None,
};

const BUFFERED: Backend = Backend::Disk {
    durability: Durability::Buffered,
    compaction_floor: None,
};

/// Sync, compacting whenever the log outgrows twice the live backlog (with `Sync` the mark,
/// below which compaction may delete, moves with every commit).
const COMPACTING: Backend = Backend::Disk {
    durability: Durability::Sync,
    compaction_floor: Some(0),
};

#[test]
fn model_in_memory() {
    run(Backend::Memory, Mode::Transactions, 60, 3000);
}

#[test]
fn model_on_disk_with_restarts() {
    run(SYNC, Mode::Transactions, 40, 500);
}

#[test]
fn model_on_disk_buffered_with_restarts() {
    run(BUFFERED, Mode::Transactions, 40, 300);
}

#[test]
fn processing_model_in_memory() {
    // A fifth in debug builds, where this model is some twenty times slower.
    let cases = if cfg!(debug_assertions) { 1000 } else { 5000 };
    run(Backend::Memory, Mode::Processing, 150, cases);
}

#[test]
fn processing_model_on_disk_compacting_with_restarts() {
    run(COMPACTING, Mode::Processing, 80, 300);
}

#[test]
fn processing_model_on_disk_buffered_with_restarts() {
    run(BUFFERED, Mode::Processing, 80, 300);
}

/// A fencing token is "unique in the store, never reused" (`Lease::token`): also after a
/// restart that follows compaction, which may delete every record that named the highest
/// ids (each record's header carries the id high-water mark forward). Found by this model.
#[test]
fn fencing_tokens_are_not_reused_after_compaction_and_a_restart() {
    let (_dir, path) = common::temp_dir();
    let open = || {
        Store::builder()
            .path(&path)
            .compaction_floor(0)
            .open()
            .expect("open the store")
    };
    let store = open();
    let q = store.blocking_queue::<u64>("q").expect("queue");
    let mut tx = store.begin();
    q.enqueue(&mut tx, 0).expect("enqueue"); // stays in the queue throughout
    q.enqueue(&mut tx, 1).expect("enqueue");
    tx.blocking_commit().expect("commit");
    // Lease both, complete item 1, give item 0 back (a release without delay writes nothing).
    let mut leases = q.blocking_lease_many(2, ms(30_000)).expect("lease");
    let tokens: Vec<u64> = leases.iter().map(|l| l.token()).collect();
    leases
        .pop()
        .expect("two leases")
        .blocking_complete()
        .expect("complete");
    drop(leases);
    store.blocking_close().expect("close");
    let store = open();
    let q = store.blocking_queue::<u64>("q").expect("queue");
    let token = q.blocking_lease(ms(30_000)).expect("lease").token();
    assert!(
        tokens.iter().all(|&t| t < token),
        "token {token} after the restart; before it: {tokens:?}"
    );
}
