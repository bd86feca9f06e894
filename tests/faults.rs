//! Fault injection: sled's failpoints on the commit, recovery and compaction paths, and a real
//! disk-full test on a small tmpfs.
//!
//! Build with `--features failpoints`. Failpoints are process-global, so every run of the sweep
//! happens in one test function, one after another, and the disk-full test takes the same lock.
//!
//! Each run of the sweep arms one failpoint to fail on its n-th hit (n = 1..=8) in one of the
//! scenarios of [`Scenario`], drives a workload against the store and a model of it (three
//! threads in the concurrent scenario, one elsewhere), then disarms the failpoint, drops the
//! store and reopens it. It checks:
//!
//! - every failure reaches the caller typed: `Error::Storage` for the calls that hit it,
//!   `Error::PreviousFailure` carrying that same source for every call after the store stopped,
//!   or `Error::Closed`; nothing panics (a panic hook counts panics in every thread, the
//!   committer's and sled's included) and nothing hangs;
//! - a failed commit is rolled back in memory: its dequeued items are visible again and
//!   `count()` equals the model after every operation;
//! - after the reopen the queues hold exactly the state reached by replaying a prefix of the
//!   commit history that contains every acknowledged durable commit (S3, S7, S8), and the
//!   total-queue check finds nothing lost, duplicated or unexpected (the concurrent scenario,
//!   whose commit order is unknown, has the total-queue check only; see `run_concurrent`).
//!
//! A commit whose `commit()` returned an error may or may not have reached the disk: sled may
//! have written its record before the flush failed. Its items count as *attempted*, not
//! *acknowledged*: the reopened store may show it applied or not applied, but only entirely
//! (all of its enqueues present and all of its dequeues gone, or none of either). The store
//! stops committing after a storage failure, so only the first failed commit can be in that
//! state, and no commit may succeed after it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{Builder, Durability, Error, ReliableConcurrentQueue, Store};
use serde::{Deserialize, Serialize};

use common::{peek_all, temp_dir, TotalQueue};

/// Every I/O failpoint of sled 0.34.7 (`io_fail!` in its source).
const FAILPOINTS: &[&str] = &[
    "buffer write",
    "buffer write post",
    "blob blob write",
    "write_blob write crc",
    "write_blob write kind_byte",
    "write_blob write buf",
    "write_config bytes",
    "write_config crc",
    "write_config post",
    "segment initial free zero",
    "zero garbage segment SA",
    "file truncation",
    "snap write",
    "snap write len",
    "snap write crc",
    "snap write post",
    "snap write mv",
    "snap write mv post",
    "snap write rm old",
];

/// Each failpoint fails on its 1st, 2nd, ... up to this hit.
const MAX_HITS: u32 = 8;
/// Transactions a run drives while a failpoint is armed.
const ARMED_TRANSACTIONS: usize = 12;
/// Longest a run may take before the sweep reports a hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// An item this large goes to a sled blob file (over a quarter of its 512 KiB segment).
const BIG: usize = 200 * 1024;
const SMALL: usize = 16;
const QUEUES: [&str; 2] = ["a", "b"];

/// Failpoints and the disk-full test share process-global state.
static SERIAL: Mutex<()> = Mutex::new(());
/// Panics in any thread since the hook was installed.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Item {
    id: u64,
    pad: Vec<u8>,
}

impl Item {
    fn new(id: u64, big: bool) -> Self {
        Item::with_len(id, if big { BIG } else { SMALL })
    }

    fn with_len(id: u64, len: usize) -> Self {
        Item {
            id,
            pad: vec![id as u8; len],
        }
    }

    /// The pad is a function of the id: damaged bytes cannot pass for an item.
    fn is_intact(&self) -> bool {
        !self.pad.is_empty() && self.pad.iter().all(|&b| b == self.id as u8)
    }
}

/// One commit and its outcome.
#[derive(Debug, Clone, Default)]
struct Attempt {
    enq: Vec<(usize, u64)>,
    deq: Vec<(usize, u64)>,
    ok: bool,
}

type State = [BTreeSet<u64>; 2];

fn replay<'a>(attempts: impl IntoIterator<Item = &'a Attempt>) -> State {
    let mut state = State::default();
    for a in attempts {
        for &(q, id) in &a.deq {
            state[q].remove(&id);
        }
        for &(q, id) in &a.enq {
            state[q].insert(id);
        }
    }
    state
}

/// The source an `Error::Storage` or `Error::PreviousFailure` carries.
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What the typed failures of one store so far say: the first storage failure stops the store,
/// the calls that hit it get `Storage`, every later call `PreviousFailure` with its source.
#[derive(Debug, Default)]
struct Sticky {
    /// The source of the failure that stopped the store, once a call reported one.
    stopped_by: Option<Source>,
}

impl Sticky {
    /// Checks a typed failure (`Storage`, `PreviousFailure` or `Closed`) against the ones seen
    /// before on the same store.
    fn check(&mut self, e: &Error) -> Result<(), String> {
        match (e, &self.stopped_by) {
            (Error::Storage { source, .. }, None) => {
                self.stopped_by = Some(source.clone());
                Ok(())
            }
            (Error::Storage { .. }, Some(first)) => Err(format!(
                "Storage after the store stopped on {first:?}: later calls get PreviousFailure, \
                 got {e:?}"
            )),
            // No call saw the failure itself (compaction, which runs after a group was
            // answered, hit it): the first caller to hear of it gets `PreviousFailure`.
            (Error::PreviousFailure { source }, None) => {
                self.stopped_by = Some(source.clone());
                Ok(())
            }
            (Error::PreviousFailure { source }, Some(first)) if !Arc::ptr_eq(source, first) => {
                Err(format!(
                    "PreviousFailure with another source than the failure that stopped the \
                     store ({first:?}): {e:?}"
                ))
            }
            _ => Ok(()),
        }
    }
}

/// A failure a fault may cause: storage, the sticky form of an earlier one, or closed.
fn is_typed(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage { .. } | Error::PreviousFailure { .. } | Error::Closed
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// The failpoint is armed before a new store is created.
    Create,
    /// Armed before reopening a store with history (blob item included).
    Recovery,
    /// As `Recovery`, with a garbage record in the log: open sets it aside (quarantine
    /// write, fences, flush) and the armed phase lifts the fences.
    RecoveryBadRecord,
    /// Armed on an open `Durability::Sync` store: writes and flushes of commit groups.
    Commit,
    /// As `Commit` under `Durability::Buffered`: sled's background flusher hits the faults.
    CommitBuffered,
    /// Armed while three threads commit at once: the failure hits a group of several
    /// transactions, each of which must fail and roll back on its own thread.
    CommitConcurrent,
    /// A store whose 2.4 MB of 100 KiB items (inline in sled's log segments) were all
    /// consumed; armed while commits go on, then while it is closed and reopened (sled's
    /// segment cleanup and recovery).
    Churn,
    /// Armed on a store whose log is mostly acknowledged, with a compaction floor of one
    /// byte, so every group is followed by deletes and rewrites (`apply_batch`).
    Compaction,
}

const SCENARIOS: [Scenario; 8] = [
    Scenario::Create,
    Scenario::Recovery,
    Scenario::RecoveryBadRecord,
    Scenario::Commit,
    Scenario::CommitBuffered,
    Scenario::CommitConcurrent,
    Scenario::Churn,
    Scenario::Compaction,
];

impl Scenario {
    fn builder(self, path: &Path) -> Builder {
        let b = Store::builder().path(path);
        match self {
            Scenario::CommitBuffered => b
                .durability(Durability::Buffered)
                .flush_interval(Duration::from_millis(2)),
            Scenario::Compaction => b.compaction_floor(1),
            _ => b,
        }
    }

    fn buffered(self) -> bool {
        self == Scenario::CommitBuffered
    }
}

/// The shape of a run's transactions.
#[derive(Debug, Clone, Copy)]
struct Mix {
    min_deq: usize,
    max_enq: usize,
    max_deq: usize,
    /// Queue dequeues come from; `None` for a random one each time.
    deq_from: Option<usize>,
    big_one_in: u32,
    /// Length of the items that are not big.
    small: usize,
}

const MIXED: Mix = Mix {
    min_deq: 0,
    max_enq: 3,
    max_deq: 3,
    deq_from: None,
    big_one_in: 6,
    small: SMALL,
};

const DRAIN_A: Mix = Mix {
    min_deq: 4,
    max_enq: 0,
    max_deq: 8,
    deq_from: Some(0),
    big_one_in: 0,
    small: SMALL,
};

/// One item of 100 KiB per commit at most: a group stays under sled's blob threshold and is
/// written inline in its 512 KiB log segments.
const CHURN: Mix = Mix {
    min_deq: 1,
    max_enq: 1,
    max_deq: 2,
    deq_from: None,
    big_one_in: 0,
    small: 100 * 1024,
};

/// The workload's view of the store: what it did, what it expects to see.
struct Driver {
    rng: StdRng,
    history: Vec<Attempt>,
    /// Items visible now, per queue (the in-memory model).
    visible: State,
    next_id: u64,
    /// `history[..durable]` is known to be on disk (last successful flush, or Sync commits).
    durable: usize,
    violations: Vec<String>,
    /// Where the first error surfaced, if any did.
    fired: Option<&'static str>,
    /// The typed failures of the store under test so far.
    sticky: Sticky,
}

impl Driver {
    fn new(seed: u64) -> Self {
        Driver {
            rng: StdRng::seed_from_u64(seed),
            history: Vec::new(),
            visible: State::default(),
            next_id: 0,
            durable: 0,
            violations: Vec::new(),
            fired: None,
            sticky: Sticky::default(),
        }
    }

    fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    /// A store error: typed storage failure (a fault fired) or a violation.
    fn storage_error(&mut self, at: &'static str, e: &Error) {
        if !is_typed(e) {
            self.violation(format!("{at}: untyped failure {e:?}"));
            return;
        }
        self.fired.get_or_insert(at);
        if let Err(v) = self.sticky.check(e) {
            self.violation(format!("{at}: {v}"));
        }
    }

    fn check_counts(&mut self, queues: &[ReliableConcurrentQueue<Item>], at: &str) {
        for (i, q) in queues.iter().enumerate() {
            let count = match q.blocking_count() {
                Ok(count) => count,
                Err(e) => {
                    self.violation(format!("{at}: count of {} failed: {e:?}", QUEUES[i]));
                    continue;
                }
            };
            let model = self.visible[i].len() as u64;
            if count != model {
                self.violation(format!(
                    "{at}: count of {} is {count}, model {model}",
                    QUEUES[i]
                ));
            }
        }
    }

    fn take(
        &mut self,
        queues: &[ReliableConcurrentQueue<Item>],
        q: usize,
        tx: &mut reliable_queue::Transaction,
        held: &mut Vec<(usize, u64)>,
    ) -> bool {
        match queues[q].blocking_try_dequeue(tx) {
            Ok(Some(item)) => {
                if !item.is_intact() {
                    self.violation(format!("dequeued a damaged item {}", item.id));
                }
                if !self.visible[q].remove(&item.id) {
                    self.violation(format!(
                        "dequeued item {} from {}, which the model does not show visible there",
                        item.id, QUEUES[q]
                    ));
                }
                held.push((q, item.id));
                true
            }
            Ok(None) => {
                if !self.visible[q].is_empty() {
                    self.violation(format!(
                        "try_dequeue on {} found nothing, model shows {} visible",
                        QUEUES[q],
                        self.visible[q].len()
                    ));
                }
                false
            }
            Err(e) => {
                self.violation(format!("try_dequeue failed: {e:?}"));
                false
            }
        }
    }

    /// Runs one random transaction; returns false once the store refused a commit.
    fn transaction(
        &mut self,
        store: &Store,
        queues: &[ReliableConcurrentQueue<Item>],
        mix: Mix,
    ) -> bool {
        let mut tx = store.begin();
        let mut attempt = Attempt::default();
        let n_enq = self.rng.gen_range(0..=mix.max_enq);
        for _ in 0..n_enq {
            let q = self.rng.gen_range(0..2);
            let big = mix.big_one_in > 0 && self.rng.gen_ratio(1, mix.big_one_in);
            let id = self.next_id;
            self.next_id += 1;
            let len = if big { BIG } else { mix.small };
            if let Err(e) = queues[q].enqueue(&mut tx, Item::with_len(id, len)) {
                self.violation(format!("enqueue failed: {e:?}"));
            }
            attempt.enq.push((q, id));
            self.check_counts(queues, "after enqueue");
        }
        let n_deq = self.rng.gen_range(mix.min_deq..=mix.max_deq);
        for _ in 0..n_deq {
            let q = mix.deq_from.unwrap_or_else(|| self.rng.gen_range(0..2));
            self.take(queues, q, &mut tx, &mut attempt.deq);
            self.check_counts(queues, "after dequeue");
        }
        if self.rng.gen_ratio(1, 4) && self.take(queues, 0, &mut tx, &mut attempt.deq) {
            // A move: the item leaves `a` and a copy (under a new id) joins `b`.
            let id = self.next_id;
            self.next_id += 1;
            if let Err(e) = queues[1].enqueue(&mut tx, Item::new(id, false)) {
                self.violation(format!("enqueue (move) failed: {e:?}"));
            }
            attempt.enq.push((1, id));
        }
        if attempt.enq.is_empty() && attempt.deq.is_empty() {
            // Nothing to commit: `commit` returns at once without the log.
            tx.blocking_commit().expect("an empty commit");
            return true;
        }
        if self.rng.gen_ratio(1, 8) {
            tx.blocking_abort().expect("abort");
            self.give_back(&attempt);
            self.check_counts(queues, "after abort");
            return true;
        }
        let result = tx.blocking_commit();
        let ok = result.is_ok();
        match result {
            Ok(()) => {
                if self.history.iter().any(|a| !a.ok) {
                    self.violation(
                        "a commit succeeded after a failed one, without a reopen".into(),
                    );
                }
                for &(q, id) in &attempt.enq {
                    self.visible[q].insert(id);
                }
            }
            Err(e) => {
                self.storage_error("commit", &e);
                self.give_back(&attempt);
            }
        }
        attempt.ok = ok;
        self.history.push(attempt);
        self.check_counts(
            queues,
            if ok {
                "after commit"
            } else {
                "after failed commit"
            },
        );
        ok
    }

    fn give_back(&mut self, attempt: &Attempt) {
        for &(q, id) in &attempt.deq {
            self.visible[q].insert(id);
        }
    }

    fn flush(&mut self, store: &Store, buffered: bool) {
        match store.blocking_flush() {
            Ok(()) => {
                if buffered {
                    self.durable = self.history.len();
                }
            }
            Err(e) => self.storage_error("flush", &e),
        }
    }

    /// After a reopen: the state must be the replay of a prefix of the history that holds
    /// every durable acknowledged commit and at most the first failed one.
    fn check_recovered(&mut self, found: &State, buffered: bool) {
        let first_failed = self.history.iter().position(|a| !a.ok);
        let effective: Vec<Attempt> = self
            .history
            .iter()
            .filter(|a| a.ok)
            .chain(first_failed.map(|i| &self.history[i]))
            .cloned()
            .collect();
        let n_ok = self.history.iter().filter(|a| a.ok).count();
        let durable_ok = if buffered {
            self.history[..self.durable].iter().filter(|a| a.ok).count()
        } else {
            n_ok
        };
        let longest = n_ok + usize::from(first_failed.is_some());
        let matched = (durable_ok..=longest)
            .rev()
            .find(|&p| replay(&effective[..p]) == *found);

        let attempted: BTreeSet<u64> = self
            .history
            .iter()
            .flat_map(|a| a.enq.iter().map(|&(_, id)| id))
            .collect();
        let acknowledged: BTreeSet<u64> = effective[..durable_ok]
            .iter()
            .flat_map(|a| a.enq.iter().map(|&(_, id)| id))
            .collect();
        let consumed: Vec<u64> = effective[..matched.unwrap_or(durable_ok)]
            .iter()
            .flat_map(|a| a.deq.iter().map(|&(_, id)| id))
            .collect();
        let remaining: Vec<u64> = found.iter().flatten().copied().collect();
        let verdict = TotalQueue::check(&attempted, &acknowledged, &consumed, &remaining);
        if !verdict.is_valid() {
            self.violation(format!("total-queue check after reopen: {verdict:?}"));
        }
        if matched.is_none() {
            let expected = replay(&effective[..durable_ok]);
            self.violation(format!(
                "reopened state is no prefix of the commit history ({durable_ok}..={longest} \
                 commits): found {found:?}, with every durable commit {expected:?}"
            ));
        }
    }
}

fn open_queues(store: &Store) -> Result<Vec<ReliableConcurrentQueue<Item>>, Error> {
    QUEUES
        .iter()
        .map(|name| store.blocking_queue::<Item>(name))
        .collect()
}

/// What one run of the sweep saw.
#[derive(Debug, Default)]
struct Outcome {
    fired: Option<&'static str>,
    violations: Vec<String>,
    commits: usize,
    log_keys_after: Option<Vec<u64>>,
}

/// Builds a store with history in `path` and closes it.
fn prepare_history(scenario: Scenario, path: &Path, driver: &mut Driver) {
    let store = scenario.builder(path).open().expect("open for preparation");
    let queues = open_queues(&store).expect("queues for preparation");
    prepare_open(scenario, &store, &queues, driver);
}

/// Commits the history a run starts from, without faults.
fn prepare_open(
    scenario: Scenario,
    store: &Store,
    queues: &[ReliableConcurrentQueue<Item>],
    driver: &mut Driver,
) {
    if scenario == Scenario::Compaction {
        // Ten groups of seven items for `a` and one for `b`: draining `a` leaves each group
        // pinned by one live item, which compaction must move.
        for _ in 0..10 {
            let mut tx = store.begin();
            let mut attempt = Attempt {
                ok: true,
                ..Attempt::default()
            };
            for k in 0..8 {
                let q = usize::from(k == 7);
                let id = driver.next_id;
                driver.next_id += 1;
                queues[q]
                    .enqueue(&mut tx, Item::with_len(id, 256))
                    .expect("enqueue");
                attempt.enq.push((q, id));
            }
            tx.blocking_commit().expect("commit during preparation");
            for &(q, id) in &attempt.enq {
                driver.visible[q].insert(id);
            }
            driver.history.push(attempt);
        }
    } else if scenario == Scenario::Churn {
        // 2.4 MB of items in groups under sled's blob threshold fill several log segments;
        // consuming them all leaves those segments garbage for sled to clean and free.
        for _ in 0..24 {
            let mut tx = store.begin();
            let id = driver.next_id;
            driver.next_id += 1;
            queues[0]
                .enqueue(&mut tx, Item::with_len(id, CHURN.small))
                .expect("enqueue");
            tx.blocking_commit().expect("commit during preparation");
            driver.history.push(Attempt {
                enq: vec![(0, id)],
                deq: Vec::new(),
                ok: true,
            });
        }
        loop {
            let mut tx = store.begin();
            let mut deq = Vec::new();
            while deq.len() < 4 {
                match queues[0].blocking_try_dequeue(&mut tx).expect("dequeue") {
                    Some(item) => deq.push((0, item.id)),
                    None => break,
                }
            }
            if deq.is_empty() {
                break;
            }
            tx.blocking_commit().expect("commit during preparation");
            driver.history.push(Attempt {
                enq: Vec::new(),
                deq,
                ok: true,
            });
        }
    } else {
        for _ in 0..6 {
            driver.transaction(store, queues, MIXED);
        }
    }
    store.blocking_flush().expect("flush during preparation");
    driver.durable = driver.history.len();
    if !driver.violations.is_empty() || driver.history.iter().any(|a| !a.ok) {
        panic!("preparation failed without faults: {:?}", driver.violations);
    }
}

/// Writes a garbage record after the last one of the closed store at `path`.
fn plant_bad_record(path: &Path, seed: u64) -> u64 {
    let db = common::open_raw_sled(path);
    let log = db.open_tree("log").expect("log tree");
    let next = match log.last().expect("last record") {
        Some((k, _)) => u64::from_be_bytes(k.as_ref().try_into().expect("8-byte key")) + 1,
        None => 0,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let garbage: Vec<u8> = (0..rng.gen_range(1..200)).map(|_| rng.gen()).collect();
    log.insert(next.to_be_bytes(), garbage)
        .expect("insert garbage");
    db.flush().expect("flush");
    next
}

fn log_keys(path: &Path) -> Vec<u64> {
    let db = common::open_raw_sled(path);
    let log = db.open_tree("log").expect("log tree");
    log.iter()
        .keys()
        .map(|k| u64::from_be_bytes(k.expect("key").as_ref().try_into().expect("8-byte key")))
        .collect()
}

/// One run: prepare, arm `point` to fail on hit `hit` (none for a baseline), work, disarm,
/// reopen, check.
fn run(scenario: Scenario, point: Option<&'static str>, hit: u32, seed: u64) -> Outcome {
    if scenario == Scenario::CommitConcurrent {
        return run_concurrent(point, hit, seed);
    }
    let (_guard, path) = temp_dir();
    let mut d = Driver::new(seed);
    let mut bad_record = None;
    let mut open = None;
    match scenario {
        Scenario::Create | Scenario::CommitConcurrent => {}
        Scenario::Recovery => prepare_history(scenario, &path, &mut d),
        Scenario::RecoveryBadRecord => {
            prepare_history(scenario, &path, &mut d);
            bad_record = Some(plant_bad_record(&path, seed));
        }
        Scenario::Commit | Scenario::CommitBuffered | Scenario::Compaction | Scenario::Churn => {
            let store = scenario
                .builder(&path)
                .open()
                .expect("open for preparation");
            let queues = open_queues(&store).expect("queues for preparation");
            prepare_open(scenario, &store, &queues, &mut d);
            open = Some((store, queues));
        }
    }

    if let Some(point) = point {
        sled::fail::set(point, 1 << hit);
    }
    let armed = armed_phase(scenario, &path, open, &mut d);
    sled::fail::reset();
    // The store (and every sled handle of it) is closed here.
    drop(armed);

    let store = match scenario.builder(&path).open() {
        Ok(store) => store,
        Err(e) => {
            d.violation(format!("reopen after the fault failed: {e:?}"));
            return Outcome {
                fired: d.fired,
                violations: d.violations,
                ..Outcome::default()
            };
        }
    };
    let set_aside: Vec<u64> = store.set_aside_records().iter().map(|r| r.record).collect();
    match bad_record {
        Some(seq) if set_aside != [seq] => d.violation(format!(
            "set-aside records {set_aside:?}, expected the planted record {seq}"
        )),
        None if !set_aside.is_empty() => d.violation(format!(
            "healthy log, yet records {set_aside:?} were set aside"
        )),
        _ => {}
    }
    for name in QUEUES {
        if let Err(e) = store.blocking_unfence(name) {
            d.violation(format!("unfence after reopen: {e:?}"));
        }
    }
    let queues = match open_queues(&store) {
        Ok(q) => q,
        Err(e) => {
            d.violation(format!("queues after reopen: {e:?}"));
            return Outcome {
                fired: d.fired,
                violations: d.violations,
                ..Outcome::default()
            };
        }
    };
    let mut found = State::default();
    for (i, q) in queues.iter().enumerate() {
        let items = peek_all(&store, q);
        for item in &items {
            if !item.is_intact() {
                d.violation(format!(
                    "reopened store returned a damaged item {}",
                    item.id
                ));
            }
            if !found[i].insert(item.id) {
                d.violation(format!(
                    "item {} twice in {} after reopen",
                    item.id, QUEUES[i]
                ));
            }
        }
        match q.blocking_count() {
            Ok(count) if count == items.len() as u64 => {}
            Ok(count) => d.violation(format!(
                "count of {} after reopen is {count}, {} visible",
                QUEUES[i],
                items.len()
            )),
            Err(e) => d.violation(format!("count of {} after reopen: {e:?}", QUEUES[i])),
        }
    }
    d.check_recovered(&found, scenario.buffered());
    drop((queues, store));
    let log_keys_after =
        (point.is_none() && scenario == Scenario::Compaction).then(|| log_keys(&path));
    Outcome {
        fired: d.fired,
        violations: d.violations,
        commits: d.history.len(),
        log_keys_after,
    }
}

/// The part of a run with the failpoint armed. Returns the store to close, if it opened.
fn armed_phase(
    scenario: Scenario,
    path: &Path,
    open: Option<(Store, Vec<ReliableConcurrentQueue<Item>>)>,
    d: &mut Driver,
) -> Option<Store> {
    let (store, queues) = match open {
        Some(open) => open,
        None => {
            let store = match scenario.builder(path).open() {
                Ok(store) => store,
                Err(e) => {
                    d.storage_error("open", &e);
                    return None;
                }
            };
            let mut queues = Vec::new();
            for name in QUEUES {
                let q = match store.blocking_queue::<Item>(name) {
                    Err(Error::Fenced { .. }) if scenario == Scenario::RecoveryBadRecord => {
                        match store.blocking_unfence(name) {
                            Ok(()) => store.blocking_queue::<Item>(name),
                            Err(e) => Err(e),
                        }
                    }
                    other => other,
                };
                match q {
                    Ok(q) => queues.push(q),
                    Err(e) => {
                        d.storage_error("queue", &e);
                        return Some(store);
                    }
                }
            }
            // The model of a reopened store is the replay of what was committed.
            d.visible = replay(d.history.iter().filter(|a| a.ok));
            d.check_counts(&queues, "after open");
            (store, queues)
        }
    };
    let mix = match scenario {
        Scenario::Compaction => DRAIN_A,
        Scenario::Churn => CHURN,
        _ => MIXED,
    };
    work_while_armed(scenario, &store, &queues, mix, ARMED_TRANSACTIONS, d);
    if scenario != Scenario::Churn || d.fired.is_some() {
        drop(queues);
        return Some(store);
    }
    // Still armed: close, reopen (sled recovers the churned segments) and work a little more.
    drop((queues, store));
    let store = match scenario.builder(path).open() {
        Ok(store) => store,
        Err(e) => {
            d.storage_error("open", &e);
            return None;
        }
    };
    let queues = match open_queues(&store) {
        Ok(queues) => queues,
        Err(e) => {
            d.storage_error("queue", &e);
            return Some(store);
        }
    };
    d.visible = replay(d.history.iter().filter(|a| a.ok));
    d.check_counts(&queues, "after reopen");
    work_while_armed(scenario, &store, &queues, mix, 4, d);
    drop(queues);
    Some(store)
}

/// Runs `n` transactions (two more after the first refused commit: they must fail too, and
/// roll back), then flushes.
fn work_while_armed(
    scenario: Scenario,
    store: &Store,
    queues: &[ReliableConcurrentQueue<Item>],
    mix: Mix,
    n: usize,
    d: &mut Driver,
) {
    let mut refused = 0;
    for _ in 0..n {
        if !d.transaction(store, queues, mix) {
            refused += 1;
            if refused == 3 {
                break;
            }
        }
    }
    d.flush(store, scenario.buffered());
}

/// Threads of the concurrent scenario, and transactions each runs while armed.
const WORKERS: u64 = 3;
const WORKER_TRANSACTIONS: usize = 8;

/// What one worker of the concurrent scenario did.
#[derive(Debug, Default)]
struct WorkerLog {
    attempts: Vec<Attempt>,
    violations: Vec<String>,
    fired: Option<&'static str>,
    /// The typed failures this worker saw.
    sticky: Sticky,
}

/// One worker: random transactions on the shared queues, its own ids, its own log.
fn worker(store: &Store, queues: &[ReliableConcurrentQueue<Item>], w: u64, seed: u64) -> WorkerLog {
    let mut rng = StdRng::seed_from_u64(seed ^ (w << 32));
    let mut log = WorkerLog::default();
    let mut next_id = (w + 1) << 40;
    let mut failures = 0;
    for _ in 0..WORKER_TRANSACTIONS {
        let mut tx = store.begin();
        let mut attempt = Attempt::default();
        for _ in 0..rng.gen_range(0..=3) {
            let q = rng.gen_range(0..2);
            let item = Item::new(next_id, rng.gen_ratio(1, 8));
            if let Err(e) = queues[q].enqueue(&mut tx, item) {
                log.violations.push(format!("enqueue failed: {e:?}"));
            }
            attempt.enq.push((q, next_id));
            next_id += 1;
        }
        for _ in 0..rng.gen_range(0..=3) {
            let q = rng.gen_range(0..2);
            match queues[q].blocking_try_dequeue(&mut tx) {
                Ok(Some(item)) => {
                    if !item.is_intact() {
                        log.violations
                            .push(format!("dequeued a damaged item {}", item.id));
                    }
                    attempt.deq.push((q, item.id));
                }
                Ok(None) => {}
                Err(e) => log.violations.push(format!("try_dequeue failed: {e:?}")),
            }
        }
        if attempt.enq.is_empty() && attempt.deq.is_empty() {
            continue;
        }
        match tx.blocking_commit() {
            Ok(()) => attempt.ok = true,
            Err(e) if is_typed(&e) => {
                log.fired.get_or_insert("commit");
                failures += 1;
                if let Err(v) = log.sticky.check(&e) {
                    log.violations.push(format!("commit: {v}"));
                }
            }
            Err(e) => log
                .violations
                .push(format!("commit: untyped failure {e:?}")),
        }
        log.attempts.push(attempt);
        if failures == 2 {
            break;
        }
    }
    log
}

/// The concurrent scenario: commit order across threads is unknown, so instead of replaying
/// a prefix it checks the total queue, with the dequeues of failed commits counted as
/// consumed only when their items are gone, and that each failed commit is all or nothing
/// as far as its enqueues show.
fn run_concurrent(point: Option<&'static str>, hit: u32, seed: u64) -> Outcome {
    let (_guard, path) = temp_dir();
    let mut violations = Vec::new();
    let store = Store::open(&path).expect("open for preparation");
    let queues = open_queues(&store).expect("queues for preparation");
    let mut prep = Attempt {
        ok: true,
        ..Attempt::default()
    };
    let mut tx = store.begin();
    for id in 0..30 {
        let q = (id % 2) as usize;
        queues[q]
            .enqueue(&mut tx, Item::new(id, false))
            .expect("enqueue");
        prep.enq.push((q, id));
    }
    tx.blocking_commit().expect("commit during preparation");

    if let Some(point) = point {
        sled::fail::set(point, 1 << hit);
    }
    let logs: Vec<WorkerLog> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (store, queues) = (&store, &queues);
                std::thread::Builder::new()
                    .name("fault-workload".into())
                    .spawn_scoped(scope, move || worker(store, queues, w, seed))
                    .expect("spawn a worker")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(log) => log,
                Err(_) => WorkerLog {
                    violations: vec!["a worker panicked".into()],
                    fired: Some("panic"),
                    ..WorkerLog::default()
                },
            })
            .collect()
    });
    let mut fired = logs.iter().find_map(|l| l.fired);
    // Every worker heard of the one failure that stopped the store, if any did.
    let mut sticky = Sticky::default();
    for source in logs.iter().filter_map(|l| l.sticky.stopped_by.as_ref()) {
        match &sticky.stopped_by {
            None => sticky.stopped_by = Some(source.clone()),
            Some(first) if !Arc::ptr_eq(first, source) => violations.push(format!(
                "workers were told of different failures: {first:?} and {source:?}"
            )),
            Some(_) => {}
        }
    }
    if let Err(e) = store.blocking_flush() {
        if is_typed(&e) {
            fired.get_or_insert("flush");
            if let Err(v) = sticky.check(&e) {
                violations.push(format!("flush: {v}"));
            }
        } else {
            violations.push(format!("flush: untyped failure {e:?}"));
        }
    }
    sled::fail::reset();
    drop((queues, store));

    let store = match Store::open(&path) {
        Ok(store) => store,
        Err(e) => {
            violations.push(format!("reopen after the fault failed: {e:?}"));
            return Outcome {
                fired,
                violations,
                ..Outcome::default()
            };
        }
    };
    let queues = open_queues(&store).expect("queues after reopen");
    let mut remaining = BTreeSet::new();
    for q in &queues {
        for item in peek_all(&store, q) {
            if !item.is_intact() || !remaining.insert(item.id) {
                violations.push(format!("item {} damaged or twice after reopen", item.id));
            }
        }
    }
    let attempts: Vec<&Attempt> = std::iter::once(&prep)
        .chain(logs.iter().flat_map(|l| &l.attempts))
        .collect();
    let enq_ids = |a: &Attempt| a.enq.iter().map(|&(_, id)| id).collect::<Vec<_>>();
    let attempted: BTreeSet<u64> = attempts.iter().flat_map(|a| enq_ids(a)).collect();
    let acknowledged: BTreeSet<u64> = attempts
        .iter()
        .filter(|a| a.ok)
        .flat_map(|a| enq_ids(a))
        .collect();
    let mut consumed: Vec<u64> = attempts
        .iter()
        .filter(|a| a.ok)
        .flat_map(|a| a.deq.iter().map(|&(_, id)| id))
        .collect();
    let acked_consumed: BTreeSet<u64> = consumed.iter().copied().collect();
    let mut maybe_consumed = BTreeSet::new();
    for a in attempts.iter().filter(|a| !a.ok) {
        let present = a
            .enq
            .iter()
            .filter(|(_, id)| remaining.contains(id))
            .count();
        if present != 0 && present != a.enq.len() {
            violations.push(format!("a failed commit was applied in part: {a:?}"));
        }
        for &(_, id) in &a.deq {
            if !remaining.contains(&id) && !acked_consumed.contains(&id) {
                maybe_consumed.insert(id);
            }
        }
    }
    consumed.extend(maybe_consumed);
    let remaining: Vec<u64> = remaining.into_iter().collect();
    let verdict = TotalQueue::check(&attempted, &acknowledged, &consumed, &remaining);
    if !verdict.is_valid() {
        violations.push(format!("total-queue check after reopen: {verdict:?}"));
    }
    let commits = attempts.len();
    violations.extend(logs.into_iter().flat_map(|l| l.violations));
    Outcome {
        fired,
        violations,
        commits,
        log_keys_after: None,
    }
}

/// Runs `run` on a thread of its own, so a panic or a hang is reported, not fatal.
fn isolated(scenario: Scenario, point: Option<&'static str>, hit: u32, seed: u64) -> Outcome {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("fault-workload".into())
        .spawn(move || {
            let outcome = run(scenario, point, hit, seed);
            let _ = tx.send(());
            outcome
        })
        .expect("spawn the workload thread");
    match rx.recv_timeout(RUN_TIMEOUT) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(outcome) => outcome,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Outcome {
                    fired: Some("panic"),
                    violations: vec![format!("the workload panicked: {msg}")],
                    ..Outcome::default()
                }
            }
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{scenario:?} with failpoint {point:?} on hit {}: no outcome after {RUN_TIMEOUT:?}",
            hit + 1
        ),
    }
}

#[test]
fn failpoint_sweep() {
    let _serial = serial();
    count_panics();
    let panics_before = PANICS.load(Ordering::SeqCst);
    let started = Instant::now();
    let mut violations = Vec::new();
    // failpoint -> scenario -> faults that fired
    let mut fired: BTreeMap<&str, BTreeMap<String, u32>> = BTreeMap::new();
    let mut runs = 0;
    let mut faults = 0;
    let mut seed = 0xFA17;

    for scenario in SCENARIOS {
        seed += 1;
        let baseline = isolated(scenario, None, 0, seed);
        runs += 1;
        if let Some(at) = baseline.fired {
            violations.push(format!(
                "{scenario:?} baseline failed at {at} without a fault"
            ));
        }
        violations.extend(
            baseline
                .violations
                .iter()
                .map(|v| format!("{scenario:?} baseline: {v}")),
        );
        if let Some(keys) = &baseline.log_keys_after {
            // Each of the first ten groups keeps a live item of `b` (never dequeued here), so
            // a missing one was rewritten.
            let pinned_left = keys.iter().filter(|&&k| k < 10).count();
            println!(
                "compaction baseline: {} of 10 pinned groups rewritten, {} records left after {} commits",
                10 - pinned_left,
                keys.len(),
                baseline.commits
            );
            if pinned_left == 10 {
                violations.push(format!(
                    "compaction baseline did not rewrite the pinned groups: log keys {keys:?} \
                     after {} commits",
                    baseline.commits
                ));
            }
        }
        for &point in FAILPOINTS {
            for hit in 0..MAX_HITS {
                seed += 1;
                let outcome = isolated(scenario, Some(point), hit, seed);
                runs += 1;
                violations.extend(
                    outcome.violations.iter().map(|v| {
                        format!("{scenario:?}, {point:?} failing on hit {}: {v}", hit + 1)
                    }),
                );
                let Some(at) = outcome.fired else {
                    // The point was reached fewer than hit + 1 times: later hits won't be either.
                    break;
                };
                faults += 1;
                *fired
                    .entry(point)
                    .or_default()
                    .entry(format!("{scenario:?}@{at}"))
                    .or_default() += 1;
            }
        }
    }

    let panics = PANICS.load(Ordering::SeqCst) - panics_before;
    println!(
        "failpoint sweep: {faults} faults injected in {runs} runs, {} violations, {panics} panics, {:.1?}",
        violations.len(),
        started.elapsed()
    );
    for point in FAILPOINTS {
        match fired.get(point) {
            Some(by) => println!("  {point:28} {by:?}"),
            None => println!("  {point:28} never reached"),
        }
    }
    assert!(
        faults > 0,
        "no fault was injected: the sweep tested nothing"
    );
    assert_eq!(panics, 0, "panics during the sweep (see the output above)");
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// A snapshot write of sled cut short (by a crash or an I/O error while the store opens)
/// must not leave a directory that never opens again; the failpoint sweep finds this through
/// "snap write", here it is reproduced by hand, as a crash between two writes leaves it.
#[test]
fn a_snapshot_cut_short_does_not_make_the_store_unopenable() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        for i in 0..100 {
            q.enqueue(&mut tx, i).unwrap();
        }
        tx.blocking_commit().unwrap();
    }
    // sled writes a snapshot when it opens a non-empty log.
    drop(Store::open(&path).unwrap());
    let snapshot = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("snap.") && !name.ends_with(".generating")
        })
        .expect("sled wrote a snapshot");
    let bytes = std::fs::read(&snapshot).unwrap();
    let mut torn = snapshot.clone().into_os_string();
    torn.push(".generating");
    std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();

    let store = Store::open(&path).expect("open with a torn snapshot file");
    let q = store.blocking_queue::<u64>("q").unwrap();
    assert_eq!(common::drain(&store, &q), (0..100).collect::<Vec<_>>());
}

/// A tmpfs mounted for the life of the guard.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        let output = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if output.status.success() {
            Ok(Tmpfs(at.to_path_buf()))
        } else {
            Err(format!(
                "mount -t tmpfs failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    fn resize(at: &Path, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(status.success(), "remounting the tmpfs failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn is_disk_full(e: &Error) -> bool {
    // sled copies I/O errors into new ones of the same kind (the OS code is lost).
    let Error::Storage { source, .. } = e else {
        return false;
    };
    match source.downcast_ref::<sled::Error>() {
        Some(sled::Error::Io(io)) => io.kind() == std::io::ErrorKind::StorageFull,
        _ => false,
    }
}

/// How a disk-full run sizes its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Records {
    /// Commit groups of 32 KiB: written inline in sled's log segments.
    Inline,
    /// Commit groups of 200 KiB: written by sled as separate blob files.
    Blob,
}

/// Longest the filling and closing of a full store may take.
const DISK_FULL_TIMEOUT: Duration = Duration::from_secs(60);

/// What a disk-full run committed before the disk filled up.
#[derive(Debug, Default)]
struct Filled {
    attempted: BTreeSet<u64>,
    acknowledged: BTreeSet<u64>,
}

/// Fills a store in `path` until a commit fails, checks the failure and its rollback, and
/// closes the store. Every step must return: a run that does not is reported by its caller.
fn fill_the_disk(path: &Path, records: Records) -> Filled {
    let store = Store::open(path).expect("open on the tmpfs");
    let q = store.blocking_queue::<Item>("a").expect("queue");
    let mut filled = Filled::default();
    let mut next_id = 0;
    let mut failure = None;
    // 4 MiB cannot take more than ~130 commits of 32 KiB; 1000 is a generous bound.
    for _ in 0..1000 {
        let mut tx = store.begin();
        let lens = match records {
            Records::Inline => vec![4096; 8],
            Records::Blob => vec![BIG],
        };
        let mut ids = Vec::new();
        for len in lens {
            let id = next_id;
            next_id += 1;
            q.enqueue(&mut tx, Item::with_len(id, len))
                .expect("enqueue");
            filled.attempted.insert(id);
            ids.push(id);
        }
        match tx.blocking_commit() {
            Ok(()) => filled.acknowledged.extend(ids),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.expect("a full disk never failed a commit");
    assert!(
        matches!(failure, Error::Storage { .. }) && is_disk_full(&failure),
        "expected a storage error caused by ENOSPC, got {failure:?}"
    );
    let Error::Storage {
        source: stopped_by, ..
    } = &failure
    else {
        unreachable!("checked above");
    };
    // Every later call that needs the log hears of that failure, as `PreviousFailure`.
    let is_sticky = |e: &Error| match e {
        Error::PreviousFailure { source } => Arc::ptr_eq(source, stopped_by),
        _ => false,
    };
    let count = q.blocking_count().expect("count");
    assert_eq!(count, filled.acknowledged.len() as u64);

    // A transaction holding items when its commit fails gives them back.
    let mut tx = store.begin();
    for _ in 0..3 {
        q.blocking_try_dequeue(&mut tx)
            .expect("dequeue")
            .expect("an item");
    }
    assert_eq!(q.blocking_count().expect("count"), count - 3);
    let e = tx
        .blocking_commit()
        .expect_err("the store is full and stopped");
    assert!(
        is_sticky(&e),
        "expected PreviousFailure with the ENOSPC source, got {e:?}"
    );
    assert_eq!(
        q.blocking_count().expect("count"),
        count,
        "failed commit did not give its items back"
    );
    // Creating a queue writes to the catalog: it must fail, not wait for a disk that is full.
    let e = store
        .blocking_queue::<Item>("created-after-the-failure")
        .expect_err("the store is full and stopped");
    assert!(
        is_sticky(&e),
        "expected PreviousFailure with the ENOSPC source, got {e:?}"
    );
    // A queue whose creation failed is not in the catalog: asking again fails again.
    assert!(
        !store
            .queue_names()
            .iter()
            .any(|n| n == "created-after-the-failure"),
        "a queue whose creation failed is listed"
    );
    let again = store
        .blocking_queue::<Item>("created-after-the-failure")
        .expect_err("still stopped");
    assert!(is_sticky(&again), "expected PreviousFailure, got {again:?}");
    drop(q);
    // Closing must return, even when sled cannot write what it buffered.
    drop(store);
    filled
}

/// Reopens the store in `path` after a disk full, checks that every acknowledged item is
/// there and nothing else, and that it commits again. Returns the items accounted for.
fn verify_after_disk_full(path: &Path, filled: &Filled) -> usize {
    let store = Store::open(path).expect("reopen after space was freed");
    let q = store.blocking_queue::<Item>("a").expect("queue");
    let remaining: Vec<u64> = peek_all(&store, &q)
        .into_iter()
        .map(|item| {
            assert!(item.is_intact(), "damaged item {} after disk full", item.id);
            item.id
        })
        .collect();
    let verdict = TotalQueue::check(&filled.attempted, &filled.acknowledged, &[], &remaining);
    assert!(verdict.is_valid(), "after disk full: {verdict:?}");
    let mut tx = store.begin();
    q.enqueue(&mut tx, Item::new(u64::MAX, false))
        .expect("enqueue");
    tx.blocking_commit().expect("commit after space was freed");
    verdict.ok
}

const CHILD_PATH: &str = "RELIABLE_QUEUE_DISK_FULL_PATH";

fn ids_to_text(ids: &BTreeSet<u64>) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn ids_from_text(text: &str) -> BTreeSet<u64> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("an id"))
        .collect()
}

/// Fills the disk with blob-sized records in a child process and returns what it committed.
///
/// After a blob write fails for lack of space, sled 0.34 cannot flush any more: the store's
/// close gives up on it after a few seconds and sled keeps the directory locked until the
/// process exits. The reopen that must find everything is then a restart, as in production.
fn fill_the_disk_in_a_child(path: &Path) -> Filled {
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "fill_the_disk_in_a_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_PATH, path)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |name: &str| {
        let line = stdout
            .lines()
            // The harness prints the test's name on the same line as the first of them.
            .find_map(|l| l.find(name).map(|at| &l[at + name.len()..]))
            .unwrap_or_else(|| panic!("no {name} line from the child: {stdout}"));
        ids_from_text(line)
    };
    Filled {
        attempted: field("attempted="),
        acknowledged: field("acknowledged="),
    }
}

/// The first half of the blob disk-full test, run by it in a child process (see
/// `fill_the_disk_in_a_child`). Run directly, without the variable the parent sets, it has
/// nothing to do and returns.
#[test]
fn fill_the_disk_in_a_child_process() {
    let Some(path) = std::env::var_os(CHILD_PATH) else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let filled = fill_the_disk(Path::new(&path), Records::Blob);
        let _ = tx.send(filled);
    });
    // A hung child must not outlive the test: it ends itself.
    let filled = match rx.recv_timeout(DISK_FULL_TIMEOUT / 2) {
        Ok(filled) => filled,
        Err(mpsc::RecvTimeoutError::Disconnected) => std::process::exit(2),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            println!("the store hung after the disk filled up");
            std::process::exit(3);
        }
    };
    println!("attempted={}", ids_to_text(&filled.attempted));
    println!("acknowledged={}", ids_to_text(&filled.acknowledged));
}

/// Disk full for real: a store on a 4 MiB tmpfs is filled until a commit fails with ENOSPC,
/// then closed, the filesystem grown (space freed) and the store reopened: every acknowledged
/// item is there, nothing else, and commits work again. Once with records sled writes inline
/// (all in this process), once with records it writes as blob files (filled in a child).
///
/// Needs permission to mount a tmpfs (root, or CAP_SYS_ADMIN). Without it the test prints why
/// it did not run; set `RELIABLE_QUEUE_REQUIRE_ENOSPC=1` to make that a failure instead.
#[test]
fn disk_full_is_a_storage_error_and_loses_nothing() {
    let _serial = serial();
    for records in [Records::Inline, Records::Blob] {
        let base = tempfile::tempdir().expect("temporary directory");
        let mnt = base.path().join("fs");
        std::fs::create_dir(&mnt).expect("mount point");
        let fs = match Tmpfs::mount(&mnt, "4m") {
            Ok(fs) => fs,
            Err(reason) => {
                assert!(
                    std::env::var_os("RELIABLE_QUEUE_REQUIRE_ENOSPC").is_none(),
                    "the disk-full test is required but cannot run: {reason}"
                );
                println!("disk-full test NOT RUN: {reason}");
                return;
            }
        };
        let path = mnt.join("store");
        let started = Instant::now();
        let (tx, rx) = mpsc::channel();
        let worker = {
            let path = path.clone();
            std::thread::Builder::new()
                .name("disk-full".into())
                .spawn(move || {
                    let filled = match records {
                        Records::Inline => fill_the_disk(&path, records),
                        Records::Blob => fill_the_disk_in_a_child(&path),
                    };
                    let _ = tx.send(());
                    filled
                })
                .expect("spawn")
        };
        let filled = match rx.recv_timeout(DISK_FULL_TIMEOUT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
                Ok(filled) => filled,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The worker is stuck on the tmpfs; dropping `fs` unmounts it lazily.
                drop(fs);
                panic!(
                    "{records:?} records: no outcome after {DISK_FULL_TIMEOUT:?}: \
                     the store hung after the disk filled up"
                );
            }
        };
        Tmpfs::resize(&mnt, "64m");
        let ok = verify_after_disk_full(&path, &filled);
        assert_eq!(ok, filled.acknowledged.len());
        println!(
            "disk-full test, {records:?} records: {ok} items acknowledged before ENOSPC, all \
             present after reopen ({:.1?})",
            started.elapsed()
        );
        drop(fs);
    }
}
