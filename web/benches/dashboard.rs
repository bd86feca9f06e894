//! What the dashboard costs, in two measurements:
//!
//! 1. **Response times with a large backlog.** A store with `--items` queued items (default
//!    1,000,000) in one queue, on sled and on PostgreSQL (the root crate's test harness starts
//!    a private server; without one that part is skipped with a message). The dashboard is
//!    served on loopback; each request is timed from connect to the last byte, 21 times
//!    (the first, then the median and maximum of the other 20): the overview, `api/stats`, a queue's first page, a queue's page
//!    of leased items (a scan of up to 10,000 items), and the read the dashboard's task makes
//!    every second (`stats()` of every queue).
//! 2. **The commit path with viewers.** `--threads` threads (default 2) each doing one-item
//!    transactions on a sled store (enqueue and commit, then take and commit) for `--seconds`
//!    (default 10) per round: with no dashboard, with the dashboard mounted and no viewer, and
//!    with 10 viewers on its event stream; the three alternate over `--rounds` (default 3).
//!
//! ```sh
//! cargo bench -p reliable-queue-web --bench dashboard
//! cargo bench -p reliable-queue-web --bench dashboard -- --items 100000 --seconds 5 --rounds 2
//! ```

#[path = "../../tests/pg/mod.rs"]
mod pg;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reliable_queue::{Store, Transaction};
use reliable_queue_web::Dashboard;

struct Args {
    items: u64,
    threads: usize,
    seconds: u64,
    rounds: usize,
}

fn args() -> Args {
    let mut a = Args {
        items: 1_000_000,
        threads: 2,
        seconds: 10,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<u64>().ok());
        match flag.as_str() {
            "--items" => a.items = value().unwrap_or(a.items),
            "--threads" => a.threads = value().map_or(a.threads, |v| v as usize),
            "--seconds" => a.seconds = value().unwrap_or(a.seconds),
            "--rounds" => a.rounds = value().map_or(a.rounds, |v| v as usize),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

/// Serves `dashboard` on loopback; its address.
fn serve(runtime: &tokio::runtime::Runtime, dashboard: Dashboard) -> SocketAddr {
    runtime.block_on(async {
        let router = dashboard.router().expect("a router");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    })
}

/// One GET, connect to last byte: its time, status line and whole answer.
fn get(addr: SocketAddr, path: &str) -> (Duration, String, String) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.lines().next().unwrap_or_default().to_owned();
    (took, status, answer)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The first of 21 runs of `f`, and the median and maximum of the other 20.
fn timed(mut f: impl FnMut() -> Duration) -> (f64, f64, f64) {
    let first = ms(f());
    let mut times: Vec<f64> = (0..20).map(|_| ms(f())).collect();
    times.sort_by(f64::total_cmp);
    (first, times[times.len() / 2], times[times.len() - 1])
}

/// Fills queue `jobs` of `store` with `items` items, 10,000 a commit, and leases 16 of them.
fn fill(store: &Store, items: u64) -> Vec<reliable_queue::Lease<String>> {
    let q = store.blocking_queue::<String>("jobs").expect("queue");
    let mut left = items;
    let mut n = 0u64;
    while left > 0 {
        let batch = left.min(10_000);
        let mut tx = store.begin();
        for _ in 0..batch {
            q.enqueue(&mut tx, format!("job {n:08} with a payload of some size"))
                .expect("enqueue");
            n += 1;
        }
        tx.blocking_commit().expect("commit");
        left -= batch;
    }
    q.blocking_lease_many(16, Duration::from_secs(3600))
        .expect("lease")
}

fn response_times(engine: &str, store: &Store, items: u64, runtime: &tokio::runtime::Runtime) {
    let filled = Instant::now();
    let _leases = fill(store, items);
    println!(
        "dashboard: {engine}: {items} items queued in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let addr = serve(runtime, Dashboard::new(store.clone()));
    // `api/stats` answers once the dashboard has read the store.
    assert!(get(addr, "/api/stats").2.contains("\"jobs\""));
    let read = timed(|| {
        let started = Instant::now();
        runtime.block_on(async {
            for name in store.list_queues().await.expect("list") {
                let q = store
                    .queue::<reliable_queue::RawItem>(&name)
                    .await
                    .expect("queue");
                q.stats().await.expect("stats");
            }
        });
        started.elapsed()
    });
    println!(
        "{:<10} {:<34} {:>9} {:>9} {:>9}",
        "engine", "request", "first ms", "median ms", "max ms"
    );
    println!(
        "{engine:<10} {:<34} {:>9.2} {:>9.2} {:>9.2}",
        "(the task's read: stats of all)", read.0, read.1, read.2
    );
    for path in [
        "/",
        "/api/stats",
        "/queues/jobs",
        "/queues/jobs?state=leased",
    ] {
        let mut status = String::new();
        let (first, median, max) = timed(|| {
            let (took, s, _) = get(addr, path);
            status = s;
            took
        });
        assert!(status.contains("200"), "{path}: {status}");
        println!("{engine:<10} {path:<34} {first:>9.2} {median:>9.2} {max:>9.2}");
    }
}

/// Runs the one-item transaction loop on `threads` threads for `seconds`; round trips/s.
fn commits(store: &Store, threads: usize, seconds: u64) -> f64 {
    let q = store.blocking_queue::<u64>("load").expect("queue");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, q, stop, done) = (store.clone(), q.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = t as u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut tx: Transaction = store.begin();
                    q.enqueue(&mut tx, n).expect("enqueue");
                    tx.blocking_commit().expect("commit");
                    let mut tx = store.begin();
                    q.blocking_try_dequeue(&mut tx).expect("take");
                    tx.blocking_commit().expect("commit");
                    n += threads as u64;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("a worker");
    }
    done.load(Ordering::Relaxed) as f64 / seconds as f64
}

/// Connects `n` viewers to the event stream at `addr`; they read until `stop`.
fn viewers(n: usize, addr: SocketAddr, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .expect("timeout");
                write!(s, "GET /events HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
                let mut buf = [0u8; 4096];
                let mut bytes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(k) = s.read(&mut buf) {
                        bytes += k as u64;
                    }
                }
                bytes
            })
        })
        .collect()
}

fn commit_path(args: &Args, runtime: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().expect("a directory");
    let store = Store::open(dir.path().join("store")).expect("a store");
    let plain = Store::open(dir.path().join("plain")).expect("a store");
    let addr = serve(runtime, Dashboard::new(store.clone()));
    println!(
        "dashboard: {} threads of one-item transactions (enqueue+commit, take+commit) on sled, \
         {} s a round, {} rounds",
        args.threads, args.seconds, args.rounds
    );
    println!(
        "{:<6} {:>14} {:>14} {:>14}",
        "round", "no dashboard", "0 viewers", "10 viewers"
    );
    let mut sums = [0.0; 3];
    for round in 1..=args.rounds {
        let none = commits(&plain, args.threads, args.seconds);
        let zero = commits(&store, args.threads, args.seconds);
        let stop = Arc::new(AtomicBool::new(false));
        let watching = viewers(10, addr, stop.clone());
        let ten = commits(&store, args.threads, args.seconds);
        stop.store(true, Ordering::Relaxed);
        let read: u64 = watching
            .into_iter()
            .map(|v| v.join().expect("a viewer"))
            .sum();
        assert!(read > 0, "the viewers received nothing");
        println!("{round:<6} {none:>14.0} {zero:>14.0} {ten:>14.0}");
        sums[0] += none;
        sums[1] += zero;
        sums[2] += ten;
    }
    let mean = |i: usize| sums[i] / args.rounds as f64;
    println!(
        "dashboard summary: round trips/s, mean: no dashboard {:.0}, dashboard with 0 viewers {:.0} \
         ({:+.1}%), with 10 viewers {:.0} ({:+.1}% of 0 viewers)",
        mean(0),
        mean(1),
        (mean(1) / mean(0) - 1.0) * 100.0,
        mean(2),
        (mean(2) / mean(1) - 1.0) * 100.0
    );
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a directory");
    let store = Store::open(dir.path().join("big")).expect("a store");
    response_times("sled", &store, args.items, &runtime);
    drop(store);
    match pg::PgServer::start() {
        Ok(server) => {
            let store = server.store("dashboard_bench");
            response_times("postgres", &store, args.items, &runtime);
            drop(store);
        }
        Err(skip) => println!("dashboard: PostgreSQL part SKIPPED: {skip}"),
    }
    commit_path(&args, &runtime);
}
