//! How long a commit takes to wake a consumer waiting in `dequeue` on Redis, on one store
//! (the store wakes its own waiters when the commit returns) and across two stores (the
//! commit's script publishes the queue; the other store's subscription hears it).
//!
//! Needs the `redis` feature and Debian's `redis-server` (started by the bench with the test
//! harness, `tests/redis/mod.rs`; or `RQ_TEST_REDIS_URL`):
//!
//! ```sh
//! cargo bench --features redis --bench redis_wake
//! cargo bench --features redis --bench redis_wake -- --samples 1000
//! ```
//!
//! Per sample a consumer task begins a transaction and waits in `dequeue` on the empty queue;
//! once the consumer's store counts it among the queue's waiters and a fallback look cannot
//! be what wakes it (the poll interval is the default second; a sample whose wake took longer
//! than that is reported), the producer enqueues one item and commits. The time runs from
//! just before the producer's commit to the moment `dequeue` returns the item.

use std::time::{Duration, Instant};

use reliable_queue::Store;

#[path = "../tests/redis/mod.rs"]
mod redis_server;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn samples(producer: Store, consumer: Store, n: usize) -> Vec<Duration> {
    let q_in = producer.queue::<u64>("wake").await.unwrap();
    let q_out = consumer.queue::<u64>("wake").await.unwrap();
    let mut out = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let (store, q) = (consumer.clone(), q_out.clone());
        let waiter = tokio::spawn(async move {
            let mut tx = store.begin();
            let item = q.dequeue(&mut tx).await.unwrap();
            let at = Instant::now();
            tx.commit().await.unwrap();
            (item, at)
        });
        while q_out.waiters() == 0 {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        let mut tx = producer.begin();
        q_in.enqueue(&mut tx, i as u64).unwrap();
        tx.commit().await.unwrap();
        let (item, at) = waiter.await.unwrap();
        assert_eq!(item, i as u64);
        if i >= 5 {
            out.push(at - start);
        }
    }
    out
}

fn main() {
    let n = std::env::args()
        .skip_while(|a| a != "--samples")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let server = match redis_server::RedisServer::start() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("==> Redis wake bench SKIPPED: {why}");
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let open = |ns: &str| {
        Store::builder()
            .url(server.url())
            .namespace(ns)
            .open()
            .unwrap()
    };
    println!("{n} samples; redis-server with appendfsync always (Unix socket)\n");
    println!("| scenario | p50 | p99 | max |");
    println!("| --- | --- | --- | --- |");
    let one = open("wake1");
    let two = (open("wake2"), open("wake2"));
    for (name, producer, consumer) in [
        ("one store", one.clone(), one),
        ("two stores", two.0, two.1),
    ] {
        let mut got = rt.block_on(samples(producer, consumer, n));
        got.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ms(percentile(&got, 0.5)),
            ms(percentile(&got, 0.99)),
            ms(*got.last().unwrap())
        );
    }
}
