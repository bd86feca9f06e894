//! The PostgreSQL engine against a hand-written tokio-postgres loop doing the same `SKIP LOCKED`
//! work with the same durability, and the sled engine on the same workload beside them.
//!
//! Needs the `postgres` feature and PostgreSQL's server binaries (the bench starts its own
//! server with the test harness, `tests/pg/mod.rs`, with `fsync` and `synchronous_commit` on,
//! Unix socket only; or uses `RQ_TEST_POSTGRES_URL`):
//!
//! ```sh
//! cargo bench --features postgres --bench postgres
//! ```
//!
//! Workloads (16-byte items):
//! - `postgres/move/{1,16,64}-clients`: each client moves one item at a time between two queues
//!   `a` and `b` (both filled with 8 items per client at the start): a transaction that takes
//!   the head item of one queue (the other when it is empty) and enqueues it to the other, and
//!   commits. Throughput counts moves. Clients are tasks on a tokio runtime with two worker
//!   threads.
//!   - `reliable-queue`: `try_dequeue`, `enqueue`, `commit` (async), a pool of as many
//!     connections as clients, on the store's own runtime thread (the default).
//!   - `reliable-queue-on-caller-runtime`: the same with `Builder::postgres_runtime` set to the
//!     bench's runtime, as a tokio service would.
//!   - `tokio-postgres`: each client its own connection and prepared statements: `BEGIN`;
//!     `DELETE ... WHERE id = (SELECT id ... ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
//!     RETURNING payload`; `INSERT`; `COMMIT`, on a table of the same shape and index.
//!   - `sled`: the same loop on an on-disk store (`Durability::Sync`), for what leaving the
//!     process costs.
//! - `postgres/64-item-tx`: 4 producers commit 64-item enqueue transactions, 4 consumers take
//!   up to 64 items per transaction (`try_dequeue_many`; by hand, one `DELETE ... LIMIT 64`)
//!   and commit, until every item is through. Throughput counts items.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use reliable_queue::{ReliableConcurrentQueue, Store};
use tokio_postgres::{Client, NoTls};

#[path = "../tests/pg/mod.rs"]
mod pg;

type Item = [u8; 16];

/// A fresh schema name for each sample (each side starts from empty tables).
fn schema(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the bench server");
    tokio::spawn(connection);
    client
}

/// The hand-written side's table, in its own schema: the shape and index of the engine's.
async fn baseline_table(url: &str) -> (Client, String) {
    let client = connect(url).await;
    let s = schema("byhand");
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {s}; \
             CREATE TABLE {s}.items (id bigserial PRIMARY KEY, queue int4 NOT NULL, \
               payload bytea NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT now()); \
             CREATE INDEX ON {s}.items (queue, id);"
        ))
        .await
        .expect("create the baseline table");
    (client, s)
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
    // Warm up as the hand-written side does before its clock starts (it connects and
    // prepares its statements first): one uncounted move per client, all at once, so that
    // the pool holds a connection per client with its statements prepared.
    let warm: Vec<_> = (0..clients)
        .map(|c| {
            let (store, queues) = (store.clone(), [a.clone(), b.clone()]);
            tokio::spawn(async move {
                let mut from = c % 2;
                move_one(&store, &queues, &mut from).await;
            })
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

/// `moves` moves by `clients` tasks, each on its own connection, written by hand.
async fn baseline_moves(url: &str, clients: usize, moves: u64) -> Duration {
    let (setup, s) = baseline_table(url).await;
    setup
        .execute(
            &format!(
                "INSERT INTO {s}.items (queue, payload) \
                 SELECT q, '\\x07070707070707070707070707070707'::bytea \
                 FROM generate_series(1, $1::int4) n, (VALUES (0), (1)) v(q)"
            ),
            &[&i32::try_from(clients * 8).unwrap()],
        )
        .await
        .unwrap();
    let mut clients_ready = Vec::new();
    for _ in 0..clients {
        let client = connect(url).await;
        let take = client
            .prepare(&format!(
                "DELETE FROM {s}.items WHERE id = (SELECT id FROM {s}.items WHERE queue = $1 \
                 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING payload"
            ))
            .await
            .unwrap();
        let put = client
            .prepare(&format!(
                "INSERT INTO {s}.items (queue, payload) VALUES ($1, $2)"
            ))
            .await
            .unwrap();
        clients_ready.push((client, take, put));
    }
    let left = Arc::new(AtomicU64::new(moves));
    let start = Instant::now();
    let tasks: Vec<_> = clients_ready
        .into_iter()
        .enumerate()
        .map(|(c, (client, take, put))| {
            let left = left.clone();
            tokio::spawn(async move {
                let mut from = i32::try_from(c % 2).unwrap();
                while take_one(&left) {
                    loop {
                        client.batch_execute("BEGIN").await.unwrap();
                        let row = client.query_opt(&take, &[&from]).await.unwrap();
                        if let Some(row) = row {
                            let payload: Vec<u8> = row.get(0);
                            client
                                .execute(&put, &[&(1 - from), &payload])
                                .await
                                .unwrap();
                            client.batch_execute("COMMIT").await.unwrap();
                            break;
                        }
                        client.batch_execute("ROLLBACK").await.unwrap();
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

/// 4 producers, 4 consumers, 64-item transactions, `txs` producer transactions in all.
async fn engine_batches(store: Store, txs: u64) -> Duration {
    let q = store.queue::<Item>("q").await.unwrap();
    let items = txs * 64;
    let taken = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..4u64 {
        let (store, q) = (store.clone(), q.clone());
        let mine = txs / 4 + u64::from(p < txs % 4);
        tasks.push(tokio::spawn(async move {
            for _ in 0..mine {
                let mut tx = store.begin();
                for _ in 0..64 {
                    q.enqueue(&mut tx, [7u8; 16]).unwrap();
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    for _ in 0..4 {
        let (store, q, taken) = (store.clone(), q.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            while taken.load(Ordering::Relaxed) < items {
                let mut tx = store.begin();
                let got = q.try_dequeue_many(&mut tx, 64).await.unwrap().len() as u64;
                tx.commit().await.unwrap();
                if got == 0 {
                    tokio::task::yield_now().await;
                }
                taken.fetch_add(got, Ordering::Relaxed);
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

async fn baseline_batches(url: &str, txs: u64) -> Duration {
    let (_setup, s) = baseline_table(url).await;
    let items = txs * 64;
    let taken = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..4u64 {
        let client = connect(url).await;
        let put = client
            .prepare(&format!(
                "INSERT INTO {s}.items (queue, payload) SELECT 0, p FROM unnest($1::bytea[]) p"
            ))
            .await
            .unwrap();
        let mine = txs / 4 + u64::from(p < txs % 4);
        tasks.push(tokio::spawn(async move {
            let batch: Vec<Vec<u8>> = vec![vec![7u8; 16]; 64];
            for _ in 0..mine {
                client.execute(&put, &[&batch]).await.unwrap();
            }
        }));
    }
    for _ in 0..4 {
        let client = connect(url).await;
        let take = client
            .prepare(&format!(
                "DELETE FROM {s}.items WHERE id IN (SELECT id FROM {s}.items WHERE queue = 0 \
                 ORDER BY id LIMIT 64 FOR UPDATE SKIP LOCKED) RETURNING payload"
            ))
            .await
            .unwrap();
        let taken = taken.clone();
        tasks.push(tokio::spawn(async move {
            while taken.load(Ordering::Relaxed) < items {
                client.batch_execute("BEGIN").await.unwrap();
                let got = client.query(&take, &[]).await.unwrap().len() as u64;
                client.batch_execute("COMMIT").await.unwrap();
                if got == 0 {
                    tokio::task::yield_now().await;
                }
                taken.fetch_add(got, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

/// The engine on PostgreSQL; `on_caller_runtime`: with `Builder::postgres_runtime` set to the
/// bench's own runtime, else on the store's own runtime thread (the default).
async fn on_postgres(url: &str, schema_name: &str, pool: usize, on_caller_runtime: bool) -> Store {
    let mut builder = Store::builder()
        .postgres(url)
        .postgres_schema(schema_name)
        .postgres_pool_size(pool);
    if on_caller_runtime {
        builder = builder.postgres_runtime(tokio::runtime::Handle::current());
    }
    builder.connect().await.expect("connect the engine")
}

fn on_sled(dir: &std::path::Path) -> Store {
    Store::open(dir.join("store")).expect("open a sled store")
}

fn bench(c: &mut Criterion) {
    let server = match pg::PgServer::start() {
        Ok(server) => server,
        Err(skip) => {
            eprintln!("==> PostgreSQL benches SKIPPED: {skip:?}");
            return;
        }
    };
    let url = server.url().to_owned();
    let rt = pg::bench_runtime();
    // The harness runs its test server without fsync; the figures here are for the durable
    // configuration a user runs (the server's defaults).
    rt.block_on(pg::make_durable(&url));

    for clients in [1usize, 16, 64] {
        let mut group = c.benchmark_group(format!("postgres/move/{clients}-clients"));
        group.throughput(Throughput::Elements(1));
        group.sampling_mode(SamplingMode::Flat);
        for (name, on_caller_runtime) in [
            ("reliable-queue", false),
            ("reliable-queue-on-caller-runtime", true),
        ] {
            group.bench_function(name, |b| {
                b.iter_custom(|moves| {
                    rt.block_on(async {
                        let store =
                            on_postgres(&url, &schema("rq"), clients, on_caller_runtime).await;
                        engine_moves(store, clients, moves).await
                    })
                })
            });
        }
        group.bench_function("tokio-postgres", |b| {
            b.iter_custom(|moves| rt.block_on(baseline_moves(&url, clients, moves)))
        });
        group.bench_function("sled", |b| {
            b.iter_custom(|moves| {
                let dir = tempfile::tempdir().unwrap();
                let store = on_sled(dir.path());
                rt.block_on(engine_moves(store, clients, moves))
            })
        });
        group.finish();
    }

    let mut group = c.benchmark_group("postgres/64-item-tx");
    group.throughput(Throughput::Elements(64));
    group.sampling_mode(SamplingMode::Flat);
    for (name, on_caller_runtime) in [
        ("reliable-queue", false),
        ("reliable-queue-on-caller-runtime", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|txs| {
                rt.block_on(async {
                    let store = on_postgres(&url, &schema("rqbatch"), 16, on_caller_runtime).await;
                    engine_batches(store, txs).await
                })
            })
        });
    }
    group.bench_function("tokio-postgres", |b| {
        b.iter_custom(|txs| rt.block_on(baseline_batches(&url, txs)))
    });
    group.bench_function("sled", |b| {
        b.iter_custom(|txs| {
            let dir = tempfile::tempdir().unwrap();
            let store = on_sled(dir.path());
            rt.block_on(engine_batches(store, txs))
        })
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
}
