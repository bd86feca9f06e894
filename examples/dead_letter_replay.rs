//! Dead letters and replay: jobs that keep failing end in the queue's dead letters, an operator
//! lists them, fixes the cause and replays them, and they complete.
//!
//! ```text
//! cargo run --release --example dead_letter_replay
//! ```
//!
//! A worker sends mails through a simulated mail relay, one lease per mail: on success the
//! mail's id goes to the `sent` queue in the same transaction as the lease's ack; on a failure
//! `Lease::fail` records the reason and the queue's `RetryPolicy` (3 attempts, backoff from
//! 50 ms) decides: due again after the backoff, or moved to the dead letters at the third
//! failed attempt. Some mails fail once (a transient error) and go through on their retry;
//! the mails to one domain, which the relay refuses, fail at every attempt and become dead
//! letters. The store is then closed and reopened (dead letters are durable), the dead letters
//! listed with their reason, attempts and times, the relay fixed, and the dead letters replayed
//! with `Replay::All` and their attempts reset: this time they are sent.

use std::error::Error;
use std::time::{Duration, SystemTime};

use reliable_queue::{Failed, ReliableConcurrentQueue, Replay, RetryPolicy, Store};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn Error + Send + Sync>;

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Mail {
    id: u32,
    to: String,
}

/// The simulated relay: refuses every mail to `refused` (a permanent failure), and the first
/// attempt at every fifth mail (a transient one).
struct Relay {
    refused: Option<&'static str>,
}

impl Relay {
    fn send(&self, mail: &Mail, attempt: u32) -> Result<(), String> {
        if let Some(domain) = self.refused {
            if mail.to.ends_with(domain) {
                return Err(format!("550 5.7.1 relaying to {domain} denied"));
            }
        }
        if mail.id.is_multiple_of(5) && attempt == 1 {
            return Err("421 4.3.2 service not available, try again later".to_owned());
        }
        Ok(())
    }
}

const LEASE_TTL: Duration = Duration::from_secs(30);
const BROKEN_DOMAIN: &str = "@broken.example";

fn main() -> Result<(), BoxError> {
    let start = SystemTime::now();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    let store = Store::open(&path)?;
    let mail = store.blocking_queue::<Mail>("mail")?;
    let sent = store.blocking_queue::<u32>("sent")?;
    mail.blocking_set_retry_policy(
        RetryPolicy::default()
            .max_attempts(3)
            .initial_backoff(Duration::from_millis(50))
            .max_backoff(Duration::from_millis(200))
            .jitter(0.0),
    )?;

    let recipients = [
        "ada@example.org",
        "bob@broken.example",
        "cy@example.net",
        "dee@example.org",
        "eve@broken.example",
        "flo@example.com",
        "gus@example.net",
        "hal@broken.example",
        "ivy@example.org",
        "jo@example.com",
        "kim@example.org",
        "lu@broken.example",
    ];
    let mut tx = store.begin();
    for (id, to) in (0..).zip(recipients) {
        mail.enqueue(&mut tx, Mail { id, to: to.into() })?;
    }
    tx.blocking_commit()?;
    let total = recipients.len();
    let broken = recipients
        .iter()
        .filter(|r| r.ends_with(BROKEN_DOMAIN))
        .count();
    println!(
        "{total} mails queued, {broken} of them to {BROKEN_DOMAIN}, which the relay refuses\n"
    );

    let relay = Relay {
        refused: Some(BROKEN_DOMAIN),
    };
    let done = work(&store, &mail, &sent, &relay, start)?;
    let stats = mail.blocking_stats()?;
    println!(
        "\nfirst pass: {done} sent, {} dead letters, {} left in the queue",
        stats.dead,
        stats.visible + stats.delayed + stats.leased
    );

    // Dead letters are durable: they are still there after a restart.
    store.blocking_close()?;
    let store = Store::open(&path)?;
    let mail = store.blocking_queue::<Mail>("mail")?;
    let sent = store.blocking_queue::<u32>("sent")?;

    println!("\ndead letters after reopening the store:");
    let mut after = None;
    loop {
        let page = mail.blocking_dead_letters(after, 2)?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for letter in &page {
            println!(
                "  #{:<3} mail {:>2} to {:<20} {} attempts (enqueued {}, first attempt {}, last {})\n       reason: {}",
                letter.id,
                letter.item.id,
                letter.item.to,
                letter.attempts,
                at(start, letter.enqueued_at),
                at(start, letter.first_attempt),
                at(start, letter.last_attempt),
                letter.reason,
            );
        }
    }

    println!(
        "\nthe relay for {BROKEN_DOMAIN} is fixed; replaying every dead letter, attempts reset"
    );
    let relay = Relay { refused: None };
    let replayed = mail.blocking_replay(Replay::All, true)?;
    let stats = mail.blocking_stats()?;
    println!(
        "replayed {replayed}: {} visible, {} dead letters\n",
        stats.visible, stats.dead
    );
    let done_again = work(&store, &mail, &sent, &relay, start)?;

    let stats = mail.blocking_stats()?;
    let in_sent = sent.blocking_count()?;
    println!(
        "\nsecond pass: {done_again} sent; {in_sent} of {total} mails in `sent`, {} dead \
         letters, {} left in the queue",
        stats.dead,
        stats.visible + stats.delayed + stats.leased
    );
    // Read `sent` without consuming it (dequeue, then abort): each mail's id exactly once.
    let mut tx = store.begin();
    let mut ids = Vec::new();
    while let Some(id) = sent.blocking_try_dequeue(&mut tx)? {
        ids.push(id);
    }
    tx.blocking_abort()?;
    ids.sort_unstable();
    store.blocking_close()?;
    if !ids.iter().copied().eq(0..u32::try_from(total)?) || stats.dead != 0 {
        return Err(format!("not every mail was sent exactly once: {ids:?}").into());
    }
    println!("every mail sent exactly once");
    Ok(())
}

/// Sends mails until none is left (visible, or waiting out a retry's backoff); returns how
/// many were sent.
fn work(
    store: &Store,
    mail: &ReliableConcurrentQueue<Mail>,
    sent: &ReliableConcurrentQueue<u32>,
    relay: &Relay,
    start: SystemTime,
) -> Result<usize, BoxError> {
    let mut done = 0;
    loop {
        let stats = mail.blocking_stats()?;
        if stats.visible + stats.delayed + stats.leased == 0 {
            return Ok(done);
        }
        // A mail, or a retry backing off: the lease waits until it is due.
        let lease = mail.blocking_lease(LEASE_TTL)?;
        let (m, attempt) = (lease.item().clone(), lease.attempt());
        match relay.send(&m, attempt) {
            Ok(()) => {
                // Sent: recorded in `sent` and the lease acked, in one commit.
                let mut tx = store.begin();
                sent.enqueue(&mut tx, m.id)?;
                lease.ack(&mut tx)?;
                tx.blocking_commit()?;
                done += 1;
                println!("mail {:>2} to {:<20} attempt {attempt}: sent", m.id, m.to);
            }
            Err(reason) => {
                let outcome = match lease.blocking_fail(&reason)? {
                    Failed::Retry { at: due } => format!("retry at {}", at(start, Some(due))),
                    Failed::Dead => "moved to the dead letters".to_owned(),
                    other => format!("{other:?}"),
                };
                println!(
                    "mail {:>2} to {:<20} attempt {attempt}: {reason}; {outcome}",
                    m.id, m.to
                );
            }
        }
    }
}

/// A time as seconds since the example started.
fn at(start: SystemTime, t: Option<SystemTime>) -> String {
    match t.map(|t| t.duration_since(start)) {
        Some(Ok(d)) => format!("+{:.3}s", d.as_secs_f64()),
        Some(Err(e)) => format!("-{:.3}s", e.duration().as_secs_f64()),
        None => "unknown".to_owned(),
    }
}
