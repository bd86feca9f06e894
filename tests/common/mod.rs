//! Helpers shared by the behaviour tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub mod certs;
pub mod engines;
pub mod movers;
#[path = "../pg/mod.rs"]
pub mod pg;
mod raw_sled;
#[path = "../redis/mod.rs"]
pub mod redis;
pub mod scenarios;
#[allow(unused_imports)]
pub use raw_sled::open_raw_sled;

use reliable_queue::{ReliableConcurrentQueue, Store};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A fresh directory that lives as long as the returned guard.
pub fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("store");
    (dir, path)
}

/// Dequeues everything visible in one transaction per item batch and commits.
pub fn drain<T>(store: &Store, queue: &ReliableConcurrentQueue<T>) -> Vec<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    let mut out = Vec::new();
    loop {
        let mut tx = store.begin();
        let mut got = 0;
        while got < 256 {
            match queue.blocking_try_dequeue(&mut tx).expect("dequeue") {
                Some(item) => {
                    out.push(item);
                    got += 1;
                }
                None => break,
            }
        }
        tx.blocking_commit().expect("commit drain");
        if got == 0 {
            return out;
        }
    }
}

/// [`drain`] for async code (the blocking forms are for threads).
pub async fn drain_async<T>(store: &Store, queue: &ReliableConcurrentQueue<T>) -> Vec<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    let mut out = Vec::new();
    loop {
        let mut tx = store.begin();
        let mut got = 0;
        while got < 256 {
            match queue.try_dequeue(&mut tx).await.expect("dequeue") {
                Some(item) => {
                    out.push(item);
                    got += 1;
                }
                None => break,
            }
        }
        tx.commit().await.expect("commit drain");
        if got == 0 {
            return out;
        }
    }
}

/// Looks at everything visible without consuming it (dequeue, then abort).
pub fn peek_all<T>(store: &Store, queue: &ReliableConcurrentQueue<T>) -> Vec<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    let mut tx = store.begin();
    let mut out = Vec::new();
    while let Some(item) = queue.blocking_try_dequeue(&mut tx).expect("dequeue") {
        out.push(item);
    }
    tx.blocking_abort().expect("abort");
    out
}

/// The verdict of a total-queue check, in the manner of Jepsen's `total-queue` checker.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TotalQueue {
    /// Acknowledged enqueues that were neither dequeued nor left in the queue.
    pub lost: BTreeSet<u64>,
    /// Items dequeued (or left) more than once, with how many times.
    pub duplicated: BTreeMap<u64, usize>,
    /// Items seen that no enqueue ever attempted.
    pub unexpected: BTreeSet<u64>,
    /// Acknowledged enqueues accounted for.
    pub ok: usize,
}

impl TotalQueue {
    /// `attempted`: every item any enqueue tried (committed or not); `acknowledged`: the ones
    /// whose commit returned `Ok`; `consumed`: every item of a committed dequeue;
    /// `remaining`: what a final drain found.
    pub fn check(
        attempted: &BTreeSet<u64>,
        acknowledged: &BTreeSet<u64>,
        consumed: &[u64],
        remaining: &[u64],
    ) -> TotalQueue {
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for &id in consumed.iter().chain(remaining) {
            *seen.entry(id).or_default() += 1;
        }
        let mut verdict = TotalQueue::default();
        for &id in acknowledged {
            if seen.contains_key(&id) {
                verdict.ok += 1;
            } else {
                verdict.lost.insert(id);
            }
        }
        for (&id, &n) in &seen {
            if n > 1 {
                verdict.duplicated.insert(id, n);
            }
            if !attempted.contains(&id) {
                verdict.unexpected.insert(id);
            }
        }
        verdict
    }

    /// True when nothing was lost, duplicated or unexpected.
    pub fn is_valid(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.unexpected.is_empty()
    }
}

/// The permission bits of `path` itself (a symbolic link is not followed).
#[cfg(unix)]
pub fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

/// The trials of a test binary that runs its own `main` (libtest-mimic): one per test.
pub fn trials(tests: &[(&'static str, fn())]) -> Vec<libtest_mimic::Trial> {
    tests
        .iter()
        .map(|&(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
        })
        .collect()
}
