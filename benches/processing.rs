//! The processing layer's leases against the plain dequeue they are built on, side by side in
//! the same run.
//!
//! Workloads (100-byte items; throughput counts items that were enqueued and then taken and
//! completed):
//! - `processing/16p-16c/1-item-tx`, on disk (`Durability::Sync`, the default), mirroring
//!   `durable/16p-16c/1-item-tx`: 16 producer threads commit one-item enqueue transactions, 16
//!   consumer threads take one item at a time. `dequeue-commit`: `begin`, `blocking_try_dequeue`
//!   (else `blocking_dequeue`), `blocking_commit` (one durable write per item).
//!   `lease-complete`: `blocking_lease(ttl)`, then `Lease::blocking_complete` (the ack in a
//!   transaction of its own, committed): two durable writes per item, the attempt and the ack.
//! - `processing/4p-4c/up-to-16`, on disk: 4 producer threads commit 16-item enqueue
//!   transactions, 4 consumer threads take up to 16 items at a time: wait for the first, then
//!   take what else is visible. `dequeue-commit`: `begin`, `blocking_dequeue` (or
//!   `blocking_try_dequeue`), up to 15 × `blocking_try_dequeue`, `blocking_commit`.
//!   `lease-many-ack`: `blocking_lease_many(16, ttl)`, then `begin`, `Lease::ack` for each,
//!   `blocking_commit`: two durable writes per batch, the attempts and the acks.
//!   `lease-chained`: the batch consumer's loop on `blocking_commit_and_lease`: `begin`,
//!   `Lease::ack` for each lease of the batch, then `blocking_commit_and_lease(tx, 16, ttl)`
//!   commits the acks and leases the next batch (what is visible) in one durable write; only
//!   when it leases nothing does the consumer wait in `blocking_lease_many`. After the group,
//!   the mean number of items per consumer call is printed for each side (each side gets what
//!   is visible, so their batches may differ).
//! - `processing/memory/1-thread`, in memory: one thread loops over enqueue one item + commit,
//!   then `dequeue-commit` (one item) or `lease-complete`.
//!
//! The lease time is 60 s: no lease expires during a run. A fresh store in a fresh directory
//! for every sample; opening and closing it are not timed. Stores are created under
//! `$RQ_BENCH_DIR` (default: the system temporary directory), which must be on the disk being
//! measured.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use reliable_queue::{Durability, Lease, ReliableConcurrentQueue, Store};

#[path = "common/mod.rs"]
mod common;

use common::{fresh_dir, item, pipeline, round_trips, Payload};

/// Lease time: long enough that no lease expires during a run.
const TTL: Duration = Duration::from_secs(60);

/// How a consumer takes its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// A transaction: dequeue, commit.
    Dequeue,
    /// A lease, then its completion.
    Lease,
    /// Batches of leases, each batch's acks committed with the next batch's attempts.
    Chain,
}

/// A `reliable-queue` store with one queue of [`Payload`]s, and how its consumers take items.
#[derive(Debug, Clone, Copy)]
struct Peer {
    /// `None`: `Store::in_memory()`.
    durability: Option<Durability>,
    take: Take,
}

impl Peer {
    const fn new(durability: Option<Durability>, take: Take) -> Peer {
        Peer { durability, take }
    }
}

#[derive(Debug, Clone)]
struct Open {
    store: Store,
    queue: ReliableConcurrentQueue<Payload>,
    take: Take,
}

impl common::Peer for Peer {
    type Queue = Open;
    fn name(&self) -> &'static str {
        match self.take {
            Take::Dequeue => "dequeue-commit",
            Take::Lease => "lease-complete",
            Take::Chain => "lease-chained",
        }
    }
    fn open(&self, dir: &Path) -> Open {
        let store = match self.durability {
            None => Store::in_memory(),
            Some(durability) => Store::builder().path(dir).durability(durability).open(),
        }
        .expect("open reliable-queue store");
        let queue = store.blocking_queue("bench").expect("open queue");
        Open {
            store,
            queue,
            take: self.take,
        }
    }
}

impl common::Queue for Open {
    type Producer = Open;
    type Consumer = Open;
    fn producer(&self) -> Open {
        self.clone()
    }
    fn consumer(&self) -> Open {
        self.clone()
    }
    fn len(&self) -> u64 {
        let stats = self.queue.blocking_stats().expect("stats");
        stats.visible + stats.delayed + stats.leased + stats.held
    }
}

impl common::Producer for Open {
    fn send(&mut self, item: &[u8], n: usize) {
        let mut tx = self.store.begin();
        for _ in 0..n {
            self.queue
                .enqueue(&mut tx, Payload(item.to_vec()))
                .expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
    }
}

impl common::Consumer for Open {
    /// Takes exactly `n` items (the workloads here call it with 1).
    fn recv(&mut self, n: usize) {
        let mut left = n;
        while left > 0 {
            left -= self.take_up_to(left);
        }
    }
}

impl Open {
    /// Takes at least one and at most `n` items, waiting for the first and taking what else
    /// is visible, and completes them; returns how many it took.
    fn take_up_to(&self, n: usize) -> usize {
        match self.take {
            Take::Dequeue => {
                let mut tx = self.store.begin();
                let first = match self.queue.blocking_try_dequeue(&mut tx).expect("dequeue") {
                    Some(item) => item,
                    None => self.queue.blocking_dequeue(&mut tx).expect("dequeue"),
                };
                std::hint::black_box(first);
                let mut taken = 1;
                while taken < n {
                    match self.queue.blocking_try_dequeue(&mut tx).expect("dequeue") {
                        Some(item) => std::hint::black_box(item),
                        None => break,
                    };
                    taken += 1;
                }
                tx.blocking_commit().expect("commit");
                taken
            }
            Take::Lease if n == 1 => {
                let lease = self.queue.blocking_lease(TTL).expect("lease");
                std::hint::black_box(lease.item());
                lease.blocking_complete().expect("complete");
                1
            }
            Take::Lease | Take::Chain => {
                let leases = self.queue.blocking_lease_many(n, TTL).expect("lease_many");
                let taken = leases.len();
                let mut tx = self.store.begin();
                for lease in leases {
                    std::hint::black_box(lease.item());
                    lease.ack(&mut tx).expect("ack");
                }
                tx.blocking_commit().expect("commit");
                taken
            }
        }
    }
}

/// Items and calls of the consumers of the `up-to-n` workload, per side, in `Take` order.
static TAKEN: [(AtomicU64, AtomicU64); 3] = [
    (AtomicU64::new(0), AtomicU64::new(0)),
    (AtomicU64::new(0), AtomicU64::new(0)),
    (AtomicU64::new(0), AtomicU64::new(0)),
];

/// The `Take::Chain` consumer of [`pipeline_up_to`]: reserves up to `up_to` items from `left`
/// before each call (as the other sides do), returns what it did not get. Returns its items
/// and calls.
fn chained_consumer(consumer: &Open, left: &AtomicU64, up_to: usize) -> (u64, u64) {
    let (mut items, mut calls) = (0, 0);
    let mut held: Vec<Lease<Payload>> = Vec::new();
    let reserve = |left: u64| (left > 0).then(|| left - left.min(up_to as u64));
    loop {
        let reserved = left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, reserve)
            .map_or(0, |before| before.min(up_to as u64) as usize);
        if held.is_empty() {
            if reserved == 0 {
                return (items, calls);
            }
            held = consumer
                .queue
                .blocking_lease_many(reserved, TTL)
                .expect("lease_many");
        } else {
            let mut tx = consumer.store.begin();
            for lease in held.drain(..) {
                std::hint::black_box(lease.item());
                lease.ack(&mut tx).expect("ack");
            }
            if reserved == 0 {
                tx.blocking_commit().expect("commit");
                continue;
            }
            held = consumer
                .queue
                .blocking_commit_and_lease(tx, reserved, TTL)
                .expect("commit_and_lease");
        }
        left.fetch_add((reserved - held.len()) as u64, Ordering::Relaxed);
        items += held.len() as u64;
        calls += 1;
    }
}

/// `producers` threads commit `txs` transactions of `batch` enqueues in all; `consumers`
/// threads take up to `up_to` items at a time (waiting for the first, then what else is
/// visible) until every item is taken. Each consumer reserves what it may take from a shared
/// count of items not yet taken before it waits, so no consumer waits for an item that another
/// will take, and the run ends when every item has been enqueued and taken. Returns the time
/// from the start until the last thread finishes.
fn pipeline_up_to(
    queue: &Open,
    producers: usize,
    consumers: usize,
    batch: usize,
    up_to: usize,
    txs: u64,
) -> Duration {
    let item = item();
    let left = Arc::new(AtomicU64::new(txs * batch as u64));
    let start = Arc::new(Barrier::new(producers + consumers + 1));
    let mut handles = Vec::new();
    for i in 0..producers {
        let mut producer = queue.clone();
        let item = item.clone();
        let start = start.clone();
        let mine = txs / producers as u64 + u64::from((i as u64) < txs % producers as u64);
        handles.push(thread::spawn(move || {
            start.wait();
            for _ in 0..mine {
                common::Producer::send(&mut producer, &item, batch);
            }
        }));
    }
    for _ in 0..consumers {
        let consumer = queue.clone();
        let left = left.clone();
        let start = start.clone();
        handles.push(thread::spawn(move || {
            let (mut items, mut calls) = (0, 0);
            start.wait();
            let reserve = |left: u64| (left > 0).then(|| left - left.min(up_to as u64));
            if consumer.take == Take::Chain {
                (items, calls) = chained_consumer(&consumer, &left, up_to);
            }
            while let Ok(before) = left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, reserve)
            {
                let reserved = before.min(up_to as u64) as usize;
                let taken = consumer.take_up_to(reserved);
                left.fetch_add((reserved - taken) as u64, Ordering::Relaxed);
                items += taken as u64;
                calls += 1;
            }
            let side = &TAKEN[consumer.take as usize];
            side.0.fetch_add(items, Ordering::Relaxed);
            side.1.fetch_add(calls, Ordering::Relaxed);
        }));
    }
    start.wait();
    let began = Instant::now();
    for handle in handles {
        handle.join().expect("bench thread panicked");
    }
    began.elapsed()
}

fn one_at_a_time(group: &mut BenchmarkGroup<'_, WallTime>, peer: Peer, producers: usize) {
    use common::{Peer as _, Queue as _};
    let consumers = 16;
    group.bench_function(peer.name(), |b| {
        b.iter_custom(|txs| {
            let dir = fresh_dir();
            let queue = peer.open(dir.path());
            let elapsed = pipeline(&queue, producers, consumers, 1, txs);
            assert_eq!(queue.len(), 0, "{}: every item came back out", peer.name());
            elapsed
        })
    });
}

fn batches(group: &mut BenchmarkGroup<'_, WallTime>, peer: Peer, threads: usize, n: usize) {
    use common::{Peer as _, Queue as _};
    let name = match peer.take {
        Take::Dequeue => "dequeue-commit",
        Take::Lease => "lease-many-ack",
        Take::Chain => "lease-chained",
    };
    group.bench_function(name, |b| {
        b.iter_custom(|txs| {
            let dir = fresh_dir();
            let queue = peer.open(dir.path());
            let elapsed = pipeline_up_to(&queue, threads, threads, n, n, txs);
            assert_eq!(queue.len(), 0, "{name}: every item came back out");
            elapsed
        })
    });
}

fn in_memory(group: &mut BenchmarkGroup<'_, WallTime>, peer: Peer) {
    use common::{Peer as _, Queue as _};
    group.bench_function(peer.name(), |b| {
        b.iter_custom(|rounds| {
            let queue = peer.open(Path::new("in-memory"));
            let elapsed = round_trips(&queue, 1, 1, rounds);
            assert_eq!(queue.len(), 0, "{}: every item came back out", peer.name());
            elapsed
        })
    });
}

fn processing(c: &mut Criterion) {
    let disk = Some(Durability::Sync);

    let mut group = c.benchmark_group("processing/16p-16c/1-item-tx");
    group.throughput(Throughput::Elements(1));
    group.sampling_mode(SamplingMode::Flat);
    one_at_a_time(&mut group, Peer::new(disk, Take::Dequeue), 16);
    one_at_a_time(&mut group, Peer::new(disk, Take::Lease), 16);
    group.finish();

    let n = 16;
    let mut group = c.benchmark_group(format!("processing/4p-4c/up-to-{n}"));
    group.throughput(Throughput::Elements(n as u64));
    group.sampling_mode(SamplingMode::Flat);
    batches(&mut group, Peer::new(disk, Take::Dequeue), 4, n);
    batches(&mut group, Peer::new(disk, Take::Lease), 4, n);
    batches(&mut group, Peer::new(disk, Take::Chain), 4, n);
    group.finish();
    let sides = ["dequeue-commit", "lease-many-ack", "lease-chained"];
    for (side, (items, calls)) in sides.iter().zip(&TAKEN) {
        let (items, calls) = (items.load(Ordering::Relaxed), calls.load(Ordering::Relaxed));
        if calls > 0 {
            println!(
                "processing/4p-4c/up-to-{n}/{side}: {:.2} items per consumer call ({items} items, {calls} calls)",
                items as f64 / calls as f64
            );
        }
    }

    let mut group = c.benchmark_group("processing/memory/1-thread");
    group.throughput(Throughput::Elements(1));
    in_memory(&mut group, Peer::new(None, Take::Dequeue));
    in_memory(&mut group, Peer::new(None, Take::Lease));
    group.finish();
}

fn main() {
    // Settings here are defaults: command-line options (`--sample-size`, `--measurement-time`,
    // `--warm-up-time`, `--quick`) override them.
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    processing(&mut criterion);
    criterion.final_summary();
}
