//! How long a commit takes to wake a consumer waiting in `dequeue` on PostgreSQL: the
//! notification path, against a hand-written `LISTEN`/`NOTIFY` pair, its floor.
//!
//! A commit must wake a waiting consumer of its own store within 10 ms at p99: a consumer
//! that found its queue empty waits for a notification, and the fallback poll
//! (`Builder::postgres_poll_interval`, 1 s by default) only bounds the delay when a
//! notification was lost. Here the poll interval is an hour, so that only a notification can
//! wake the consumer: a lost wake would take an hour, and each sample gives up after 30 s and
//! counts as a failure (printed; the bench then exits non-zero).
//!
//! Needs the `postgres` feature and PostgreSQL's server binaries (the bench starts its own
//! server with the test harness, `tests/pg/mod.rs`, with `fsync` and `synchronous_commit` on,
//! Unix socket only; or uses `RQ_TEST_POSTGRES_URL`, whose settings it reports as they are):
//!
//! ```sh
//! cargo bench --features postgres --bench postgres_wake
//! cargo bench --features postgres --bench postgres_wake -- --samples 1000
//! ```
//!
//! Scenarios (300 samples each by default, after 5 uncounted warm-up samples; items are
//! `u64`s):
//! - `one-store`: producer and consumer on one `Store`. Per sample a consumer task begins a
//!   transaction and waits in `dequeue` on the empty queue. Once it is among the queue's
//!   waiters (`waiters() == 1`) and has looked (`pg_stat_activity`, on a connection of the
//!   bench's own, shows a session `idle in transaction` whose last statement is the
//!   consumer's `DELETE FROM "<schema>".items`, which found nothing), the producer enqueues
//!   one item and commits. The consumer takes the time as `dequeue` returns the item and
//!   sends it over a channel, then commits. The store wakes its own waiters in the
//!   committing call, without a round trip through the server.
//! - `two-stores`: the same with the producer and the consumer on two stores of one schema:
//!   the cross-store path, where the producer's store has its listening connection send a
//!   `pg_notify` after the commit and the consumer's store's listener hears it.
//! - `baseline-listen-notify`: the floor, by hand with tokio-postgres: one connection
//!   `LISTEN`s, another runs `SELECT pg_notify(...)` (autocommit); the time is taken where
//!   the listening connection's task reads the notification.
//!
//! Each scenario has two rows: from the instant the commit (the `pg_notify` statement)
//! returned to the producer, and from just before it started. The consumer may have the item
//! before the producer's commit call has returned (a store wakes its own waiters before the
//! call returns, and the server sends a notification as the notifying transaction commits);
//! such samples count as 0 µs in the first row, and the `early` column counts them.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use reliable_queue::{ReliableConcurrentQueue, Store};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls};

#[path = "../tests/pg/mod.rs"]
mod pg;

/// Samples per scenario unless `--samples N` says otherwise.
const DEFAULT_SAMPLES: usize = 300;
/// Samples run before the counted ones (connections made, statements prepared).
const WARM_UP: usize = 5;
/// A sample not done by then (the consumer ready, woken, and its commit back) has failed.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The fallback poll of the waiting consumers: an hour, so that only a notification wakes
/// them within a sample's timeout.
const POLL_INTERVAL: Duration = Duration::from_secs(3600);
/// The goal for `one-store`, from the commit's return, at p99.
const TARGET_P99: Duration = Duration::from_millis(10);
/// How often the producer looks whether the consumer is waiting yet (not measured).
const READY_POLL: Duration = Duration::from_millis(1);

const REPRODUCE: &str = "cargo bench --features postgres --bench postgres_wake";

/// The latencies of one scenario, in microseconds.
struct Scenario {
    name: &'static str,
    /// From the instant the commit (the notify statement) returned.
    from_return: Histogram<u64>,
    /// From just before the commit (the notify statement) started.
    from_start: Histogram<u64>,
    /// Counted samples whose consumer had the item before the commit had returned.
    early: u64,
    /// Samples (warm-up ones included) that did not complete, and why.
    failures: Vec<String>,
}

impl Scenario {
    fn new(name: &'static str) -> Scenario {
        let histogram = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        Scenario {
            name,
            from_return: histogram(),
            from_start: histogram(),
            early: 0,
            failures: Vec::new(),
        }
    }

    fn record(&mut self, sample: Sample) {
        self.early += u64::from(sample.woke < sample.returned);
        self.from_return
            .saturating_record(micros(sample.returned, sample.woke));
        self.from_start
            .saturating_record(micros(sample.started, sample.woke));
    }

    fn fail(&mut self, sample: usize, why: String) {
        eprintln!("    {}: sample {sample} FAILED: {why}", self.name);
        self.failures.push(format!("sample {sample}: {why}"));
    }
}

/// The instants of one sample.
#[derive(Clone, Copy)]
struct Sample {
    /// Just before the commit (the notify statement) started.
    started: Instant,
    /// When it returned.
    returned: Instant,
    /// When the consumer had the item (the listener the notification).
    woke: Instant,
}

/// `to - from` in microseconds, 0 when `to` came first.
fn micros(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
}

/// `--samples N` (or `--samples=N`); every other argument (`--bench`, which cargo passes, a
/// filter) is ignored.
fn samples_from_args() -> Result<usize, String> {
    let mut samples = DEFAULT_SAMPLES;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--samples" {
            args.next()
                .ok_or_else(|| "--samples needs a number".to_owned())?
        } else if let Some(value) = arg.strip_prefix("--samples=") {
            value.to_owned()
        } else {
            continue;
        };
        samples = value
            .parse()
            .ok()
            .filter(|&n: &usize| n > 0)
            .ok_or_else(|| format!("--samples {value}: want a positive number"))?;
    }
    Ok(samples)
}

/// A store on the bench server in `schema` whose consumers wait for notifications only.
async fn store(url: &str, schema: &str) -> Store {
    Store::builder()
        .postgres(url)
        .postgres_schema(schema)
        .postgres_poll_interval(POLL_INTERVAL)
        .connect()
        .await
        .expect("connect the engine")
}

/// Waits until the consumer on `queue` is among its waiters and its first look has found
/// nothing: its session is `idle in transaction` after its `DELETE` on `schema`'s items.
async fn consumer_ready(
    queue: &ReliableConcurrentQueue<u64>,
    monitor: &Client,
    schema: &str,
) -> Result<(), String> {
    let looked = format!("DELETE FROM \"{schema}\".items");
    loop {
        if queue.waiters() == 1 {
            let row = monitor
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND state = 'idle in transaction' \
                     AND strpos(query, $1) > 0",
                    &[&looked],
                )
                .await
                .map_err(|e| format!("reading pg_stat_activity: {e}"))?;
            if row.get::<_, i64>(0) > 0 {
                return Ok(());
            }
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// One sample of `one-store` or `two-stores`: a consumer of `consumer` waits on `cq`, the
/// producer commits `seq` to `pq` once it is waiting.
async fn engine_sample(
    (producer, pq): (&Store, &ReliableConcurrentQueue<u64>),
    (consumer, cq): (&Store, &ReliableConcurrentQueue<u64>),
    monitor: &Client,
    schema: &str,
    seq: u64,
) -> Result<Sample, String> {
    let deadline = tokio::time::Instant::now() + SAMPLE_TIMEOUT;
    let (woke_tx, woke_rx) = oneshot::channel::<(u64, Instant)>();
    let mut waiting: JoinHandle<Result<(), String>> = {
        let (store, q) = (consumer.clone(), cq.clone());
        tokio::spawn(async move {
            let mut tx = store.begin();
            let item = q
                .dequeue(&mut tx)
                .await
                .map_err(|e| format!("dequeue: {e}"))?;
            let woke = Instant::now();
            let _ = woke_tx.send((item, woke));
            tx.commit()
                .await
                .map_err(|e| format!("the consumer's commit: {e}"))
        })
    };
    let sample = async {
        tokio::time::timeout_at(deadline, consumer_ready(cq, monitor, schema))
            .await
            .map_err(|_| {
                format!(
                    "the consumer was not waiting after {SAMPLE_TIMEOUT:?} (waiters: {})",
                    cq.waiters()
                )
            })??;
        let mut tx = producer.begin();
        pq.enqueue(&mut tx, seq)
            .map_err(|e| format!("enqueue: {e}"))?;
        let started = Instant::now();
        tx.commit()
            .await
            .map_err(|e| format!("the producer's commit: {e}"))?;
        let returned = Instant::now();
        let (item, woke) = match tokio::time::timeout_at(deadline, woke_rx).await {
            Ok(Ok(woken)) => woken,
            Ok(Err(_)) => {
                // The consumer ended without an item: its error says why.
                let why = match (&mut waiting).await {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => "the consumer ended without an item".to_owned(),
                    Err(e) => format!("the consumer task: {e}"),
                };
                return Err(why);
            }
            Err(_) => {
                return Err(format!(
                    "LOST WAKE: the consumer was not woken within {SAMPLE_TIMEOUT:?} of the \
                     commit (waiters: {})",
                    cq.waiters()
                ))
            }
        };
        if item != seq {
            return Err(format!("the consumer got item {item}, not {seq}"));
        }
        match tokio::time::timeout_at(deadline, &mut waiting).await {
            Ok(Ok(Ok(()))) => Ok(Sample {
                started,
                returned,
                woke,
            }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(e)) => Err(format!("the consumer task: {e}")),
            Err(_) => Err(format!(
                "the consumer's commit did not return within {SAMPLE_TIMEOUT:?}"
            )),
        }
    }
    .await;
    if sample.is_err() {
        // Dropping its future and transaction puts back whatever it held.
        waiting.abort();
        let _ = waiting.await;
    }
    sample
}

/// Empties `queue` after a failed sample, so that the next starts from an empty queue.
async fn drain(store: &Store, queue: &ReliableConcurrentQueue<u64>) -> Result<(), String> {
    loop {
        let mut tx = store.begin();
        let taken = queue
            .try_dequeue(&mut tx)
            .await
            .map_err(|e| format!("draining: {e}"))?;
        tx.commit().await.map_err(|e| format!("draining: {e}"))?;
        if taken.is_none() {
            return Ok(());
        }
    }
}

/// `one-store` (`two_stores` false) or `two-stores`, in a fresh schema.
async fn engine_scenario(
    name: &'static str,
    url: &str,
    schema: &str,
    two_stores: bool,
    samples: usize,
) -> Scenario {
    let mut scenario = Scenario::new(name);
    let admin = pg::connect(url).await;
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .expect("drop a leftover schema");
    let consumer = store(url, schema).await;
    let producer = if two_stores {
        store(url, schema).await
    } else {
        consumer.clone()
    };
    let cq = consumer.queue::<u64>("wake").await.expect("the queue");
    let pq = producer.queue::<u64>("wake").await.expect("the queue");
    let monitor = pg::connect(url).await;
    for i in 0..WARM_UP + samples {
        let seq = u64::try_from(i).expect("a sample number");
        match engine_sample((&producer, &pq), (&consumer, &cq), &monitor, schema, seq).await {
            Ok(sample) if i >= WARM_UP => scenario.record(sample),
            Ok(_) => {}
            Err(why) => {
                scenario.fail(i, why);
                if let Err(why) = tokio::time::timeout(SAMPLE_TIMEOUT, drain(&consumer, &cq))
                    .await
                    .unwrap_or_else(|_| Err("draining timed out".to_owned()))
                {
                    scenario.fail(i, why);
                }
            }
        }
    }
    drop((cq, pq));
    if two_stores {
        producer.close().await.expect("close the producer's store");
    } else {
        drop(producer);
    }
    consumer.close().await.expect("close the store");
    admin
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .expect("drop the bench schema");
    scenario
}

/// `baseline-listen-notify`: one connection listens on `channel`, another notifies it.
async fn baseline_scenario(url: &str, channel: &str, samples: usize) -> Scenario {
    let mut scenario = Scenario::new("baseline-listen-notify");
    let (listener, mut connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect the listener");
    let (heard, mut notes) = mpsc::unbounded_channel::<(String, Instant)>();
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let at = Instant::now();
                    if heard.send((n.payload().to_owned(), at)).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("the listening connection failed: {e}");
                    return;
                }
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .expect("LISTEN");
    let notifier = pg::connect(url).await;
    let notify = notifier
        .prepare(&format!("SELECT pg_notify('{channel}', $1)"))
        .await
        .expect("prepare the notify statement");
    for i in 0..WARM_UP + samples {
        let payload = i.to_string();
        let started = Instant::now();
        if let Err(e) = notifier.execute(&notify, &[&payload]).await {
            scenario.fail(i, format!("pg_notify: {e}"));
            continue;
        }
        let returned = Instant::now();
        match tokio::time::timeout(SAMPLE_TIMEOUT, notes.recv()).await {
            Ok(Some((heard, woke))) if heard == payload => {
                if i >= WARM_UP {
                    scenario.record(Sample {
                        started,
                        returned,
                        woke,
                    });
                }
            }
            Ok(Some((heard, _))) => {
                scenario.fail(i, format!("heard {heard:?}, not {payload:?}"));
            }
            Ok(None) => {
                scenario.fail(i, "the listening connection ended".to_owned());
                break;
            }
            Err(_) => scenario.fail(
                i,
                format!("LOST WAKE: no notification within {SAMPLE_TIMEOUT:?}"),
            ),
        }
    }
    drop(listener);
    driver.abort();
    scenario
}

/// Makes a server this bench started durable (the harness runs it without `fsync`), and
/// returns the settings line.
async fn settings(url: &str, started_here: bool) -> String {
    if started_here {
        pg::make_durable(url).await;
    }
    // A new session sees the reloaded settings.
    let check = pg::connect(url).await;
    let mut shown = Vec::new();
    for setting in ["server_version", "fsync", "synchronous_commit"] {
        let row = check
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap_or_else(|e| panic!("SHOW {setting}: {e}"));
        shown.push(row.get::<_, String>(0));
    }
    if started_here {
        assert_eq!(shown[1], "on", "fsync on the bench server");
        assert_eq!(shown[2], "on", "synchronous_commit on the bench server");
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "machine: {cores} cores; PostgreSQL {} ({}); fsync={}, synchronous_commit={}",
        shown[0],
        if started_here {
            "private server of the test harness, Unix socket"
        } else {
            "RQ_TEST_POSTGRES_URL, settings as found"
        },
        shown[1],
        shown[2]
    )
}

fn print_table(scenarios: &[Scenario]) {
    println!(
        "{:<24} {:<14} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7}",
        "scenario", "from", "count", "p50 µs", "p90 µs", "p99 µs", "max µs", "early", "failed"
    );
    for s in scenarios {
        let what = if s.name.starts_with("baseline") {
            ["notify return", "notify start"]
        } else {
            ["commit return", "commit start"]
        };
        for (from, h) in what.into_iter().zip([&s.from_return, &s.from_start]) {
            println!(
                "{:<24} {:<14} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7}",
                s.name,
                from,
                h.len(),
                h.value_at_quantile(0.50),
                h.value_at_quantile(0.90),
                h.value_at_quantile(0.99),
                h.max(),
                s.early,
                s.failures.len()
            );
        }
    }
}

fn main() -> ExitCode {
    let samples = match samples_from_args() {
        Ok(samples) => samples,
        Err(why) => {
            eprintln!("postgres_wake: {why}");
            return ExitCode::from(2);
        }
    };
    let server = match pg::PgServer::start() {
        Ok(server) => server,
        Err(skip) => {
            eprintln!("==> PostgreSQL wake bench SKIPPED: {skip}");
            return ExitCode::SUCCESS;
        }
    };
    let url = server.url().to_owned();
    // Names of this run's own: an existing server (RQ_TEST_POSTGRES_URL) may be shared.
    let run = format!(
        "{}_{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() % 100_000)
    );
    let rt = pg::bench_runtime();
    let (settings, scenarios) = rt.block_on(async {
        let settings = settings(&url, server.started_here()).await;
        println!("reliable-queue: waking a consumer waiting on PostgreSQL");
        println!("{settings}");
        println!(
            "samples: {samples} per scenario (after {WARM_UP} uncounted), poll interval \
             {POLL_INTERVAL:?} (only a notification wakes), timeout {SAMPLE_TIMEOUT:?} per sample"
        );
        println!("reproduce: {REPRODUCE}\n");
        let scenarios = vec![
            engine_scenario(
                "one-store",
                &url,
                &format!("rq_wake_one_{run}"),
                false,
                samples,
            )
            .await,
            engine_scenario(
                "two-stores",
                &url,
                &format!("rq_wake_two_{run}"),
                true,
                samples,
            )
            .await,
            baseline_scenario(&url, &format!("rq_wake_baseline_{run}"), samples).await,
        ];
        (settings, scenarios)
    });
    drop(rt);
    drop(server);

    print_table(&scenarios);
    println!(
        "\nearly: samples whose consumer had the item before the commit (notify) call returned \
         (0 µs in the \"return\" row)"
    );
    let one = &scenarios[0];
    if !one.from_return.is_empty() {
        let p99 = Duration::from_micros(one.from_return.value_at_quantile(0.99));
        println!(
            "target: one-store p99 from the commit's return <= {TARGET_P99:?}: {} ({p99:?})",
            if p99 <= TARGET_P99 { "met" } else { "NOT MET" }
        );
    }
    println!("{settings}");
    println!("reproduce: {REPRODUCE}");
    let failures: usize = scenarios.iter().map(|s| s.failures.len()).sum();
    if failures == 0 {
        return ExitCode::SUCCESS;
    }
    eprintln!("\n==> {failures} sample(s) FAILED:");
    for s in &scenarios {
        for why in &s.failures {
            eprintln!("    {}: {why}", s.name);
        }
    }
    ExitCode::FAILURE
}
