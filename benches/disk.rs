//! Disk: how big the store gets on disk during a long steady churn.
//!
//! Workload, per peer, on a fresh store under `$RQ_BENCH_DIR`: enqueue a backlog of 1,000
//! 100-byte items; then 4 threads each loop over "dequeue 64 items + commit, enqueue 64 items +
//! commit" (durable commits) until `RQ_BENCH_CHURN_ITEMS` items (default 10,000,000) have
//! passed through. The backlog stays between 744 and 1,000 items the whole time.
//!
//! Every 100 ms a sampler thread records the directory's size (sum of file lengths, and the
//! blocks actually allocated, as `du` counts them) and, where the peer exposes its sled
//! database, sled's own `Db::size_on_disk()`. Printed per peer: churn time and items/s, the
//! maximum and final figures, and after the store is closed, the directory's size and sled's
//! `size_on_disk()` from a fresh `sled::open` of the directory.
//!
//! This is a one-shot measurement of a fixed volume, not a statistical benchmark, so it does
//! not go through criterion's sampling; the churn time is printed for reference only.
//!
//! Peers: `reliable-queue` (`Durability::Sync`) and sled used directly (one key per item,
//! batch + flush per transaction). `persistent-queue` stores one sled key per item too, so its
//! log behaves as the raw sled peer's; it fsyncs every ack on its own, which makes a 10M-item
//! churn take hours, so it runs only with `RQ_BENCH_DISK_PQ=1` (then with its `Group` policy).
//! `RQ_BENCH_PEERS=a,b` limits the peers.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use common::{
    dir_size, fresh_dir, item, mib, selected, Consumer, Ours, Peer, Pq, Producer, Queue, RawSled,
};

const BACKLOG: usize = 1_000;
const BATCH: usize = 64;
const WORKERS: usize = 4;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

fn main() {
    // `cargo bench` passes criterion-style flags; a filter argument selects peers by name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| selected(name) && filter.iter().all(|f| name.contains(f.as_str()));
    let total: u64 = std::env::var("RQ_BENCH_CHURN_ITEMS")
        .map(|n| n.parse().expect("RQ_BENCH_CHURN_ITEMS: an item count"))
        .unwrap_or(10_000_000);
    println!(
        "disk: steady churn of {total} items, backlog {BACKLOG}, {WORKERS} threads, \
         {BATCH}-item transactions, {}-byte items, under {}",
        common::ITEM_SIZE,
        common::bench_root().display()
    );
    if wanted(Ours::SYNC.name()) {
        churn(&Ours::SYNC, total);
    }
    if wanted(RawSled.name()) {
        churn(&RawSled, total);
    }
    let pq = Pq::SLED_GROUP;
    if std::env::var("RQ_BENCH_DISK_PQ").as_deref() == Ok("1") && wanted(pq.name()) {
        churn(&pq, total);
    }
}

/// Largest and last values seen by the sampler.
#[derive(Debug, Default, Clone, Copy)]
struct Sizes {
    apparent: u64,
    allocated: u64,
    engine: Option<u64>,
}

impl Sizes {
    fn max(self, other: Sizes) -> Sizes {
        Sizes {
            apparent: self.apparent.max(other.apparent),
            allocated: self.allocated.max(other.allocated),
            engine: match (self.engine, other.engine) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }

    fn show(self) -> String {
        let engine = self
            .engine
            .map_or_else(|| "n/a".to_owned(), |e| format!("{:.1} MiB", mib(e)));
        format!(
            "files {:.1} MiB, allocated {:.1} MiB, sled size_on_disk {engine}",
            mib(self.apparent),
            mib(self.allocated)
        )
    }
}

fn sample<Q: Queue>(queue: &Q, dir: &Path) -> Sizes {
    let (apparent, allocated) = dir_size(dir);
    Sizes {
        apparent,
        allocated,
        engine: queue.engine_size_on_disk(),
    }
}

fn churn<P: Peer>(peer: &P, total: u64) {
    let name = peer.name();
    let dir = fresh_dir();
    let queue = Arc::new(peer.open(dir.path()));
    let item = item();
    let mut producer = queue.producer();
    let mut left = BACKLOG;
    while left > 0 {
        let n = left.min(BATCH);
        producer.send(&item, n);
        left -= n;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (queue, stop, path) = (queue.clone(), stop.clone(), dir.path().to_owned());
        thread::spawn(move || {
            let mut max = Sizes::default();
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(sample(&*queue, &path));
                samples += 1;
                thread::sleep(SAMPLE_EVERY);
            }
            (max, samples)
        })
    };

    let tickets = Arc::new(AtomicU64::new(total.div_ceil(BATCH as u64)));
    let began = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (mut producer, mut consumer) = (queue.producer(), queue.consumer());
            let (tickets, item) = (tickets.clone(), item.clone());
            thread::spawn(move || {
                while tickets
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    consumer.recv(BATCH);
                    producer.send(&item, BATCH);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("churn thread panicked");
    }
    let elapsed = began.elapsed();
    let last = sample(&*queue, dir.path());
    stop.store(true, Ordering::Relaxed);
    let (max, samples) = sampler.join().expect("sampler thread panicked");
    let max = max.max(last);
    assert_eq!(queue.len(), BACKLOG as u64, "{name}: backlog unchanged");
    let through = total.div_ceil(BATCH as u64) * BATCH as u64;

    drop(producer);
    drop(Arc::into_inner(queue).expect("every handle is gone"));
    let (closed_apparent, closed_allocated) = dir_size(dir.path());
    let closed_engine = sled::open(dir.path()).and_then(|db| db.size_on_disk()).ok();
    let closed = Sizes {
        apparent: closed_apparent,
        allocated: closed_allocated,
        engine: closed_engine,
    };

    println!(
        "figure disk/churn/{name} throughput: {through} items in {:.1} s, {:.0} items/s",
        elapsed.as_secs_f64(),
        through as f64 / elapsed.as_secs_f64()
    );
    println!(
        "figure disk/churn/{name} max: {} ({samples} samples)",
        max.show()
    );
    println!("figure disk/churn/{name} final: {}", last.show());
    println!(
        "figure disk/churn/{name} closed: {} (sled reopened)",
        closed.show()
    );
}
