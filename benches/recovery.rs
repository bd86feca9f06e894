//! Recovery: the time to open a store that holds a backlog of queued items, and the memory
//! each queued item costs once the store is open.
//!
//! For each size (1M items; 10M items too with `RQ_BENCH_10M=1`, which takes GBs of disk and
//! several minutes per peer to build; `RQ_BENCH_RECOVERY_ITEMS=<n>` replaces both sizes for
//! quick runs) and each peer:
//!
//! 1. A child process builds the store in a fresh directory under `$RQ_BENCH_DIR`: 100-byte
//!    items enqueued in transactions of 10,000, nothing dequeued, then closed.
//! 2. `recovery/<size>/<peer>`: criterion times `open` of that same store, one iteration = one
//!    open in a new child process, as after a restart: the child times its own open (until the
//!    queue is usable with every item in it), so starting the process and closing the store
//!    are not counted. A fresh process each time matters: reopening in the same process would
//!    reuse memory the allocator already holds and understate the cost (by 4x at 10M items).
//!    The store is reused across iterations, so its files are in the OS page cache: a cold
//!    process, but warm files.
//! 3. Printed alongside: the memory per queued item, from the first of those opens: resident
//!    set size (`/proc/self/statm`) after the open minus before it, divided by the item count;
//!    and, after the timed opens (it changes the store), the same in one more child that opens
//!    the store and then churns it, as a store that runs for a while holds it:
//!    `RQ_BENCH_CHURN=<n>` (200,000 by default, 0 for none) times a one-item dequeue
//!    transaction then a one-item enqueue transaction, so the backlog stays the same
//!    (reliable-queue with `Durability::Buffered` for the churn, so that it takes seconds).
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
    dir_size, fresh_dir, item, mib, rss_bytes, selected, Consumer, Ours, Peer, Pq, Producer, Queue,
    RawSled,
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
                reopen(&mut group, peer, items);
            }
        }
        group.finish();
    }
    criterion.final_summary();
}

/// Builds the store, measures its memory per item, then times its opens. The child processes
/// map `name` to the peer (see [`child`]).
fn reopen(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, items: u64) {
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
    let (first_open, grown) = open_in_child(name, items, dir.path());
    println!(
        "figure recovery/{}/{name} memory per queued item: {:.1} bytes \
         (RSS +{:.1} MiB after open; payload {} bytes; first open {:.2} s)",
        label(items),
        grown as f64 / items as f64,
        mib(grown),
        common::ITEM_SIZE,
        first_open.as_secs_f64(),
    );
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| open_in_child(name, items, dir.path()).0)
                .sum()
        })
    });
    // Last: the churn changes the store the opens above timed.
    let out = run_child("open-churn", name, items, dir.path());
    if let Some(line) = out.lines().find(|l| l.starts_with("churned ")) {
        let mut fields = line.split_whitespace().skip(1);
        let pairs: u64 = fields.next().expect("count").parse().expect("a number");
        let grown: u64 = fields.next().expect("bytes").parse().expect("a number");
        let seconds: f64 = fields.next().expect("seconds").parse().expect("a number");
        println!(
            "figure recovery/{}/{name} memory per queued item after churn: {:.1} bytes \
             (RSS +{:.1} MiB over the open's start after {pairs} one-item dequeue and \
             enqueue transaction pairs in {seconds:.1} s; backlog unchanged)",
            label(items),
            grown as f64 / items as f64,
            mib(grown),
        );
    }
}

/// Opens the store in a new child process; returns the time the open took there and how much
/// the child's resident set grew with it.
fn open_in_child(peer: &str, items: u64, dir: &Path) -> (Duration, u64) {
    opened(&run_child("open", peer, items, dir))
}

/// The open's time and resident-set growth from a child's output.
fn opened(out: &str) -> (Duration, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("opened "))
        .expect("a line `opened <seconds> <bytes>`");
    let mut fields = line.split_whitespace().skip(1);
    let seconds: f64 = fields.next().expect("seconds").parse().expect("a number");
    let grown: u64 = fields.next().expect("bytes").parse().expect("a number");
    (Duration::from_secs_f64(seconds), grown)
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
        ("open", OURS) => drop(open(&Ours::SYNC, items, dir)),
        ("open", PQ) => drop(open(&Pq::SLED_GROUP, items, dir)),
        ("open", _) => drop(open(&RawSled, items, dir)),
        // Buffered: the churn's commits need not wait for the disk (the memory is the same).
        ("open-churn", OURS) => churn(&Ours::BUFFERED, items, dir),
        ("open-churn", PQ) => churn(&Pq::SLED_GROUP, items, dir),
        ("open-churn", _) => churn(&RawSled, items, dir),
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

/// Opens the store and prints `opened <seconds> <RSS growth>`; returns the queue and the RSS
/// before the open.
fn open<P: Peer>(peer: &P, items: u64, dir: &Path) -> (P::Queue, u64) {
    let before = rss_bytes().expect("read /proc/self/statm");
    let began = Instant::now();
    let queue = peer.open(dir);
    let opened = began.elapsed();
    let after = rss_bytes().expect("read /proc/self/statm");
    assert_eq!(queue.len(), items, "every item recovered");
    println!(
        "opened {} {}",
        opened.as_secs_f64(),
        after.saturating_sub(before)
    );
    (queue, before)
}

/// [`open`], then a steady churn: `RQ_BENCH_CHURN` times a one-item dequeue transaction then
/// a one-item enqueue transaction (the backlog stays `items`); prints `churned <pairs> <RSS
/// growth over the open's start> <seconds>`.
fn churn<P: Peer>(peer: &P, items: u64, dir: &Path) {
    let (queue, before) = open(peer, items, dir);
    let pairs: u64 = std::env::var("RQ_BENCH_CHURN")
        .map(|n| n.parse().expect("RQ_BENCH_CHURN: a transaction count"))
        .unwrap_or(200_000);
    if pairs == 0 {
        return;
    }
    let (mut producer, mut consumer) = (queue.producer(), queue.consumer());
    let item = item();
    let began = Instant::now();
    for _ in 0..pairs {
        consumer.recv(1);
        producer.send(&item, 1);
    }
    let took = began.elapsed();
    queue.sync();
    assert_eq!(queue.len(), items, "the churn keeps the backlog");
    let after = rss_bytes().expect("read /proc/self/statm");
    println!(
        "churned {} {} {}",
        pairs,
        after.saturating_sub(before),
        took.as_secs_f64()
    );
}

fn label(items: u64) -> String {
    match items {
        n if n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
