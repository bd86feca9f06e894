//! Delayed items on disk with the real clock: how late consumers get them, and what an idle
//! store with delayed items costs in CPU. A plain program (no criterion) that prints its
//! figures.
//!
//! **Lateness.** A fresh on-disk store (`Durability::Sync`, the default), consumer threads
//! waiting on an empty queue, then `RQ_BENCH_DELAYED_ITEMS` items (default 10,000) enqueued
//! with `enqueue_at` in 10 transactions, in random order, their due times spread evenly over
//! 4 s starting 1 s after the enqueues begin. Each item is its own due time (milliseconds since
//! the Unix epoch). Lateness = the wall-clock time when the consumer has the item minus its
//! due time. Run twice, with 4 consumer threads each:
//! - `dequeue`: `begin`, `blocking_dequeue` (the time is read when it returns), `blocking_commit`;
//! - `lease`: `blocking_lease(60 s)` (the time is read when it returns, so after the durable
//!   write of the attempt), `blocking_complete`.
//!
//! A consumer that is committing is not waiting, so lateness includes the wait for a free
//! consumer as well as the timer thread's wake-up and the hand-over. Each run prints two
//! distributions: `all` items, and `consumer-waiting`: the items whose consumer was already
//! waiting (it called `blocking_dequeue` or `blocking_lease` before the due time), which leaves
//! out the wait for a free consumer. The store's clock counts whole milliseconds from the wall
//! clock read at open, so up to 1 ms of every figure can be that rounding.
//!
//! **Idle CPU.** A fresh on-disk store with 2 consumer threads waiting in `blocking_dequeue`:
//! first with nothing in it, then with 10,000 items due in 60 s. For each, after 0.5 s to
//! settle, the process's CPU time over 2 s of sleep: `utime + stime` from `/proc/self/stat`
//! (clock ticks, 10 ms each here), the sum of every thread's run time from
//! `/proc/self/task/*/schedstat` (nanoseconds), and the threads' context switches.
//!
//! Stores are created under `$RQ_BENCH_DIR` (default: the system temporary directory).
//!
//! Command: `cargo bench --bench delayed`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use reliable_queue::{Durability, ReliableConcurrentQueue, Store};

#[path = "common/mod.rs"]
mod common;

/// Lease time of the `lease` consumers: no lease expires during a run.
const TTL: Duration = Duration::from_secs(60);
/// The first item is due this long after the enqueues begin.
const LEAD: Duration = Duration::from_secs(1);
/// Due times spread over this long.
const SPREAD: Duration = Duration::from_secs(4);
/// Enqueue transactions.
const TRANSACTIONS: usize = 10;
/// Consumer threads of the lateness runs.
const CONSUMERS: usize = 4;
/// Marks the end for the consumers of the idle measurement.
const STOP: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    Dequeue,
    Lease,
}

fn open(dir: &std::path::Path) -> (Store, ReliableConcurrentQueue<u64>) {
    let store = Store::builder()
        .path(dir)
        .durability(Durability::Sync)
        .open()
        .expect("open store");
    let queue = store.blocking_queue::<u64>("delayed").expect("open queue");
    (store, queue)
}

fn now_ms() -> u64 {
    millis(SystemTime::now())
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// One lateness run; prints its figures.
fn lateness(take: Take, items: usize) {
    let dir = common::fresh_dir();
    let (store, queue) = open(dir.path());
    let left = Arc::new(AtomicU64::new(items as u64));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (store, queue, left) = (store.clone(), queue.clone(), left.clone());
            thread::spawn(move || {
                let mut late = Vec::new();
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let waiting_since = SystemTime::now();
                    let (due, taken) = match take {
                        Take::Dequeue => {
                            let mut tx = store.begin();
                            let due = queue.blocking_dequeue(&mut tx).expect("dequeue");
                            let taken = SystemTime::now();
                            tx.blocking_commit().expect("commit");
                            (due, taken)
                        }
                        Take::Lease => {
                            let lease = queue.blocking_lease(TTL).expect("lease");
                            let taken = SystemTime::now();
                            let due = *lease.item();
                            lease.blocking_complete().expect("complete");
                            (due, taken)
                        }
                    };
                    let due_us = due as i64 * 1000;
                    late.push((micros(taken) - due_us, micros(waiting_since) <= due_us));
                }
                late
            })
        })
        .collect();

    // Due times: whole milliseconds, spread evenly, enqueued in random order.
    let began = Instant::now();
    let first = now_ms() + LEAD.as_millis() as u64;
    let spread = SPREAD.as_millis() as u64;
    let mut dues: Vec<u64> = (0..items as u64)
        .map(|i| first + i * spread / items as u64)
        .collect();
    dues.shuffle(&mut rand::rngs::StdRng::seed_from_u64(10));
    for chunk in dues.chunks(items.div_ceil(TRANSACTIONS)) {
        let mut tx = store.begin();
        for &due in chunk {
            let at = UNIX_EPOCH + Duration::from_millis(due);
            queue.enqueue_at(&mut tx, due, at).expect("enqueue_at");
        }
        tx.blocking_commit().expect("commit");
    }
    let enqueued = began.elapsed();
    let ahead = first as i64 - now_ms() as i64;
    assert!(
        ahead > 0,
        "the enqueues took longer than the lead of {LEAD:?}"
    );

    let late: Vec<(i64, bool)> = consumers
        .into_iter()
        .flat_map(|c| c.join().expect("consumer panicked"))
        .collect();
    let total = began.elapsed();
    let name = match take {
        Take::Dequeue => "dequeue",
        Take::Lease => "lease",
    };
    println!(
        "delayed/lateness/{name}: {} items, {CONSUMERS} consumers; enqueued in {:.0} ms \
         ({TRANSACTIONS} transactions, {ahead} ms before the first due time), all taken {:.2} s \
         after the first enqueue",
        late.len(),
        enqueued.as_secs_f64() * 1000.0,
        total.as_secs_f64(),
    );
    let all: Vec<i64> = late.iter().map(|&(us, _)| us).collect();
    print_lateness(&format!("{name}/all"), all);
    let waited: Vec<i64> = late.iter().filter(|l| l.1).map(|&(us, _)| us).collect();
    print_lateness(&format!("{name}/consumer-waiting"), waited);
    assert_eq!(queue.blocking_count().expect("count"), 0);
    store.blocking_close().expect("close");
}

/// Prints the distribution of `late` (microseconds).
fn print_lateness(label: &str, mut late: Vec<i64>) {
    if late.is_empty() {
        println!("delayed/lateness/{label}: no items");
        return;
    }
    late.sort_unstable();
    let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    let ms = |us: i64| us as f64 / 1000.0;
    println!(
        "delayed/lateness/{label}: {} items: min {:.2} ms, p50 {:.2} ms, p90 {:.2} ms, \
         p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms; over 10 ms: {}",
        late.len(),
        ms(late[0]),
        ms(at(0.50)),
        ms(at(0.90)),
        ms(at(0.99)),
        ms(at(0.999)),
        ms(late[late.len() - 1]),
        late.iter().filter(|&&us| us > 10_000).count(),
    );
}

/// CPU use of this process so far.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    /// `utime + stime` of `/proc/self/stat`, in clock ticks.
    ticks: u64,
    /// Sum over the threads of `/proc/self/task/*/schedstat`'s run time, in nanoseconds.
    run_ns: u64,
    /// Sum over the threads of their voluntary and involuntary context switches.
    switches: u64,
    /// Threads.
    threads: usize,
}

fn cpu() -> Cpu {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the command name (which ends with the last ')'): state is field 3, utime
    // field 14, stime field 15.
    let rest: Vec<&str> = stat[stat.rfind(')').expect("a command name") + 1..]
        .split_whitespace()
        .collect();
    let field = |n: usize| rest[n - 3].parse::<u64>().expect("a number");
    let ticks = field(14) + field(15);
    let (mut run_ns, mut switches, mut threads) = (0, 0, 0);
    for task in std::fs::read_dir("/proc/self/task").expect("read /proc/self/task") {
        let path = task.expect("a task").path();
        // A thread that ended meanwhile is skipped.
        if let Ok(s) = std::fs::read_to_string(path.join("schedstat")) {
            run_ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string(path.join("status")) {
            threads += 1;
            switches += s
                .lines()
                .filter(|l| {
                    l.starts_with("voluntary_ctxt_switches")
                        || l.starts_with("nonvoluntary_ctxt_switches")
                })
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    Cpu {
        ticks,
        run_ns,
        switches,
        threads,
    }
}

fn clock_tick_ms() -> f64 {
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    1000.0 / hz
}

/// Sleeps `window` and prints the CPU this process used meanwhile.
fn measure_idle(label: &str, window: Duration, tick_ms: f64) {
    thread::sleep(Duration::from_millis(500));
    let before = cpu();
    thread::sleep(window);
    let after = cpu();
    println!(
        "delayed/idle-cpu/{label}: over {:.1} s: {:.0} ms by /proc/self/stat ({} ticks), \
         {:.3} ms by schedstat, {} context switches, {} threads",
        window.as_secs_f64(),
        (after.ticks - before.ticks) as f64 * tick_ms,
        after.ticks - before.ticks,
        after.run_ns.saturating_sub(before.run_ns) as f64 / 1e6,
        after.switches.saturating_sub(before.switches),
        after.threads,
    );
}

fn idle_cpu(items: usize) {
    let tick_ms = clock_tick_ms();
    let window = Duration::from_secs(2);
    let dir = common::fresh_dir();
    let (store, queue) = open(dir.path());
    let waiting = 2;
    let consumers: Vec<_> = (0..waiting)
        .map(|_| {
            let (store, queue) = (store.clone(), queue.clone());
            thread::spawn(move || loop {
                let mut tx = store.begin();
                let item = queue.blocking_dequeue(&mut tx).expect("dequeue");
                tx.blocking_commit().expect("commit");
                if item == STOP {
                    break;
                }
            })
        })
        .collect();

    measure_idle(
        &format!("empty, {waiting} consumers waiting"),
        window,
        tick_ms,
    );

    let mut tx = store.begin();
    let due = SystemTime::now() + Duration::from_secs(60);
    for _ in 0..items {
        queue.enqueue_at(&mut tx, 0, due).expect("enqueue_at");
    }
    tx.blocking_commit().expect("commit");
    measure_idle(
        &format!("{items} items due in 60 s, {waiting} consumers waiting"),
        window,
        tick_ms,
    );
    let stats = queue.blocking_stats().expect("stats");
    assert_eq!(
        (stats.delayed, stats.visible),
        (items as u64, 0),
        "the items were still delayed"
    );

    let mut tx = store.begin();
    for _ in 0..waiting {
        queue.enqueue(&mut tx, STOP).expect("enqueue");
    }
    tx.blocking_commit().expect("commit");
    for consumer in consumers {
        consumer.join().expect("consumer panicked");
    }
    store.blocking_close().expect("close");
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to choose.
    let items = std::env::var("RQ_BENCH_DELAYED_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    lateness(Take::Dequeue, items);
    lateness(Take::Lease, items);
    idle_cpu(items);
}
