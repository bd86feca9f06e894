//! The Redis engine against a hand-written redis-rs loop doing the same work with the same
//! durability, with PostgreSQL and sled beside them on the same workloads.
//!
//! Needs the `redis` feature and Debian's `redis-server` (the bench starts its own with the
//! test harness, `tests/redis/mod.rs`: Unix socket, `appendonly yes`, `appendfsync always`;
//! or uses `RQ_TEST_REDIS_URL`). With the `postgres` feature and PostgreSQL's binaries the
//! PostgreSQL engine runs beside it (`tests/pg/mod.rs`: `fsync` and `synchronous_commit` on).
//!
//! ```sh
//! cargo bench --features redis,postgres --bench redis            # 3 rounds, medians
//! cargo bench --features redis,postgres --bench redis -- --quick # 1 round, fewer moves
//! ```
//!
//! With `RQ_BENCH_REDIS_CALLER_RUNTIME=1` the engine runs on the bench's runtime
//! (`Builder::redis_runtime`) instead of a runtime thread of the store's own.
//!
//! Workloads (16-byte items), each side starting from its own empty store:
//! - `move/{1,16,64}-clients`: each client moves one item at a time between two queues `a`
//!   and `b` (8 items per client in each at the start): take the head item of one queue (the
//!   other when it is empty), put it on the other, commit. Clients are tasks on a tokio
//!   runtime with two worker threads.
//!   - `reliable-queue`: `try_dequeue`, `enqueue`, `commit` (two function calls, the take
//!     and the commit, which the store groups with its other transactions' calls; the bench
//!     prints the `FCALL`s per move and their cost from `INFO commandstats`).
//!   - `redis-rs by hand`: the reliable-queue pattern of a processing list: `LMOVE a
//!     inprogress:<client> LEFT RIGHT` (the item is safe in the client's list while it is
//!     worked on), then `MULTI; LREM inprogress:<client> 1 item; RPUSH b item; EXEC` (its
//!     completion); both on one multiplexed connection (`ConnectionManager`), as the engine
//!     has.
//!   - `postgres`, `sled`: the engine on those stores, the same loop.
//! - `64-item-tx`: 4 producers commit 64-item enqueue transactions and 4 consumers take up to
//!   64 items per transaction and commit, until every item is through (by hand: `RPUSH` of 64
//!   items; `LMOVE` 64 times in one `MULTI` into the consumer's processing list, then `DEL`
//!   of it). Throughput counts items.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use reliable_queue::{ReliableConcurrentQueue, Store};

#[path = "../tests/redis/mod.rs"]
mod redis_server;

#[cfg(feature = "postgres")]
#[path = "../tests/pg/mod.rs"]
mod pg;

type Item = [u8; 16];

fn namespace(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn take_one(left: &AtomicU64) -> bool {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

async fn move_one(store: &Store, queues: &[ReliableConcurrentQueue<Item>; 2], from: &mut usize) {
    loop {
        let mut tx = store.begin();
        if let Some(item) = queues[*from].try_dequeue(&mut tx).await.unwrap() {
            queues[1 - *from].enqueue(&mut tx, item).unwrap();
            tx.commit().await.unwrap();
            return;
        }
        drop(tx);
        *from = 1 - *from;
    }
}

/// `moves` moves by `clients` tasks on the engine.
async fn engine_moves(store: Store, clients: usize, moves: u64) -> Duration {
    let a = store.queue::<Item>("a").await.unwrap();
    let b = store.queue::<Item>("b").await.unwrap();
    for q in [&a, &b] {
        let mut tx = store.begin();
        for _ in 0..clients * 8 {
            q.enqueue(&mut tx, [7u8; 16]).unwrap();
        }
        tx.commit().await.unwrap();
    }
    // One uncounted move per client first (scripts loaded, connections made).
    let warm: Vec<_> = (0..clients)
        .map(|c| {
            let (store, queues) = (store.clone(), [a.clone(), b.clone()]);
            tokio::spawn(async move { move_one(&store, &queues, &mut (c % 2)).await })
        })
        .collect();
    for t in warm {
        t.await.unwrap();
    }
    let left = Arc::new(AtomicU64::new(moves));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (store, queues, left) = (store.clone(), [a.clone(), b.clone()], left.clone());
            tokio::spawn(async move {
                let mut from = c % 2;
                while take_one(&left) {
                    move_one(&store, &queues, &mut from).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    store.close().await.unwrap();
    elapsed
}

async fn connection(url: &str) -> ConnectionManager {
    redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

/// `moves` moves by `clients` tasks, written by hand with redis-rs.
async fn baseline_moves(url: &str, clients: usize, moves: u64) -> Duration {
    let conn = connection(url).await;
    let ns = namespace("byhand");
    let (a, b) = (format!("{ns}:a"), format!("{ns}:b"));
    let mut setup = conn.clone();
    for key in [&a, &b] {
        let items: Vec<Vec<u8>> = (0..clients * 8).map(|_| vec![7u8; 16]).collect();
        let _: () = redis::cmd("RPUSH")
            .arg(key)
            .arg(items)
            .query_async(&mut setup)
            .await
            .unwrap();
    }
    let left = Arc::new(AtomicU64::new(moves));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (mut conn, left) = (conn.clone(), left.clone());
            let queues = [a.clone(), b.clone()];
            let inprogress = format!("{ns}:inprogress:{c}");
            tokio::spawn(async move {
                let mut from = c % 2;
                while take_one(&left) {
                    loop {
                        let item: Option<Vec<u8>> = redis::cmd("LMOVE")
                            .arg(&queues[from])
                            .arg(&inprogress)
                            .arg("LEFT")
                            .arg("RIGHT")
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        if let Some(item) = item {
                            let _: () = redis::pipe()
                                .atomic()
                                .cmd("LREM")
                                .arg(&inprogress)
                                .arg(1)
                                .arg(&item)
                                .ignore()
                                .cmd("RPUSH")
                                .arg(&queues[1 - from])
                                .arg(&item)
                                .ignore()
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                            break;
                        }
                        from = 1 - from;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

const BATCH: usize = 64;
const SIDES: usize = 4;

/// `txs` 64-item transactions through the engine: 4 producers, 4 consumers.
async fn engine_batches(store: Store, txs: u64) -> Duration {
    let q = store.queue::<Item>("q").await.unwrap();
    let start = Instant::now();
    let left = Arc::new(AtomicU64::new(txs));
    let taken = Arc::new(AtomicU64::new(0));
    let total = txs * BATCH as u64;
    let mut tasks = Vec::new();
    for _ in 0..SIDES {
        let (producer, pq, left) = (store.clone(), q.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            let (store, q) = (producer, pq);
            while take_one(&left) {
                let mut tx = store.begin();
                for _ in 0..BATCH {
                    q.enqueue(&mut tx, [7u8; 16]).unwrap();
                }
                tx.commit().await.unwrap();
            }
        }));
        let (store, q, taken) = (store.clone(), q.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            while taken.load(Ordering::Relaxed) < total {
                let mut tx = store.begin();
                let got = q.try_dequeue_many(&mut tx, BATCH).await.unwrap();
                if got.is_empty() {
                    drop(tx);
                    tokio::task::yield_now().await;
                    continue;
                }
                tx.commit().await.unwrap();
                taken.fetch_add(got.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    store.close().await.unwrap();
    elapsed
}

/// The same by hand.
async fn baseline_batches(url: &str, txs: u64) -> Duration {
    let conn = connection(url).await;
    let ns = namespace("byhand");
    let q = format!("{ns}:q");
    let start = Instant::now();
    let left = Arc::new(AtomicU64::new(txs));
    let taken = Arc::new(AtomicU64::new(0));
    let total = txs * BATCH as u64;
    let mut tasks = Vec::new();
    for c in 0..SIDES {
        let (mut pconn, pq, left) = (conn.clone(), q.clone(), left.clone());
        tasks.push(tokio::spawn(async move {
            let (conn, q) = (&mut pconn, pq);
            while take_one(&left) {
                let items: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![7u8; 16]).collect();
                let _: () = redis::cmd("RPUSH")
                    .arg(&q)
                    .arg(items)
                    .query_async(conn)
                    .await
                    .unwrap();
            }
        }));
        let (mut conn, q, taken) = (conn.clone(), q.clone(), taken.clone());
        let inprogress = format!("{ns}:inprogress:{c}");
        tasks.push(tokio::spawn(async move {
            while taken.load(Ordering::Relaxed) < total {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for _ in 0..BATCH {
                    pipe.cmd("LMOVE")
                        .arg(&q)
                        .arg(&inprogress)
                        .arg("LEFT")
                        .arg("RIGHT");
                }
                let got: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await.unwrap();
                let n = got.iter().flatten().count() as u64;
                if n == 0 {
                    tokio::task::yield_now().await;
                    continue;
                }
                let _: () = redis::cmd("DEL")
                    .arg(&inprogress)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                taken.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 1 } else { 3 };
    let server = match redis_server::RedisServer::start() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("==> Redis bench SKIPPED: {why}");
            return;
        }
    };
    let url = server.url().to_owned();
    #[cfg(feature = "postgres")]
    let pg = pg::PgServer::start().ok();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // `RQ_BENCH_REDIS_CALLER_RUNTIME=1`: the engine's connection and tasks on the bench's own
    // runtime (`Builder::redis_runtime`) instead of a runtime thread of the store's own.
    let on_caller_runtime = std::env::var("RQ_BENCH_REDIS_CALLER_RUNTIME").as_deref() == Ok("1");
    let redis_store = |ns: String| {
        let builder = Store::builder().url(&url).namespace(&ns);
        let builder = if on_caller_runtime {
            builder.redis_runtime(rt.handle().clone())
        } else {
            builder
        };
        builder.open().unwrap()
    };
    let sled_store = || {
        Store::builder()
            .path(dir.path().join(namespace("sled")))
            .open()
            .unwrap()
    };
    #[cfg(feature = "postgres")]
    let pg_store = |clients: usize| {
        pg.as_ref().map(|pg| {
            Store::builder()
                .postgres(pg.url())
                .postgres_schema(&namespace("bench"))
                .postgres_pool_size(clients.max(1))
                .open()
                .unwrap()
        })
    };
    println!(
        "machine: {} CPUs; redis-server with appendonly yes, appendfsync always (Unix socket); \
         {rounds} round(s), medians; the engine on {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if on_caller_runtime {
            "the bench's runtime (redis_runtime)"
        } else {
            "a runtime thread of its own"
        }
    );
    println!(
        "\n| workload | reliable-queue on Redis | redis-rs by hand | ratio | Redis CPU per move or item (engine / by hand) | PostgreSQL | sled |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    // Redis's CPU time over a run, per unit of work, in µs.
    let cpu_per = |units: f64, run: &mut dyn FnMut() -> Duration| {
        let before = server.cpu_seconds();
        let (calls0, usec0) = server.fcall_stats().unwrap_or((0, 0));
        let d = run();
        let (calls1, usec1) = server.fcall_stats().unwrap_or((0, 0));
        if calls1 > calls0 {
            eprintln!(
                "  FCALL: {} calls, {:.2} per unit, {:.1} µs each",
                calls1 - calls0,
                (calls1 - calls0) as f64 / units,
                (usec1 - usec0) as f64 / (calls1 - calls0) as f64
            );
        }
        (d, (server.cpu_seconds() - before) * 1e6 / units)
    };
    for clients in [1usize, 16, 64] {
        let moves = if quick { 2_000 } else { 20_000 };
        // `post` is only written with the `postgres` feature.
        #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
        let (mut engine, mut hand, mut sled, mut post) = (vec![], vec![], vec![], vec![]);
        let (mut engine_cpu, mut hand_cpu) = (vec![], vec![]);
        for _ in 0..rounds {
            let per_s = |d: Duration| moves as f64 / d.as_secs_f64();
            let (d, cpu) = cpu_per(moves as f64, &mut || {
                rt.block_on(engine_moves(
                    redis_store(namespace("engine")),
                    clients,
                    moves,
                ))
            });
            engine.push(per_s(d));
            engine_cpu.push(cpu);
            let (d, cpu) = cpu_per(moves as f64, &mut || {
                rt.block_on(baseline_moves(&url, clients, moves))
            });
            hand.push(per_s(d));
            hand_cpu.push(cpu);
            sled.push(per_s(rt.block_on(engine_moves(
                sled_store(),
                clients,
                moves,
            ))));
            #[cfg(feature = "postgres")]
            if let Some(store) = pg_store(clients) {
                post.push(per_s(rt.block_on(engine_moves(store, clients, moves))));
            }
        }
        let (e, h) = (median(engine), median(hand));
        let pg_text = if post.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.0}", median(post))
        };
        println!(
            "| move, {clients} client(s) (moves/s) | {e:.0} | {h:.0} | {:.2}x | {:.1} / {:.1} µs | {pg_text} | {:.0} |",
            e / h,
            median(engine_cpu),
            median(hand_cpu),
            median(sled)
        );
    }
    let txs = if quick { 200 } else { 2_000 };
    // `post` is only written with the `postgres` feature.
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let (mut engine, mut hand, mut sled, mut post) = (vec![], vec![], vec![], vec![]);
    let (mut engine_cpu, mut hand_cpu) = (vec![], vec![]);
    let items = (txs * BATCH as u64) as f64;
    for _ in 0..rounds {
        let per_s = |d: Duration| items / d.as_secs_f64();
        let (d, cpu) = cpu_per(items, &mut || {
            rt.block_on(engine_batches(redis_store(namespace("engine")), txs))
        });
        engine.push(per_s(d));
        engine_cpu.push(cpu);
        let (d, cpu) = cpu_per(items, &mut || rt.block_on(baseline_batches(&url, txs)));
        hand.push(per_s(d));
        hand_cpu.push(cpu);
        sled.push(per_s(rt.block_on(engine_batches(sled_store(), txs))));
        #[cfg(feature = "postgres")]
        if let Some(store) = pg_store(SIDES * 2) {
            post.push(per_s(rt.block_on(engine_batches(store, txs))));
        }
    }
    let (e, h) = (median(engine), median(hand));
    let pg_text = if post.is_empty() {
        "-".to_owned()
    } else {
        format!("{:.0}", median(post))
    };
    println!(
        "| 64-item transactions, 4+4 clients (items/s) | {e:.0} | {h:.0} | {:.2}x | {:.1} / {:.1} µs | {pg_text} | {:.0} |",
        e / h,
        median(engine_cpu),
        median(hand_cpu),
        median(sled)
    );
}
