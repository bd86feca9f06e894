//! A service that mounts the dashboard under `/ops/queues` of its own axum server, beside its
//! own routes, on an embedded store in a temporary directory, with a small workload running
//! (a producer, and a consumer that fails one job in ten) so the charts move.
//!
//! ```sh
//! RQ_ADMIN_TOKEN=secret cargo run -p reliable-queue-web --example mounted
//! # then open http://127.0.0.1:8080/ops/queues
//! ```

use std::time::Duration;

use axum::routing::get;
use reliable_queue::Store;
use reliable_queue_web::Dashboard;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    let jobs = store.queue::<String>("jobs").await?;
    let mut tx = store.begin();
    for i in 0..25 {
        jobs.enqueue(&mut tx, format!("job {i}"))?;
    }
    jobs.enqueue_after(&mut tx, "tomorrow".to_owned(), Duration::from_secs(86_400))?;
    tx.commit().await?;

    // A small live workload for the charts: a producer, and a consumer that fails one job
    // in ten (three attempts, then the dead letters).
    jobs.set_retry_policy(
        reliable_queue::RetryPolicy::default()
            .max_attempts(3)
            .initial_backoff(Duration::from_millis(200)),
    )
    .await?;
    let producer = (store.clone(), jobs.clone());
    tokio::spawn(async move {
        let (store, jobs) = producer;
        for i in 0u64.. {
            let mut tx = store.begin();
            for j in 0..(i % 7 + 1) {
                let _ = jobs.enqueue(&mut tx, format!("job {i}.{j}"));
            }
            let _ = tx.commit().await;
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    let consumer = jobs.clone();
    tokio::spawn(async move {
        let mut n = 0u64;
        while let Ok(lease) = consumer.lease(Duration::from_secs(30)).await {
            n += 1;
            let _ = if n.is_multiple_of(10) {
                lease.fail("the job's input was rejected").await.map(|_| ())
            } else {
                lease.complete().await
            };
            tokio::time::sleep(Duration::from_millis(12)).await;
        }
    });

    let dashboard = Dashboard::new(store.clone())
        .admin_token(std::env::var("RQ_ADMIN_TOKEN").ok())
        .router()?;
    let app = axum::Router::new()
        .route("/", get(|| async { "the service's own page" }))
        .nest("/ops/queues", dashboard);
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "the dashboard is at http://{}/ops/queues",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}
