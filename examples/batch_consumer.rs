//! Batch consumers: dequeue up to `BATCH` items in one transaction, then process them.
//!
//! Where the processing sits relative to the commit decides what a failure costs:
//!
//! - **at-most-once** (commit, then process): the batch is removed for good before it is
//!   processed, so the transaction is short and nothing is ever processed twice, but a crash
//!   between the commit and the end of the processing loses the rest of the batch.
//! - **at-least-once** (process, then commit): the items stay held by the open transaction
//!   while they are processed; a failure aborts it and the whole batch comes back, so nothing
//!   is lost, but the items processed before the failure are processed again. The processing
//!   must then be idempotent (here: a set keyed by event id), and the transaction lives as
//!   long as the processing does, so keep batches small.
//!
//! The program runs both against the same stream of events, each with one simulated failure
//! in the middle of a batch, and reports what each lost and what each processed twice.
//!
//! ```text
//! cargo run --release --example batch_consumer
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::thread;
use std::time::{Duration, Instant};

use reliable_queue::{ReliableConcurrentQueue, Store};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

const EVENTS: u64 = 2_000;
const PRODUCER_TX: u64 = 25;
const BATCH: usize = 32;
/// The consumer fails while processing the batch that holds this event.
const FAIL_AT: u64 = 1_010;

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Event {
    id: u64,
    amount: i64,
}

/// Which side of the commit the processing is on.
#[derive(Debug, Clone, Copy)]
enum Mode {
    AtMostOnce,
    AtLeastOnce,
}

/// What a consumer did, and what its processing produced.
#[derive(Default)]
struct Outcome {
    batches: u64,
    aborted: u64,
    /// Times each event was processed.
    processed: BTreeMap<u64, u32>,
    /// The result of the processing: one entry per event id, so applying twice is harmless.
    ledger: BTreeMap<u64, i64>,
}

fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    for mode in [Mode::AtMostOnce, Mode::AtLeastOnce] {
        let queue = store.blocking_queue::<Event>(&format!("events-{mode:?}"))?;
        let start = Instant::now();

        let producer = {
            let (store, queue) = (store.clone(), queue.clone());
            thread::spawn(move || produce(&store, &queue))
        };
        let outcome = consume(&store, &queue, mode, || producer.is_finished())?;
        producer.join().map_err(|_| "the producer panicked")??;
        report(mode, &outcome, queue.blocking_count()?, start.elapsed());
    }
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    store.blocking_close()?;
    Ok(())
}

/// Enqueues `EVENTS` events, `PRODUCER_TX` per transaction.
fn produce(store: &Store, queue: &ReliableConcurrentQueue<Event>) -> Result<(), BoxError> {
    for first in (0..EVENTS).step_by(PRODUCER_TX as usize) {
        let mut tx = store.begin();
        for id in first..(first + PRODUCER_TX).min(EVENTS) {
            let amount = amount_of(id);
            queue.enqueue(&mut tx, Event { id, amount })?;
        }
        tx.blocking_commit()?;
    }
    Ok(())
}

/// Runs the consumer loop until the producer is done and the queue is empty.
fn consume(
    store: &Store,
    queue: &ReliableConcurrentQueue<Event>,
    mode: Mode,
    producer_done: impl Fn() -> bool,
) -> Result<Outcome, BoxError> {
    let mut outcome = Outcome::default();
    let mut failed_once = false;
    loop {
        let done = producer_done();
        let mut tx = store.begin();
        let batch = take_batch(queue, &mut tx)?;
        if batch.is_empty() {
            // Nothing came within the wait: stop once the producer has finished.
            if done && queue.blocking_count()? == 0 {
                return Ok(outcome);
            }
            continue;
        }
        outcome.batches += 1;
        let fail_here = !failed_once && batch.iter().any(|e| e.id == FAIL_AT);
        failed_once |= fail_here;

        match mode {
            Mode::AtMostOnce => {
                // Commit first: the batch is gone from the queue for good.
                tx.blocking_commit()?;
                for event in &batch {
                    if fail_here && event.id == FAIL_AT {
                        // A crash here (simulated: we stop processing this batch) loses
                        // every event of the batch not processed yet.
                        break;
                    }
                    process(event, &mut outcome);
                }
            }
            Mode::AtLeastOnce => {
                // Process while the transaction holds the batch; commit only once all of it
                // has been processed.
                let mut ok = true;
                for event in &batch {
                    if fail_here && event.id == FAIL_AT {
                        ok = false;
                        break;
                    }
                    process(event, &mut outcome);
                }
                if ok {
                    tx.blocking_commit()?;
                } else {
                    // The whole batch goes back to the head of the queue; the events already
                    // processed will be processed again.
                    tx.blocking_abort()?;
                    outcome.aborted += 1;
                }
            }
        }
    }
}

/// Dequeues up to `BATCH` events in `tx`: waits a little for the first, then takes whatever
/// else is there without waiting.
fn take_batch(
    queue: &ReliableConcurrentQueue<Event>,
    tx: &mut reliable_queue::Transaction,
) -> Result<Vec<Event>, BoxError> {
    let mut batch = Vec::with_capacity(BATCH);
    if let Some(first) = queue.blocking_dequeue_timeout(tx, Duration::from_millis(20))? {
        batch.push(first);
        while batch.len() < BATCH {
            match queue.blocking_try_dequeue(tx)? {
                Some(event) => batch.push(event),
                None => break,
            }
        }
    }
    Ok(batch)
}

/// The amount carried by event `id`.
fn amount_of(id: u64) -> i64 {
    (id % 7) as i64 * 10 - 25
}

/// The work: record the event in the ledger, keyed by id so a replay changes nothing.
fn process(event: &Event, outcome: &mut Outcome) {
    *outcome.processed.entry(event.id).or_default() += 1;
    outcome.ledger.insert(event.id, event.amount);
}

fn report(mode: Mode, outcome: &Outcome, left: u64, elapsed: Duration) {
    let never = (0..EVENTS)
        .filter(|id| !outcome.processed.contains_key(id))
        .count();
    let twice = outcome.processed.values().filter(|&&n| n > 1).count();
    let label = match mode {
        Mode::AtMostOnce => "at-most-once: commit, then process",
        Mode::AtLeastOnce => "at-least-once: process, then commit",
    };
    println!("{label} (batches of up to {BATCH}, one failure at event {FAIL_AT}), {elapsed:.2?}:");
    println!(
        "  batches {}, aborted {}, events processed {} of {EVENTS}",
        outcome.batches,
        outcome.aborted,
        outcome.processed.len()
    );
    println!("  never processed (lost)        {never}");
    println!("  processed more than once      {twice}");
    let balance: i64 = outcome.ledger.values().sum();
    let expected: i64 = (0..EVENTS).map(amount_of).sum();
    println!(
        "  ledger balance                {balance} of {expected} (keyed by event id: replays add nothing)"
    );
    println!("  left in the queue             {left}\n");
}
