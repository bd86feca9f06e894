//! Commit latency under load: how long `Transaction::blocking_commit` takes with many threads
//! committing at once to a durable store (`Durability::Sync`, every commit fsync'd).
//!
//! ```text
//! cargo run --release --example latency                       # 16 + 16 threads, 5 s
//! cargo run --release --example latency -- --producers 4 --consumers 4 --seconds 2
//! ```
//!
//! Producers loop over "enqueue one 100-byte item, commit"; consumers over "dequeue one item
//! (waiting for it), commit". Only the `commit` call is timed: for consumers the wait for an
//! item is not part of the figure. Each thread records into its own histogram (microsecond
//! resolution, 3 significant digits); they are merged at the end and printed as a table of
//! percentiles, one row for producer commits, one for consumer commits, one for all.

use std::error::Error;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use reliable_queue::{Durability, ReliableConcurrentQueue, Store};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Commit latency of one-item transactions under concurrent load, on disk.
#[derive(Debug, Parser)]
struct Args {
    /// Producer threads (enqueue one item + commit, in a loop).
    #[arg(long, default_value_t = 16)]
    producers: usize,
    /// Consumer threads (dequeue one item + commit, in a loop).
    #[arg(long, default_value_t = 16)]
    consumers: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Parent of the store's temporary directory (default `$RQ_BENCH_DIR`, else the system
    /// temporary directory); it must be on the disk being measured.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Use `Durability::Buffered` instead of `Sync` (commits do not wait for the fsync).
    #[arg(long)]
    buffered: bool,
}

/// A 100-byte item, serialized as a byte string.
#[derive(Debug, Clone)]
struct Payload(Vec<u8>);

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = Payload;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Payload, E> {
                Ok(Payload(v.to_vec()))
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

type BoxError = Box<dyn Error + Send + Sync>;

fn histogram() -> Histogram<u64> {
    // 1 µs to 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

fn producer(
    store: Store,
    queue: ReliableConcurrentQueue<Payload>,
    stop: Arc<AtomicBool>,
) -> Result<Histogram<u64>, BoxError> {
    let mut hist = histogram();
    let item: Vec<u8> = (0..100).map(|i| (i * 31 + 7) as u8).collect();
    while !stop.load(Ordering::Relaxed) {
        let mut tx = store.begin();
        queue.enqueue(&mut tx, Payload(item.clone()))?;
        let began = Instant::now();
        tx.blocking_commit()?;
        hist.saturating_record(micros(began.elapsed()));
    }
    Ok(hist)
}

fn consumer(
    store: Store,
    queue: ReliableConcurrentQueue<Payload>,
    stop: Arc<AtomicBool>,
) -> Result<Histogram<u64>, BoxError> {
    let mut hist = histogram();
    while !stop.load(Ordering::Relaxed) {
        let mut tx = store.begin();
        // Wake up now and then to notice the end of the run; an empty wait aborts nothing.
        match queue.blocking_dequeue_timeout(&mut tx, Duration::from_millis(50))? {
            Some(item) => {
                std::hint::black_box(item);
                let began = Instant::now();
                tx.blocking_commit()?;
                hist.saturating_record(micros(began.elapsed()));
            }
            None => tx.blocking_abort()?,
        }
    }
    Ok(hist)
}

fn row(label: &str, hist: &Histogram<u64>, seconds: f64) {
    let q = |p: f64| hist.value_at_quantile(p);
    println!(
        "| {label:<9} | {:>9} | {:>9.0} | {:>7} | {:>7} | {:>7} | {:>7} | {:>8} |",
        hist.len(),
        hist.len() as f64 / seconds,
        q(0.50),
        q(0.90),
        q(0.99),
        q(0.999),
        hist.max(),
    );
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let root = args
        .dir
        .clone()
        .or_else(|| std::env::var_os("RQ_BENCH_DIR").map(PathBuf::from))
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    let dir = tempfile::Builder::new()
        .prefix("rq-latency-")
        .tempdir_in(&root)?;
    // The store refuses a directory open to others; tempfile creates it with the umask's mode.
    #[cfg(unix)]
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    let durability = if args.buffered {
        Durability::Buffered
    } else {
        Durability::Sync
    };
    let store = Store::builder()
        .path(dir.path())
        .durability(durability)
        .open()?;
    let queue = store.blocking_queue::<Payload>("latency")?;
    let stop = Arc::new(AtomicBool::new(false));

    let producers: Vec<_> = (0..args.producers)
        .map(|_| {
            let (store, queue, stop) = (store.clone(), queue.clone(), stop.clone());
            thread::spawn(move || producer(store, queue, stop))
        })
        .collect();
    let consumers: Vec<_> = (0..args.consumers)
        .map(|_| {
            let (store, queue, stop) = (store.clone(), queue.clone(), stop.clone());
            thread::spawn(move || consumer(store, queue, stop))
        })
        .collect();
    let began = Instant::now();
    thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);

    let mut produced = histogram();
    for handle in producers {
        produced.add(handle.join().expect("producer panicked")?)?;
    }
    let mut consumed = histogram();
    for handle in consumers {
        consumed.add(handle.join().expect("consumer panicked")?)?;
    }
    let seconds = began.elapsed().as_secs_f64();
    let mut all = histogram();
    all.add(&produced)?;
    all.add(&consumed)?;

    println!(
        "commit latency, {} producers + {} consumers, one-item transactions, {:?}, {:.1} s, \
         store under {}",
        args.producers,
        args.consumers,
        durability,
        seconds,
        root.display()
    );
    println!();
    println!(
        "| commits   |     count |   per sec |  p50 µs |  p90 µs |  p99 µs | p999 µs |   max µs |"
    );
    println!(
        "|-----------|-----------|-----------|---------|---------|---------|---------|----------|"
    );
    row("enqueue", &produced, seconds);
    row("dequeue", &consumed, seconds);
    row("all", &all, seconds);
    println!();
    println!("items left in the queue: {}", queue.blocking_count()?);
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    store.blocking_close()?;
    Ok(())
}
