//! Scenarios of waiting consumers, run once on an in-memory and once on an on-disk store
//! (`tests/waiting.rs`, `tests/leak.rs`): the fixture, the macros that run a scenario on both,
//! and waiting for consumers to register (through `waiters()`, never through sleeps).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reliable_queue::{ReliableConcurrentQueue, Store};

use super::temp_dir;

pub type Queue = ReliableConcurrentQueue<u64>;

/// How long any single scenario may take before it counts as hung.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(120);
/// How long to wait for consumers to register before counting it as a failure.
pub const REGISTRATION_LIMIT: Duration = Duration::from_secs(30);

/// Where a scenario's store lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Disk,
}

/// A store with one queue, and the directory behind it when on disk.
pub struct Fixture {
    pub store: Store,
    pub q: Queue,
    pub path: Option<PathBuf>,
    pub _dir: Option<tempfile::TempDir>,
}

impl Fixture {
    pub fn new(kind: Kind) -> Fixture {
        let (dir, path, store) = match kind {
            Kind::Memory => (None, None, Store::in_memory().expect("in-memory store")),
            Kind::Disk => {
                let (dir, path) = temp_dir();
                let store = Store::open(&path).expect("open the store");
                (Some(dir), Some(path), store)
            }
        };
        let q = store.blocking_queue::<u64>("jobs").expect("open the queue");
        Fixture {
            store,
            q,
            path,
            _dir: dir,
        }
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
}

/// Runs an async scenario on a two-worker runtime, once per store kind.
#[macro_export]
macro_rules! on_both_stores_async {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_memory() {
                tokio::time::timeout(super::SCENARIO_LIMIT, super::$name(super::Kind::Memory))
                    .await
                    .expect("the scenario did not finish in time");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_disk() {
                tokio::time::timeout(super::SCENARIO_LIMIT, super::$name(super::Kind::Disk))
                    .await
                    .expect("the scenario did not finish in time");
            }
        }
    )*};
}

/// Runs a blocking scenario on the test thread, once per store kind.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn in_memory() {
                super::$name(super::Kind::Memory);
            }

            #[test]
            fn on_disk() {
                super::$name(super::Kind::Disk);
            }
        }
    )*};
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
