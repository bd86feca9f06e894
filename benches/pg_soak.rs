//! The PostgreSQL engine under minutes of churn at a large backlog: producers keep the queue at
//! `--backlog` items while 16 consumers lease and acknowledge (and every 8th time take and
//! commit instead), for `--seconds`. Every `--window` seconds a line reports the window's
//! throughput, lease and dequeue latencies (p50/p99), the median time of five `stats()` calls and of five `SELECT 1` round trips (the floor under that load), and the
//! `items` table as the server sees it: dead rows, autovacuum runs, table and index sizes.
//!
//! ```sh
//! cargo bench --features postgres --bench pg_soak                        # 1,000,000 items, 10 minutes
//! cargo bench --features postgres --bench pg_soak -- --backlog 100000 --seconds 60 --window 30 --smoke
//! ```
//!
//! The server is the test harness's (`tests/pg/mod.rs`: its own cluster, with `fsync`,
//! `full_page_writes` and `synchronous_commit` turned on, PostgreSQL's defaults otherwise), or
//! the one `RQ_TEST_POSTGRES_URL` names. With `--smoke` (CI) the run fails when the last
//! window's throughput is below half the first's.
//!
//! The backlog is kept by counting in the process (enqueued minus consumed), not by asking the
//! store, so the figures are of the work alone.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use reliable_queue::{ReliableConcurrentQueue, Store};
use tokio::sync::Notify;

#[path = "../tests/pg/mod.rs"]
mod pg;

#[derive(Parser, Debug)]
#[command(about = "The PostgreSQL engine at a steady backlog under churn")]
struct Args {
    /// Items kept in the queue.
    #[arg(long, default_value_t = 1_000_000)]
    backlog: u64,
    /// How long the churn runs.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// The length of a reported window.
    #[arg(long, default_value_t = 30)]
    window: u64,
    /// Leasing consumers.
    #[arg(long, default_value_t = 16)]
    consumers: usize,
    /// Producers (each commits 8 items at a time).
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Consumers call `try_lease` (and `lease` only when it finds nothing) instead of
    /// `lease`.
    #[arg(long)]
    try_lease: bool,
    /// Print, at the end, the plans of the statements that took longer than this many
    /// milliseconds (PostgreSQL's `auto_explain`, with timings).
    #[arg(long)]
    explain_over_ms: Option<u64>,
    /// Fail when the last window's throughput is below half the first's.
    #[arg(long)]
    smoke: bool,
    /// cargo bench passes this; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type Item = u64;

/// Latencies of one kind of call in the current window, in microseconds.
struct Latencies(Mutex<Histogram<u64>>);

impl Latencies {
    fn new() -> Latencies {
        Latencies(Mutex::new(
            Histogram::new_with_bounds(1, 60_000_000, 2).expect("histogram bounds"),
        ))
    }

    fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        h.saturating_record(us);
    }

    /// (p50, p99) in milliseconds, and the histogram emptied for the next window.
    fn take(&self) -> (f64, f64) {
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let q = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let out = if h.is_empty() {
            (0.0, 0.0)
        } else {
            (q(0.5), q(0.99))
        };
        h.reset();
        out
    }
}

struct Shared {
    /// Items enqueued and committed minus items consumed and committed.
    outstanding: AtomicI64,
    backlog: i64,
    consumed: AtomicU64,
    room: Notify,
    stop: AtomicBool,
    lease: Latencies,
    dequeue: Latencies,
    try_lease: bool,
}

const BATCH: usize = 8;

async fn producer(store: Store, q: ReliableConcurrentQueue<Item>, shared: Arc<Shared>) {
    let mut next: u64 = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.outstanding.load(Ordering::Acquire) >= shared.backlog {
            let room = shared.room.notified();
            if shared.outstanding.load(Ordering::Acquire) >= shared.backlog
                && !shared.stop.load(Ordering::Relaxed)
            {
                room.await;
            }
            continue;
        }
        let mut tx = store.begin();
        for _ in 0..BATCH {
            q.enqueue(&mut tx, next).expect("enqueue");
            next += 1;
        }
        tx.commit().await.expect("commit of an enqueue");
        shared.outstanding.fetch_add(BATCH as i64, Ordering::AcqRel);
    }
}

async fn consumer(store: Store, q: ReliableConcurrentQueue<Item>, shared: Arc<Shared>, n: usize) {
    let mut round: usize = n;
    while !shared.stop.load(Ordering::Relaxed) {
        round += 1;
        let start = Instant::now();
        if round.is_multiple_of(8) {
            let mut tx = store.begin();
            if q.try_dequeue(&mut tx).await.expect("dequeue").is_none() {
                continue;
            }
            tx.commit().await.expect("commit of a dequeue");
            shared.dequeue.record(start.elapsed());
        } else {
            let ttl = Duration::from_secs(60);
            let lease = match shared.try_lease {
                true => match q.try_lease(ttl).await.expect("lease") {
                    Some(lease) => lease,
                    None => q.lease(ttl).await.expect("lease"),
                },
                false => q.lease(ttl).await.expect("lease"),
            };
            shared.lease.record(start.elapsed());
            let mut tx = store.begin();
            lease.ack(&mut tx).expect("ack");
            tx.commit().await.expect("commit of an ack");
        }
        shared.consumed.fetch_add(1, Ordering::Relaxed);
        if shared.outstanding.fetch_sub(1, Ordering::AcqRel) <= shared.backlog {
            shared.room.notify_waiters();
        }
    }
}

/// The `items` table as the server sees it: (live rows, dead rows, autovacuum runs, table
/// bytes, index bytes).
async fn table_figures(admin: &tokio_postgres::Client, schema: &str) -> (i64, i64, i64, i64, i64) {
    let row = admin
        .query_one(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, \
               pg_table_size(relid), pg_indexes_size(relid) \
             FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'items'",
            &[&schema],
        )
        .await
        .expect("read the table's statistics");
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let args = Args::parse();
    let server = match pg::PgServer::start() {
        Ok(server) => server,
        Err(skip) => {
            eprintln!("==> pg_soak SKIPPED: {skip}");
            return;
        }
    };
    let url = server.url().to_owned();
    let rt = pg::bench_runtime();
    let failed = rt.block_on(run(&args, &url));
    drop(server);
    if failed {
        std::process::exit(1);
    }
}

async fn run(args: &Args, url: &str) -> bool {
    pg::make_durable(url).await;
    let schema = "soak";
    let admin = pg::connect(url).await;
    if let Some(ms) = args.explain_over_ms {
        for statement in [
            "LOAD 'auto_explain'".to_owned(),
            "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'".to_owned(),
            format!("ALTER SYSTEM SET auto_explain.log_min_duration = {ms}"),
            "ALTER SYSTEM SET auto_explain.log_analyze = on".to_owned(),
            "SELECT pg_reload_conf()".to_owned(),
        ] {
            admin
                .batch_execute(&statement)
                .await
                .expect("turn auto_explain on");
        }
    }
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .expect("drop the schema of an earlier run");
    let store = Store::builder()
        .postgres(url)
        .postgres_schema(schema)
        .postgres_pool_size(args.consumers + args.producers + 2)
        .postgres_runtime(tokio::runtime::Handle::current())
        .connect()
        .await
        .expect("connect the store");
    let q = store.queue::<Item>("jobs").await.expect("the queue");

    // The backlog, 1,000 items a commit.
    let filled = Instant::now();
    let mut left = args.backlog;
    let mut next = u64::MAX / 2;
    while left > 0 {
        let n = left.min(1000);
        let mut tx = store.begin();
        for _ in 0..n {
            q.enqueue(&mut tx, next).expect("enqueue");
            next += 1;
        }
        tx.commit().await.expect("commit of the backlog");
        left -= n;
    }
    admin
        .batch_execute(&format!("ANALYZE \"{schema}\".items"))
        .await
        .expect("analyze");
    // `stats()` and `count()` on the backlog at rest: the figures a dashboard's refresh costs.
    let mut at_rest = Vec::new();
    for _ in 0..5 {
        let asked = Instant::now();
        let stats = q.stats().await.expect("stats");
        let took = asked.elapsed();
        let asked = Instant::now();
        let count = q.count().await.expect("count");
        at_rest.push((took, asked.elapsed()));
        assert_eq!(
            (stats.visible, count),
            (args.backlog, args.backlog),
            "an idle queue's figures are exact"
        );
    }
    at_rest.sort();
    let (stats_ms, count_ms) = at_rest[at_rest.len() / 2];
    println!(
        "pg_soak: at rest with {} items, stats() {:.2} ms, count() {:.2} ms (median of 5)",
        args.backlog,
        stats_ms.as_secs_f64() * 1000.0,
        count_ms.as_secs_f64() * 1000.0
    );
    println!(
        "pg_soak: backlog {} filled in {:.1} s; {} leasing consumers (every 8th call a take), \
         {} producers of {BATCH}-item commits; {} s in {} s windows",
        args.backlog,
        filled.elapsed().as_secs_f64(),
        args.consumers,
        args.producers,
        args.seconds,
        args.window
    );
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>6} {:>9} {:>9}",
        "t(s)",
        "jobs/s",
        "lease50",
        "lease99",
        "deq50",
        "deq99",
        "stats",
        "select1",
        "visible",
        "dead",
        "autov",
        "tableMiB",
        "indexMiB"
    );

    let shared = Arc::new(Shared {
        outstanding: AtomicI64::new(i64::try_from(args.backlog).unwrap_or(i64::MAX)),
        backlog: i64::try_from(args.backlog).unwrap_or(i64::MAX),
        consumed: AtomicU64::new(0),
        room: Notify::new(),
        stop: AtomicBool::new(false),
        lease: Latencies::new(),
        dequeue: Latencies::new(),
        try_lease: args.try_lease,
    });
    let mut tasks = Vec::new();
    for _ in 0..args.producers {
        tasks.push(tokio::spawn(producer(
            store.clone(),
            q.clone(),
            shared.clone(),
        )));
    }
    for n in 0..args.consumers {
        tasks.push(tokio::spawn(consumer(
            store.clone(),
            q.clone(),
            shared.clone(),
            n,
        )));
    }

    let start = Instant::now();
    let windows = (args.seconds / args.window.max(1)).max(1);
    let mut rates = Vec::new();
    let mut worst_lease_p99: f64 = 0.0;
    let mut first_sizes = None;
    let mut last_sizes = (0, 0);
    let mut before = 0;
    for w in 1..=windows {
        let due = start + Duration::from_secs(w * args.window);
        tokio::time::sleep_until(due.into()).await;
        let consumed = shared.consumed.load(Ordering::Relaxed);
        let rate = (consumed - before) as f64 / args.window as f64;
        before = consumed;
        let (l50, l99) = shared.lease.take();
        let (d50, d99) = shared.dequeue.take();
        // Five `stats()` calls, as a dashboard's refreshes would make: their median.
        let mut took = Vec::new();
        let mut stats = None;
        for _ in 0..5 {
            let asked = Instant::now();
            stats = Some(q.stats().await.expect("stats"));
            took.push(asked.elapsed().as_secs_f64() * 1000.0);
        }
        took.sort_by(f64::total_cmp);
        let stats_ms = took[took.len() / 2];
        // The floor under this load: five round trips of a statement that reads nothing.
        let mut floor = Vec::new();
        for _ in 0..5 {
            let asked = Instant::now();
            admin.simple_query("SELECT 1").await.expect("SELECT 1");
            floor.push(asked.elapsed().as_secs_f64() * 1000.0);
        }
        floor.sort_by(f64::total_cmp);
        let floor_ms = floor[floor.len() / 2];
        let stats = stats.expect("five calls were made");
        let (_live, dead, autovacuums, table, index) = table_figures(&admin, schema).await;
        println!(
            "{:>6} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10} {:>10} {:>6} {:>9.1} {:>9.1}",
            w * args.window,
            rate,
            l50,
            l99,
            d50,
            d99,
            stats_ms,
            floor_ms,
            stats.visible,
            dead,
            autovacuums,
            mib(table),
            mib(index)
        );
        rates.push(rate);
        worst_lease_p99 = worst_lease_p99.max(l99);
        first_sizes.get_or_insert((table, index));
        last_sizes = (table, index);
    }
    shared.stop.store(true, Ordering::Relaxed);
    shared.room.notify_waiters();
    // Consumers waiting in `lease` find items (the backlog is full), so every task ends.
    for t in tasks {
        t.await.expect("a client task");
    }
    store.close().await.expect("close");

    if args.explain_over_ms.is_some() {
        // The harness's server logs to `server.log` beside its data directory.
        let log = admin
            .query_one(
                "SELECT pg_read_file(current_setting('data_directory') || '/../server.log')",
                &[],
            )
            .await
            .map(|row| row.get::<_, String>(0))
            .unwrap_or_else(|e| format!("(the server's log could not be read: {e})"));
        println!("{log}");
    }
    let first = rates.first().copied().unwrap_or(0.0);
    let last = rates.last().copied().unwrap_or(0.0);
    let (t0, i0) = first_sizes.unwrap_or((0, 0));
    println!(
        "pg_soak summary: first window {first:.0} jobs/s, last {last:.0} jobs/s ({:.0}%), \
         worst lease p99 {worst_lease_p99:.1} ms, table {:.1} -> {:.1} MiB, indexes {:.1} -> {:.1} MiB",
        if first > 0.0 { last / first * 100.0 } else { 0.0 },
        mib(t0),
        mib(last_sizes.0),
        mib(i0),
        mib(last_sizes.1)
    );
    if args.smoke && last < first / 2.0 {
        eprintln!("pg_soak: the last window's throughput fell below half the first's");
        return true;
    }
    false
}
