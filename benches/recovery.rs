//! Recovery: the time to open a store that holds a backlog of queued items, and the memory
//! each queued item costs once the store is open.
//!
//! For each size (1M items; 10M items too with `RQ_BENCH_10M=1`, which takes GBs of disk and
//! several minutes per peer to build; `RQ_BENCH_RECOVERY_ITEMS=<n>` replaces both sizes for
//! quick runs) and each peer:
//!
//! 1. A child process builds the store in a fresh directory under `$RQ_BENCH_DIR`: 100-byte
//!    items enqueued in transactions of 10,000, nothing dequeued, then closed.
//! 2. Another child process opens it once and prints the memory per queued item: resident set
//!    size (`/proc/self/statm`) after the open minus before it, divided by the item count. A
//!    fresh process, so that memory freed earlier in this one cannot hide the cost.
//! 3. `recovery/<size>/<peer>`: criterion times `open` of that same store (one iteration =
//!    one open, until the queue is usable with every item in it); closing is not timed. The
//!    store is reused across iterations, so its files are in the OS page cache: this measures
//!    a warm open, not a cold one.
//!
//! Peers: `reliable-queue` (`Store::open`: replays its log), `persistent-queue` over
//! `SledStore` (its `Builder::open` scans every entry; built with its `None` policy plus a
//! final flush, opened with `Group`), and sled used directly (open, then scan every key into
//! the in-memory index). `RQ_BENCH_PEERS=a,b` limits the peers.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode};

#[path = "common/mod.rs"]
mod common;

use common::{
    dir_size, fresh_dir, item, mib, rss_bytes, selected, Ours, Peer, Pq, Producer, Queue, RawSled,
};

/// Set in the environment of a child process: `<job> <peer> <items> <dir>`.
const CHILD: &str = "RQ_RECOVERY_CHILD";
/// Items per transaction when building a store.
const BUILD_TX: usize = 10_000;

const OURS: &str = "reliable-queue";
const PQ: &str = "pq-sled";
const SLED: &str = "sled-batch-flush";

fn main() {
    if let Ok(job) = std::env::var(CHILD) {
        child(&job);
        return;
    }
    let sizes: Vec<u64> = match std::env::var("RQ_BENCH_RECOVERY_ITEMS") {
        Ok(n) => vec![n.parse().expect("RQ_BENCH_RECOVERY_ITEMS: an item count")],
        Err(_) if std::env::var("RQ_BENCH_10M").as_deref() == Ok("1") => {
            vec![1_000_000, 10_000_000]
        }
        Err(_) => vec![1_000_000],
    };
    // Settings here are defaults: command-line options override them.
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    for items in sizes {
        let mut group = criterion.benchmark_group(format!("recovery/{}", label(items)));
        group.sampling_mode(SamplingMode::Flat);
        for peer in [OURS, PQ, SLED] {
            if selected(peer) {
                match peer {
                    OURS => reopen(&mut group, peer, &Ours::SYNC, items),
                    PQ => reopen(&mut group, peer, &Pq::SLED_GROUP, items),
                    _ => reopen(&mut group, peer, &RawSled, items),
                }
            }
        }
        group.finish();
    }
    criterion.final_summary();
}

/// Builds the store, measures its memory per item, then times its opens.
fn reopen<P: Peer>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, peer: &P, items: u64) {
    let dir = fresh_dir();
    let started = Instant::now();
    run_child("build", name, items, dir.path());
    let (apparent, allocated) = dir_size(dir.path());
    println!(
        "figure recovery/{}/{name} build: {:.1} s, store on disk {:.1} MiB ({:.1} MiB allocated)",
        label(items),
        started.elapsed().as_secs_f64(),
        mib(apparent),
        mib(allocated),
    );
    let rss = run_child("rss", name, items, dir.path());
    let line = rss
        .lines()
        .find(|l| l.starts_with("rss "))
        .expect("rss line");
    let mut fields = line.split_whitespace().skip(1);
    let grown: f64 = fields.next().expect("rss growth").parse().expect("number");
    let first_open: f64 = fields.next().expect("open time").parse().expect("number");
    println!(
        "figure recovery/{}/{name} memory per queued item: {:.1} bytes \
         (RSS +{:.1} MiB after open; payload {} bytes; first open {:.2} s, cold process)",
        label(items),
        grown / items as f64,
        grown / (1024.0 * 1024.0),
        common::ITEM_SIZE,
        first_open,
    );
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let began = Instant::now();
                let queue = peer.open(dir.path());
                total += began.elapsed();
                assert_eq!(queue.len(), items, "{name}: every item recovered");
                drop(queue);
            }
            total
        })
    });
}

/// Runs this bench binary again as a child doing `job`; returns its standard output.
fn run_child(job: &str, peer: &str, items: u64, dir: &Path) -> String {
    let exe = std::env::current_exe().expect("path of the bench binary");
    let out = Command::new(exe)
        .env(CHILD, format!("{job} {peer} {items} {}", dir.display()))
        .output()
        .expect("run a child bench process");
    assert!(
        out.status.success(),
        "child {job} {peer} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn child(job: &str) {
    let mut parts = job.splitn(4, ' ');
    let (what, peer, items, dir) = (
        parts.next().expect("job"),
        parts.next().expect("peer"),
        parts.next().expect("items").parse().expect("item count"),
        Path::new(parts.next().expect("dir")),
    );
    match (what, peer) {
        ("build", OURS) => build(&Ours::SYNC, items, dir),
        ("build", PQ) => build(&Pq::SLED_UNSYNCED, items, dir),
        ("build", _) => build(&RawSled, items, dir),
        ("rss", OURS) => measure_rss(&Ours::SYNC, items, dir),
        ("rss", PQ) => measure_rss(&Pq::SLED_GROUP, items, dir),
        ("rss", _) => measure_rss(&RawSled, items, dir),
        (other, _) => panic!("unknown child job {other:?}"),
    }
}

fn build<P: Peer>(peer: &P, items: u64, dir: &Path) {
    let queue = peer.open(dir);
    let mut producer = queue.producer();
    let item = item();
    let mut left = items;
    while left > 0 {
        let n = left.min(BUILD_TX as u64);
        producer.send(&item, n as usize);
        left -= n;
    }
    queue.sync();
    assert_eq!(queue.len(), items);
}

fn measure_rss<P: Peer>(peer: &P, items: u64, dir: &Path) {
    let before = rss_bytes().expect("read /proc/self/statm");
    let began = Instant::now();
    let queue = peer.open(dir);
    let opened = began.elapsed();
    let after = rss_bytes().expect("read /proc/self/statm");
    assert_eq!(queue.len(), items);
    println!(
        "rss {} {}",
        after.saturating_sub(before),
        opened.as_secs_f64()
    );
}

fn label(items: u64) -> String {
    match items {
        n if n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
