//! Dequeue under contention: how throughput holds up as consumer threads grow.
//!
//! Workload: the queue is pre-filled (not timed) with as many `u64` items as criterion asks
//! for; then `consumers` threads, released together by a barrier, each loop over "begin,
//! `blocking_try_dequeue` one item, `blocking_commit`" until the queue is empty. No producer
//! runs during the measurement, so the figure is the dequeue side alone: the queue lock and
//! the staging path for `try_dequeue`, plus, on disk, the commit path (group commit:
//! concurrent one-item commits share one log write and one fsync). Throughput counts committed
//! dequeues; the clock runs from the barrier to the last consumer's exit.
//!
//! Stores: `memory` (`Store::in_memory()`: a commit applies in the caller's thread) and
//! `disk-sync` (a fresh temporary directory per sample, `Durability::Sync`: every commit is
//! fsync'd before it returns). Consumers: 1, 2, 8 and 64 threads, whatever the core count.
//!
//! Run with `cargo bench --bench contention`; criterion's options (`--sample-size`,
//! `--measurement-time`, a filter such as `disk-sync`) override the defaults in `main`.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use reliable_queue::{Durability, ReliableConcurrentQueue, Store};

type Queue = ReliableConcurrentQueue<u64>;

/// Consumer thread counts measured.
const CONSUMERS: [usize; 4] = [1, 2, 8, 64];
/// Items per transaction when pre-filling.
const FILL_BATCH: u64 = 4096;

/// Where a sample's store lives.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    DiskSync,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::DiskSync => "disk-sync",
        }
    }

    /// A fresh store, and the directory to delete once it is closed.
    fn open(self) -> (Store, Option<tempfile::TempDir>) {
        match self {
            Kind::Memory => (Store::in_memory().expect("in-memory store"), None),
            Kind::DiskSync => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let store = Store::builder()
                    .path(dir.path().join("store"))
                    .durability(Durability::Sync)
                    .open()
                    .expect("open the store");
                (store, Some(dir))
            }
        }
    }
}

/// Enqueues `items` items, committed in batches.
fn fill(store: &Store, q: &Queue, items: u64) {
    let mut next = 0;
    while next < items {
        let mut tx = store.begin();
        let end = (next + FILL_BATCH).min(items);
        for item in next..end {
            q.enqueue(&mut tx, item).expect("enqueue");
        }
        tx.blocking_commit().expect("commit the fill");
        next = end;
    }
}

/// One consumer: one-item transactions until the queue is empty. Returns the items taken.
fn consume(store: &Store, q: &Queue) -> u64 {
    let mut taken = 0;
    loop {
        let mut tx = store.begin();
        match q.blocking_try_dequeue(&mut tx).expect("try_dequeue") {
            Some(_) => {
                tx.blocking_commit().expect("commit the dequeue");
                taken += 1;
            }
            // No producer runs and nobody aborts: empty now means empty for good.
            None => return taken,
        }
    }
}

/// Drains `items` pre-filled items with `consumers` threads; returns the time it took.
fn sample(kind: Kind, consumers: usize, items: u64) -> Duration {
    let (store, dir) = kind.open();
    let q = store
        .blocking_queue::<u64>("contention")
        .expect("open the queue");
    fill(&store, &q, items);
    let start = Arc::new(Barrier::new(consumers + 1));
    let threads: Vec<_> = (0..consumers)
        .map(|_| {
            let (store, q, start) = (store.clone(), q.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                consume(&store, &q)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    let taken: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("consumer thread"))
        .sum();
    let elapsed = began.elapsed();
    assert_eq!(taken, items, "every item dequeued exactly once");
    assert_eq!(q.blocking_count().expect("count"), 0);
    drop((q, store, dir));
    elapsed
}

fn contention(c: &mut Criterion) {
    for kind in [Kind::Memory, Kind::DiskSync] {
        let mut group = c.benchmark_group(format!("contention/{}", kind.name()));
        group.throughput(Throughput::Elements(1));
        group.sampling_mode(SamplingMode::Flat);
        for consumers in CONSUMERS {
            group.bench_with_input(
                BenchmarkId::new("consumers", consumers),
                &consumers,
                |b, &consumers| b.iter_custom(|items| sample(kind, consumers, items)),
            );
        }
        group.finish();
    }
}

fn main() {
    // Defaults sized so the whole bench takes a few minutes; command-line options override.
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    contention(&mut criterion);
    criterion.final_summary();
}
