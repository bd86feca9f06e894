//! Crash safety under `kill -9` (S3, S7, S8, S9), for `Durability::Sync` and `Buffered`, of
//! plain transactions and of the processing layer (leases, delayed items, retries, dead
//! letters).
//!
//! Each test is a parent that runs many cycles over one store directory. In a cycle it starts
//! this test binary again as a child (the same test, selected with `--exact`, told by
//! `RQ_CRASH_ROLE` to play the child). The child opens the store and runs producers,
//! consumers, movers and lease workers (which also tend the dead letters) on it (`crash/child.rs`),
//! reporting on stdout every transaction just before it calls `commit` (intent) and just
//! after `commit` returned `Ok` (acknowledgement); a lease call just before it starts and,
//! with the items and attempts it got, just after it returned (`crash/report.rs`). The parent
//! reads the reports as they come and kills the child with SIGKILL at a random moment: a
//! random delay after the store opened, or, in about a third of the cycles, a random delay
//! after the child began to open it, scaled to how long opening takes, so that the kill lands
//! in recovery. Then, in most cycles, the parent reopens the store, waits for its delayed
//! items to fall due, looks at everything in it (every item with its attempts, every dead
//! letter, the stats), and checks it against what it knew before and what the children
//! reported (`crash/check.rs` states the exact invariants); in the other cycles the next child
//! recovers a store that was just killed, possibly in the middle of its own recovery. After
//! the last cycle the parent drains the store with committed transactions and purges its dead
//! letters, reopens it and expects it empty.
//!
//! `RQ_CRASH_CYCLES` sets the number of cycles (default 30), `RQ_CRASH_SEED` the seed of the
//! parent's choices. Run with `--nocapture` to see the figures.

#[path = "crash/check.rs"]
mod check;
#[path = "crash/child.rs"]
mod child;
#[path = "crash/report.rs"]
mod report;
#[path = "crash/twosat.rs"]
mod twosat;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{
    Durability, ItemState, ManualClock, QueueStats, ReliableConcurrentQueue, Replay, Store,
};

use check::{Figures, Found, FoundQueue, Model, Violation};
use child::Item;
use report::{CycleLog, Place, Queue};

/// Set in the child's environment; its presence selects the child role.
const ROLE_VAR: &str = "RQ_CRASH_ROLE";
const DIR_VAR: &str = "RQ_CRASH_DIR";
const FIRST_ID_VAR: &str = "RQ_CRASH_FIRST_ID";
const CHILD_SEED_VAR: &str = "RQ_CRASH_CHILD_SEED";

const CYCLES_VAR: &str = "RQ_CRASH_CYCLES";
const SEED_VAR: &str = "RQ_CRASH_SEED";
const DEFAULT_CYCLES: usize = 30;

/// Flush interval of the Buffered store.
const FLUSH_INTERVAL: Duration = Duration::from_millis(25);
/// Share of the cycles whose kill aims at the open.
const KILL_IN_OPEN: f64 = 0.3;
/// Share of the cycles after which the parent reopens and checks the store.
const LOOK: f64 = 0.7;
/// Range of the kill delay after the store opened, in milliseconds.
const KILL_AFTER_OPEN_MS: std::ops::Range<u64> = 5..250;
/// How long the parent waits for a child to open the store before giving up on it.
const PATIENCE: Duration = Duration::from_secs(60);

/// Opens the store as the child and the parent both do.
fn open_store(path: &Path, durability: Durability) -> reliable_queue::Result<Store> {
    Store::builder()
        .path(path)
        .durability(durability)
        .flush_interval(FLUSH_INTERVAL)
        .open()
}

#[test]
fn sync_store_keeps_every_acknowledged_commit_across_kill_9() {
    crash_test(
        "crash::sync_store_keeps_every_acknowledged_commit_across_kill_9",
        Durability::Sync,
    );
}

#[test]
fn buffered_store_loses_only_whole_recent_commits_across_kill_9() {
    crash_test(
        "crash::buffered_store_loses_only_whole_recent_commits_across_kill_9",
        Durability::Buffered,
    );
}

/// Closing a store releases its directory at once: opening it again right away, in this
/// process or in a child, never finds it locked. sled's background threads hold its lock file
/// for a moment after the database is dropped (longest when a recovery left them work), and
/// `Store::open` waits that moment out.
#[test]
fn a_recovered_store_reopens_at_once_after_close() {
    let test_name = "crash::a_recovered_store_reopens_at_once_after_close";
    if run_child_if_asked(Durability::Sync) {
        return;
    }
    let mut parent = Parent {
        test_name,
        durability: Durability::Sync,
        rng: StdRng::seed_from_u64(rand::random()),
        open_time: Duration::from_millis(5),
    };
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("store");
    let mut failures = Vec::new();
    for cycle in 0..10 {
        let log = parent.cycle(&path, cycle);
        failures.extend(log.errors.iter().map(|e| format!("cycle {cycle}: {e}")));
        for _ in 0..3 {
            let reopened = open_store(&path, Durability::Sync)
                .and_then(|store| store.blocking_queue::<u64>("a").map(drop));
            if let Err(e) = reopened {
                failures.push(format!("cycle {cycle}: reopening failed: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// An empty store directory, owner-only as the store makes it (it refuses a directory open
/// to others), in a temporary directory that lives as long as the guard.
fn empty_store_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("store");
    std::fs::create_dir_all(&path).expect("create the store directory");
    #[cfg(unix)]
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("make the store directory owner-only");
    (dir, path)
}

/// A kill during the very first open of a directory, between sled's two writes of its
/// settings file (the text, then its checksum), leaves a directory that opens. The crash cycles
/// below find this now and then; here it is made on purpose.
#[test]
fn a_store_killed_in_its_first_open_opens() {
    let (_dir, path) = empty_store_dir();
    // What sled 0.34.7 had written when the kill came: its settings, without their checksum.
    let settings = "segment_size: 524288\nuse_compression: false\nversion: 0.34\n";
    std::fs::write(path.join("conf"), settings).expect("write the settings");
    for round in 0..2 {
        let store = open_store(&path, Durability::Sync).expect("open after the killed open");
        let a = store.blocking_queue::<u64>("a").expect("open queue a");
        assert_eq!(
            a.blocking_count().expect("count"),
            round,
            "the item committed before the reopen"
        );
        let mut tx = store.begin();
        a.enqueue(&mut tx, round).expect("enqueue");
        tx.blocking_commit().expect("commit");
    }
}

/// A power cut during the very first open can leave sled's settings file cut anywhere (sled
/// never syncs it; the store syncs it once sled has opened), with nothing stored yet: such a
/// directory opens too, at every cut point of the file with its checksum.
#[test]
fn a_first_open_cut_by_a_power_loss_opens() {
    let settings = "segment_size: 524288\nuse_compression: false\nversion: 0.34\n";
    let mut full = settings.as_bytes().to_vec();
    full.extend_from_slice(&crc32fast::hash(settings.as_bytes()).to_le_bytes());
    for cut in 9..full.len() {
        let (_dir, path) = empty_store_dir();
        std::fs::write(path.join("conf"), &full[..cut]).expect("write the settings");
        std::fs::write(path.join("db"), b"").expect("an empty log");
        let store = open_store(&path, Durability::Sync)
            .unwrap_or_else(|e| panic!("cut at {cut} of {}: {e}", full.len()));
        let a = store.blocking_queue::<u64>("a").expect("open queue a");
        let mut tx = store.begin();
        a.enqueue(&mut tx, 1).expect("enqueue");
        tx.blocking_commit().expect("commit");
        store.blocking_close().expect("close");
        let store = open_store(&path, Durability::Sync).expect("reopen");
        let a = store.blocking_queue::<u64>("a").expect("open queue a");
        assert_eq!(a.blocking_count().expect("count"), 1, "cut at {cut}");
    }
}

/// Runs the child's workload if this process is a child; returns whether it was.
fn run_child_if_asked(durability: Durability) -> bool {
    if std::env::var_os(ROLE_VAR).is_none() {
        return false;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let config = child::ChildConfig {
        path: PathBuf::from(var(DIR_VAR)),
        first_id: var(FIRST_ID_VAR).parse().expect("the child's first id"),
        seed: var(CHILD_SEED_VAR).parse().expect("the child's seed"),
    };
    child::run(durability, config);
    true
}

fn crash_test(test_name: &str, durability: Durability) {
    if run_child_if_asked(durability) {
        return;
    }
    let cycles = match std::env::var(CYCLES_VAR) {
        Ok(n) => n.parse().expect("RQ_CRASH_CYCLES must be a number"),
        Err(_) => DEFAULT_CYCLES,
    };
    let seed = match std::env::var(SEED_VAR) {
        Ok(s) => s.parse().expect("RQ_CRASH_SEED must be a number"),
        Err(_) => rand::random(),
    };
    Parent {
        test_name,
        durability,
        rng: StdRng::seed_from_u64(seed),
        open_time: Duration::from_millis(5),
    }
    .run(cycles, seed);
}

/// Kills the child when dropped, so a failing parent leaves no process behind.
struct Killer(Child);

impl Killer {
    fn kill(mut self) -> ExitStatus {
        // An error here means the child already exited; `wait` tells how.
        let _ = self.0.kill();
        self.0.wait().expect("wait for the child")
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(unix)]
fn killed_by_sigkill(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}

#[cfg(not(unix))]
fn killed_by_sigkill(status: ExitStatus) -> bool {
    !status.success()
}

/// Forwards the child's report lines, with the time each was read, until its stdout closes.
fn read_reports(stdout: ChildStdout, sender: Sender<(Instant, String)>) {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let at = Instant::now();
        if !line.ends_with('\n') {
            return; // cut short by the kill
        }
        if let Some(start) = line.find("RQ|") {
            if sender
                .send((at, line[start..].trim_end().to_owned()))
                .is_err()
            {
                return;
            }
        }
    }
}

/// What a run covered.
#[derive(Debug, Default)]
struct Totals {
    cycles: usize,
    kills_in_open: usize,
    looks: usize,
    /// Checks that found records in sled's blob files.
    looks_with_blobs: usize,
    figures: Figures,
    violations: Vec<Violation>,
}

struct Parent<'a> {
    test_name: &'a str,
    durability: Durability,
    rng: StdRng,
    /// Running estimate of how long a child takes to open the store.
    open_time: Duration,
}

impl Parent<'_> {
    fn run(mut self, cycles: usize, seed: u64) {
        let started = Instant::now();
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let path = dir.path().join("store");
        let mut model = Model::default();
        let mut pending: Vec<CycleLog> = Vec::new();
        let mut totals = Totals::default();
        for cycle in 0..cycles {
            let log = self.cycle(&path, cycle);
            if let (Some(opening), Some(opened)) = (log.opening, log.opened) {
                self.open_time = (self.open_time * 3 + (opened - opening)) / 4;
            }
            totals.cycles += 1;
            totals.kills_in_open += usize::from(log.killed_during_open());
            pending.push(log);
            if cycle + 1 < cycles && !self.rng.gen_bool(LOOK) {
                continue;
            }
            totals.looks += 1;
            match inspect(&path, self.durability) {
                Ok(found) => {
                    totals.looks_with_blobs += usize::from(found.blob_files > 0);
                    let (violations, figures) = model.check(self.durability, &pending, &found);
                    totals.violations.extend(violations);
                    totals.figures.add(&figures);
                }
                Err(e) => {
                    let cycles: Vec<String> = pending.iter().map(CycleLog::summary).collect();
                    totals.violations.push(Violation {
                        kind: "reopen",
                        detail: format!(
                            "after cycle {cycle}: {e}; since the last check: {cycles:#?}"
                        ),
                    });
                    break;
                }
            }
            pending.clear();
        }
        if totals.violations.is_empty() {
            totals
                .violations
                .extend(drain_and_reopen(&path, self.durability, model.items()));
        }
        if !totals.violations.is_empty() {
            let kept = dir.keep();
            eprintln!("the store is kept for inspection in {}", kept.display());
        }
        self.summarize(&totals, seed, started.elapsed(), model.present());
    }

    /// Runs one child and kills it; returns what it reported.
    fn cycle(&mut self, path: &Path, cycle: usize) -> CycleLog {
        let kill_in_open = self.rng.gen_bool(KILL_IN_OPEN);
        let first_id = (cycle as u64 + 1) << 32;
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Killer(
            Command::new(exe)
                .args([self.test_name, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE_VAR, "child")
                .env(DIR_VAR, path)
                .env(FIRST_ID_VAR, first_id.to_string())
                .env(CHILD_SEED_VAR, self.rng.gen::<u64>().to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the child"),
        );
        let stdout = child.0.stdout.take().expect("the child's stdout");
        let (sender, reports) = mpsc::channel();
        let reader = std::thread::spawn(move || read_reports(stdout, sender));

        let mut lines = Vec::new();
        let mut errors = Vec::new();
        let give_up = Instant::now() + PATIENCE;
        let kill_at = loop {
            match reports.recv_timeout(give_up.saturating_duration_since(Instant::now())) {
                Ok((at, line)) => {
                    let kill_at = match line.as_str() {
                        "RQ|o" if kill_in_open => {
                            let max = self.open_time.as_micros() as u64;
                            Some(at + Duration::from_micros(self.rng.gen_range(0..=max)))
                        }
                        "RQ|O" => {
                            Some(at + Duration::from_millis(self.rng.gen_range(KILL_AFTER_OPEN_MS)))
                        }
                        l if l.starts_with("RQ|e|") => Some(at),
                        _ => None,
                    };
                    lines.push((at, line));
                    if let Some(kill_at) = kill_at {
                        break kill_at;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    errors.push(format!("the child did not open the store in {PATIENCE:?}"));
                    break Instant::now();
                }
                Err(RecvTimeoutError::Disconnected) => break Instant::now(),
            }
        };
        // The random delay before the kill is the test's point; the reports keep arriving.
        while let Some(left) = kill_at.checked_duration_since(Instant::now()) {
            match reports.recv_timeout(left) {
                Ok(report) => lines.push(report),
                Err(_) => break,
            }
        }
        let killed_at = Instant::now();
        let status = child.kill();
        reader.join().expect("the report reader panicked");
        lines.extend(reports.try_iter());
        let mut log = CycleLog::parse(cycle, &lines, killed_at);
        if !killed_by_sigkill(status) {
            errors.push(format!("the child ended on its own: {status}"));
        }
        log.errors.extend(errors);
        log
    }

    fn summarize(&self, totals: &Totals, seed: u64, elapsed: Duration, backlog: usize) {
        let f = &totals.figures;
        println!(
            "crash test, {:?}: {} cycles in {:.1} s (seed {seed}), {} kills during open \
             (opening takes about {:.1} ms), {} checks ({} with blob records), {} acknowledged operations checked ({} acknowledged transactions, \
             {} of unknown outcome), backlog at the end {backlog}, {} violations",
            self.durability,
            totals.cycles,
            elapsed.as_secs_f64(),
            totals.kills_in_open,
            self.open_time.as_secs_f64() * 1e3,
            totals.looks,
            totals.looks_with_blobs,
            f.acked_ops,
            f.acked_txs,
            f.unknown_txs,
            totals.violations.len(),
        );
        if self.durability == Durability::Buffered {
            println!(
                "crash test, Buffered: {} acknowledged transactions shown lost, the oldest \
                 acknowledged {:.1} ms before its kill (flush interval {} ms)",
                f.lost_acked_txs,
                f.max_lost_age.as_secs_f64() * 1e3,
                FLUSH_INTERVAL.as_millis(),
            );
        }
        println!(
            "crash test, {:?}, processing layer: acknowledged {} leases, {} acks, {} fails \
             retried, {} fails to the dead letters, {} releases with a delay, {} replays, {} \
             purges, {} delayed enqueues; the checks found {} dead letters and {} items with \
             attempts (at most {})",
            self.durability,
            f.leases,
            f.acks,
            f.retries,
            f.buries,
            f.releases,
            f.replays,
            f.purges,
            f.delayed,
            f.dead_found,
            f.tried_found,
            f.max_attempts,
        );
        let mut kinds: Vec<(&str, usize)> = Vec::new();
        for v in &totals.violations {
            match kinds.iter_mut().find(|(k, _)| *k == v.kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((v.kind, 1)),
            }
        }
        if !kinds.is_empty() {
            eprintln!("violations by kind: {kinds:?}");
        }
        for v in totals.violations.iter().take(40) {
            eprintln!("violation ({}): {}", v.kind, v.detail);
        }
        assert!(
            totals.violations.is_empty(),
            "{} violations (seed {seed}; RQ_CRASH_SEED={seed} repeats the parent's choices)",
            totals.violations.len()
        );
    }
}

/// How far the parent moves the clock of a store it reopened: past every due time the
/// workload sets (delays and backoffs of a few milliseconds).
const PAST_EVERY_DUE: Duration = Duration::from_secs(3600);

/// Reopens the store for the parent on a clock of its own, moved past every due time: the
/// delayed items of the child are then in their queues, with no waiting.
fn open_all_due(path: &Path, durability: Durability) -> reliable_queue::Result<Store> {
    let clock = ManualClock::new(SystemTime::now())?;
    let store = Store::builder()
        .path(path)
        .durability(durability)
        .flush_interval(FLUSH_INTERVAL)
        .clock(clock.clone())
        .open()?;
    clock.advance(PAST_EVERY_DUE);
    Ok(store)
}

/// The queues of the workload, opened on `store`.
fn open_queues(
    store: &Store,
) -> reliable_queue::Result<Vec<(Queue, ReliableConcurrentQueue<Item>)>> {
    Queue::ALL
        .into_iter()
        .map(|queue| Ok((queue, store.blocking_queue::<Item>(queue.name())?)))
        .collect()
}

/// Reopens the store and looks at everything in it, once the delayed items fell due: the
/// stats of each queue, every item with its attempts (browsing), every dead letter; then one
/// transaction dequeues every item of every queue and aborts, so the store is left as it was.
fn inspect(path: &Path, durability: Durability) -> Result<Found, String> {
    let text = |e: reliable_queue::Error| e.to_string();
    let store = open_all_due(path, durability).map_err(|e| format!("reopening failed: {e:?}"))?;
    let queues = open_queues(&store).map_err(text)?;
    let mut found = Found {
        set_aside: store.set_aside_records().len(),
        ..Found::default()
    };
    for (queue, q) in &queues {
        let stats = q.blocking_stats().map_err(text)?;
        let mut fq = FoundQueue {
            count: q.blocking_count().map_err(text)?,
            leased: stats.leased,
            delayed: stats.delayed,
            dead_count: stats.dead,
            ..FoundQueue::default()
        };
        let mut after = None;
        loop {
            let page = q.blocking_browse(after, 1000).map_err(text)?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for b in page {
                if !child::intact(&b.item) {
                    found.damaged.push(b.item.0);
                }
                if b.state != ItemState::Ready {
                    fq.not_ready.push(b.item.0);
                }
                fq.browsed.push((b.item.0, b.attempts));
            }
        }
        let mut after = None;
        loop {
            let page = q.blocking_dead_letters(after, 1000).map_err(text)?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for d in page {
                if !child::intact(&d.item) {
                    found.damaged.push(d.item.0);
                }
                if d.reason != child::fail_reason(d.item.0) {
                    fq.wrong_reasons.push((d.item.0, d.reason));
                }
                fq.dead.push((d.item.0, d.attempts));
            }
        }
        found.queues.insert(*queue, fq);
    }
    let mut tx = store.begin();
    for (queue, q) in &queues {
        let fq = found.queues.get_mut(queue).expect("inspected above");
        while let Some(item) = q.blocking_try_dequeue(&mut tx).map_err(text)? {
            if !child::intact(&item) {
                found.damaged.push(item.0);
            }
            fq.dequeued.push(item.0);
        }
    }
    tx.blocking_abort().map_err(text)?;
    for (queue, q) in &queues {
        let fq = found.queues.get_mut(queue).expect("inspected above");
        fq.count_after_abort = q.blocking_count().map_err(text)?;
        fq.held_after_abort = q.blocking_stats().map_err(text)?.held;
    }
    found.blob_files = std::fs::read_dir(path.join("blobs")).map_or(0, |d| d.count());
    Ok(found)
}

/// Drains every queue with committed transactions and purges every dead letter, expecting
/// exactly `items`; then reopens the store and expects it empty.
fn drain_and_reopen(
    path: &Path,
    durability: Durability,
    items: &HashMap<u64, check::Held>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut fail = |detail: String| {
        violations.push(Violation {
            kind: "final drain",
            detail,
        })
    };
    let drained = (|| -> Result<HashMap<u64, Place>, String> {
        let text = |e: reliable_queue::Error| e.to_string();
        let store = open_all_due(path, durability).map_err(text)?;
        let queues = open_queues(&store).map_err(text)?;
        let mut drained = HashMap::new();
        for (queue, q) in &queues {
            loop {
                let mut tx = store.begin();
                let mut n = 0;
                while n < 100 {
                    let Some((id, _)) = q.blocking_try_dequeue(&mut tx).map_err(text)? else {
                        break;
                    };
                    drained.insert(id, Place::In(*queue));
                    n += 1;
                }
                tx.blocking_commit().map_err(text)?;
                if n == 0 {
                    break;
                }
            }
            loop {
                let page = q.blocking_dead_letters(None, 100).map_err(text)?;
                if page.is_empty() {
                    break;
                }
                for d in &page {
                    drained.insert(d.item.0, Place::Dead(*queue));
                }
                let ids = page.iter().map(|d| d.id).collect();
                q.blocking_purge(Replay::Ids(ids)).map_err(text)?;
            }
        }
        Ok(drained)
    })();
    let expected: HashMap<u64, Place> = items.iter().map(|(&id, &(p, _))| (id, p)).collect();
    match drained {
        Ok(drained) if drained == expected => {}
        Ok(drained) => fail(format!(
            "drained {} items and dead letters, the last check found {}",
            drained.len(),
            expected.len()
        )),
        Err(e) => fail(format!("draining failed: {e}")),
    }
    let left = open_store(path, durability).and_then(|store| {
        let mut left = Vec::new();
        for (queue, q) in open_queues(&store)? {
            let stats = q.blocking_stats()?;
            if stats != QueueStats::default() {
                left.push(format!("{}: {stats:?}", queue.name()));
            }
        }
        Ok(left)
    });
    match left {
        Ok(left) if left.is_empty() => {}
        Ok(left) => fail(format!("after the drain and a reopen: {left:?}")),
        Err(e) => fail(format!("reopening after the drain failed: {e}")),
    }
    violations
}
