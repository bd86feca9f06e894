//! A notification-style consumer: instead of polling `count()` and sleeping, consumers wait
//! in `dequeue`, are woken by the commit that makes an item visible, top the batch up with
//! `try_dequeue`, process it, and commit.
//!
//! Run with `cargo run --example notify_consumer`. It uses a temporary directory and
//! finishes in about a second.

use std::time::{Duration, Instant};

use reliable_queue::{ReliableConcurrentQueue, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::timeout;

/// One unit of work.
#[derive(Debug, Serialize, Deserialize)]
struct Email {
    id: u64,
    to: String,
}

/// The most items one consumer transaction takes.
const BATCH: usize = 16;
/// How long a consumer waits for work before doing its idle housekeeping.
const IDLE: Duration = Duration::from_millis(100);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    let emails = store.queue::<Email>("emails").await?;
    let (stop_tx, stop_rx) = watch::channel(false);

    let consumers: Vec<_> = (0..2)
        .map(|n| {
            let (store, emails, stop) = (store.clone(), emails.clone(), stop_rx.clone());
            tokio::spawn(consume(n, store, emails, stop))
        })
        .collect();

    let produced = produce(&store, &emails).await?;
    // Ask the consumers to stop once they have nothing left to do.
    stop_tx.send(true)?;

    let mut processed = 0;
    for consumer in consumers {
        processed += consumer.await??;
    }
    let left = emails.count().await?;
    println!("produced {produced}, processed {processed}, left {left}");
    assert_eq!(processed, produced);
    assert_eq!(left, 0);
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    store.close().await?;
    Ok(())
}

/// Commits emails in bursts, with pauses in between so that the consumers go idle and wait.
async fn produce(store: &Store, emails: &ReliableConcurrentQueue<Email>) -> Result<u64> {
    let mut next = 0;
    for burst in 1..=12_u64 {
        let mut tx = store.begin();
        for _ in 0..burst * 3 {
            emails.enqueue(
                &mut tx,
                Email {
                    id: next,
                    to: format!("user{next}@example.com"),
                },
            )?;
            next += 1;
        }
        tx.commit().await?;
        // The pauses stand for the time between bursts of real traffic; the long one, a
        // lull, lets the consumers' idle timeout fire.
        let pause = if burst == 6 { 250 } else { 20 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(next)
}

/// Waits for work, processes it in batches, and returns how many items it processed once
/// `stop` is set and nothing is left.
async fn consume(
    n: usize,
    store: Store,
    emails: ReliableConcurrentQueue<Email>,
    mut stop: watch::Receiver<bool>,
) -> Result<u64> {
    let mut processed = 0;
    let mut last_busy = Instant::now();
    loop {
        let mut tx = store.begin();
        // Wait for the first item. `dequeue` is cancel-safe: when the stop branch or the
        // timeout wins, the dropped future gives back anything it had been handed.
        let first = tokio::select! {
            // Poll the queue first, so that work still queued is done before stopping.
            biased;
            first = timeout(IDLE, emails.dequeue(&mut tx)) => first,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let first = match first {
            Ok(item) => item?,
            Err(_elapsed) => {
                // Idle: a place for housekeeping (metrics, heartbeats); then wait again.
                println!(
                    "consumer {n}: idle for {:?}, {} waiting",
                    last_busy.elapsed(),
                    emails.waiters()
                );
                continue;
            }
        };
        // Top the batch up with whatever else is visible, without waiting.
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match emails.try_dequeue(&mut tx).await? {
                Some(email) => batch.push(email),
                None => break,
            }
        }
        // Process, then commit: a crash before the commit hands the batch out again
        // (at-least-once). Commit before processing for at-most-once.
        for email in &batch {
            send(email);
        }
        tx.commit().await?;
        processed += batch.len() as u64;
        println!(
            "consumer {n}: sent a batch of {} (first id {})",
            batch.len(),
            batch[0].id
        );
        last_busy = Instant::now();
    }
    println!("consumer {n}: stopping after {processed} emails");
    Ok(processed)
}

/// Stands for the real work.
fn send(email: &Email) {
    debug_assert!(email.to.ends_with("@example.com"));
}
