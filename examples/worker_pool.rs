//! A pool of producer and consumer threads sharing a durable job queue, on disk, with the
//! default settings (`Durability::Sync`: every commit is on disk before it returns), processing
//! jobs under leases with retries, backoff and dead letters.
//!
//! ```text
//! cargo run --release --example worker_pool            # run, or resume an interrupted run
//! cargo run --release --example worker_pool -- --help  # flags
//! cargo run --release --features postgres --example worker_pool -- --postgres URL
//! cargo run --release --features redis --example worker_pool -- --redis URL
//! ```
//!
//! - Producers enqueue jobs with unique ids `(producer, seq)` a few per transaction. Each
//!   producer keeps its cursor (the next `seq`) as the single item of its own queue
//!   `cursor-<n>`, and advances it in the same transaction as the jobs it enqueues, so a run
//!   killed at any moment resumes exactly where it stopped: no id skipped, none reused.
//! - Consumers lease a job (`blocking_lease`: the job is hidden from the others and its
//!   attempt is counted, durably), process it, and then either
//!   - succeed: the job's id is enqueued to the `done` queue and the lease acked in the same
//!     transaction, so the job leaves `jobs` and enters `done` in one atomic, durable commit;
//!   - or fail (simulated, `--failure-rate` of the attempts): `Lease::fail` hands the job back
//!     to the queue's `RetryPolicy`, set at start: it is due again after a backoff (5 ms,
//!     doubling up to 100 ms), and after its 5th failed attempt it moves to the queue's dead
//!     letters with the failure's reason.
//!
//!   A few "poison" jobs (`--poison-rate`, chosen by a hash of the id when the job is
//!   produced) fail at every attempt, and so end in the dead letters.
//! - At the end the program waits for `jobs` to drain (nothing visible, delayed for a retry,
//!   leased or held: `blocking_stats`), closes the store, which wakes the consumers waiting in
//!   `blocking_lease` with `Error::Closed`, reopens it, and checks it: every id the cursors say
//!   was ever produced is either in `done` exactly once or in the dead letters exactly once,
//!   never both, and nothing else is in either.
//!
//! Interrupt it at any time (Ctrl-C, `kill -9`): the next run picks up the jobs left behind,
//! adds its own, and accounts for both. Leases do not survive a restart: the jobs leased when
//! the process died are visible again at the next open, their attempts counted (a poison job
//! still ends in the dead letters after 5 attempts in all); a retry waiting out its backoff
//! stays delayed until its due time. On PostgreSQL (`--postgres`) a lease outlives its
//! holder: the jobs a killed run had leased come back when their 30 s lease ends, and this run
//! waits for them.

use std::collections::btree_map::{BTreeMap, Entry};
use std::error::Error;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::Rng;
use reliable_queue::{Failed, QueueStats, ReliableConcurrentQueue, RetryPolicy, Store};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

/// Producers and consumers share a durable job queue, processing jobs under leases with
/// retries and dead letters; interrupt it at any time, run it again, and it resumes and
/// accounts for every job.
#[derive(Parser, Debug)]
struct Args {
    /// Directory of the store.
    #[arg(long, default_value = "./worker-pool-data")]
    dir: PathBuf,
    /// Run on a PostgreSQL database instead (libpq URL, e.g. `postgresql://app@db/app`;
    /// build with `--features postgres`). Then `rq --postgres URL stats --watch` follows the
    /// run live from another terminal.
    #[arg(long, conflicts_with = "dir")]
    postgres: Option<String>,
    /// Run on a Redis server instead (`redis://host:port/db`, `redis+unix:///path`; build
    /// with `--features redis`; give the server `appendonly yes` and `appendfsync always`).
    #[arg(long, conflicts_with_all = ["dir", "postgres"])]
    redis: Option<String>,
    /// The store's PostgreSQL schema (with --postgres) or Redis namespace (with --redis).
    #[arg(long, default_value = "reliable_queue")]
    schema: String,
    /// Delete the store first and start from nothing (with --postgres: drop its schema).
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
    /// Fraction of processing attempts that fail (`Lease::fail`: the job is retried after a
    /// backoff, or moved to the dead letters after its 5th attempt).
    #[arg(long, default_value_t = 0.05)]
    failure_rate: f64,
    /// Fraction of the new jobs that are poison: every attempt fails, so they end in the dead
    /// letters.
    #[arg(long, default_value_t = 0.001)]
    poison_rate: f64,
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
    /// Fails at every attempt (decided when the job is produced, so that a later run with
    /// another `--poison-rate` does not change it).
    poison: bool,
}

/// A job's unique id; what the `done` queue records.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct JobId {
    producer: u32,
    seq: u64,
}

const CURSOR_PREFIX: &str = "cursor-";

/// How long a consumer may hold a job before the queue takes it back (a consumer that hangs
/// loses its job to another one; its late ack is refused).
const LEASE_TTL: Duration = Duration::from_secs(30);

/// Attempts before a job moves to the dead letters.
const MAX_ATTEMPTS: u32 = 5;

/// The `jobs` queue's retry policy: 5 ms after the first failure, doubling up to 100 ms (with
/// the default 20 % jitter), dead letters after the 5th failed attempt.
fn retry_policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(Duration::from_millis(5))
        .max_backoff(Duration::from_millis(100))
}

/// Counters of what this run did, updated only after the call they count returned.
#[derive(Default)]
struct Stats {
    enqueued: AtomicU64,
    /// Committed producer transactions.
    produce_commits: AtomicU64,
    /// Leases granted (each a durable commit of the attempt).
    leases: AtomicU64,
    /// Jobs acked with their `done` entry.
    processed: AtomicU64,
    /// Failed attempts (`Lease::fail`): retried after a backoff, or moved to the dead letters.
    failed: AtomicU64,
    /// Failed attempts that moved the job to the dead letters.
    buried: AtomicU64,
    /// Settlements refused because the lease had ended (the job went back to the queue).
    expired: AtomicU64,
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
            if let Some(reliable_queue::Error::Deserialize { .. }) = e.downcast_ref() {
                eprintln!(
                    "hint: the store may hold jobs of an older version of this example; \
                     start again with --reset"
                );
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
    if !(0.0..=1.0).contains(&args.poison_rate) {
        return Err("--poison-rate must be in [0, 1]".into());
    }
    if args.reset {
        reset(args)?;
    }

    let store = open(args)?;
    let jobs = store.blocking_queue::<Job>("jobs")?;
    let done = store.blocking_queue::<JobId>("done")?;
    // Kept in the store; setting it again on every run is harmless.
    jobs.blocking_set_retry_policy(retry_policy())?;

    // Cursors of this run's producers, and of any producer an earlier run had.
    let mut cursors = open_cursors(&store)?;
    for n in 0..args.producers {
        if let Entry::Vacant(slot) = cursors.entry(n) {
            slot.insert(store.blocking_queue(&format!("{CURSOR_PREFIX}{n}"))?);
        }
    }

    // Where the store stands before this run (nothing else is using it: the counts are exact;
    // no lease survives a restart, so the jobs an earlier run had leased are visible again).
    let positions_before = read_cursors(&store, &cursors)?;
    let produced_before: u64 = positions_before.values().sum();
    let before = jobs.blocking_stats()?;
    let backlog_before = in_queue(&before);
    let done_before = done.blocking_count()?;

    println!(
        "store {} (durability {:?}): {} jobs produced by earlier runs, {} done, {} dead letters, \
         {} waiting ({} of them in backoff)",
        place(args),
        store.durability(),
        produced_before,
        done_before,
        before.dead,
        backlog_before,
        before.delayed,
    );
    println!(
        "this run: {} new jobs, {} producers, {} consumers; {:.0}% of attempts fail and are \
         retried after a backoff (5 ms doubling to 100 ms), {:.1}% of jobs are poison; \
         dead letters after {MAX_ATTEMPTS} attempts",
        args.items,
        args.producers,
        args.consumers,
        args.failure_rate * 100.0,
        args.poison_rate * 100.0,
    );
    println!("interrupt at any time (Ctrl-C, kill -9); the next run resumes\n");

    let stats = Arc::new(Stats::default());
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
            poison_rate: args.poison_rate,
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
            stats: stats.clone(),
        };
        consumers.push(spawn(format!("consumer-{n}"), move || consumer.run())?);
    }

    // Progress, about once a second, until the producers are done and `jobs` has drained.
    // Consumers wait in `blocking_lease` for the retries still in backoff; they end only
    // on an error, or when the store is closed below.
    let mut last = (Instant::now(), 0);
    let mut first_error = None;
    let mut empty_since: Option<Instant> = None;
    loop {
        thread::sleep(Duration::from_millis(100));
        for result in join_finished(&mut producers)
            .into_iter()
            .chain(join_finished(&mut consumers))
        {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if first_error.is_some() || consumers.is_empty() {
            break;
        }
        let now = jobs.blocking_stats()?;
        if producers.is_empty() {
            // Drained when `jobs` holds nothing, and this run's own counts agree: what was
            // there at the start, plus what was enqueued, was acked or moved to the dead
            // letters. (The stats are snapshots taken one after the other, and can miss a job
            // moving between two states; the counts cannot. Should they ever disagree, an
            // empty queue for 3 s ends the wait anyway, and the check below reports it.)
            let settled =
                stats.processed.load(Ordering::Acquire) + now.dead.saturating_sub(before.dead);
            let balanced = backlog_before + stats.enqueued.load(Ordering::Acquire) == settled;
            let empty = in_queue(&now) == 0;
            empty_since = if empty {
                empty_since.or(Some(Instant::now()))
            } else {
                None
            };
            if empty && (balanced || empty_since.is_some_and(|t| t.elapsed().as_secs() >= 3)) {
                break;
            }
        }
        if last.0.elapsed() >= Duration::from_secs(1) {
            let processed = stats.processed.load(Ordering::Relaxed);
            let rate = (processed - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), processed);
            progress(&start, &stats, rate, &now, args.items);
        }
    }
    let elapsed = start.elapsed();
    let processed = stats.processed.load(Ordering::Relaxed);
    progress(
        &start,
        &stats,
        processed as f64 / elapsed.as_secs_f64(),
        &jobs.blocking_stats()?,
        args.items,
    );
    println!();

    // Closing wakes the consumers waiting in `blocking_lease` with `Closed`, and reports the
    // final flush's outcome (dropping the store only logs it).
    let closed = store.blocking_close();
    for thread in producers.into_iter().chain(consumers) {
        if let Err(e) = join(thread) {
            if !matches!(e.downcast_ref(), Some(reliable_queue::Error::Closed)) {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    closed?;

    // Check what a new process would find: reopen the store.
    let store = open(args)?;
    let report = verify(&store)?;
    store.blocking_close()?;

    let enqueued = stats.enqueued.load(Ordering::Relaxed);
    let failed = stats.failed.load(Ordering::Relaxed);
    let expired = stats.expired.load(Ordering::Relaxed);
    let dead_growth = report.dead_len as i64 - before.dead as i64;
    let done_growth = report.done_len as i64 - done_before as i64;
    let produced_growth = report.produced as i64 - produced_before as i64;

    let mut problems = Vec::new();
    if report.lost > 0 {
        problems.push(format!(
            "{} jobs lost (neither done nor dead letters)",
            report.lost
        ));
    }
    if report.duplicated > 0 {
        problems.push(format!(
            "{} extra copies of jobs in done or in the dead letters",
            report.duplicated
        ));
    }
    if report.both > 0 {
        problems.push(format!(
            "{} jobs both done and in the dead letters",
            report.both
        ));
    }
    if report.unexpected > 0 {
        problems.push(format!(
            "{} unknown ids in done or the dead letters",
            report.unexpected
        ));
    }
    if report.queued > 0 {
        problems.push(format!("{} jobs still queued", report.queued));
    }
    if report.dead_len != report.dead_counted {
        problems.push(format!(
            "stats count {} dead letters, {} were listed",
            report.dead_counted, report.dead_len
        ));
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
    if (backlog_before + enqueued) as i64 != processed as i64 + dead_growth {
        problems.push(format!(
            "{backlog_before} waiting + {enqueued} enqueued != {processed} processed + \
             {dead_growth} new dead letters"
        ));
    }

    let secs = elapsed.as_secs_f64();
    let commits = stats.produce_commits.load(Ordering::Relaxed)
        + stats.leases.load(Ordering::Relaxed)
        + processed
        + failed;
    println!(
        "\nsummary (checked against the store {}, reopened):",
        place(args)
    );
    println!("  enqueued this run             {enqueued:>9}");
    println!(
        "  processed this run            {processed:>9}  ({backlog_before} jobs were waiting \
         from an earlier run)"
    );
    println!(
        "  retries (failed attempts)     {failed:>9}  ({} of them moved the job to the dead \
         letters)",
        stats.buried.load(Ordering::Relaxed)
    );
    if expired > 0 {
        println!(
            "  expired leases                {expired:>9}  (their settlement was refused; the job \
             went back to the queue)"
        );
    }
    println!(
        "  produced, all runs            {:>9}  (sum of {} producer cursors)",
        report.produced, report.cursors
    );
    println!("  in done, all runs             {:>9}", report.done_len);
    println!(
        "  dead letters, all runs        {:>9}  ({} poison jobs, {} others)",
        report.dead_len,
        report.dead_len - report.dead_unlucky,
        report.dead_unlucky
    );
    if let Some(sample) = &report.sample {
        println!("    e.g. {sample}");
    }
    println!("  still queued                  {:>9}", report.queued);
    println!("  lost                          {:>9}", report.lost);
    println!("  duplicated                    {:>9}", report.duplicated);
    println!("  both done and dead            {:>9}", report.both);
    println!("  unexpected                    {:>9}", report.unexpected);
    println!(
        "  time                          {secs:>8.1}s  ({:.0} jobs/s processed, {:.0} commits/s)",
        processed as f64 / secs,
        commits as f64 / secs,
    );
    if problems.is_empty() {
        println!(
            "verification passed: every job produced is done exactly once or a dead letter \
             exactly once, never both"
        );
        Ok(true)
    } else {
        println!("VERIFICATION FAILED:");
        for p in &problems {
            println!("  - {p}");
        }
        Ok(false)
    }
}

/// Jobs in the queue in any state but dead: visible, delayed (retries in backoff), leased,
/// or held by a transaction (a lease being granted).
fn in_queue(s: &QueueStats) -> u64 {
    s.visible + s.delayed + s.leased + s.held
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
    poison_rate: f64,
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
                        poison: is_poison(id, self.poison_rate),
                    },
                )?;
            }
            self.cursor.enqueue(&mut tx, next + n)?;
            tx.blocking_commit()?;
            self.next = next + n;
            left -= n;
            self.stats.enqueued.fetch_add(n, Ordering::Release);
            self.stats.produce_commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Whether the job `id` is poison: a hash of the id below `rate` (the same ids for the same
/// rate, run after run).
fn is_poison(id: JobId, rate: f64) -> bool {
    // splitmix64
    let mut z = (u64::from(id.producer) << 48 ^ id.seq).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < rate
}

struct Consumer {
    store: Store,
    jobs: ReliableConcurrentQueue<Job>,
    done: ReliableConcurrentQueue<JobId>,
    failure_rate: f64,
    work: Duration,
    stats: Arc<Stats>,
}

impl Consumer {
    /// Processes jobs until an error; the store's close ends it with `Error::Closed`.
    fn run(self) -> Result<(), BoxError> {
        let mut rng = rand::thread_rng();
        loop {
            // Waits for a visible job: new, given back, or a retry whose backoff is over.
            let lease = self.jobs.blocking_lease(LEASE_TTL)?;
            self.stats.leases.fetch_add(1, Ordering::Relaxed);
            let job = lease.item();
            process(job, self.work);
            let failure = if job.poison {
                Some("poison job: fails at every attempt")
            } else if rng.gen_bool(self.failure_rate) {
                Some("simulated failure")
            } else {
                None
            };
            let settled = match failure {
                // Processing failed: due again after the backoff, or a dead letter at the
                // last attempt. Durable when this returns.
                Some(reason) => lease.blocking_fail(reason).map(|failed| {
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    if failed == Failed::Dead {
                        self.stats.buried.fetch_add(1, Ordering::Relaxed);
                    }
                }),
                // The job leaves `jobs` and enters `done` in one atomic, durable commit.
                None => {
                    let mut tx = self.store.begin();
                    self.done.enqueue(&mut tx, job.id)?;
                    lease
                        .ack(&mut tx)
                        .and_then(|()| tx.blocking_commit())
                        .map(|()| {
                            self.stats.processed.fetch_add(1, Ordering::Release);
                        })
                }
            };
            match settled {
                Ok(()) => {}
                // Held past its deadline: the job went back to the queue (or to the dead
                // letters) and nothing of this settlement applied. Someone else has it now.
                Err(reliable_queue::Error::LeaseExpired { .. }) => {
                    self.stats.expired.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(e.into()),
            }
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

fn progress(start: &Instant, stats: &Stats, rate: f64, jobs: &QueueStats, items: u64) {
    print!(
        "\r[{:>5.1}s] processed {:>7} ({:>5.0}/s)  waiting {:>6}  backoff {:>4}  retries {:>5}  \
         dead {:>4}  enqueued {:>7}/{}   ",
        start.elapsed().as_secs_f64(),
        stats.processed.load(Ordering::Relaxed),
        rate,
        jobs.visible,
        jobs.delayed,
        stats.failed.load(Ordering::Relaxed),
        jobs.dead,
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

fn join(thread: JoinHandle<Result<(), BoxError>>) -> Result<(), BoxError> {
    let name = thread.thread().name().unwrap_or("worker").to_owned();
    thread
        .join()
        .unwrap_or_else(|_| Err(format!("{name} panicked").into()))
}

/// Joins and removes the threads that have finished.
fn join_finished(threads: &mut Vec<JoinHandle<Result<(), BoxError>>>) -> Vec<Result<(), BoxError>> {
    let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(threads)
        .into_iter()
        .partition(|t| t.is_finished());
    *threads = running;
    finished.into_iter().map(join).collect()
}

/// The cursor queues of every producer any run had.
fn open_cursors(store: &Store) -> Result<BTreeMap<u32, ReliableConcurrentQueue<u64>>, BoxError> {
    let mut cursors = BTreeMap::new();
    for name in store.blocking_list_queues()? {
        if let Some(n) = name.strip_prefix(CURSOR_PREFIX) {
            let n: u32 = n
                .parse()
                .map_err(|_| format!("unexpected queue {name:?}"))?;
            cursors.insert(n, store.blocking_queue(&name)?);
        }
    }
    Ok(cursors)
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
    /// Producer cursors.
    cursors: usize,
    /// Jobs ever produced, per the cursors.
    produced: u64,
    /// Items in `done`.
    done_len: u64,
    /// Dead letters of `jobs`, as listed.
    dead_len: u64,
    /// Dead letters of `jobs`, as `blocking_stats` counts them.
    dead_counted: u64,
    /// Dead letters of jobs that were not poison (they failed by chance at every attempt, or
    /// their last lease expired).
    dead_unlucky: u64,
    /// One dead letter, described.
    sample: Option<String>,
    /// Produced ids neither in `done` nor in the dead letters nor still queued.
    lost: u64,
    /// Extra copies of ids in `done`, or in the dead letters (counted once per extra copy).
    duplicated: u64,
    /// Ids both in `done` and in the dead letters.
    both: u64,
    /// Ids in `done`, the dead letters or `jobs` that no cursor accounts for.
    unexpected: u64,
    /// Items left in `jobs` (in any state but dead).
    queued: u64,
}

/// Where one produced id was found.
#[derive(Clone, Copy, Default)]
struct Seen {
    done: u32,
    dead: u32,
    queued: u32,
}

/// Reads the cursors, the whole of `done` (browsing), the dead letters of `jobs` (paging by
/// id) and what is left in `jobs` (browsing), without consuming anything, and
/// checks that every produced id is done exactly once or a dead letter exactly once.
fn verify(store: &Store) -> Result<Report, BoxError> {
    let jobs = store.blocking_queue::<Job>("jobs")?;
    let done = store.blocking_queue::<JobId>("done")?;
    let cursors = open_cursors(store)?;
    let positions = read_cursors(store, &cursors)?;
    let mut seen: BTreeMap<u32, Vec<Seen>> = positions
        .iter()
        .map(|(&n, &next)| Ok((n, vec![Seen::default(); usize::try_from(next)?])))
        .collect::<Result<_, BoxError>>()?;
    let mut unexpected = 0;
    let mut mark = |id: JobId, count: fn(&mut Seen)| match seen
        .get_mut(&id.producer)
        .and_then(|s| s.get_mut(usize::try_from(id.seq).ok()?))
    {
        Some(s) => count(s),
        None => unexpected += 1,
    };

    let mut done_len = 0;
    let mut after = None;
    loop {
        let page = done.blocking_browse(after, 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for entry in page {
            mark(entry.item, |s| s.done += 1);
            done_len += 1;
        }
    }

    let (mut dead_len, mut dead_unlucky, mut sample) = (0, 0, None);
    let mut after = None;
    loop {
        let page = jobs.blocking_dead_letters(after, 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for letter in page {
            mark(letter.item.id, |s| s.dead += 1);
            if !letter.item.poison {
                dead_unlucky += 1;
            }
            dead_len += 1;
            sample.get_or_insert_with(|| {
                let time = |t: Option<std::time::SystemTime>| {
                    t.and_then(|t| t.elapsed().ok())
                        .map_or("?".to_owned(), |ago| {
                            format!("{:.1}s ago", ago.as_secs_f64())
                        })
                };
                format!(
                    "job {}/{}: {:?} after {} attempts (first {}, last {})",
                    letter.item.id.producer,
                    letter.item.id.seq,
                    letter.reason,
                    letter.attempts,
                    time(letter.first_attempt),
                    time(letter.last_attempt),
                )
            });
        }
    }

    let mut queued = 0;
    let mut after = None;
    loop {
        let page = jobs.blocking_browse(after, 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for item in page {
            mark(item.item.id, |s| s.queued += 1);
            queued += 1;
        }
    }
    let stats = jobs.blocking_stats()?;
    queued = queued.max(in_queue(&stats));

    let (mut lost, mut duplicated, mut both) = (0, 0, 0);
    for s in seen.values().flatten() {
        match (s.done, s.dead, s.queued) {
            (0, 0, 0) => lost += 1,
            (d, 0, 0) | (0, d, 0) => duplicated += u64::from(d - 1),
            (d, e, _) if d > 0 && e > 0 => both += 1,
            _ => {} // still queued: counted above
        }
    }
    Ok(Report {
        cursors: cursors.len(),
        produced: positions.values().sum(),
        done_len,
        dead_len,
        dead_counted: stats.dead,
        dead_unlucky,
        sample,
        lost,
        duplicated,
        both,
        unexpected,
        queued,
    })
}

/// Opens the store: the directory, the PostgreSQL database with `--postgres`, or the Redis
/// server with `--redis`.
fn open(args: &Args) -> Result<Store, BoxError> {
    if let Some(url) = &args.redis {
        return Ok(Store::builder()
            .url(url)
            .namespace(&args.schema)
            .open()
            .map_err(|e| match e {
                reliable_queue::Error::InvalidConfig { setting: "url", .. } => format!(
                    "{e} (the Redis engine: cargo run --release --features redis \
                     --example worker_pool -- --redis URL)"
                ),
                e => e.to_string(),
            })?);
    }
    match &args.postgres {
        None => Ok(Store::open(&args.dir)?),
        #[cfg(feature = "postgres")]
        Some(url) => Ok(Store::builder()
            .postgres(url)
            .postgres_schema(&args.schema)
            // A connection per thread: consumers commit while producers do.
            .postgres_pool_size(args.consumers as usize + args.producers as usize + 2)
            .open()?),
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(
            "--postgres needs the engine: cargo run --release --features postgres \
                        --example worker_pool -- --postgres URL"
                .into(),
        ),
    }
}

/// The store, as the output names it.
fn place(args: &Args) -> String {
    if args.redis.is_some() {
        return format!("in Redis namespace {:?}", args.schema);
    }
    match &args.postgres {
        None => args.dir.display().to_string(),
        Some(_) => format!("in PostgreSQL schema {:?}", args.schema),
    }
}

/// Starts from nothing: deletes the directory, or drops the PostgreSQL schema.
fn reset(args: &Args) -> Result<(), BoxError> {
    if args.redis.is_some() {
        return Err(
            "--reset with --redis: the store cannot drop its keys; give another \
                    --schema (namespace) to start from nothing"
                .into(),
        );
    }
    if args.postgres.is_none() {
        return reset_dir(&args.dir);
    }
    reset_schema(args)
}

#[cfg(not(feature = "postgres"))]
fn reset_schema(args: &Args) -> Result<(), BoxError> {
    open(args).map(drop)
}

/// Drops the store's schema, through the store's own connection: the example needs no
/// database client of its own.
#[cfg(feature = "postgres")]
fn reset_schema(args: &Args) -> Result<(), BoxError> {
    let store = open(args)?;
    let mut tx = store.begin();
    let drop = format!(
        "DROP SCHEMA \"{}\" CASCADE",
        args.schema.replace('"', "\"\"")
    );
    tx.blocking_execute(&drop, &[])?;
    tx.blocking_commit()?;
    store.blocking_close()?;
    println!("dropped schema {:?}", args.schema);
    Ok(())
}

/// Deletes the store directory, refusing anything that does not look like a store.
fn reset_dir(dir: &Path) -> Result<(), BoxError> {
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
