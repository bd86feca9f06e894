//! In memory: the cost of the queue itself, with no storage behind it.
//!
//! Workloads (100-byte items; one iteration = one round trip of `batch` items):
//! - `inmemory/1-item-tx/{1,4}-threads`: each thread loops over enqueue one item + commit,
//!   then dequeue one item + commit.
//! - `inmemory/64-item-tx/{1,4}-threads`: each thread loops over 64 enqueues + commit, then
//!   64 dequeues + commit.
//! - `inmemory/1-item-tx-vec/1-threads`: the `1-item-tx/1-threads` workload with
//!   `reliable-queue` storing plain `Vec<u8>` items instead of the `Payload` byte-string
//!   wrapper, against `persistent-queue` over its `MemStore` (whose items are plain bytes in
//!   every group): the ratio for plain `Vec<u8>` items.
//! - `inmemory/1-item-tx-struct/1-threads`: the same with a small serde struct (`Job`: an id,
//!   a timestamp, a 24-letter name) as the item, against `persistent-queue`'s `MemStore`
//!   storing the struct encoded with postcard (encoded at each push, decoded at each reserve).
//!
//! Peers: `reliable-queue` (`Store::in_memory()`), crossbeam's `SegQueue`, a
//! `parking_lot::Mutex<VecDeque>`, `persistent-queue` over its `MemStore`. How each maps
//! "transaction" onto its API is documented in `common/mod.rs`. A fresh queue per sample.

use std::path::Path;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};

#[path = "common/mod.rs"]
mod common;

use common::{
    round_trips, Job, MutexDequePeer, Ours, OursOf, Peer, Pq, PqJob, Queue, SegQueuePeer,
};

fn run<P: Peer>(group: &mut BenchmarkGroup<'_, WallTime>, peer: &P, threads: usize, batch: usize) {
    group.bench_function(peer.name(), |b| {
        b.iter_custom(|rounds| {
            let queue = peer.open(Path::new("in-memory"));
            let elapsed = round_trips(&queue, threads, batch, rounds);
            assert_eq!(queue.len(), 0, "{}: every item came back out", peer.name());
            elapsed
        })
    });
}

fn inmemory(c: &mut Criterion) {
    for batch in [1, 64] {
        for threads in [1, 4] {
            let mut group =
                c.benchmark_group(format!("inmemory/{batch}-item-tx/{threads}-threads"));
            group.throughput(Throughput::Elements(batch as u64));
            run(&mut group, &Ours::MEMORY, threads, batch);
            run(&mut group, &SegQueuePeer, threads, batch);
            run(&mut group, &MutexDequePeer, threads, batch);
            run(&mut group, &Pq::MEMORY, threads, batch);
            group.finish();
        }
    }
    // Plain `Vec<u8>` items: reliable-queue against persistent-queue alone.
    let (batch, threads) = (1, 1);
    let mut group = c.benchmark_group(format!("inmemory/{batch}-item-tx-vec/{threads}-threads"));
    group.throughput(Throughput::Elements(batch as u64));
    run(&mut group, &OursOf::<Vec<u8>>::MEMORY, threads, batch);
    run(&mut group, &Pq::MEMORY, threads, batch);
    group.finish();
    // A small serde struct: reliable-queue against persistent-queue storing it encoded.
    let mut group = c.benchmark_group(format!("inmemory/{batch}-item-tx-struct/{threads}-threads"));
    group.throughput(Throughput::Elements(batch as u64));
    run(&mut group, &OursOf::<Job>::MEMORY, threads, batch);
    run(&mut group, &PqJob, threads, batch);
    group.finish();
}

fn main() {
    // Settings here are defaults: command-line options (`--sample-size`, `--measurement-time`,
    // `--warm-up-time`, `--quick`) override them.
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    inmemory(&mut criterion);
    criterion.final_summary();
}
