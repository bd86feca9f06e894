//! On disk, durable: every commit is on disk (fsync) before it returns, end to end.
//!
//! Workloads (100-byte items; one iteration = `batch` items enqueued and then dequeued, both
//! durably; throughput counts items of completed round trips):
//! - `durable/16p-16c/1-item-tx`: 16 producer threads commit one-item enqueue transactions,
//!   16 consumer threads commit one-item dequeue transactions (waiting for items).
//! - `durable/1024-tasks/1-item-tx`: 1024 tokio tasks on a multi-thread runtime with 2 worker
//!   threads; each task loops over enqueue one item + `commit().await`, then dequeue one
//!   item + `commit().await` (every task both produces and consumes).
//! - `durable/4p-4c/64-item-tx`: 4 producer threads commit 64-item enqueue transactions, 4
//!   consumer threads commit 64-item dequeue transactions.
//! - `buffered/16p-16c/1-item-tx`: the first workload under `Durability::Buffered` (flushed
//!   and synced every 100 ms, the default), against persistent-queue over `SledStore` without
//!   fsync (its `None` policy).
//!
//! Peers: `reliable-queue` (`Durability::Sync`, the default), `persistent-queue` over
//! `SledStore` under its `Group` and its `Sync` policies, and sled used directly (one key per
//! item, one batch + `Db::flush` per transaction). How each is driven is documented in
//! `common/mod.rs`. A fresh store in a fresh directory for every sample; opening and closing
//! it are not timed. Stores are created under `$RQ_BENCH_DIR` (default: the system temporary
//! directory), which must be on the disk being measured.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};

#[path = "common/mod.rs"]
mod common;

use common::{async_round_trips, fresh_dir, pipeline, AsyncPeer, Ours, Peer, Pq, Queue, RawSled};

fn threads<P: Peer>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    peer: &P,
    producers: usize,
    consumers: usize,
    batch: usize,
) {
    group.bench_function(peer.name(), |b| {
        b.iter_custom(|txs| {
            let dir = fresh_dir();
            let queue = peer.open(dir.path());
            let elapsed = pipeline(&queue, producers, consumers, batch, txs);
            assert_eq!(queue.len(), 0, "{}: every item came back out", peer.name());
            elapsed
        })
    });
}

fn tasks<P: AsyncPeer>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    runtime: &tokio::runtime::Runtime,
    peer: &P,
    tasks: usize,
) {
    group.bench_function(peer.name(), |b| {
        b.iter_custom(|rounds| {
            let dir = fresh_dir();
            let queue = peer.open_async(dir.path(), runtime);
            async_round_trips(runtime, &queue, tasks, 1, rounds)
        })
    });
}

fn durable(c: &mut Criterion) {
    for (producers, consumers, batch) in [(16, 16, 1), (4, 4, 64)] {
        let mut group =
            c.benchmark_group(format!("durable/{producers}p-{consumers}c/{batch}-item-tx"));
        group.throughput(Throughput::Elements(batch as u64));
        group.sampling_mode(SamplingMode::Flat);
        threads(&mut group, &Ours::SYNC, producers, consumers, batch);
        threads(&mut group, &Pq::SLED_GROUP, producers, consumers, batch);
        threads(&mut group, &Pq::SLED_SYNC, producers, consumers, batch);
        threads(&mut group, &RawSled, producers, consumers, batch);
        group.finish();
    }

    let mut group = c.benchmark_group("buffered/16p-16c/1-item-tx");
    group.throughput(Throughput::Elements(1));
    group.sampling_mode(SamplingMode::Flat);
    threads(&mut group, &Ours::BUFFERED, 16, 16, 1);
    threads(&mut group, &Pq::SLED_UNSYNCED, 16, 16, 1);
    group.finish();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("durable/1024-tasks/1-item-tx");
    group.throughput(Throughput::Elements(1));
    group.sampling_mode(SamplingMode::Flat);
    tasks(&mut group, &runtime, &Ours::SYNC, 1024);
    tasks(&mut group, &runtime, &Pq::SLED_GROUP, 1024);
    tasks(&mut group, &runtime, &Pq::SLED_SYNC, 1024);
    tasks(&mut group, &runtime, &RawSled, 1024);
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
    durable(&mut criterion);
    criterion.final_summary();
}
