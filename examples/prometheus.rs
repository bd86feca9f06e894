//! A worker pool on an on-disk store whose metrics are served to Prometheus: producers
//! enqueue jobs, consumers lease them; some attempts fail (retried after a backoff, or moved
//! to the dead letters), a few consumers stall past their lease (the lease expires and the
//! job goes to another consumer). The store's metrics (`reliable_queue::metrics`, the table
//! in ARCHITECTURE.md) are recorded by `metrics-exporter-prometheus` and served over HTTP;
//! the queue depths are set by `Store::blocking_report_metrics` once a second.
//!
//! ```text
//! cargo run --release --example prometheus                      # 10 s, on 127.0.0.1:9000
//! cargo run --release --example prometheus -- --seconds 60 --listen 127.0.0.1:9100
//! curl -s http://127.0.0.1:9000/metrics | grep '^reliable_queue'  # while it runs
//! ```
//!
//! A Prometheus scrape configuration for it:
//!
//! ```text
//! scrape_configs:
//!   - job_name: reliable-queue-example
//!     scrape_interval: 5s
//!     static_configs:
//!       - targets: ["127.0.0.1:9000"]
//! ```
//!
//! It stops by itself after `--seconds`, closes the store and prints the store's metrics as a
//! scrape would show them (histogram buckets left out). The store is in a temporary
//! directory unless `--dir` names one.

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rand::Rng;
use reliable_queue::{metrics as m, Failed, ReliableConcurrentQueue, RetryPolicy, Store};

type BoxError = Box<dyn Error + Send + Sync>;

/// A worker pool on a durable queue, its metrics served on a Prometheus endpoint.
#[derive(Parser, Debug)]
struct Args {
    /// Address of the metrics endpoint (`GET /metrics`, or any path).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Seconds to run before stopping.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Directory of the store (default: a temporary directory, deleted at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Producer threads.
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Consumer threads.
    #[arg(long, default_value_t = 8)]
    consumers: u32,
    /// Jobs produced per second, all producers together.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Fraction of processing attempts that fail (`Lease::fail`).
    #[arg(long, default_value_t = 0.1)]
    failure_rate: f64,
    /// Fraction of attempts whose consumer stalls past the lease, which then expires.
    #[arg(long, default_value_t = 0.002)]
    stall_rate: f64,
    /// Lease time, in milliseconds.
    #[arg(long, default_value_t = 200)]
    lease_ms: u64,
}

/// Attempts before a job moves to the dead letters.
const MAX_ATTEMPTS: u32 = 3;

/// Jobs a producer enqueues per transaction.
const BATCH: u64 = 10;

/// What the pool did, as the threads saw it (the store's metrics say the same from inside).
#[derive(Default)]
struct Counts {
    enqueued: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    stalled: AtomicU64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    if args.producers == 0 || args.consumers == 0 || args.rate == 0 || args.lease_ms == 0 {
        return Err("--producers, --consumers, --rate and --lease-ms must be at least 1".into());
    }
    if !(0.0..1.0).contains(&args.failure_rate) || !(0.0..1.0).contains(&args.stall_rate) {
        return Err("--failure-rate and --stall-rate must be in [0, 1)".into());
    }
    let handle = serve_metrics(args.listen)?;

    let temp;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().join("store")
        }
    };
    let store = Store::open(&dir)?;
    let jobs = store.blocking_queue::<u64>("jobs")?;
    jobs.blocking_set_retry_policy(
        RetryPolicy::default()
            .max_attempts(MAX_ATTEMPTS)
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(100)),
    )?;
    println!(
        "store {}; metrics on http://{}/metrics for {} s: {} producers ({} jobs/s), {} consumers, \
         {:.0}% of attempts fail, {:.1}% stall past their {} ms lease; dead letters after {} \
         attempts",
        dir.display(),
        args.listen,
        args.seconds,
        args.producers,
        args.rate,
        args.consumers,
        args.failure_rate * 100.0,
        args.stall_rate * 100.0,
        args.lease_ms,
        MAX_ATTEMPTS,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let mut threads = Vec::new();
    for n in 0..args.producers {
        let (store, jobs, stop, counts) =
            (store.clone(), jobs.clone(), stop.clone(), counts.clone());
        let per_second = (args.rate / u64::from(args.producers)).max(1);
        threads.push(spawn(format!("producer-{n}"), move || {
            produce(&store, &jobs, &stop, &counts, per_second)
        })?);
    }
    for n in 0..args.consumers {
        let (jobs, stop, counts) = (jobs.clone(), stop.clone(), counts.clone());
        let settings = Settings {
            failure_rate: args.failure_rate,
            stall_rate: args.stall_rate,
            lease: Duration::from_millis(args.lease_ms),
        };
        threads.push(spawn(format!("consumer-{n}"), move || {
            consume(&jobs, &stop, &counts, &settings)
        })?);
    }

    // Once a second: the depth gauges, and a line of progress.
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let mut next = start;
    while Instant::now() < end && !threads.iter().any(JoinHandle::is_finished) {
        store.blocking_report_metrics()?;
        let stats = jobs.blocking_stats()?;
        println!(
            "{:>3} s: enqueued {:>6}, completed {:>6}, failed {:>5}, stalled {:>3} | \
             visible {:>5}, delayed {:>4}, leased {:>3}, dead {:>4}",
            start.elapsed().as_secs(),
            counts.enqueued.load(Ordering::Relaxed),
            counts.completed.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
            counts.stalled.load(Ordering::Relaxed),
            stats.visible,
            stats.delayed,
            stats.leased,
            stats.dead,
        );
        next += Duration::from_secs(1);
        thread::sleep(next.min(end).saturating_duration_since(Instant::now()));
    }

    // Stop: producers finish their transaction; closing the store wakes the consumers
    // waiting in `blocking_lease` with `Error::Closed`.
    stop.store(true, Ordering::Release);
    store.blocking_report_metrics()?;
    let closed = store.blocking_close();
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| "a worker thread panicked".into());
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    closed?;

    println!("\nthe store's metrics, as the last scrape would see them (buckets left out):");
    for line in handle.render().lines() {
        if line.starts_with("reliable_queue_") && !line.contains("_bucket{") {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Installs the Prometheus recorder, serving on `listen` from a runtime thread of its own,
/// with histogram buckets fit for the store's metrics.
fn serve_metrics(listen: SocketAddr) -> Result<PrometheusHandle, BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (recorder, exporter) = {
        let _entered = runtime.enter();
        PrometheusBuilder::new()
            .with_http_listener(listen)
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".to_owned()),
                &[
                    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0,
                ],
            )?
            .set_buckets_for_metric(
                Matcher::Full(m::GROUP_SIZE.to_owned()),
                &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
            )?
            .set_buckets_for_metric(
                Matcher::Full(m::GROUP_BYTES.to_owned()),
                &[
                    256.0,
                    1024.0,
                    4096.0,
                    16384.0,
                    65536.0,
                    262_144.0,
                    1_048_576.0,
                ],
            )?
            .build()?
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    m::describe();
    thread::Builder::new()
        .name("metrics-endpoint".into())
        .spawn(move || runtime.block_on(exporter))?;
    Ok(handle)
}

/// Enqueues `per_second` jobs a second, [`BATCH`] per transaction, until `stop`.
fn produce(
    store: &Store,
    jobs: &ReliableConcurrentQueue<u64>,
    stop: &AtomicBool,
    counts: &Counts,
    per_second: u64,
) -> Result<(), BoxError> {
    let start = Instant::now();
    let mut produced = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut tx = store.begin();
        let committed = (produced..produced + BATCH)
            .try_for_each(|i| jobs.enqueue(&mut tx, i))
            .and_then(|()| tx.blocking_commit());
        match committed {
            Ok(()) => {}
            // Stopping: the store closed under this transaction.
            Err(reliable_queue::Error::Closed) if stop.load(Ordering::Acquire) => break,
            Err(e) => return Err(e.into()),
        }
        produced += BATCH;
        counts.enqueued.fetch_add(BATCH, Ordering::Relaxed);
        // Pace to the rate: the time this many jobs are due by.
        let due = Duration::from_secs_f64(produced as f64 / per_second as f64);
        thread::sleep(due.saturating_sub(start.elapsed()));
    }
    Ok(())
}

/// How a consumer behaves.
struct Settings {
    failure_rate: f64,
    stall_rate: f64,
    lease: Duration,
}

/// Leases jobs until the store closes: completes most, fails some, stalls on a few.
fn consume(
    jobs: &ReliableConcurrentQueue<u64>,
    stop: &AtomicBool,
    counts: &Counts,
    settings: &Settings,
) -> Result<(), BoxError> {
    let mut rng = rand::thread_rng();
    loop {
        let lease = match jobs.blocking_lease(settings.lease) {
            Ok(lease) => lease,
            Err(reliable_queue::Error::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        // Work: a few hundred microseconds.
        thread::sleep(Duration::from_micros(rng.gen_range(100..500)));
        let settled = if rng.gen_bool(settings.stall_rate) {
            // A consumer that hangs: its lease runs out, and the job is another's.
            counts.stalled.fetch_add(1, Ordering::Relaxed);
            thread::sleep(settings.lease + Duration::from_millis(50));
            lease.blocking_complete().map(drop)
        } else if rng.gen_bool(settings.failure_rate) {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            lease.blocking_fail("simulated failure").map(|_: Failed| ())
        } else {
            lease.blocking_complete().map(|()| {
                counts.completed.fetch_add(1, Ordering::Relaxed);
            })
        };
        match settled {
            Ok(()) | Err(reliable_queue::Error::LeaseExpired { .. }) => {}
            Err(reliable_queue::Error::Closed) => return Ok(()),
            Err(_) if stop.load(Ordering::Acquire) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

fn spawn(
    name: String,
    f: impl FnOnce() -> Result<(), BoxError> + Send + 'static,
) -> Result<JoinHandle<Result<(), BoxError>>, BoxError> {
    Ok(thread::Builder::new().name(name).spawn(f)?)
}
