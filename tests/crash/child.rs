//! The child: opens the store and runs a concurrent workload on it until it is killed.
//!
//! Two producers enqueue fresh ids into `a`; a consumer dequeues from `a` and `b` (sometimes
//! enqueuing a fresh follow-up id into `a` in the same transaction); a mover dequeues from `a`
//! and enqueues the same ids into `b`, in one transaction. One transaction in ten is aborted
//! (explicitly or by drop) and never reported. Under `Durability::Buffered` the producers
//! also call `Store::flush` now and then.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{Durability, ReliableConcurrentQueue, Store, Transaction};

use crate::report::{format_ops, Op, Queue};

/// How long a child runs if nobody kills it (the parent counts that as a failure).
const LIFETIME: Duration = Duration::from_secs(60);

/// What the queues hold: an id and a payload, empty except one item in five hundred,
/// whose 160 KiB take its commit group past sled's 128 KiB limit for a log message, into a
/// blob file of its own (a different write and recovery path).
pub(crate) type Item = (u64, Vec<u8>);

const LARGE_PAYLOAD: usize = 160 << 10;

/// The payload of item `id`: `len` copies of one byte that depends on the id.
pub(crate) fn payload(id: u64, len: usize) -> Vec<u8> {
    vec![(id % 251) as u8; len]
}

/// Does `item` carry a payload `payload` could have made for its id?
pub(crate) fn intact(item: &Item) -> bool {
    item.1.iter().all(|&b| u64::from(b) == item.0 % 251)
}

/// Above this many items, producers consume instead, so the store (and the time it takes to
/// open) stays about the same size from cycle to cycle.
const BACKLOG_LIMIT: u64 = 3000;

/// How long a consumer or mover waits for a first item before it looks again.
const WAIT: Duration = Duration::from_millis(20);

/// What the parent tells the child.
#[derive(Debug, Clone)]
pub(crate) struct ChildConfig {
    pub(crate) path: PathBuf,
    /// The first id this child may enqueue; ids up to `first_id + 2^32` are its own.
    pub(crate) first_id: u64,
    pub(crate) seed: u64,
}

/// Writes one report line to stdout with a single `write` call.
fn report(line: &str) {
    let mut text = String::with_capacity(line.len() + 4);
    text.push_str("RQ|");
    text.push_str(&line.replace('\n', " "));
    text.push('\n');
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        // The parent is gone: nobody is left to check anything.
        std::process::exit(2);
    }
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Producer,
    Consumer,
    Mover,
}

struct Workload {
    store: Store,
    a: ReliableConcurrentQueue<Item>,
    b: ReliableConcurrentQueue<Item>,
    durability: Durability,
    next_id: AtomicU64,
    next_tx: AtomicU64,
    next_flush: AtomicU64,
    deadline: Instant,
}

type Step = Result<(), String>;

impl Workload {
    fn queue(&self, queue: Queue) -> &ReliableConcurrentQueue<Item> {
        match queue {
            Queue::A => &self.a,
            Queue::B => &self.b,
        }
    }

    fn count(&self, queue: Queue) -> Result<u64, String> {
        self.queue(queue)
            .blocking_count()
            .map_err(|e| e.to_string())
    }

    fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Reports the intent, commits, reports the acknowledgement.
    fn commit(&self, tx: Transaction, ops: &[Op]) -> Step {
        let n = self.next_tx.fetch_add(1, Ordering::Relaxed);
        report(&format!("i|{n}|{}", format_ops(ops)));
        tx.blocking_commit()
            .map_err(|e| format!("commit of transaction {n} failed: {e}"))?;
        report(&format!("a|{n}"));
        Ok(())
    }

    /// Commits, or (one time in ten) aborts without a word.
    fn finish(&self, tx: Transaction, ops: &[Op], rng: &mut StdRng) -> Step {
        if ops.is_empty() {
            tx.blocking_abort().map_err(|e| e.to_string())?;
            return Ok(());
        }
        if rng.gen_ratio(1, 10) {
            if rng.gen() {
                tx.blocking_abort().map_err(|e| e.to_string())?;
            } else {
                drop(tx);
            }
            return Ok(());
        }
        self.commit(tx, ops)
    }

    fn flush(&self) -> Step {
        let n = self.next_flush.fetch_add(1, Ordering::Relaxed);
        report(&format!("fs|{n}"));
        self.store
            .blocking_flush()
            .map_err(|e| format!("flush {n} failed: {e}"))?;
        report(&format!("fd|{n}"));
        Ok(())
    }

    fn run(&self, role: Role, rng: &mut StdRng) -> Step {
        while Instant::now() < self.deadline {
            match role {
                Role::Producer => self.produce(rng)?,
                Role::Consumer => self.consume(rng)?,
                Role::Mover => self.move_items(rng)?,
            }
        }
        Ok(())
    }

    fn produce(&self, rng: &mut StdRng) -> Step {
        if self.count(Queue::A)? + self.count(Queue::B)? > BACKLOG_LIMIT {
            // Consumers fall behind when commits are cheap (Buffered): help them.
            return self.consume(rng);
        }
        let mut tx = self.store.begin();
        let mut ops = Vec::new();
        for _ in 0..rng.gen_range(1..=4) {
            let id = self.fresh_id();
            let len = if rng.gen_ratio(1, 500) {
                LARGE_PAYLOAD
            } else {
                0
            };
            let item = (id, payload(id, len));
            self.a.enqueue(&mut tx, item).map_err(|e| e.to_string())?;
            ops.push(Op::Enqueue(Queue::A, id));
        }
        self.finish(tx, &ops, rng)?;
        if self.durability == Durability::Buffered && rng.gen_ratio(1, 50) {
            self.flush()?;
        }
        Ok(())
    }

    /// Dequeues a batch from both queues, sized to keep the backlog near a thousand items.
    fn consume(&self, rng: &mut StdRng) -> Step {
        let backlog = self.count(Queue::A)? + self.count(Queue::B)?;
        let want = (backlog / 100).clamp(1, 12) as usize;
        let mut tx = self.store.begin();
        let mut ops = Vec::new();
        let first = if self.count(Queue::B)? > 0 && rng.gen() {
            Queue::B
        } else {
            Queue::A
        };
        let waited = self
            .queue(first)
            .blocking_dequeue_timeout(&mut tx, WAIT)
            .map_err(|e| e.to_string())?;
        let Some((id, _)) = waited else {
            return Ok(());
        };
        ops.push(Op::Dequeue(first, id));
        while ops.len() < want {
            let queue = if rng.gen() { Queue::A } else { Queue::B };
            match self
                .queue(queue)
                .blocking_try_dequeue(&mut tx)
                .map_err(|e| e.to_string())?
            {
                Some((id, _)) => ops.push(Op::Dequeue(queue, id)),
                None => break,
            }
        }
        if rng.gen_ratio(1, 4) {
            let id = self.fresh_id();
            self.a
                .enqueue(&mut tx, (id, Vec::new()))
                .map_err(|e| e.to_string())?;
            ops.push(Op::Enqueue(Queue::A, id));
        }
        self.finish(tx, &ops, rng)
    }

    /// Moves one to three items from `a` to `b` in one transaction.
    fn move_items(&self, rng: &mut StdRng) -> Step {
        let mut tx = self.store.begin();
        let mut items = Vec::new();
        let waited = self
            .a
            .blocking_dequeue_timeout(&mut tx, WAIT)
            .map_err(|e| e.to_string())?;
        let Some(item) = waited else {
            return Ok(());
        };
        items.push(item);
        let want = rng.gen_range(1..=3);
        while items.len() < want {
            match self
                .a
                .blocking_try_dequeue(&mut tx)
                .map_err(|e| e.to_string())?
            {
                Some(item) => items.push(item),
                None => break,
            }
        }
        let mut ops = Vec::new();
        for item in items {
            let id = item.0;
            self.b.enqueue(&mut tx, item).map_err(|e| e.to_string())?;
            ops.push(Op::Dequeue(Queue::A, id));
            ops.push(Op::Enqueue(Queue::B, id));
        }
        self.finish(tx, &ops, rng)
    }
}

/// Runs the child: open, report, work until killed.
pub(crate) fn run(durability: Durability, config: ChildConfig) {
    report("o");
    let opened = crate::open_store(&config.path, durability).and_then(|store| {
        let a = store.blocking_queue::<Item>("a")?;
        let b = store.blocking_queue::<Item>("b")?;
        Ok((store, a, b))
    });
    let (store, a, b) = match opened {
        Ok(opened) => opened,
        Err(e) => return report(&format!("e|opening the store failed: {e:?}")),
    };
    report("O");
    let workload = Workload {
        store,
        a,
        b,
        durability,
        next_id: AtomicU64::new(config.first_id),
        next_tx: AtomicU64::new(0),
        next_flush: AtomicU64::new(0),
        deadline: Instant::now() + LIFETIME,
    };
    let roles = [Role::Producer, Role::Producer, Role::Consumer, Role::Mover];
    std::thread::scope(|scope| {
        for (i, role) in roles.into_iter().enumerate() {
            let workload = &workload;
            let seed = config.seed.wrapping_add(i as u64);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                if let Err(e) = workload.run(role, &mut rng) {
                    report(&format!("e|{role:?}: {e}"));
                }
            });
        }
    });
    report("e|the child was not killed within its lifetime");
}
