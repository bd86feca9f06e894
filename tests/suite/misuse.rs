//! Misuse and limits: transactions used with another store's queues, item size limits at their
//! exact boundary and across a reopen with other limits, failed serialization in the middle of
//! a move, a directory opened twice (in this process and from another), bad paths, and the
//! permissions of the directories a store creates.
//!
//! The cases that are not about sled's directory run on every engine of the conformance suite
//! (`tests/common/engines.rs`); the others run once, on sled.

use crate::common;
use crate::{engine_case, once_case};

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::engines::{Engine, ENGINES};
#[cfg(unix)]
use common::mode;
use common::{drain, peek_all, temp_dir};
use reliable_queue::{Error, ReliableConcurrentQueue, Store};
use serde::ser::{Error as _, Serializer};
use serde::{Deserialize, Serialize};

fn assert_wrong_store<T: std::fmt::Debug>(result: reliable_queue::Result<T>, queue: &str) {
    match result {
        Err(Error::WrongStore { queue: name }) => assert_eq!(name, queue),
        other => panic!("expected WrongStore for {queue:?}, got {other:?}"),
    }
}

/// Two stores, each with a queue `jobs` holding `a1, a2` and `b1, b2`.
fn two_stores(first: Store, second: Store) -> [(Store, ReliableConcurrentQueue<String>); 2] {
    [(first, "a"), (second, "b")].map(|(store, prefix)| {
        let q = store.blocking_queue::<String>("jobs").expect("queue");
        let mut tx = store.begin();
        for i in 1..=2 {
            q.enqueue(&mut tx, format!("{prefix}{i}")).expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
        (store, q)
    })
}

fn wrong_store_is_refused_and_loses_nothing(first: Store, second: Store) {
    let [(a, qa), (b, qb)] = two_stores(first, second);
    let mut tx = a.begin();
    // Work of `a` already in the transaction must survive the misuse.
    assert_eq!(
        qa.blocking_try_dequeue(&mut tx).unwrap().as_deref(),
        Some("a1")
    );
    qa.enqueue(&mut tx, "a3".to_owned()).unwrap();

    // Same queue name, other store: every operation is refused, nothing is taken or added.
    assert_wrong_store(qb.enqueue(&mut tx, "smuggled".to_owned()), "jobs");
    assert_wrong_store(qb.blocking_try_dequeue(&mut tx), "jobs");
    assert_wrong_store(
        qb.blocking_dequeue_timeout(&mut tx, Duration::from_millis(1)),
        "jobs",
    );
    assert_wrong_store(qb.blocking_dequeue(&mut tx), "jobs");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // An item is visible in `b`, but the refusal comes first, without waiting.
    assert_wrong_store(runtime.block_on(qb.dequeue(&mut tx)), "jobs");
    assert_eq!((tx.enqueued(), tx.dequeued()), (1, 1));
    assert_eq!(
        (qa.blocking_count().unwrap(), qb.blocking_count().unwrap()),
        (1, 2)
    );
    assert_eq!(qb.waiters(), 0, "a refused dequeue left a waiter behind");

    tx.blocking_commit().unwrap();
    assert_eq!(drain(&a, &qa), ["a2", "a3"]);
    assert_eq!(drain(&b, &qb), ["b1", "b2"]);
}

/// Two stores of `engine`, then a store of `engine` with a store of each engine of the suite.
fn transaction_of_another_store_is_refused(engine: &'static Engine) {
    let (first, second) = (engine.store(), engine.store());
    wrong_store_is_refused_and_loses_nothing(first.store.clone(), second.store.clone());
    for other in ENGINES {
        let mine = engine.store();
        wrong_store_is_refused_and_loses_nothing(mine.store.clone(), other.store().store.clone());
    }
    // After a reopen, nothing but what was drained ever reached either store.
    for at in [&first, &second] {
        at.store.clone().blocking_close().unwrap();
        if let Some(store) = at.reopen() {
            assert_eq!(
                store
                    .blocking_queue::<String>("jobs")
                    .unwrap()
                    .blocking_count()
                    .unwrap(),
                0
            );
        }
    }
}

fn queue_and_transaction_handles_keep_their_store_open() {
    let (_guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    drop(store);
    // The handles keep the store, and so its directory, in use.
    assert!(matches!(Store::open(&path), Err(Error::AlreadyOpen { .. })));
    q.enqueue(&mut tx, 1).unwrap();
    tx.blocking_commit().unwrap();
    assert_eq!(q.blocking_count().unwrap(), 1);
    drop(q);
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();
    assert_eq!(drain(&store, &q), [1]);
}

// ---- limits ----

/// Encoded size of a `Vec<u8>` of `n < 128` bytes: envelope byte, length byte, bytes.
fn encoded_len(n: usize) -> usize {
    2 + n
}

fn item_limit_is_exact_and_rejections_leave_the_transaction_whole(engine: &'static Engine) {
    let limit = 64;
    let fits = limit - encoded_len(0);
    {
        let at = engine.store_with(move |b| b.max_item_size(limit));
        let store = at.store.clone();
        let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, vec![1; fits])
            .expect("an item of exactly the limit fits");
        match q.enqueue(&mut tx, vec![2; fits + 1]) {
            Err(Error::ItemTooLarge {
                queue,
                size,
                limit: l,
            }) => {
                assert_eq!((queue.as_str(), size, l), ("q", limit + 1, limit));
            }
            other => panic!("expected ItemTooLarge one byte over, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 1);
        tx.blocking_commit().unwrap();
        assert_eq!(drain(&store, &q), [vec![1; fits]]);
    }
}

/// What the transaction limit counts for each item beyond its encoded bytes: its slot in the
/// transaction plus the smallest heap block (the crate's `ITEM_OVERHEAD`).
const ITEM_OVERHEAD: usize = std::mem::size_of::<(std::sync::Arc<()>, Box<[u8]>)>() + 32;

fn transaction_limit_is_exact(engine: &'static Engine) {
    // Three items of 50 encoded bytes and their overhead fill the transaction exactly.
    let full = 3 * (50 + ITEM_OVERHEAD);
    let at = engine.store_with(move |b| b.max_item_size(50).max_transaction_size(full));
    let store = at.store.clone();
    let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
    let item = vec![7; 50 - encoded_len(0)];
    let mut tx = store.begin();
    for _ in 0..3 {
        q.enqueue(&mut tx, item.clone()).unwrap();
    }
    match q.enqueue(&mut tx, Vec::new()) {
        Err(Error::TransactionTooLarge { size, limit }) => {
            assert_eq!((size, limit), (full + encoded_len(0) + ITEM_OVERHEAD, full));
        }
        other => panic!("expected TransactionTooLarge, got {other:?}"),
    }
    tx.blocking_commit().unwrap();
    assert_eq!(q.blocking_count().unwrap(), 3);
}

/// (In memory nothing outlives the store, S9: nothing to reopen.)
fn items_over_a_lowered_limit_survive_a_reopen_and_can_be_dequeued(engine: &'static Engine) {
    let at = engine.store();
    {
        let store = &at.store;
        let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, vec![9; 10_000]).unwrap();
        tx.blocking_commit().unwrap();
        store.clone().blocking_close().unwrap();
    }
    // The limit applies to new items only: what is already stored is not lost.
    let Some(store) = at.reopen_with(|b| b.max_item_size(100)) else {
        return;
    };
    let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
    assert!(matches!(
        q.enqueue(&mut store.begin(), vec![9; 10_000]),
        Err(Error::ItemTooLarge { .. })
    ));
    let mut tx = store.begin();
    assert_eq!(
        q.blocking_try_dequeue(&mut tx).unwrap(),
        Some(vec![9; 10_000])
    );
    // Giving it back (abort) is not an enqueue: no limit applies.
    tx.blocking_abort().expect("abort");
    assert_eq!(drain(&store, &q), [vec![9; 10_000]]);
}

/// An order whose serialization fails when it is marked poisoned.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Order {
    id: u32,
    poisoned: bool,
}

impl Serialize for Order {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.poisoned {
            return Err(S::Error::custom("poisoned order"));
        }
        (self.id, false).serialize(serializer)
    }
}

fn failed_serialization_in_the_middle_of_a_move_loses_nothing(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = at.store.clone();
        let inbox = store.blocking_queue::<Order>("inbox").unwrap();
        let outbox = store.blocking_queue::<Order>("outbox").unwrap();
        let mut tx = store.begin();
        inbox
            .enqueue(
                &mut tx,
                Order {
                    id: 1,
                    poisoned: false,
                },
            )
            .unwrap();
        tx.blocking_commit().unwrap();

        let mut tx = store.begin();
        let mut order = inbox
            .blocking_try_dequeue(&mut tx)
            .unwrap()
            .expect("the order");
        order.poisoned = true;
        match outbox.enqueue(&mut tx, order.clone()) {
            Err(Error::Serialize { queue, .. }) => assert_eq!(queue, "outbox"),
            other => panic!("expected Serialize, got {other:?}"),
        }
        // The transaction still holds the order; dropping it gives the order back.
        assert_eq!((tx.enqueued(), tx.dequeued()), (0, 1));
        drop(tx);
        engine.after_drop("the order is back", || inbox.blocking_count().unwrap() == 1);
        assert_eq!(outbox.blocking_count().unwrap(), 0);
        assert_eq!(
            peek_all(&store, &inbox),
            [Order {
                id: 1,
                poisoned: false
            }]
        );
        // Retried with a good item, the move goes through.
        let mut tx = store.begin();
        let order = inbox
            .blocking_try_dequeue(&mut tx)
            .unwrap()
            .expect("the order");
        outbox.enqueue(&mut tx, order).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(
            drain(&store, &outbox),
            [Order {
                id: 1,
                poisoned: false
            }]
        );
        assert_eq!(inbox.blocking_count().unwrap(), 0);
    }
}

// ---- a directory opened twice ----

fn a_directory_open_in_this_process_is_refused_under_any_spelling() {
    let (guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();

    let dotted = path.join("..").join(path.file_name().expect("name"));
    // A link to the parent: the store follows links before its own directory, not to it.
    let parent_link = guard.path().join("parent-link");
    std::os::unix::fs::symlink(guard.path(), &parent_link).expect("symlink");
    let link = parent_link.join(path.file_name().expect("name"));
    for spelling in [path.clone(), dotted, link.clone()] {
        match Store::open(&spelling) {
            Err(Error::AlreadyOpen { path: reported }) => {
                assert_eq!(reported, path.canonicalize().unwrap(), "{spelling:?}");
            }
            other => panic!("second open of {spelling:?}: expected AlreadyOpen, got {other:?}"),
        }
    }
    // The refused opens did not disturb the open store.
    let mut tx = store.begin();
    q.enqueue(&mut tx, 5).unwrap();
    tx.blocking_commit().unwrap();
    drop((q, store));
    // Closed, the directory opens again at once, under any spelling.
    let store = Store::open(&link).unwrap();
    assert_eq!(
        drain(&store, &store.blocking_queue::<u32>("q").unwrap()),
        [5]
    );
}

const CHILD_DIR: &str = "RELIABLE_QUEUE_MISUSE_CHILD_DIR";

/// The other process of the test below. Run directly, without the variable the parent sets,
/// it has nothing to do and returns.
fn child_holds_a_store_open_until_stdin_closes() {
    let Some(path) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let store = Store::open(&path).expect("child opens the store");
    let q = store.blocking_queue::<String>("q").expect("queue");
    let mut tx = store.begin();
    q.enqueue(&mut tx, "from the child".to_owned())
        .expect("enqueue");
    tx.blocking_commit().expect("commit");
    println!("child: ready");
    std::io::stdout().flush().expect("flush stdout");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
    drop((q, store));
    println!("child: released");
}

fn a_directory_open_in_another_process_is_refused_quickly() {
    let (_guard, path) = temp_dir();
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "misuse::child_holds_a_store_open_until_stdin_closes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("child stdout");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str| loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains(what) => break,
            Ok(_) => continue,
            Err(e) => panic!("the child never said {what:?}: {e}"),
        }
    };
    wait_for("child: ready");

    let started = Instant::now();
    let result = Store::open(&path);
    let waited = started.elapsed();
    match result {
        Err(Error::AlreadyOpen { path: reported }) => {
            assert_eq!(reported, path.canonicalize().unwrap())
        }
        other => panic!("expected AlreadyOpen while the child holds the store, got {other:?}"),
    }
    // Bounded: the store waits a moment for a lock released by a close, never indefinitely.
    assert!(
        waited < Duration::from_secs(10),
        "the refusal took {waited:?}"
    );
    // A refused open leaves nothing behind: the process can try again later.
    assert!(matches!(Store::open(&path), Err(Error::AlreadyOpen { .. })));

    drop(child.stdin.take());
    wait_for("child: released");
    let status = child.wait().expect("wait for the child");
    assert!(status.success(), "child failed: {status}");
    let store = Store::open(&path).expect("open once the child is gone");
    let q = store.blocking_queue::<String>("q").unwrap();
    assert_eq!(drain(&store, &q), ["from the child"]);
    println!("another process's store refused in {waited:?}");
}

fn a_path_that_is_a_file_is_refused() {
    let (guard, _) = temp_dir();
    let file = guard.path().join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    match Store::open(&file) {
        Err(Error::UnsafeDirectory { path, .. }) => assert_eq!(path, file),
        other => panic!("{file:?}: expected UnsafeDirectory, got {other:?}"),
    }
    // Below a file, the directory cannot be created: a storage error.
    let below = file.join("below");
    match Store::open(&below) {
        Err(Error::Storage { .. }) => {}
        other => panic!("{below:?}: expected Storage, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

// ---- permissions ----

#[cfg(unix)]
fn the_store_directory_is_owner_only() {
    let (guard, path) = temp_dir();
    Store::open(&path).unwrap();
    assert_eq!(mode(&path), 0o700, "{path:?}");
    drop(guard);
}

#[cfg(unix)]
fn missing_parents_are_created_owner_only_and_existing_ones_left_alone() {
    use std::os::unix::fs::PermissionsExt;
    let (guard, _) = temp_dir();
    let base = guard.path().join("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = base.join("a").join("b").join("c").join("store");
    Store::open(&path).unwrap();
    let created = [
        base.join("a"),
        base.join("a").join("b"),
        base.join("a").join("b").join("c"),
        path.clone(),
    ];
    for dir in &created {
        assert_eq!(mode(dir), 0o700, "{dir:?}");
    }
    assert_eq!(mode(&base), 0o755, "an existing parent was changed");
}

#[cfg(unix)]
fn an_existing_store_directory_open_to_others_is_refused_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    let (_guard, path) = temp_dir();
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
    assert!(matches!(
        Store::open(&path),
        Err(Error::UnsafeDirectory { .. })
    ));
    Store::builder()
        .path(&path)
        .allow_shared_directory(true)
        .open()
        .unwrap();
    assert_eq!(
        mode(&path),
        0o750,
        "an allowed directory keeps its permissions"
    );
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(transaction_of_another_store_is_refused),
        engine_case!(item_limit_is_exact_and_rejections_leave_the_transaction_whole),
        engine_case!(transaction_limit_is_exact),
        engine_case!(items_over_a_lowered_limit_survive_a_reopen_and_can_be_dequeued),
        engine_case!(failed_serialization_in_the_middle_of_a_move_loses_nothing),
        once_case!(queue_and_transaction_handles_keep_their_store_open),
        once_case!(a_directory_open_in_this_process_is_refused_under_any_spelling),
        once_case!(child_holds_a_store_open_until_stdin_closes),
        once_case!(a_directory_open_in_another_process_is_refused_quickly),
        once_case!(a_path_that_is_a_file_is_refused),
        #[cfg(unix)]
        once_case!(the_store_directory_is_owner_only),
        #[cfg(unix)]
        once_case!(missing_parents_are_created_owner_only_and_existing_ones_left_alone),
        #[cfg(unix)]
        once_case!(an_existing_store_directory_open_to_others_is_refused_unless_allowed),
    ]
}
