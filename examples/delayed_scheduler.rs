//! A delayed-job scheduler: jobs enqueued now, each to run at its own time over the next few
//! seconds, on an on-disk store, with the real clock.
//!
//! ```text
//! cargo run --release --example delayed_scheduler
//! cargo run --release --example delayed_scheduler -- --jobs 500 --over-ms 3000 --each
//! ```
//!
//! The scheduler enqueues every job at once, in a few transactions, in random order: half
//! with `enqueue_after(delay)`, half with `enqueue_at(time)`. A delayed job is durable like
//! any other (it survives a restart) but invisible until it falls due; then it is appended at
//! the tail of the queue, in due order, and a waiting consumer is woken. One consumer waits in
//! `blocking_lease`, takes each job as it falls due, completes it, and measures how late it
//! got it: from the job's due time (as the store has it: `browse` lists it) to the moment the
//! lease was in its hands (the lease's attempt is written durably first, so this includes one
//! fsync). At the end it prints the lateness percentiles and checks that no job came early and
//! that they came in due order.

use std::collections::HashMap;
use std::error::Error;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{ItemState, Store};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

/// Schedules jobs at spread times and runs each when it falls due, measuring how late.
#[derive(Parser, Debug)]
struct Args {
    /// Jobs to schedule.
    #[arg(long, default_value_t = 200)]
    jobs: u32,
    /// Due times are spread at random over this many milliseconds from now.
    #[arg(long, default_value_t = 4000)]
    over_ms: u64,
    /// Print a line for every job (otherwise for the first 10).
    #[arg(long)]
    each: bool,
}

/// A scheduled job.
#[derive(Serialize, Deserialize, Debug)]
struct Job {
    id: u32,
    /// When it is due, in milliseconds after the scheduler's start.
    due_ms: u64,
    /// Scheduled with `enqueue_at` (else `enqueue_after`).
    at: bool,
}

const LEASE_TTL: Duration = Duration::from_secs(30);

/// The store's clock runs on the monotonic clock from the wall-clock time read at open: a job
/// earlier than this, by the wall clock, counts as early (NTP slewing the wall clock could
/// account for less).
const EARLY_TOLERANCE_MS: f64 = 2.0;

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.jobs == 0 {
        return Err("--jobs must be at least 1".into());
    }
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    let jobs = store.blocking_queue::<Job>("scheduled")?;

    // The start, in whole milliseconds (the store's unit): due times are offsets from it.
    let start = Instant::now();
    let start_wall = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms_since_epoch()?)?);

    // Random due times, enqueued in random order.
    let mut rng = StdRng::seed_from_u64(7);
    let mut schedule: Vec<Job> = (0..args.jobs)
        .map(|id| Job {
            id,
            due_ms: rng.gen_range(100..=args.over_ms.max(100)),
            at: id % 2 == 1,
        })
        .collect();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, rng.gen_range(0..=i));
    }
    for chunk in schedule.chunks(50) {
        let mut tx = store.begin();
        for job in chunk {
            let due = start_wall + Duration::from_millis(job.due_ms);
            if job.at {
                jobs.enqueue_at(&mut tx, job, due)?;
            } else {
                // A delay counts from the store's now (whole milliseconds).
                let delay = due.duration_since(SystemTime::now())?;
                jobs.enqueue_after(&mut tx, job, delay)?;
            }
        }
        tx.blocking_commit()?;
    }
    let stats = jobs.blocking_stats()?;
    println!(
        "scheduled {} jobs over {:.1} s ({} with enqueue_after, {} with enqueue_at) in {:.1} ms: \
         {} delayed, {} visible",
        args.jobs,
        args.over_ms as f64 / 1000.0,
        schedule.iter().filter(|j| !j.at).count(),
        schedule.iter().filter(|j| j.at).count(),
        start.elapsed().as_secs_f64() * 1000.0,
        stats.delayed,
        stats.visible,
    );

    // Browsing lists delayed items with their due times, without taking anything: the due
    // times lateness is measured from. (The store's clock is the wall clock read at open,
    // carried forward by the monotonic clock: over a few seconds the two agree.)
    let mut due: HashMap<u32, SystemTime> = HashMap::new();
    for b in jobs.blocking_browse(None, usize::MAX)? {
        if let ItemState::Delayed { until } = b.state {
            due.insert(b.item.id, until);
        }
    }
    let mut soonest: Vec<_> = due.iter().map(|(&id, &until)| (until, id)).collect();
    soonest.sort();
    let first: Vec<String> = soonest
        .iter()
        .take(3)
        .map(|&(until, id)| format!("job {id} at {}", since(start_wall, until)))
        .collect();
    println!("browse: the first due are {}\n", first.join(", "));

    // The consumer: one lease at a time, as the jobs fall due.
    let mut late_ms = Vec::with_capacity(schedule.len());
    let mut out_of_order = 0;
    let mut last_due = UNIX_EPOCH;
    for n in 0..args.jobs {
        let lease = jobs.blocking_lease(LEASE_TTL)?;
        let now = SystemTime::now();
        let job = lease.item();
        // A job due already when browsed (not expected): the time asked for.
        let due_at = due
            .get(&job.id)
            .copied()
            .unwrap_or(start_wall + Duration::from_millis(job.due_ms));
        let late = match now.duration_since(due_at) {
            Ok(late) => late.as_secs_f64() * 1000.0,
            Err(early) => -early.duration().as_secs_f64() * 1000.0,
        };
        if due_at < last_due {
            out_of_order += 1;
        }
        last_due = last_due.max(due_at);
        if args.each || n < 10 {
            println!(
                "job {:>4} ({:<13}) due {}, leased {}: {late:>6.1} ms late",
                job.id,
                if job.at {
                    "enqueue_at"
                } else {
                    "enqueue_after"
                },
                since(start_wall, due_at),
                since(start_wall, now),
            );
        } else if n == 10 {
            println!("...");
        }
        late_ms.push(late);
        lease.blocking_complete()?;
    }

    late_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| late_ms[((late_ms.len() - 1) as f64 * p).round() as usize];
    // Early by more than the store's clock can differ from the wall clock in a few seconds.
    let early = late_ms.iter().filter(|&&l| l < -EARLY_TOLERANCE_MS).count();
    println!(
        "\n{} jobs run in {:.1} s; lateness from due time to lease in hand: \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (min {:.1} ms)",
        late_ms.len(),
        start.elapsed().as_secs_f64(),
        pct(0.5),
        pct(0.99),
        late_ms[late_ms.len() - 1],
        late_ms[0],
    );
    println!(
        "early (by over {EARLY_TOLERANCE_MS} ms): {early}; out of due order: {out_of_order}; \
         left in the queue: {:?}",
        jobs.blocking_stats()?
    );
    store.blocking_close()?;
    if early > 0 || out_of_order > 0 {
        return Err("a job came early or out of due order".into());
    }
    Ok(())
}

fn ms_since_epoch() -> Result<u128, BoxError> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())
}

/// `t` as seconds after `start`, for display.
fn since(start: SystemTime, t: SystemTime) -> String {
    match t.duration_since(start) {
        Ok(d) => format!("+{:.3}s", d.as_secs_f64()),
        Err(e) => format!("-{:.3}s", e.duration().as_secs_f64()),
    }
}
