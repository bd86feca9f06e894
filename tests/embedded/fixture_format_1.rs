//! A store written by reliable-queue 0.1.0 (commit e53f049, log format 1) still opens, with
//! exactly the items it held, in order, and keeps working.
//!
//! The fixture is `tests/fixtures/store-format-1/`; `tests/fixtures/store-format-1.md` says
//! how it was made and what it holds. The test works on a copy: the committed files are
//! never opened in place.

use std::error::Error;
use std::fmt::Debug;
use std::path::Path;

use reliable_queue::Store;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

type TestResult = Result<(), Box<dyn Error>>;

/// The record type the fixture was written with (field order and types matter).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Job {
    id: u64,
    name: String,
    tags: Vec<String>,
    payload: Vec<u8>,
    due: Option<u64>,
}

fn job(id: u64, name: &str, tags: &[&str], payload: Vec<u8>, due: Option<u64>) -> Job {
    Job {
        id,
        name: name.to_owned(),
        tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        payload,
        due,
    }
}

fn expected_strings() -> Vec<String> {
    vec![
        "beta".to_owned(),
        String::new(),
        "gamma".to_owned(),
        "ünïcödé ✓ \u{1F980}".to_owned(),
        "x".repeat(200),
        "delta".to_owned(),
    ]
}

fn expected_numbers() -> Vec<u64> {
    vec![1, 127, 128, 16383, 16384, u64::MAX, 300]
}

fn expected_bytes() -> Vec<Vec<u8>> {
    vec![
        Vec::new(),
        (0..300u32).map(|i| (i % 256) as u8).collect(),
        vec![0, 1, 2, 255],
        vec![42; 5],
    ]
}

fn expected_records() -> Vec<Job> {
    vec![
        job(2, "resize image", &[], Vec::new(), None),
        job(3, "reindex", &["search"], vec![0xAB; 200], Some(0)),
        job(
            4,
            "follow up",
            &["mail"],
            b"hello".to_vec(),
            Some(1_700_000_600),
        ),
    ]
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    // Owner-only, as the store keeps its directories: it refuses a directory open to others,
    // and a checkout or `create_dir_all` gives the umask's mode.
    #[cfg(unix)]
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// A fresh copy of the fixture. sled's `blobs` directory is empty, and git does not keep
/// empty directories, so it is created here if the checkout lacks it.
fn fixture_copy() -> Result<tempfile::TempDir, Box<dyn Error>> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-1");
    assert!(
        fixture.join("db").is_file() && fixture.join("conf").is_file(),
        "fixture missing at {}",
        fixture.display()
    );
    let dir = tempfile::tempdir()?;
    let store_dir = dir.path().join("store");
    copy_dir(&fixture, &store_dir)?;
    std::fs::create_dir_all(store_dir.join("blobs"))?;
    Ok(dir)
}

/// Checks that queue `name` holds exactly `expected`, in order: `count`, then every item
/// dequeued in one transaction, then nothing more. The transaction is aborted, so the queue
/// is left as it was (checked).
fn check_contents<T>(store: &Store, name: &str, expected: &[T]) -> TestResult
where
    T: Serialize + DeserializeOwned + Send + Debug + PartialEq + 'static,
{
    let q = store.blocking_queue::<T>(name)?;
    assert_eq!(
        q.blocking_count()?,
        expected.len() as u64,
        "count of {name}"
    );
    let mut tx = store.begin();
    let mut got = Vec::new();
    while let Some(item) = q.blocking_try_dequeue(&mut tx)? {
        got.push(item);
        assert!(
            got.len() <= expected.len(),
            "{name}: more items than expected: {got:?}"
        );
    }
    assert_eq!(got, expected, "contents of {name}");
    assert_eq!(
        q.blocking_count()?,
        0,
        "{name}: all items held by the transaction"
    );
    tx.blocking_abort()?;
    assert_eq!(
        q.blocking_count()?,
        expected.len() as u64,
        "{name}: count after abort"
    );
    Ok(())
}

/// Enqueues `new` at the back of `name` and dequeues its first item, which must be
/// `expected[0]`, each in a committed transaction.
fn enqueue_and_dequeue<T>(store: &Store, name: &str, expected: &[T], new: &T) -> TestResult
where
    T: Serialize + DeserializeOwned + Send + Debug + PartialEq + 'static,
{
    let q = store.blocking_queue::<T>(name)?;
    let mut tx = store.begin();
    q.enqueue(&mut tx, new)?;
    tx.blocking_commit()?;
    assert_eq!(
        q.blocking_count()?,
        expected.len() as u64 + 1,
        "{name}: count after enqueue"
    );

    let mut tx = store.begin();
    assert_eq!(
        q.blocking_try_dequeue(&mut tx)?.as_ref(),
        expected.first(),
        "{name}: front"
    );
    tx.blocking_commit()?;
    assert_eq!(
        q.blocking_count()?,
        expected.len() as u64,
        "{name}: count after dequeue"
    );
    Ok(())
}

/// The expected contents after `enqueue_and_dequeue`: the first item gone, `new` at the back.
fn after<T: Clone>(expected: &[T], new: &T) -> Vec<T> {
    let mut v = expected[1..].to_vec();
    v.push(new.clone());
    v
}

#[test]
fn store_written_by_format_1_opens_with_its_items_and_keeps_working() -> TestResult {
    let dir = fixture_copy()?;
    let path = dir.path().join("store");

    let new_string = "written by the new code".to_owned();
    let new_number = 4_000_000_000u64;
    let new_bytes: Vec<u8> = (0..=255u8).rev().collect();
    let new_record = job(5, "after upgrade", &["new", "code"], vec![9; 17], Some(42));

    // 1. The fixture as written.
    {
        let store = Store::open(&path)?;
        assert!(
            store.set_aside_records().is_empty(),
            "{:?}",
            store.set_aside_records()
        );
        check_contents(&store, "strings", &expected_strings())?;
        check_contents(&store, "numbers", &expected_numbers())?;
        check_contents(&store, "bytes", &expected_bytes())?;
        check_contents(&store, "records", &expected_records())?;
        // Opening and aborting did not change anything.
        check_contents(&store, "strings", &expected_strings())?;

        // 2. New work on top of the old log.
        enqueue_and_dequeue(&store, "strings", &expected_strings(), &new_string)?;
        enqueue_and_dequeue(&store, "numbers", &expected_numbers(), &new_number)?;
        enqueue_and_dequeue(&store, "bytes", &expected_bytes(), &new_bytes)?;
        enqueue_and_dequeue(&store, "records", &expected_records(), &new_record)?;
        store.blocking_close()?;
    }

    // 3. Reopened: old and new items, the dequeued ones gone.
    {
        let store = Store::open(&path)?;
        assert!(
            store.set_aside_records().is_empty(),
            "{:?}",
            store.set_aside_records()
        );
        check_contents(&store, "strings", &after(&expected_strings(), &new_string))?;
        check_contents(&store, "numbers", &after(&expected_numbers(), &new_number))?;
        check_contents(&store, "bytes", &after(&expected_bytes(), &new_bytes))?;
        check_contents(&store, "records", &after(&expected_records(), &new_record))?;
        store.blocking_close()?;
    }

    // 4. Once more: the checks above aborted everything they dequeued.
    {
        let store = Store::open(&path)?;
        assert!(store.set_aside_records().is_empty());
        check_contents(&store, "numbers", &after(&expected_numbers(), &new_number))?;
        check_contents(&store, "records", &after(&expected_records(), &new_record))?;
        store.blocking_close()?;
    }

    // 5. The processing layer on the old items: written before commit times were kept, they
    //    report no enqueue time; leased, failed into the dead letters and replayed, they
    //    come back after a restart as any new item would.
    {
        let store = Store::open(&path)?;
        let numbers = store.blocking_queue::<u64>("numbers")?;
        let old = numbers.blocking_browse(None, 1)?;
        assert_eq!(
            old[0].enqueued_at, None,
            "a format 1 record has no commit time"
        );
        numbers
            .blocking_set_retry_policy(reliable_queue::RetryPolicy::default().max_attempts(1))?;
        let lease = numbers.blocking_lease(std::time::Duration::from_secs(60))?;
        let first = *lease.item();
        assert!(after(&expected_numbers(), &new_number).contains(&first));
        assert_eq!(
            lease.blocking_fail("old item")?,
            reliable_queue::Failed::Dead
        );
        store.blocking_close()?;
        let store = Store::open(&path)?;
        let numbers = store.blocking_queue::<u64>("numbers")?;
        let dead = numbers.blocking_dead_letters(None, 10)?;
        assert_eq!((dead.len(), dead[0].item, dead[0].attempts), (1, first, 1));
        assert_eq!(
            numbers.blocking_replay(reliable_queue::Replay::All, true)?,
            1
        );
        store.blocking_close()?;
        let store = Store::open(&path)?;
        let numbers = store.blocking_queue::<u64>("numbers")?;
        let mut all = check_all(&store, &numbers)?;
        all.sort_unstable();
        let mut expected = after(&expected_numbers(), &new_number);
        expected.sort_unstable();
        assert_eq!(
            all, expected,
            "every number once, the replayed one included"
        );
        store.blocking_close()?;
    }
    Ok(())
}

/// Every item of `queue`, looked at without consuming (dequeue, then abort).
fn check_all(
    store: &Store,
    queue: &reliable_queue::ReliableConcurrentQueue<u64>,
) -> Result<Vec<u64>, Box<dyn Error>> {
    let mut tx = store.begin();
    let mut out = Vec::new();
    while let Some(item) = queue.blocking_try_dequeue(&mut tx)? {
        out.push(item);
    }
    tx.blocking_abort()?;
    Ok(out)
}
