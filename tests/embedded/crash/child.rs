//! The child: opens the store and runs a concurrent workload on it until it is killed.
//!
//! Plain transactions, on queues `a` and `b`: two producers enqueue fresh ids into `a`; a
//! consumer dequeues from `a` and `b` (sometimes enqueuing a fresh follow-up id into `a` in
//! the same transaction); a mover dequeues from `a` and enqueues the same ids into `b`, in
//! one transaction. One transaction in ten is aborted (explicitly or by drop) and never
//! reported. Under `Durability::Buffered` the producers also call `Store::flush` now and
//! then.
//!
//! The processing layer, mostly on queue `c` (the jobs; kept short so that a retried item
//! comes round again within a child's life), also on `a` and `b`: the producers put about
//! half their items into `c` while it is short, and a quarter of all their items are delayed
//! by 1 to 20 ms (`enqueue_after`, or `enqueue_at`). Two workers lease (one item, or up to
//! six with `lease_many`; `try_lease` on `b`) and then, per lease: ack it in a transaction
//! with the other acks of the batch (one time in three with a follow-up enqueue, which may be
//! delayed), fail it (every poisoned item, see [`poisoned`], and one healthy lease in ten:
//! a retry after 1 to 5 ms of backoff, or the dead letters at the third attempt), release it
//! with a delay of 1 to 5 ms, or give it back at once (a release without delay, or a drop:
//! no write, not reported). Now and then a worker extends a lease (not logged, not reported).
//! A fail reports in its intent the outcome the retry policy calls for (a retry, or the dead
//! letters at the third attempt); if `fail` returns another, the child reports a failure.
//! After one step in `TEND_ONE_IN`, one of the workers tends the dead letters: replays a few (attempts
//! kept or reset), purges some, and all those above forty per queue. Leases run 30 s: no lease expires before the kill.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{
    Durability, Failed, Lease, ReliableConcurrentQueue, Replay, RetryPolicy, Store, Transaction,
};

use super::report::{format_ops, Kind, Op, Queue};

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

/// Is item `id` poisoned: does every lease of it fail, until it is a dead letter?
pub(crate) fn poisoned(id: u64) -> bool {
    id.is_multiple_of(8)
}

/// The reason a worker gives when it fails a lease of item `id`: the dead letters keep it.
pub(crate) fn fail_reason(id: u64) -> &'static str {
    if poisoned(id) {
        "poisoned"
    } else {
        "flaky"
    }
}

/// Above this many items in `a` and `b`, producers consume instead, so the store (and the
/// time it takes to open) stays about the same size from cycle to cycle.
const BACKLOG_LIMIT: u64 = 3000;

/// Producers put items into `c` only while it has fewer than this many (visible or delayed).
const JOBS_LIMIT: u64 = 100;

/// A worker tends the dead letters after one step in this many.
const TEND_ONE_IN: u32 = 16;

/// Tending purges dead letters of a queue that has more than this many.
const DEAD_LIMIT: u64 = 40;

/// How long a consumer or mover waits for a first item before it looks again.
const WAIT: Duration = Duration::from_millis(20);

/// Leases outlive the child.
const LEASE_TTL: Duration = Duration::from_secs(30);

/// The retry policy of every queue, set by every child before it starts working.
pub(crate) const MAX_ATTEMPTS: u32 = 3;

fn retry_policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(5))
        .jitter(0.5)
}

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
    /// A lease worker; the one with `tends` also tends the dead letters (one thread only:
    /// two would race for the same dead letters).
    Worker {
        tends: bool,
    },
}

struct Workload {
    store: Store,
    a: ReliableConcurrentQueue<Item>,
    b: ReliableConcurrentQueue<Item>,
    c: ReliableConcurrentQueue<Item>,
    durability: Durability,
    next_id: AtomicU64,
    next_tx: AtomicU64,
    next_flush: AtomicU64,
    deadline: Instant,
}

type Step = Result<(), String>;

/// What a worker does with one lease.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Ack,
    Fail,
    /// Release with a delay of this many ms (0: at once, no write).
    Release(u64),
    Drop,
}

fn err(e: reliable_queue::Error) -> String {
    e.to_string()
}

impl Workload {
    fn queue(&self, queue: Queue) -> &ReliableConcurrentQueue<Item> {
        match queue {
            Queue::A => &self.a,
            Queue::B => &self.b,
            Queue::C => &self.c,
        }
    }

    fn count(&self, queue: Queue) -> Result<u64, String> {
        self.queue(queue).blocking_count().map_err(err)
    }

    fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn next_tx(&self) -> u64 {
        self.next_tx.fetch_add(1, Ordering::Relaxed)
    }

    /// Reports the intent, commits, reports the acknowledgement.
    fn commit(&self, tx: Transaction, ops: &[Op]) -> Step {
        let n = self.next_tx();
        report(&format!("i|{n}|{}", format_ops(ops)));
        tx.blocking_commit()
            .map_err(|e| format!("commit of transaction {n} failed: {e}"))?;
        report(&format!("a|{n}"));
        Ok(())
    }

    /// Commits, or (one time in ten) aborts without a word.
    fn finish(&self, tx: Transaction, ops: &[Op], rng: &mut StdRng) -> Step {
        if ops.is_empty() {
            tx.blocking_abort().map_err(err)?;
            return Ok(());
        }
        if rng.gen_ratio(1, 10) {
            if rng.gen() {
                tx.blocking_abort().map_err(err)?;
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
                Role::Worker { tends } => {
                    self.work(rng)?;
                    if tends && rng.gen_range(0..TEND_ONE_IN) == 0 {
                        self.tend(rng)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Enqueues a fresh item into `queue` in `tx`: one time in `delayed_one_in` delayed by
    /// 1 to 20 ms.
    fn enqueue_fresh(
        &self,
        tx: &mut Transaction,
        queue: Queue,
        delayed_one_in: u32,
        rng: &mut StdRng,
    ) -> Result<Op, String> {
        let id = self.fresh_id();
        let len = if rng.gen_ratio(1, 500) {
            LARGE_PAYLOAD
        } else {
            0
        };
        let item = (id, payload(id, len));
        let q = self.queue(queue);
        if !rng.gen_ratio(1, delayed_one_in) {
            q.enqueue(tx, item).map_err(err)?;
            return Ok(Op::plain(Kind::Enqueue, queue, id));
        }
        let delay = Duration::from_millis(rng.gen_range(1..=20));
        if rng.gen_ratio(1, 4) {
            q.enqueue_at(tx, item, SystemTime::now() + delay)
                .map_err(err)?;
        } else {
            q.enqueue_after(tx, item, delay).map_err(err)?;
        }
        Ok(Op::plain(Kind::EnqueueDelayed, queue, id))
    }

    fn produce(&self, rng: &mut StdRng) -> Step {
        let jobs = self.c.blocking_stats().map_err(err)?;
        let queue = if jobs.visible + jobs.delayed < JOBS_LIMIT && rng.gen() {
            Queue::C
        } else if self.count(Queue::A)? + self.count(Queue::B)? > BACKLOG_LIMIT {
            // Consumers fall behind when commits are cheap (Buffered): help them.
            return self.consume(rng);
        } else {
            Queue::A
        };
        let mut tx = self.store.begin();
        let mut ops = Vec::new();
        for _ in 0..rng.gen_range(1..=4) {
            ops.push(self.enqueue_fresh(&mut tx, queue, 4, rng)?);
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
            .map_err(err)?;
        let Some((id, _)) = waited else {
            return Ok(());
        };
        ops.push(Op::plain(Kind::Dequeue, first, id));
        while ops.len() < want {
            let queue = if rng.gen() { Queue::A } else { Queue::B };
            match self
                .queue(queue)
                .blocking_try_dequeue(&mut tx)
                .map_err(err)?
            {
                Some((id, _)) => ops.push(Op::plain(Kind::Dequeue, queue, id)),
                None => break,
            }
        }
        if rng.gen_ratio(1, 4) {
            let id = self.fresh_id();
            self.a.enqueue(&mut tx, (id, Vec::new())).map_err(err)?;
            ops.push(Op::plain(Kind::Enqueue, Queue::A, id));
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
            .map_err(err)?;
        let Some(item) = waited else {
            return Ok(());
        };
        items.push(item);
        let want = rng.gen_range(1..=3);
        while items.len() < want {
            match self.a.blocking_try_dequeue(&mut tx).map_err(err)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        let mut ops = Vec::new();
        for item in items {
            let id = item.0;
            self.b.enqueue(&mut tx, item).map_err(err)?;
            ops.push(Op::plain(Kind::Dequeue, Queue::A, id));
            ops.push(Op::plain(Kind::Enqueue, Queue::B, id));
        }
        self.finish(tx, &ops, rng)
    }

    /// Leases a batch, mostly from `c`, and settles every lease (see the module docs).
    fn work(&self, rng: &mut StdRng) -> Step {
        let queue = match rng.gen_range(0..10) {
            0..=6 => Queue::C,
            7 | 8 => Queue::A,
            _ => Queue::B,
        };
        let q = self.queue(queue);
        let stats = q.blocking_stats().map_err(err)?;
        if stats.visible == 0 && (queue != Queue::C || stats.delayed == 0) {
            // Nothing to lease, nor (in `c`) about to fall due: wait until an item is
            // committed there (or the child's life ends), give it back, and choose again.
            let mut tx = self.store.begin();
            let left = self.deadline.saturating_duration_since(Instant::now());
            q.blocking_dequeue_timeout(&mut tx, left).map_err(err)?;
            return tx.blocking_abort().map_err(err);
        }
        let n = self.next_tx();
        report(&format!("l|{n}"));
        let leases: Vec<Lease<Item>> = if queue == Queue::B {
            // Whatever is there (another worker may have taken it).
            q.blocking_try_lease(LEASE_TTL)
                .map_err(err)?
                .into_iter()
                .collect()
        } else if rng.gen() {
            // Waits for the first, which may be a delayed item falling due.
            q.blocking_lease_many(rng.gen_range(2..=6), LEASE_TTL)
                .map_err(err)?
        } else {
            vec![q.blocking_lease(LEASE_TTL).map_err(err)?]
        };
        let ops: Vec<Op> = leases
            .iter()
            .map(|l| Op::new(Kind::Lease, queue, l.item().0, l.attempt()))
            .collect();
        report(&format!("L|{n}|{}", format_ops(&ops)));
        let mut acks = Vec::new();
        for mut lease in leases {
            let (id, attempt) = (lease.item().0, lease.attempt());
            if !intact(lease.item()) || attempt == 0 {
                return Err(format!(
                    "lease of item {id}: attempt {attempt}, payload intact: {}",
                    intact(lease.item())
                ));
            }
            if rng.gen_ratio(1, 20) {
                lease.blocking_extend(LEASE_TTL).map_err(err)?;
            }
            let settle = if poisoned(id) {
                Settle::Fail
            } else {
                match rng.gen_range(0..20) {
                    0..=12 => Settle::Ack,
                    13 | 14 => Settle::Fail,
                    15 | 16 => Settle::Release(rng.gen_range(1..=5)),
                    17 | 18 => Settle::Release(0),
                    _ => Settle::Drop,
                }
            };
            match settle {
                Settle::Ack => acks.push(lease),
                Settle::Fail => self.fail(queue, lease)?,
                Settle::Release(0) => lease.blocking_release(Duration::ZERO).map_err(err)?,
                Settle::Release(ms) => {
                    let n = self.next_tx();
                    let op = Op::new(Kind::Release, queue, id, attempt);
                    report(&format!("i|{n}|{}", format_ops(&[op])));
                    lease
                        .blocking_release(Duration::from_millis(ms))
                        .map_err(|e| format!("release {n} failed: {e}"))?;
                    report(&format!("a|{n}"));
                }
                Settle::Drop => drop(lease),
            }
        }
        if acks.is_empty() {
            return Ok(());
        }
        let mut tx = self.store.begin();
        let mut ops = Vec::new();
        for lease in acks {
            ops.push(Op::new(Kind::Ack, queue, lease.item().0, lease.attempt()));
            lease.ack(&mut tx).map_err(err)?;
        }
        if rng.gen_ratio(1, 3) {
            let to = if rng.gen() { Queue::C } else { Queue::A };
            ops.push(self.enqueue_fresh(&mut tx, to, 3, rng)?);
        }
        self.finish(tx, &ops, rng)
    }

    /// Fails `lease`: a retry below the maximum attempts, the dead letters at it.
    fn fail(&self, queue: Queue, lease: Lease<Item>) -> Step {
        let (id, attempt) = (lease.item().0, lease.attempt());
        let dead = attempt >= MAX_ATTEMPTS;
        let kind = if dead { Kind::Bury } else { Kind::Retry };
        let n = self.next_tx();
        report(&format!(
            "i|{n}|{}",
            format_ops(&[Op::new(kind, queue, id, attempt)])
        ));
        let failed = lease
            .blocking_fail(fail_reason(id))
            .map_err(|e| format!("fail {n} failed: {e}"))?;
        report(&format!("a|{n}"));
        let latest = SystemTime::now() + Duration::from_secs(1);
        match failed {
            Failed::Dead if dead => Ok(()),
            Failed::Retry { at } if !dead && at < latest => Ok(()),
            other => Err(format!(
                "fail {n} of item {id} at attempt {attempt} of {MAX_ATTEMPTS}: {other:?}"
            )),
        }
    }

    /// Replays or purges a few dead letters of each queue (a worker does this after one
    /// step in [`TEND_ONE_IN`]).
    fn tend(&self, rng: &mut StdRng) -> Step {
        for queue in Queue::ALL {
            let q = self.queue(queue);
            let dead = q.blocking_stats().map_err(err)?.dead;
            let over = dead.saturating_sub(DEAD_LIMIT);
            if dead == 0 || (over == 0 && rng.gen_ratio(1, 2)) {
                continue;
            }
            let purge = over > 0 || rng.gen_ratio(1, 4);
            let take = if over > 0 {
                over.min(100) as usize
            } else {
                rng.gen_range(1..=8)
            };
            let letters = q.blocking_dead_letters(None, take).map_err(err)?;
            if let Some(d) = letters.iter().find(|d| !intact(&d.item)) {
                return Err(format!("dead letter of item {} is damaged", d.item.0));
            }
            let reset = rng.gen();
            let kind = match (purge, reset) {
                (true, _) => Kind::Purge,
                (false, true) => Kind::ReplayReset,
                (false, false) => Kind::Replay,
            };
            let ops: Vec<Op> = letters
                .iter()
                .map(|d| Op::new(kind, queue, d.item.0, d.attempts))
                .collect();
            // The oldest: ids grow, so no newer dead letter comes before them.
            let which = if rng.gen_ratio(1, 4) {
                Replay::First(letters.len())
            } else {
                Replay::Ids(letters.iter().map(|d| d.id).collect())
            };
            let n = self.next_tx();
            report(&format!("i|{n}|{}", format_ops(&ops)));
            let done = if purge {
                q.blocking_purge(which)
            } else {
                q.blocking_replay(which, reset)
            }
            .map_err(|e| format!("transaction {n} ({kind:?}) failed: {e}"))?;
            report(&format!("a|{n}"));
            if done != letters.len() {
                return Err(format!(
                    "transaction {n} ({kind:?}) took {done} dead letters of {}",
                    letters.len()
                ));
            }
        }
        Ok(())
    }
}

/// Runs the child: open, report, work until killed.
pub(crate) fn run(durability: Durability, config: ChildConfig) {
    report("o");
    let opened = super::open_store(&config.path, durability).and_then(|store| {
        let a = store.blocking_queue::<Item>("a")?;
        let b = store.blocking_queue::<Item>("b")?;
        let c = store.blocking_queue::<Item>("c")?;
        for q in [&a, &b, &c] {
            q.blocking_set_retry_policy(retry_policy())?;
        }
        Ok((store, a, b, c))
    });
    let (store, a, b, c) = match opened {
        Ok(opened) => opened,
        Err(e) => return report(&format!("e|opening the store failed: {e:?}")),
    };
    report("O");
    let workload = Workload {
        store,
        a,
        b,
        c,
        durability,
        next_id: AtomicU64::new(config.first_id),
        next_tx: AtomicU64::new(0),
        next_flush: AtomicU64::new(0),
        deadline: Instant::now() + LIFETIME,
    };
    let roles = [
        Role::Producer,
        Role::Producer,
        Role::Consumer,
        Role::Mover,
        Role::Worker { tends: true },
        Role::Worker { tends: false },
    ];
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
