//! Scenarios of waiting consumers, run on every engine of the suite (`tests/suite/waiting.rs`,
//! `tests/suite/leak.rs`, see [`super::engines`]): the fixture, and waiting for consumers to
//! register (through `waiters()`, never through sleeps).

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use reliable_queue::{ReliableConcurrentQueue, Store};

use super::engines::{Engine, EngineStore};

pub type Queue = ReliableConcurrentQueue<u64>;

/// How long any single scenario may take before it counts as hung.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(120);
/// How long to wait for consumers to register before counting it as a failure.
pub const REGISTRATION_LIMIT: Duration = Duration::from_secs(30);

/// A fresh store of one engine with one queue, `jobs`.
pub struct Fixture {
    pub store: Store,
    pub q: Queue,
    /// The engine's store and the place of its data (a directory, a schema).
    pub at: EngineStore,
}

impl Fixture {
    pub fn new(engine: &'static Engine) -> Fixture {
        Fixture::with(engine.store())
    }

    pub fn with(at: EngineStore) -> Fixture {
        let store = at.store.clone();
        let q = store.blocking_queue::<u64>("jobs").expect("open the queue");
        Fixture { store, q, at }
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.at.name()
    }

    pub fn commit(&self, items: &[u64]) {
        let mut tx = self.store.begin();
        for &item in items {
            self.q.enqueue(&mut tx, item).expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
    }

    pub async fn commit_async(&self, items: &[u64]) {
        let mut tx = self.store.begin();
        for &item in items {
            self.q.enqueue(&mut tx, item).expect("enqueue");
        }
        tx.commit().await.expect("commit");
    }

    /// `(count(), waiters())`.
    pub fn state(&self) -> (u64, usize) {
        (self.q.blocking_count().expect("count"), self.q.waiters())
    }

    /// [`state`](Self::state) for async code.
    pub async fn state_async(&self) -> (u64, usize) {
        (self.q.count().await.expect("count"), self.q.waiters())
    }
}

/// Waits, yielding, until `n` consumers are registered on `q`.
pub async fn until_waiters(q: &Queue, n: usize) {
    let start = Instant::now();
    while q.waiters() < n {
        assert!(
            start.elapsed() < REGISTRATION_LIMIT,
            "{} of {n} consumers registered",
            q.waiters()
        );
        tokio::task::yield_now().await;
    }
}

/// Blocking version of [`until_waiters`], for consumers on threads.
pub fn until_waiters_blocking(q: &Queue, n: usize) {
    let start = Instant::now();
    while q.waiters() < n {
        assert!(
            start.elapsed() < REGISTRATION_LIMIT,
            "{} of {n} consumers registered",
            q.waiters()
        );
        std::thread::yield_now();
    }
}

/// Spawns a consumer task that waits in `dequeue` and commits what it gets.
pub fn spawn_waiter(f: &Fixture) -> tokio::task::JoinHandle<u64> {
    let (store, q) = (f.store.clone(), f.q.clone());
    tokio::spawn(async move {
        let mut tx = store.begin();
        let item = q.dequeue(&mut tx).await.expect("dequeue");
        tx.commit().await.expect("commit the dequeue");
        item
    })
}

/// Spawns a consumer thread that waits in `blocking_dequeue` and commits what it gets.
pub fn spawn_blocking_waiter(f: &Fixture) -> std::thread::JoinHandle<u64> {
    let (store, q) = (f.store.clone(), f.q.clone());
    std::thread::spawn(move || {
        let mut tx = store.begin();
        let item = q.blocking_dequeue(&mut tx).expect("blocking_dequeue");
        tx.blocking_commit().expect("commit the dequeue");
        item
    })
}

/// Enqueues `items` to `q` in one transaction and commits it.
pub fn fill(store: &Store, q: &Queue, items: impl IntoIterator<Item = impl Borrow<u64>>) {
    let mut tx = store.begin();
    for i in items {
        q.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
}

/// A server engine's caller-runtime option (`postgres_runtime`, `redis_runtime`): `open` with
/// a current-thread runtime's handle is refused as an invalid `setting`; returns a
/// multi-thread runtime of two workers for the store to run on instead.
pub fn caller_runtime(
    setting: &str,
    open: impl FnOnce(tokio::runtime::Handle) -> reliable_queue::Result<Store>,
) -> tokio::runtime::Runtime {
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = open(single.handle().clone());
    assert!(
        matches!(&refused, Err(reliable_queue::Error::InvalidConfig { setting: s, .. }) if *s == setting),
        "a current-thread runtime is refused: {refused:?}"
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// On a store whose async calls run on the caller's runtime (a server engine's
/// `postgres_runtime` or `redis_runtime`, this the current one): `tasks` tasks move `items` items
/// from `a` to `b` one at a time, with an abort and a dropped transaction among every five
/// moves, while a consumer waits on the empty queue `w`; then a commit to `w` wakes it.
pub async fn move_among_aborts_then_wake_a_waiter(
    store: &Store,
    a: &Queue,
    b: &Queue,
    items: u64,
    tasks: u64,
) {
    // A consumer waiting on an empty queue, woken by the first commit to it.
    let waiting = {
        let (store, q) = (store.clone(), store.queue::<u64>("w").await.unwrap());
        tokio::spawn(async move {
            let mut tx = store.begin();
            let item = q.dequeue(&mut tx).await.unwrap();
            tx.commit().await.unwrap();
            item
        })
    };
    let movers: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, a, b) = (store.clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                let (mut moved, mut round) = (0, t);
                while moved < items / tasks {
                    round += 1;
                    let mut tx = store.begin();
                    let Some(item) = a.try_dequeue(&mut tx).await.unwrap() else {
                        // The rest are held by other tasks, or on their way back.
                        drop(tx);
                        tokio::task::yield_now().await;
                        continue;
                    };
                    b.enqueue(&mut tx, item).unwrap();
                    match round % 5 {
                        0 => tx.abort().await.unwrap(),
                        1 => drop(tx),
                        _ => {
                            tx.commit().await.unwrap();
                            moved += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for mover in movers {
        mover.await.unwrap();
    }
    let w = store.queue::<u64>("w").await.unwrap();
    let mut tx = store.begin();
    w.enqueue(&mut tx, 7).unwrap();
    tx.commit().await.unwrap();
    assert_eq!(waiting.await.unwrap(), 7);
}
