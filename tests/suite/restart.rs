//! Closing and reopening an on-disk store: what was committed is there, what was not is not,
//! in commit order; directories in use are refused; the catalog survives. A process killed
//! while it holds leases: their items come back at the head, with their attempts.
//!
//! The cases of a clean restart (S3, S4, S7, S8 across a close and an open by the next
//! process) run on every engine of the conformance suite whose data outlives the store
//! (`tests/common/engines.rs`: sled, PostgreSQL; in memory nothing does, S9, and they return
//! at once). Directories, buffered durability, sled's log records and killed processes are
//! sled's, checked once.

use crate::common;
use crate::{engine_case, once_case};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::engines::{Engine, EngineStore};
use common::{drain, peek_all, temp_dir};
use reliable_queue::{Durability, Error, Result, Store};
use serde::{Deserialize, Serialize};

fn enqueue_all<T>(store: &Store, name: &str, items: impl IntoIterator<Item = T>)
where
    T: Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    let queue = store.blocking_queue::<T>(name).unwrap();
    let mut tx = store.begin();
    for item in items {
        queue.enqueue(&mut tx, item).unwrap();
    }
    tx.blocking_commit().unwrap();
}

/// Opens `path` in another thread and returns its outcome, failing the test if the open
/// does not return within thirty seconds.
fn open_elsewhere(open: impl FnOnce() -> Result<Store> + Send + 'static) -> Result<Store> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(open());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("a second open returns instead of hanging")
}

fn assert_already_open(result: Result<Store>, path: &Path) {
    match result {
        Err(Error::AlreadyOpen { path: reported }) => {
            assert_eq!(
                reported.canonicalize().unwrap(),
                path.canonicalize().unwrap()
            );
        }
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
}

/// A fresh store of `engine` whose data outlives it, or `None` in memory.
fn durable(engine: &'static Engine) -> Option<EngineStore> {
    let at = engine.store();
    at.durable().then_some(at)
}

/// The next process's store on `at`'s data, once `current` (and every clone of it) is closed.
fn next(at: &EngineStore, current: Store) -> Store {
    current.blocking_close().expect("close");
    at.reopen().expect("a store whose data outlives it")
}

/// The queues of `store` by name: every queue of the store; on PostgreSQL `queue_names` lists
/// only those opened through this handle (its documentation), so the database is asked.
fn all_queues(engine: &Engine, store: &Store) -> Vec<String> {
    match engine.name {
        "postgres" | "redis" => store.blocking_list_queues().unwrap(),
        _ => store.queue_names(),
    }
}

fn committed_enqueues_survive_a_reopen(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    enqueue_all(&store, "q", 0..100u32);
    enqueue_all(&store, "q", 100..150u32);
    let store = next(&at, store);
    let queue = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(queue.blocking_count().unwrap(), 150);
    assert_eq!(drain(&store, &queue), (0..150).collect::<Vec<_>>());
}

fn committed_dequeues_do_not_come_back(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let mut store = at.store.clone();
    {
        enqueue_all(&store, "q", 0..10u32);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        for _ in 0..4 {
            queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        }
        tx.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 6);
    }
    for _ in 0..2 {
        store = next(&at, store);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 6);
        assert_eq!(peek_all(&store, &queue), (4..10).collect::<Vec<_>>());
    }
    {
        store = next(&at, store);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        assert_eq!(drain(&store, &queue).len(), 6);
    }
    let store = next(&at, store);
    assert_eq!(
        store
            .blocking_queue::<u32>("q")
            .unwrap()
            .blocking_count()
            .unwrap(),
        0
    );
}

/// A transaction open when its store closes is neither committed nor lost (`Store::close`).
fn transaction_open_at_close_is_undone(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    enqueue_all(&store, "q", [1u32, 2, 3]);
    let queue = store.blocking_queue::<u32>("q").unwrap();
    let mut open = store.begin();
    assert_eq!(queue.blocking_try_dequeue(&mut open).unwrap(), Some(1));
    assert_eq!(queue.blocking_try_dequeue(&mut open).unwrap(), Some(2));
    queue.enqueue(&mut open, 4).unwrap();
    drop(queue);
    let store = next(&at, store);
    drop(open);
    let queue = store.blocking_queue::<u32>("q").unwrap();
    // On PostgreSQL the held rows return when the closed store's connection ends, or the
    // dropped transaction's rollback (from a task) arrives: a moment later.
    engine.after_drop("the held items to be back", || {
        queue.blocking_count().unwrap() == 3
    });
    assert_eq!(drain(&store, &queue), [1, 2, 3]);
}

fn items_given_back_before_close_are_there_after(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    {
        enqueue_all(&store, "q", 0..5u32);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        tx.blocking_abort().expect("abort");
    }
    let store = next(&at, store);
    let queue = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&store, &queue), (0..5).collect::<Vec<_>>());
}

fn order_after_restart_follows_commit_order(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    let before;
    {
        let queue = store.blocking_queue::<String>("q").unwrap();
        // Begun first, committed last.
        let mut late = store.begin();
        queue.enqueue(&mut late, "late".to_owned()).unwrap();
        let mut early = store.begin();
        queue.enqueue(&mut early, "early-1".to_owned()).unwrap();
        queue.enqueue(&mut early, "early-2".to_owned()).unwrap();
        early.blocking_commit().unwrap();
        enqueue_all(&store, "q", ["middle".to_owned()]);
        late.blocking_commit().unwrap();
        enqueue_all(&store, "q", ["last".to_owned()]);
        before = peek_all(&store, &queue);
    }
    assert_eq!(before, ["early-1", "early-2", "middle", "late", "last"]);
    let store = next(&at, store);
    let queue = store.blocking_queue::<String>("q").unwrap();
    assert_eq!(peek_all(&store, &queue), before);

    // New items go after the recovered ones.
    enqueue_all(&store, "q", ["after restart".to_owned()]);
    let mut expected = before.clone();
    expected.push("after restart".into());
    assert_eq!(drain(&store, &queue), expected);
}

fn items_enqueued_after_a_restart_are_not_confused_with_old_ones(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let mut store = at.store.clone();
    enqueue_all(&store, "q", 0..3u32);
    {
        store = next(&at, store);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        enqueue_all(&store, "q", 3..6u32);
        // Hold the old items aside and acknowledge only the new ones: their acks must not
        // remove old items, at this open or the next.
        let mut old = store.begin();
        let held: Vec<u32> = (0..3)
            .map(|_| queue.blocking_try_dequeue(&mut old).unwrap().unwrap())
            .collect();
        assert_eq!(held, [0, 1, 2]);
        let mut new = store.begin();
        let taken: Vec<u32> = (0..3)
            .map(|_| queue.blocking_try_dequeue(&mut new).unwrap().unwrap())
            .collect();
        assert_eq!(taken, [3, 4, 5]);
        new.blocking_commit().unwrap();
        old.blocking_abort().expect("abort");
        enqueue_all(&store, "q", 6..8u32);
        assert_eq!(peek_all(&store, &queue), [0, 1, 2, 6, 7]);
    }
    let store = next(&at, store);
    let queue = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&store, &queue), [0, 1, 2, 6, 7]);
}

fn buffered_commits_survive_flush_and_reopen() {
    let (_guard, path) = temp_dir();
    let open = || {
        Store::builder()
            .path(&path)
            .durability(Durability::Buffered)
            .flush_interval(Duration::from_secs(3600))
            .open()
            .unwrap()
    };
    {
        let store = open();
        assert_eq!(store.durability(), Durability::Buffered);
        enqueue_all(&store, "q", 0..20u32);
        let queue = store.blocking_queue::<u32>("q").unwrap();
        let mut tx = store.begin();
        queue.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        tx.blocking_commit().unwrap();
        store.blocking_flush().unwrap();
    }
    let store = open();
    let queue = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&store, &queue), (1..20).collect::<Vec<_>>());
}

fn dropping_a_buffered_store_flushes_it() {
    let (_guard, path) = temp_dir();
    {
        // An interval no test run reaches: only closing the store can flush.
        let store = Store::builder()
            .path(&path)
            .durability(Durability::Buffered)
            .flush_interval(Duration::from_secs(3600))
            .open()
            .unwrap();
        enqueue_all(&store, "q", ["a".to_owned(), "b".to_owned()]);
    }
    let store = Store::open(&path).unwrap();
    let queue = store.blocking_queue::<String>("q").unwrap();
    assert_eq!(drain(&store, &queue), ["a", "b"]);
}

fn reopening_in_the_same_process_after_dropping_all_handles_works() {
    let (_guard, path) = temp_dir();
    for round in 0..5u32 {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<u32>("q").unwrap();
        assert_eq!(queue.blocking_count().unwrap(), u64::from(round));
        let mut tx = store.begin();
        queue.enqueue(&mut tx, round).unwrap();
        tx.blocking_commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    let queue = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&store, &queue), [0, 1, 2, 3, 4]);
}

fn a_queue_handle_keeps_the_store_open() {
    let (_guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    let queue = store.blocking_queue::<u32>("q").unwrap();
    drop(store);
    let again = path.clone();
    assert_already_open(open_elsewhere(move || Store::open(again)), &path);
    drop(queue);
    Store::open(&path).expect("reopen once the last handle is gone");
}

fn second_open_of_a_directory_in_use_is_refused() {
    let (_guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    enqueue_all(&store, "q", [1u8]);

    let again = path.clone();
    assert_already_open(open_elsewhere(move || Store::open(again)), &path);
    let again = path.clone();
    assert_already_open(
        open_elsewhere(move || {
            Store::builder()
                .path(again)
                .durability(Durability::Buffered)
                .open()
        }),
        &path,
    );
    // Another spelling of the same directory.
    let again = path.join(".");
    assert_already_open(open_elsewhere(move || Store::open(again)), &path);

    // The store in use is unharmed.
    let queue = store.blocking_queue::<u8>("q").unwrap();
    assert_eq!(peek_all(&store, &queue), [1]);
}

fn queues_created_before_a_restart_are_listed(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    {
        store.blocking_queue::<u32>("zeta").unwrap();
        store.blocking_queue::<String>("alpha").unwrap();
        enqueue_all(&store, "mid", [1u64]);
        assert_eq!(store.queue_names(), ["alpha", "mid", "zeta"]);
    }
    let store = next(&at, store);
    assert_eq!(all_queues(engine, &store), ["alpha", "mid", "zeta"]);
    assert_eq!(
        store
            .blocking_queue::<u64>("mid")
            .unwrap()
            .blocking_count()
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .blocking_queue::<String>("alpha")
            .unwrap()
            .blocking_count()
            .unwrap(),
        0
    );
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Order {
    id: u64,
    lines: Vec<(String, u32)>,
    note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Event {
    Created { at: i64 },
    Renamed(String),
    Deleted,
}

fn a_store_with_many_queues_of_different_types_round_trips(engine: &'static Engine) {
    let Some(at) = durable(engine) else { return };
    let store = at.store.clone();
    let orders: Vec<Order> = (0..5)
        .map(|i| Order {
            id: i,
            lines: (0..i as u32).map(|n| (format!("sku-{n}"), n)).collect(),
            note: (i % 2 == 0).then(|| format!("note {i}")),
        })
        .collect();
    let events = vec![
        Event::Created { at: -5 },
        Event::Renamed("ünïcödé ✓".into()),
        Event::Deleted,
    ];
    let blobs: Vec<Vec<u8>> = vec![vec![], vec![0; 1000], (0..=255).collect()];
    let mut numbers: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    {
        enqueue_all(&store, "orders", orders.clone());
        enqueue_all(&store, "events", events.clone());
        enqueue_all(&store, "blobs", blobs.clone());
        enqueue_all(&store, "unit", [(), ()]);
        enqueue_all(&store, "pairs", [(1i8, 'x'), (-1, 'y')]);
        enqueue_all(&store, "floats", [1.5f64, -0.0, f64::MAX]);
        // A transaction over many queues of one type.
        let mut tx = store.begin();
        for q in 0..30u64 {
            let queue = store.blocking_queue::<u64>(&format!("n/{q:02}")).unwrap();
            for i in 0..q {
                queue.enqueue(&mut tx, q * 1000 + i).unwrap();
            }
            numbers.insert(format!("n/{q:02}"), (0..q).map(|i| q * 1000 + i).collect());
        }
        tx.blocking_commit().unwrap();
    }
    let store = next(&at, store);
    assert_eq!(all_queues(engine, &store).len(), 36);
    assert_eq!(
        drain(&store, &store.blocking_queue::<Order>("orders").unwrap()),
        orders
    );
    assert_eq!(
        drain(&store, &store.blocking_queue::<Event>("events").unwrap()),
        events
    );
    assert_eq!(
        drain(&store, &store.blocking_queue::<Vec<u8>>("blobs").unwrap()),
        blobs
    );
    assert_eq!(
        drain(&store, &store.blocking_queue::<()>("unit").unwrap()).len(),
        2
    );
    assert_eq!(
        drain(
            &store,
            &store.blocking_queue::<(i8, char)>("pairs").unwrap()
        ),
        [(1, 'x'), (-1, 'y')]
    );
    let floats = drain(&store, &store.blocking_queue::<f64>("floats").unwrap());
    assert_eq!(floats.len(), 3);
    assert_eq!(floats[0], 1.5);
    assert!(floats[1] == 0.0 && floats[1].is_sign_negative());
    assert_eq!(floats[2], f64::MAX);
    for (name, expected) in numbers {
        let got: Vec<u64> = drain(&store, &store.blocking_queue::<u64>(&name).unwrap());
        assert_eq!(got, expected, "queue {name}");
    }
}

/// Copies the directory of an open store as it is on disk now: what a crash at this moment
/// would leave behind.
fn snapshot(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    // Owner-only, as the store keeps its directories (it refuses a directory open to others).
    #[cfg(unix)]
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            snapshot(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn sync_commit_is_on_disk_when_it_returns() {
    let (guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    let queue = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    for i in 0..10 {
        queue.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    let mut tx = store.begin();
    assert_eq!(queue.blocking_try_dequeue(&mut tx).unwrap(), Some(0));
    tx.blocking_commit().unwrap();

    // No flush, no close: the store is still open when its files are copied.
    let copy = guard.path().join("copy");
    snapshot(&path, &copy);
    let recovered = Store::open(&copy).unwrap();
    let queue = recovered.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&recovered, &queue), (1..10).collect::<Vec<_>>());
    drop(store);
}

fn buffered_commit_is_on_disk_after_flush() {
    let (guard, path) = temp_dir();
    let store = Store::builder()
        .path(&path)
        .durability(Durability::Buffered)
        .flush_interval(Duration::from_secs(3600))
        .open()
        .unwrap();
    let queue = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    for i in 0..10 {
        queue.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    store.blocking_flush().unwrap();

    let copy = guard.path().join("copy");
    snapshot(&path, &copy);
    let recovered = Store::open(&copy).unwrap();
    let queue = recovered.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&recovered, &queue), (0..10).collect::<Vec<_>>());
    drop(store);
}

/// A transaction too big for one log record is written as several records in one atomic
/// batch: all of it survives a restart, in order, and the log holds several records for it.
fn a_transaction_larger_than_one_record_survives_whole_and_in_order() {
    let (_guard, path) = temp_dir();
    let items: Vec<Vec<u8>> = (0..3000u32)
        .map(|i| {
            let mut item = i.to_le_bytes().to_vec();
            item.resize(100, i as u8);
            item
        })
        .collect();
    {
        let store = Store::open(&path).unwrap();
        let q = store.blocking_queue::<Vec<u8>>("big").unwrap();
        let mut tx = store.begin();
        for item in &items {
            q.enqueue(&mut tx, item.clone()).unwrap();
        }
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        assert_eq!(
            q.blocking_try_dequeue(&mut tx).unwrap().as_ref(),
            Some(&items[0])
        );
        tx.blocking_commit().unwrap();
    }
    {
        let db = common::open_raw_sled(&path);
        let log = db.open_tree("log").unwrap();
        assert!(
            log.len() >= 4,
            "300 KB of items in one transaction should take several records, found {}",
            log.len()
        );
    }
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<Vec<u8>>("big").unwrap();
    assert_eq!(q.blocking_count().unwrap(), items.len() as u64 - 1);
    assert_eq!(drain(&store, &q), items[1..]);
}

/// A log of several MiB is replayed by a storage engine instance of its own, which is closed
/// before the store starts writing: everything comes back, in order, and the store keeps
/// committing and recovering normally afterwards.
fn a_large_log_recovers_and_the_store_keeps_working() {
    let (_guard, path) = temp_dir();
    let items: Vec<(u32, Vec<u8>)> = (0..40_000u32).map(|i| (i, vec![i as u8; 100])).collect();
    {
        let store = Store::open(&path).unwrap();
        let q = store.blocking_queue::<(u32, Vec<u8>)>("q").unwrap();
        for chunk in items.chunks(5_000) {
            let mut tx = store.begin();
            for item in chunk {
                q.enqueue(&mut tx, item.clone()).unwrap();
            }
            tx.blocking_commit().unwrap();
        }
    }
    {
        let store = Store::open(&path).unwrap();
        let q = store.blocking_queue::<(u32, Vec<u8>)>("q").unwrap();
        assert_eq!(q.blocking_count().unwrap(), items.len() as u64);
        let mut tx = store.begin();
        for expected in &items[..10] {
            assert_eq!(
                q.blocking_try_dequeue(&mut tx).unwrap().as_ref(),
                Some(expected)
            );
        }
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, (u32::MAX, vec![1])).unwrap();
        tx.blocking_commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<(u32, Vec<u8>)>("q").unwrap();
    let mut expected = items[10..].to_vec();
    expected.push((u32::MAX, vec![1]));
    assert_eq!(drain(&store, &q), expected);
}

// ---- leases ended by a killed process -------------------------------------------------------

/// Set in a child's environment: the store directory it works on. Its presence selects the
/// child role of the two tests below.
const LEASE_CHILD_DIR: &str = "RQ_RESTART_LEASE_CHILD_DIR";
/// Set in a child's environment when it should churn another queue until compaction has
/// copied the records that hold its leases forward.
const LEASE_CHILD_CHURN: &str = "RQ_RESTART_LEASE_CHILD_CHURN";
/// The line a child prints once it holds its leases (and, churning, has flushed the store).
const LEASE_CHILD_READY: &str = "RQ|leases-held";
/// The compaction floor of the stores of the two tests: small, so that a short churn makes
/// compaction rewrite the oldest records.
const LEASE_FLOOR: u64 = 64 * 1024;

/// Item `n` of the leased queue: text no other item of the store contains, so that the
/// parent can find the log records that hold it.
fn numbered(n: u32) -> String {
    format!("restart-order-item-{n}")
}

fn number_of(item: &str) -> u32 {
    item.strip_prefix("restart-order-item-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not an item of the test: {item:?}"))
}

fn open_for_leases(path: &Path) -> Store {
    Store::builder()
        .path(path)
        .compaction_floor(LEASE_FLOOR)
        .open()
        .expect("open the store")
}

/// The child's part: enqueues items 1..=5 durably, leases 1 and 3 (2 is held by a
/// transaction meanwhile, then given back by its abort, so that its version in the log stays
/// the enqueued one), churns another queue if asked, reports that it is ready and waits to be
/// killed (or for its stdin to close, should the parent die first).
fn hold_leases_as_child(path: &Path, churn: bool) {
    let store = open_for_leases(path);
    let queue = store.blocking_queue::<String>("q").unwrap();
    enqueue_all(&store, "q", (1..=5).map(numbered));
    let ttl = Duration::from_secs(3600);
    let first = queue.blocking_try_lease(ttl).unwrap().expect("item 1");
    assert_eq!((number_of(first.item()), first.attempt()), (1, 1));
    let mut holder = store.begin();
    let held = queue.blocking_try_dequeue(&mut holder).unwrap();
    assert_eq!(held.as_deref().map(number_of), Some(2));
    let third = queue.blocking_try_lease(ttl).unwrap().expect("item 3");
    assert_eq!((number_of(third.item()), third.attempt()), (3, 1));
    holder.blocking_abort().expect("abort");
    let stats = queue.blocking_stats().unwrap();
    assert_eq!((stats.visible, stats.leased), (3, 2));
    if churn {
        // Items of about 120 bytes, five out and five in per commit: some 200 commits take
        // the log three times past the compaction floor, far past twice the live bytes.
        let side = store.blocking_queue::<(u64, Vec<u8>)>("side").unwrap();
        let mut next = 0u64;
        let mut tx = store.begin();
        for _ in 0..5 {
            side.enqueue(&mut tx, (next, vec![7u8; 100])).unwrap();
            next += 1;
        }
        tx.blocking_commit().unwrap();
        let mut churn_once = || {
            let mut tx = store.begin();
            for _ in 0..5 {
                side.blocking_try_dequeue(&mut tx)
                    .unwrap()
                    .expect("the side backlog");
                side.enqueue(&mut tx, (next, vec![7u8; 100])).unwrap();
                next += 1;
            }
            tx.blocking_commit().unwrap();
        };
        for _ in 0..3 * LEASE_FLOOR / (5 * 120) {
            churn_once();
        }
        // Compaction deletes a record only once both copies of the mark carry a start past
        // it, and the marker thread writes them at its own pace. A flush writes the mark and
        // waits for it, one copy each time the mark changed (a commit changes it): so four
        // commits, each flushed, put the start in both copies, let the next group's
        // compaction run, and make its work durable, however slow that thread is.
        for _ in 0..4 {
            churn_once();
            store.blocking_flush().unwrap();
        }
    }
    println!("{LEASE_CHILD_READY}");
    // Nothing is ever written to stdin: this returns when the parent closes it or dies.
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
    drop((first, third));
    std::process::exit(3);
}

/// Kills the child when dropped, so a failing parent leaves no process behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs this test binary again as the child of test `test_name` on store `path`, waits for
/// it to report that it holds its leases and kills it with SIGKILL.
fn run_child_and_kill_it(test_name: &str, path: &Path, churn: bool) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(LEASE_CHILD_DIR, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if churn {
        command.env(LEASE_CHILD_CHURN, "1");
    }
    let mut child = KillOnDrop(command.spawn().expect("start the child"));
    let stdout = child.0.stdout.take().expect("the child's stdout");
    let (ready, readiness) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            // libtest may print the test's name on the same line first.
            if line.trim_end().ends_with(LEASE_CHILD_READY) {
                let _ = ready.send(());
                return;
            }
        }
    });
    match readiness.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => {}
        Err(e) => panic!(
            "the child did not report its leases ({e}); it exited: {:?}",
            { child.0.try_wait() }
        ),
    }
    child.0.kill().expect("kill the child");
    let status = child.0.wait().expect("wait for the child");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    }
    #[cfg(not(unix))]
    assert!(!status.success(), "the child was killed: {status:?}");
}

/// Reopens the store a killed child held leases on: items 1 and 3, whose leases ended with
/// the process, come first (in the order they were leased), with their attempt counted, then
/// the items that were merely queued, in commit order.
fn check_order_after_the_kill(path: &Path) {
    let store = open_for_leases(path);
    let queue = store.blocking_queue::<String>("q").unwrap();
    let stats = queue.blocking_stats().unwrap();
    assert_eq!(
        (stats.visible, stats.leased, stats.delayed, stats.held),
        (5, 0, 0, 0),
        "every item visible after the restart"
    );
    let mut attempts: Vec<(u32, u32)> = queue
        .blocking_browse(None, 10)
        .unwrap()
        .into_iter()
        .map(|b| (number_of(&b.item), b.attempts))
        .collect();
    attempts.sort_unstable();
    assert_eq!(
        attempts,
        [(1, 1), (2, 0), (3, 1), (4, 0), (5, 0)],
        "attempts kept"
    );
    let order: Vec<u32> = peek_all(&store, &queue)
        .iter()
        .map(|s| number_of(s))
        .collect();
    assert_eq!(
        order,
        [1, 3, 2, 4, 5],
        "items whose leases the restart ended come first"
    );
    // The next lease takes the head, counting one more attempt.
    let lease = queue
        .blocking_try_lease(Duration::from_secs(60))
        .unwrap()
        .expect("an item");
    assert_eq!((number_of(lease.item()), lease.attempt()), (1, 2));
    drop(lease);
    let order: Vec<u32> = drain(&store, &queue).iter().map(|s| number_of(s)).collect();
    assert_eq!(order, [1, 3, 2, 4, 5], "given back at the head");
}

fn leases_ended_by_a_kill_come_back_at_the_head() {
    if let Some(dir) = std::env::var_os(LEASE_CHILD_DIR) {
        hold_leases_as_child(Path::new(&dir), false);
        return;
    }
    let (_guard, path) = temp_dir();
    run_child_and_kill_it(
        "restart::leases_ended_by_a_kill_come_back_at_the_head",
        &path,
        false,
    );
    check_order_after_the_kill(&path);
}

/// The keys of the log records that hold the bytes of item `n`.
fn records_holding(log: &sled::Tree, n: u32) -> Vec<u64> {
    let needle = numbered(n).into_bytes();
    log.iter()
        .map(|kv| kv.expect("read the log"))
        .filter(|(_, v)| v.windows(needle.len()).any(|w| w == needle.as_slice()))
        .map(|(k, _)| u64::from_be_bytes(k.as_ref().try_into().expect("a sequence number")))
        .collect()
}

fn leases_ended_by_a_kill_come_back_at_the_head_after_compaction() {
    if let Some(dir) = std::env::var_os(LEASE_CHILD_DIR) {
        hold_leases_as_child(
            Path::new(&dir),
            std::env::var_os(LEASE_CHILD_CHURN).is_some(),
        );
        return;
    }
    let (_guard, path) = temp_dir();
    run_child_and_kill_it(
        "restart::leases_ended_by_a_kill_come_back_at_the_head_after_compaction",
        &path,
        true,
    );
    {
        // Compaction copied the leased items forward: each is in one record, which is not
        // the record of its lease. Records are rewritten front first, each into a new record
        // at the end of the log, so a leased item's copy comes after the copy of the record
        // that enqueued items 1..=5 (the only record holding item 2 now).
        let db = common::open_raw_sled(&path);
        let log = db.open_tree("log").unwrap();
        let enqueued = records_holding(&log, 2);
        assert_eq!(enqueued.len(), 1, "item 2 is in one record: {enqueued:?}");
        for n in [1, 3] {
            let holding = records_holding(&log, n);
            assert_eq!(
                holding.len(),
                1,
                "the enqueue of item {n} was compacted away: {holding:?}"
            );
            assert!(
                holding[0] > enqueued[0],
                "the lease of item {n} (record {}) was copied forward, after record {}",
                holding[0],
                enqueued[0]
            );
        }
    }
    check_order_after_the_kill(&path);
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(committed_enqueues_survive_a_reopen),
        engine_case!(committed_dequeues_do_not_come_back),
        engine_case!(transaction_open_at_close_is_undone),
        engine_case!(items_given_back_before_close_are_there_after),
        engine_case!(order_after_restart_follows_commit_order),
        engine_case!(items_enqueued_after_a_restart_are_not_confused_with_old_ones),
        engine_case!(queues_created_before_a_restart_are_listed),
        engine_case!(a_store_with_many_queues_of_different_types_round_trips),
        once_case!(buffered_commits_survive_flush_and_reopen),
        once_case!(dropping_a_buffered_store_flushes_it),
        once_case!(reopening_in_the_same_process_after_dropping_all_handles_works),
        once_case!(a_queue_handle_keeps_the_store_open),
        once_case!(second_open_of_a_directory_in_use_is_refused),
        once_case!(sync_commit_is_on_disk_when_it_returns),
        once_case!(buffered_commit_is_on_disk_after_flush),
        once_case!(a_transaction_larger_than_one_record_survives_whole_and_in_order),
        once_case!(a_large_log_recovers_and_the_store_keeps_working),
        once_case!(leases_ended_by_a_kill_come_back_at_the_head),
        once_case!(leases_ended_by_a_kill_come_back_at_the_head_after_compaction),
    ]
}
