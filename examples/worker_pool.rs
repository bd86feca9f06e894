//! A pool of producer and consumer threads sharing a durable job queue, on disk, with the
//! default settings (`Durability::Sync`: every commit is on disk before it returns).
//!
//! ```text
//! cargo run --release --example worker_pool            # run, or resume an interrupted run
//! cargo run --release --example worker_pool -- --help  # flags
//! ```
//!
//! - Producers enqueue jobs with unique ids `(producer, seq)` a few per transaction. Each
//!   producer keeps its cursor (the next `seq`) as the single item of its own queue
//!   `cursor-<n>`, and advances it in the same transaction as the jobs it enqueues, so a run
//!   killed at any moment resumes exactly where it stopped: no id skipped, none reused.
//! - Consumers dequeue a job, process it, and then either fail (simulated: the transaction is
//!   aborted and the job goes back to the queue to be retried) or move the job's id to the
//!   `done` queue: dequeue from `jobs` and enqueue to `done` commit together, or not at all.
//! - At the end the program waits for `jobs` to drain, then checks the store itself: every id
//!   the cursors say was ever produced is in `done` exactly once, and nothing else is.
//!
//! Interrupt it at any time (Ctrl-C, `kill -9`): the next run picks up the jobs left behind,
//! adds its own, and accounts for both.

use std::collections::btree_map::{BTreeMap, Entry};
use std::error::Error;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::Rng;
use reliable_queue::{ReliableConcurrentQueue, Store};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

/// Producers and consumers share a durable job queue; interrupt it at any time, run it again,
/// and it resumes and accounts for every job.
#[derive(Parser, Debug)]
struct Args {
    /// Directory of the store.
    #[arg(long, default_value = "./worker-pool-data")]
    dir: PathBuf,
    /// Delete the store first and start from nothing.
    #[arg(long)]
    reset: bool,
    /// New jobs to produce in this run.
    #[arg(long, default_value_t = 75_000)]
    items: u64,
    /// Producer threads.
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Consumer threads.
    #[arg(long, default_value_t = 16)]
    consumers: u32,
    /// Fraction of processing attempts that fail (their transaction aborts; the job is retried).
    #[arg(long, default_value_t = 0.05)]
    failure_rate: f64,
    /// Jobs a producer enqueues per transaction.
    #[arg(long, default_value_t = 10)]
    batch: u64,
    /// Simulated processing time per job, in microseconds (time spent waiting, as on I/O).
    #[arg(long, default_value_t = 2000)]
    work_us: u64,
}

/// A job as it travels through the `jobs` queue.
#[derive(Serialize, Deserialize, Debug)]
struct Job {
    id: JobId,
    /// Something to work on.
    input: u64,
}

/// A job's unique id; what the `done` queue records.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct JobId {
    producer: u32,
    seq: u64,
}

const CURSOR_PREFIX: &str = "cursor-";

/// Counters of what this run did, updated only after a commit (or abort) returned.
#[derive(Default)]
struct Stats {
    enqueued: AtomicU64,
    /// Committed producer transactions.
    produce_commits: AtomicU64,
    processed: AtomicU64,
    retried: AtomicU64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("\nerror: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs the pool, then verifies the store; `Ok(false)` if the verification failed.
fn run(args: &Args) -> Result<bool, BoxError> {
    if args.producers == 0 || args.consumers == 0 || args.batch == 0 {
        return Err("--producers, --consumers and --batch must be at least 1".into());
    }
    if !(0.0..0.95).contains(&args.failure_rate) {
        return Err("--failure-rate must be in [0, 0.95)".into());
    }
    if args.reset {
        reset(&args.dir)?;
    }

    let store = Store::open(&args.dir)?;
    let jobs = store.blocking_queue::<Job>("jobs")?;
    let done = store.blocking_queue::<JobId>("done")?;

    // Cursors of this run's producers, and of any producer an earlier run had.
    let mut cursors: BTreeMap<u32, ReliableConcurrentQueue<u64>> = BTreeMap::new();
    for name in store.queue_names() {
        if let Some(n) = name.strip_prefix(CURSOR_PREFIX) {
            let n: u32 = n
                .parse()
                .map_err(|_| format!("unexpected queue {name:?}"))?;
            cursors.insert(n, store.blocking_queue(&name)?);
        }
    }
    for n in 0..args.producers {
        if let Entry::Vacant(slot) = cursors.entry(n) {
            slot.insert(store.blocking_queue(&format!("{CURSOR_PREFIX}{n}"))?);
        }
    }

    // Where the store stands before this run (nothing else is using it: the counts are exact).
    let positions_before = read_cursors(&store, &cursors)?;
    let produced_before: u64 = positions_before.values().sum();
    let backlog_before = jobs.blocking_count()?;
    let done_before = done.blocking_count()?;

    println!(
        "store {} (durability {:?}): {} jobs produced by earlier runs, {} done, {} waiting",
        args.dir.display(),
        store.durability(),
        produced_before,
        done_before,
        backlog_before,
    );
    println!(
        "this run: {} new jobs, {} producers, {} consumers, {:.0}% of attempts fail and are retried",
        args.items,
        args.producers,
        args.consumers,
        args.failure_rate * 100.0,
    );
    println!("interrupt at any time (Ctrl-C, kill -9); the next run resumes\n");

    let stats = Arc::new(Stats::default());
    let producers_done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let mut producers = Vec::new();
    for n in 0..args.producers {
        let quota = args.items / u64::from(args.producers)
            + u64::from(u64::from(n) < args.items % u64::from(args.producers));
        let producer = Producer {
            store: store.clone(),
            jobs: jobs.clone(),
            cursor: cursors[&n].clone(),
            id: n,
            next: positions_before[&n],
            quota,
            batch: args.batch,
            stats: stats.clone(),
        };
        producers.push(spawn(format!("producer-{n}"), move || producer.run())?);
    }
    let mut consumers = Vec::new();
    for n in 0..args.consumers {
        let consumer = Consumer {
            store: store.clone(),
            jobs: jobs.clone(),
            done: done.clone(),
            failure_rate: args.failure_rate,
            work: Duration::from_micros(args.work_us),
            producers_done: producers_done.clone(),
            stats: stats.clone(),
        };
        consumers.push(spawn(format!("consumer-{n}"), move || consumer.run())?);
    }

    // Progress, about once a second, until every thread has finished.
    let mut last = (Instant::now(), 0);
    let mut first_error = None;
    while !(producers.is_empty() && consumers.is_empty()) {
        thread::sleep(Duration::from_millis(100));
        for result in join_finished(&mut producers) {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if producers.is_empty() {
            producers_done.store(true, Ordering::Release);
        }
        for result in join_finished(&mut consumers) {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if first_error.is_some() {
            // Stop producing; consumers drain what is there and stop.
            producers_done.store(true, Ordering::Release);
        }
        if last.0.elapsed() >= Duration::from_secs(1) {
            let processed = stats.processed.load(Ordering::Relaxed);
            let rate = (processed - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), processed);
            progress(&start, &stats, rate, jobs.blocking_count()?, args.items);
        }
    }
    let elapsed = start.elapsed();
    let processed = stats.processed.load(Ordering::Relaxed);
    progress(
        &start,
        &stats,
        processed as f64 / elapsed.as_secs_f64(),
        jobs.blocking_count()?,
        args.items,
    );
    println!();
    if let Some(e) = first_error {
        return Err(e);
    }

    let report = verify(&store, &jobs, &done, &cursors)?;
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    store.blocking_close()?;
    let enqueued = stats.enqueued.load(Ordering::Relaxed);
    let retried = stats.retried.load(Ordering::Relaxed);
    let done_growth = report.done_len as i64 - done_before as i64;
    let produced_growth = report.produced as i64 - produced_before as i64;

    let mut problems = Vec::new();
    if report.lost > 0 {
        problems.push(format!("{} jobs lost", report.lost));
    }
    if report.duplicated > 0 {
        problems.push(format!("{} jobs done more than once", report.duplicated));
    }
    if report.unexpected > 0 {
        problems.push(format!("{} unknown ids in done", report.unexpected));
    }
    if report.queued > 0 {
        problems.push(format!("{} jobs still queued", report.queued));
    }
    if produced_growth != enqueued as i64 {
        problems.push(format!(
            "cursors advanced by {produced_growth}, producers committed {enqueued}"
        ));
    }
    if done_growth != processed as i64 {
        problems.push(format!(
            "done grew by {done_growth}, consumers committed {processed}"
        ));
    }
    if backlog_before + enqueued != processed {
        problems.push(format!(
            "{backlog_before} waiting + {enqueued} enqueued != {processed} processed"
        ));
    }

    let secs = elapsed.as_secs_f64();
    println!(
        "\nsummary (checked against the store in {}):",
        args.dir.display()
    );
    println!("  enqueued this run             {enqueued:>9}");
    println!("  processed this run            {processed:>9}  ({backlog_before} of them left by an earlier run)");
    println!("  retried (aborted attempts)    {retried:>9}");
    println!(
        "  produced, all runs            {:>9}  (sum of {} producer cursors)",
        report.produced,
        cursors.len()
    );
    println!("  in done, all runs             {:>9}", report.done_len);
    println!("  still queued                  {:>9}", report.queued);
    println!("  lost                          {:>9}", report.lost);
    println!("  duplicated                    {:>9}", report.duplicated);
    println!("  unexpected                    {:>9}", report.unexpected);
    println!(
        "  time                          {secs:>8.1}s  ({:.0} jobs/s processed, {:.0} commits/s)",
        processed as f64 / secs,
        (processed + stats.produce_commits.load(Ordering::Relaxed)) as f64 / secs,
    );
    if problems.is_empty() {
        println!("verification passed: every job produced is done exactly once");
        Ok(true)
    } else {
        println!("VERIFICATION FAILED:");
        for p in &problems {
            println!("  - {p}");
        }
        Ok(false)
    }
}

struct Producer {
    store: Store,
    jobs: ReliableConcurrentQueue<Job>,
    cursor: ReliableConcurrentQueue<u64>,
    id: u32,
    /// The cursor's value as last committed.
    next: u64,
    quota: u64,
    batch: u64,
    stats: Arc<Stats>,
}

impl Producer {
    fn run(mut self) -> Result<(), BoxError> {
        let mut rng = rand::thread_rng();
        let mut left = self.quota;
        while left > 0 {
            let n = left.min(self.batch);
            let mut tx = self.store.begin();
            // The cursor moves in the same transaction as the jobs: both commit, or neither.
            let next = self.cursor.blocking_try_dequeue(&mut tx)?.unwrap_or(0);
            if next != self.next {
                return Err(format!(
                    "producer {}: cursor reads {next}, last committed {}",
                    self.id, self.next
                )
                .into());
            }
            for seq in next..next + n {
                let id = JobId {
                    producer: self.id,
                    seq,
                };
                self.jobs.enqueue(
                    &mut tx,
                    Job {
                        id,
                        input: rng.gen(),
                    },
                )?;
            }
            self.cursor.enqueue(&mut tx, next + n)?;
            tx.blocking_commit()?;
            self.next = next + n;
            left -= n;
            self.stats.enqueued.fetch_add(n, Ordering::Relaxed);
            self.stats.produce_commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

struct Consumer {
    store: Store,
    jobs: ReliableConcurrentQueue<Job>,
    done: ReliableConcurrentQueue<JobId>,
    failure_rate: f64,
    work: Duration,
    producers_done: Arc<AtomicBool>,
    stats: Arc<Stats>,
}

impl Consumer {
    fn run(self) -> Result<(), BoxError> {
        let mut rng = rand::thread_rng();
        loop {
            let mut tx = self.store.begin();
            let Some(job) = self
                .jobs
                .blocking_dequeue_timeout(&mut tx, Duration::from_millis(20))?
            else {
                drop(tx);
                // Jobs held by other consumers are theirs to finish or to retry, so an empty
                // queue once producers are done means this consumer's work is over.
                if self.producers_done.load(Ordering::Acquire) && self.jobs.blocking_count()? == 0 {
                    return Ok(());
                }
                continue;
            };
            process(&job, self.work);
            if rng.gen_bool(self.failure_rate) {
                // Processing failed: the job goes back to the head of the queue for a retry.
                tx.blocking_abort()?;
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // The job leaves `jobs` and enters `done` in one atomic, durable commit.
            self.done.enqueue(&mut tx, job.id)?;
            tx.blocking_commit()?;
            self.stats.processed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Stands for the real work: waits (as on a network call) and computes something.
fn process(job: &Job, work: Duration) -> u64 {
    if !work.is_zero() {
        thread::sleep(work);
    }
    std::hint::black_box(
        job.input
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(17),
    )
}

fn progress(start: &Instant, stats: &Stats, rate: f64, depth: u64, items: u64) {
    print!(
        "\r[{:>5.1}s] processed {:>7} ({:>5.0}/s)  queue depth {:>6}  retries {:>5}  enqueued {:>7}/{}   ",
        start.elapsed().as_secs_f64(),
        stats.processed.load(Ordering::Relaxed),
        rate,
        depth,
        stats.retried.load(Ordering::Relaxed),
        stats.enqueued.load(Ordering::Relaxed),
        items,
    );
    // Progress display only: a closed stdout is not worth failing the run for.
    let _ = std::io::stdout().flush();
}

fn spawn(
    name: String,
    f: impl FnOnce() -> Result<(), BoxError> + Send + 'static,
) -> std::io::Result<JoinHandle<Result<(), BoxError>>> {
    thread::Builder::new().name(name).spawn(f)
}

/// Joins and removes the threads that have finished.
fn join_finished(threads: &mut Vec<JoinHandle<Result<(), BoxError>>>) -> Vec<Result<(), BoxError>> {
    let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(threads)
        .into_iter()
        .partition(|t| t.is_finished());
    *threads = running;
    finished
        .into_iter()
        .map(|t| {
            let name = t.thread().name().unwrap_or("worker").to_owned();
            t.join()
                .unwrap_or_else(|_| Err(format!("{name} panicked").into()))
        })
        .collect()
}

/// Reads every cursor without consuming it: dequeue, then abort.
fn read_cursors(
    store: &Store,
    cursors: &BTreeMap<u32, ReliableConcurrentQueue<u64>>,
) -> Result<BTreeMap<u32, u64>, BoxError> {
    let mut tx = store.begin();
    let mut positions = BTreeMap::new();
    for (&n, cursor) in cursors {
        positions.insert(n, cursor.blocking_try_dequeue(&mut tx)?.unwrap_or(0));
        if cursor.blocking_try_dequeue(&mut tx)?.is_some() {
            return Err(format!("cursor of producer {n} holds more than one item").into());
        }
    }
    tx.blocking_abort()?;
    Ok(positions)
}

/// What the store holds once the pool has stopped.
struct Report {
    /// Jobs ever produced, per the cursors.
    produced: u64,
    /// Items in `done`.
    done_len: u64,
    /// Produced ids neither in `done` nor still queued.
    lost: u64,
    /// Ids found in `done` more than once (counted once per extra copy).
    duplicated: u64,
    /// Ids in `done` or `jobs` that no cursor accounts for.
    unexpected: u64,
    /// Items left in `jobs`.
    queued: u64,
}

/// Reads the cursors and the whole of `jobs` and `done` without consuming anything
/// (dequeue, then abort), and checks that every produced id is done exactly once.
fn verify(
    store: &Store,
    jobs: &ReliableConcurrentQueue<Job>,
    done: &ReliableConcurrentQueue<JobId>,
    cursors: &BTreeMap<u32, ReliableConcurrentQueue<u64>>,
) -> Result<Report, BoxError> {
    let positions = read_cursors(store, cursors)?;
    // seen[producer][seq] = times the id was found in `done` (or `jobs`).
    let mut seen: BTreeMap<u32, Vec<u32>> = positions
        .iter()
        .map(|(&n, &next)| Ok((n, vec![0; usize::try_from(next)?])))
        .collect::<Result<_, BoxError>>()?;
    let mut unexpected = 0;
    let mut mark = |id: JobId| match seen
        .get_mut(&id.producer)
        .and_then(|s| s.get_mut(usize::try_from(id.seq).ok()?))
    {
        Some(count) => *count += 1,
        None => unexpected += 1,
    };

    let mut tx = store.begin();
    let mut done_len = 0;
    while let Some(id) = done.blocking_try_dequeue(&mut tx)? {
        mark(id);
        done_len += 1;
    }
    let mut queued = 0;
    while let Some(job) = jobs.blocking_try_dequeue(&mut tx)? {
        mark(job.id);
        queued += 1;
    }
    tx.blocking_abort()?;

    let (mut lost, mut duplicated) = (0, 0);
    for count in seen.values().flatten() {
        match *count {
            0 => lost += 1,
            1 => {}
            c => duplicated += u64::from(c - 1),
        }
    }
    Ok(Report {
        produced: positions.values().sum(),
        done_len,
        lost,
        duplicated,
        unexpected,
        queued,
    })
}

/// Deletes the store directory, refusing anything that does not look like a store.
fn reset(dir: &Path) -> Result<(), BoxError> {
    if !dir.exists() {
        return Ok(());
    }
    let empty = dir.read_dir()?.next().is_none();
    if !empty && !dir.join("conf").exists() {
        return Err(format!(
            "{} does not look like a store; not deleting it",
            dir.display()
        )
        .into());
    }
    std::fs::remove_dir_all(dir)?;
    println!("deleted {}", dir.display());
    Ok(())
}
