//! Model-based property test: random interleavings of up to three open transactions over
//! three queues, with restarts, run against a store and against a reference model.
//!
//! The model keeps, per queue, the set of visible items (committed and held by no open
//! transaction), and per open transaction its pending enqueues and held dequeues. Items carry
//! unique ids, so every check is exact. After every step:
//!
//! - `count()` of every queue equals the model's visible count (S5);
//! - `try_dequeue` returns `None` exactly when the model shows nothing visible, and otherwise
//!   an item the model shows visible in that queue: order is best effort, so any visible item
//!   is accepted, but never one still pending in a transaction, the caller's included (S1, S2);
//! - commits and aborts move items as the model does (S3, S4);
//! - after a restart (every open transaction dropped, the store closed and reopened) the
//!   queues hold exactly the model's items (S7, S8).
//!
//! By default 3000 cases run in memory, 500 on disk under `Durability::Sync` and 300 under
//! `Durability::Buffered` (3800 in all, about half a minute in release on two cores: a case on
//! disk opens a store two to four times). `PROPTEST_CASES` sets the count of every backend.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reliable_queue::{Durability, ReliableConcurrentQueue, Store, Transaction};

const QUEUES: usize = 3;
const SLOTS: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Opens a transaction in a slot (nothing if one is open there already).
    Begin(usize),
    Enqueue(usize, usize),
    TryDequeue(usize, usize),
    Commit(usize),
    Abort(usize),
    /// Dequeues from one queue and enqueues the same item into another, in one transaction.
    Move(usize, usize, usize),
    /// Drops every open transaction and the store, then reopens it.
    Restart,
}

fn op(restarts: bool) -> BoxedStrategy<Op> {
    let slot = 0..SLOTS;
    let queue = 0..QUEUES;
    let work = prop_oneof![
        1 => slot.clone().prop_map(Op::Begin),
        4 => (slot.clone(), queue.clone()).prop_map(|(s, q)| Op::Enqueue(s, q)),
        4 => (slot.clone(), queue.clone()).prop_map(|(s, q)| Op::TryDequeue(s, q)),
        2 => slot.clone().prop_map(Op::Commit),
        1 => slot.clone().prop_map(Op::Abort),
        2 => (slot, queue.clone(), queue).prop_map(|(s, f, t)| Op::Move(s, f, t)),
    ];
    if restarts {
        prop_oneof![14 => work, 1 => Just(Op::Restart)].boxed()
    } else {
        work.boxed()
    }
}

#[derive(Debug, Default)]
struct ModelTx {
    enq: Vec<(usize, u64)>,
    deq: Vec<(usize, u64)>,
}

#[derive(Debug, Default)]
struct Model {
    visible: [BTreeSet<u64>; QUEUES],
    txs: [Option<ModelTx>; SLOTS],
    next_id: u64,
}

impl Model {
    fn abort(&mut self, slot: usize) {
        if let Some(tx) = self.txs[slot].take() {
            for (q, id) in tx.deq {
                self.visible[q].insert(id);
            }
        }
    }

    fn commit(&mut self, slot: usize) {
        if let Some(tx) = self.txs[slot].take() {
            for (q, id) in tx.enq {
                self.visible[q].insert(id);
            }
        }
    }
}

/// How the store under test is opened.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Disk(Durability),
}

struct Real {
    backend: Backend,
    _dir: Option<tempfile::TempDir>,
    path: Option<std::path::PathBuf>,
    store: Option<Store>,
    queues: Vec<ReliableConcurrentQueue<u64>>,
    txs: [Option<Transaction>; SLOTS],
}

impl Real {
    fn new(backend: Backend) -> Real {
        let (dir, path) = match backend {
            Backend::Memory => (None, None),
            Backend::Disk(_) => {
                let (dir, path) = common::temp_dir();
                (Some(dir), Some(path))
            }
        };
        let mut real = Real {
            backend,
            _dir: dir,
            path,
            store: None,
            queues: Vec::new(),
            txs: Default::default(),
        };
        real.open();
        real
    }

    fn open(&mut self) {
        let store = match (self.backend, &self.path) {
            (Backend::Disk(durability), Some(path)) => Store::builder()
                .path(path)
                .durability(durability)
                .open()
                .expect("open the store"),
            _ => Store::in_memory().expect("in-memory store"),
        };
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

    fn restart(&mut self) {
        self.txs = Default::default();
        self.queues.clear();
        self.store = None;
        self.open();
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

/// Takes an item from queue `q` for `slot`, checking it against the model.
fn dequeue(
    real: &mut Real,
    model: &mut Model,
    slot: usize,
    q: usize,
    step: usize,
    op: Op,
) -> Result<Option<u64>, TestCaseError> {
    let queue = real.queues[q].clone();
    let got = queue
        .blocking_try_dequeue(real.tx(slot))
        .map_err(|e| fail(step, op, format!("try_dequeue failed: {e:?}")))?;
    model.txs[slot].get_or_insert_with(ModelTx::default);
    match got {
        Some(id) => {
            if !model.visible[q].remove(&id) {
                let pending = model
                    .txs
                    .iter()
                    .flatten()
                    .any(|tx| tx.enq.contains(&(q, id)));
                return Err(fail(
                    step,
                    op,
                    format!(
                        "dequeued item {id} from q{q}, not visible there (pending in a \
                         transaction: {pending}; visible: {:?})",
                        model.visible[q]
                    ),
                ));
            }
            if let Some(tx) = model.txs[slot].as_mut() {
                tx.deq.push((q, id));
            }
        }
        None if !model.visible[q].is_empty() => {
            return Err(fail(
                step,
                op,
                format!(
                    "try_dequeue on q{q} found nothing, model shows {:?}",
                    model.visible[q]
                ),
            ))
        }
        None => {}
    }
    Ok(got)
}

fn step(real: &mut Real, model: &mut Model, step: usize, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Begin(s) => {
            real.tx(s);
            model.txs[s].get_or_insert_with(ModelTx::default);
        }
        Op::Enqueue(s, q) => {
            let id = model.next_id;
            model.next_id += 1;
            let queue = real.queues[q].clone();
            queue
                .enqueue(real.tx(s), id)
                .map_err(|e| fail(step, op, format!("enqueue failed: {e:?}")))?;
            model.txs[s]
                .get_or_insert_with(ModelTx::default)
                .enq
                .push((q, id));
        }
        Op::TryDequeue(s, q) => {
            dequeue(real, model, s, q, step, op)?;
        }
        Op::Move(s, from, to) => {
            if let Some(id) = dequeue(real, model, s, from, step, op)? {
                let queue = real.queues[to].clone();
                queue
                    .enqueue(real.tx(s), id)
                    .map_err(|e| fail(step, op, format!("enqueue (move) failed: {e:?}")))?;
                model.txs[s]
                    .get_or_insert_with(ModelTx::default)
                    .enq
                    .push((to, id));
            }
        }
        Op::Commit(s) => {
            if let Some(tx) = real.txs[s].take() {
                tx.blocking_commit()
                    .map_err(|e| fail(step, op, format!("commit failed: {e:?}")))?;
            }
            model.commit(s);
        }
        Op::Abort(s) => {
            if let Some(tx) = real.txs[s].take() {
                tx.blocking_abort().expect("abort");
            }
            model.abort(s);
        }
        Op::Restart => {
            real.restart();
            for s in 0..SLOTS {
                model.abort(s);
            }
            check_contents(real, model, step, op)?;
        }
    }
    check_counts(real, model, step, op)
}

fn check_counts(real: &Real, model: &Model, step: usize, op: Op) -> Result<(), TestCaseError> {
    for (q, queue) in real.queues.iter().enumerate() {
        let count = queue
            .blocking_count()
            .map_err(|e| fail(step, op, format!("count of q{q} failed: {e:?}")))?;
        let expected = model.visible[q].len() as u64;
        if count != expected {
            return Err(fail(
                step,
                op,
                format!("count of q{q} is {count}, model {expected}"),
            ));
        }
    }
    for s in 0..SLOTS {
        let real_tx = real.txs[s]
            .as_ref()
            .map(|tx| (tx.enqueued(), tx.dequeued()));
        let model_tx = model.txs[s].as_ref().map(|tx| (tx.enq.len(), tx.deq.len()));
        if real_tx.unwrap_or_default() != model_tx.unwrap_or_default() {
            return Err(fail(
                step,
                op,
                format!("transaction {s} holds {real_tx:?}, model {model_tx:?}"),
            ));
        }
    }
    Ok(())
}

/// Every visible item of every queue, by dequeue-then-abort, against the model.
fn check_contents(real: &Real, model: &Model, step: usize, op: Op) -> Result<(), TestCaseError> {
    for (q, queue) in real.queues.iter().enumerate() {
        let items = common::peek_all(real.store(), queue);
        let found: BTreeSet<u64> = items.iter().copied().collect();
        if found.len() != items.len() || found != model.visible[q] {
            return Err(fail(
                step,
                op,
                format!("q{q} holds {items:?}, model {:?}", model.visible[q]),
            ));
        }
    }
    Ok(())
}

fn run_case(backend: Backend, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut real = Real::new(backend);
    let mut model = Model::default();
    for (i, &op) in ops.iter().enumerate() {
        step(&mut real, &mut model, i, op)?;
    }
    // End of the case: the open transactions abort, then everything is where the model says.
    real.txs = Default::default();
    for s in 0..SLOTS {
        model.abort(s);
    }
    check_contents(&real, &model, ops.len(), Op::Restart)?;
    if matches!(backend, Backend::Disk(_)) {
        real.restart();
        check_contents(&real, &model, ops.len(), Op::Restart)?;
    }
    Ok(())
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run(backend: Backend, restarts: bool, max_len: usize, default_cases: u32) {
    let cases = cases(default_cases);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let strategy = proptest::collection::vec(op(restarts), 1..max_len);
    let result = runner.run(&strategy, |ops| run_case(backend, &ops));
    println!(
        "model test, {backend:?}: {cases} cases in {:.1?}",
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{backend:?}: {e}");
    }
}

#[test]
fn model_in_memory() {
    run(Backend::Memory, false, 60, 3000);
}

#[test]
fn model_on_disk_with_restarts() {
    run(Backend::Disk(Durability::Sync), true, 40, 500);
}

#[test]
fn model_on_disk_buffered_with_restarts() {
    run(Backend::Disk(Durability::Buffered), true, 40, 300);
}
