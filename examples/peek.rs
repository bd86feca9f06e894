//! Peek: look at the item at the front of the queue without consuming it, by dequeuing it
//! and aborting the transaction.
//!
//! The queue holds reminders, each due at some time. The consumer peeks at the front one and
//! processes it (commit) only if it is due; otherwise it aborts, which puts the reminder back
//! at the head of the queue at once, and sleeps until it is due. While a reminder is peeked
//! it is held by the transaction: no other consumer can take it, and `count()` leaves it out.
//!
//! ```text
//! cargo run --release --example peek
//! ```

use std::error::Error;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reliable_queue::Store;
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

#[derive(Serialize, Deserialize, Debug)]
struct Reminder {
    id: u32,
    /// Wall-clock due time, milliseconds since the Unix epoch (survives a restart).
    due_ms: u64,
    text: String,
}

fn now_ms() -> Result<u64, BoxError> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64)
}

fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    let reminders = store.blocking_queue::<Reminder>("reminders")?;

    let texts = [
        "stand up",
        "water the plants",
        "rotate the logs",
        "renew the certificate",
        "call back",
        "back up the laptop",
    ];
    let start = Instant::now();
    let base = now_ms()?;
    let mut tx = store.begin();
    for (id, text) in (0u32..).zip(texts) {
        let due_ms = base + 150 * u64::from(id + 1);
        let text = text.to_owned();
        reminders.enqueue(&mut tx, Reminder { id, due_ms, text })?;
    }
    tx.blocking_commit()?;
    let total = reminders.blocking_count()?;
    println!("{total} reminders queued, one due every 150 ms\n");

    let (mut processed, mut peeks) = (0u64, 0u64);
    loop {
        let mut tx = store.begin();
        let Some(reminder) = reminders.blocking_try_dequeue(&mut tx)? else {
            break;
        };
        peeks += 1;
        let now = now_ms()?;
        if reminder.due_ms <= now {
            // Due: process it and commit, which removes it for good.
            println!(
                "[{:>4} ms] reminder {} \"{}\" (due at {} ms)",
                now - base,
                reminder.id,
                reminder.text,
                reminder.due_ms - base,
            );
            tx.blocking_commit()?;
            processed += 1;
        } else {
            // Not due: the peek holds it, so `count()` leaves it out until the abort.
            let held = reminders.blocking_count()?;
            tx.blocking_abort()?;
            let wait = reminder.due_ms - now;
            if processed == 0 && peeks == 1 {
                println!(
                    "peeked at reminder {}: due in {wait} ms, so aborted \
                     (count while peeked {held}, after the abort {})",
                    reminder.id,
                    reminders.blocking_count()?,
                );
            }
            thread::sleep(Duration::from_millis(wait));
        }
    }

    let left = reminders.blocking_count()?;
    println!(
        "\nprocessed {processed} of {total} reminders in {:.2?}, with {peeks} peeks ({} aborted); \
         {left} left in the queue",
        start.elapsed(),
        peeks - processed,
    );
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    store.blocking_close()?;
    if processed == total && left == 0 {
        Ok(())
    } else {
        Err("some reminders were not processed".into())
    }
}
