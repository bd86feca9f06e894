//! Several worker processes sharing the queues of one PostgreSQL database.
//!
//! The parent enqueues jobs into `jobs`, starts worker processes (this program again, with
//! `--worker`), each of which waits for jobs (`dequeue`: woken by PostgreSQL's
//! notifications), "processes" one, and moves it to `done` in the same transaction. Midway the
//! parent kills one worker with SIGKILL and starts another: the job it held goes back to
//! `jobs` when the server notices the dead connection. At the end the parent checks that every
//! job is in `done` exactly once.
//!
//! ```sh
//! cargo run --release --features postgres --example postgres_workers -- --url 'host=/run/postgresql dbname=app'
//! ```
//!
//! Without `--url` it starts a private PostgreSQL server of its own (Debian's `postgresql`
//! package must be installed; the same harness as the tests, in a temporary directory).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reliable_queue::Store;

#[path = "../tests/pg/mod.rs"]
mod pg;

const SCHEMA: &str = "workers_example";

fn open(url: &str) -> Store {
    Store::builder()
        .postgres(url)
        .postgres_schema(SCHEMA)
        .postgres_pool_size(4)
        .open()
        .expect("connect to PostgreSQL")
}

/// A worker: waits for a job, moves it to `done`, reports it, until `stop` appears in `jobs`.
fn worker(url: &str) {
    let store = open(url);
    let jobs = store.blocking_queue::<u64>("jobs").unwrap();
    let done = store.blocking_queue::<u64>("done").unwrap();
    loop {
        let mut tx = store.begin();
        let job = jobs.blocking_dequeue(&mut tx).expect("dequeue");
        if job == u64::MAX {
            // The stop signal goes back for the other workers.
            tx.blocking_abort().unwrap();
            return;
        }
        done.enqueue(&mut tx, job).unwrap();
        tx.blocking_commit().expect("commit");
        println!("{job}");
    }
}

fn spawn(url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--worker", "--url", url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a worker")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url_arg = args
        .iter()
        .position(|a| a == "--url")
        .and_then(|i| args.get(i + 1).cloned());
    if args.iter().any(|a| a == "--worker") {
        worker(&url_arg.expect("--worker needs --url"));
        return;
    }
    let _server;
    let url = match url_arg {
        Some(url) => url,
        None => match pg::PgServer::start() {
            Ok(server) => {
                let url = server.url().to_owned();
                _server = server;
                url
            }
            Err(skip) => {
                eprintln!("no --url and no local PostgreSQL: {skip}");
                std::process::exit(2);
            }
        },
    };
    let jobs_total: u64 = 2_000;
    let workers = 4;
    let store = open(&url);
    let jobs = store.blocking_queue::<u64>("jobs").unwrap();
    let done = store.blocking_queue::<u64>("done").unwrap();
    let mut tx = store.begin();
    for job in 0..jobs_total {
        jobs.enqueue(&mut tx, job).unwrap();
    }
    tx.blocking_commit().unwrap();
    let start = Instant::now();
    let (reports, reported) = std::sync::mpsc::channel::<u64>();
    let start_worker = |url: &str| -> Child {
        let mut child = spawn(url);
        let out = child.stdout.take().unwrap();
        let reports = reports.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(job) = line.parse() {
                    let _ = reports.send(job);
                }
            }
        });
        child
    };
    let mut children: Vec<Child> = (0..workers).map(|_| start_worker(&url)).collect();
    let mut killed = false;
    loop {
        let finished = done.blocking_count().unwrap();
        if finished >= jobs_total {
            break;
        }
        if !killed && finished >= jobs_total / 2 {
            children[0].kill().unwrap();
            children[0].wait().unwrap();
            children[0] = start_worker(&url);
            killed = true;
            println!("killed worker 1 with SIGKILL after {finished} jobs; started another");
        }
        // Wait for the next job a worker reports (or look again after a while).
        let _ = reported.recv_timeout(Duration::from_secs(1));
    }
    let elapsed = start.elapsed();
    // Stop the workers: one stop signal that each puts back for the next.
    let mut tx = store.begin();
    jobs.enqueue(&mut tx, u64::MAX).unwrap();
    tx.blocking_commit().unwrap();
    for mut child in children {
        child.wait().unwrap();
    }
    let mut tx = store.begin();
    let mut all = Vec::new();
    loop {
        let batch = done.blocking_try_dequeue_many(&mut tx, 1000).unwrap();
        if batch.is_empty() {
            break;
        }
        all.extend(batch);
    }
    tx.blocking_abort().unwrap();
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    println!(
        "{} jobs done by {workers} worker processes in {:.1?} ({:.0} jobs/s); {} distinct",
        all.len(),
        elapsed,
        jobs_total as f64 / elapsed.as_secs_f64(),
        distinct.len()
    );
    assert_eq!(all.len() as u64, jobs_total, "every job done once");
    assert_eq!(
        distinct,
        (0..jobs_total).collect(),
        "none missing, none twice"
    );
    // Leave the schema empty for the next run.
    let mut tx = store.begin();
    while !jobs
        .blocking_try_dequeue_many(&mut tx, 1000)
        .unwrap()
        .is_empty()
    {}
    while !done
        .blocking_try_dequeue_many(&mut tx, 1000)
        .unwrap()
        .is_empty()
    {}
    tx.blocking_commit().unwrap();
    println!("verification passed: every job done exactly once");
}
