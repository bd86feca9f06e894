//! A log that comes back shorter, or with a hole, is reported, never opened as if nothing
//! happened: the store's marks (kept outside sled) say which records must be there.
//!
//! Each test builds a store, closes it, damages its files the way disks, backups and people
//! do, and checks what the next open says: `Error::MissingRecords` naming the missing ranges
//! and the queues they may have touched; with `Builder::salvage(true)` an open that fences
//! those queues and reports the ranges; and that healthy stores, restarts and compaction never
//! see a false report.

use std::path::{Path, PathBuf};

use reliable_queue::{Error, Store};

use crate::common;

use common::{drain, peek_all};

/// A temporary directory and a path for a store in it.
fn temp_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("store");
    (dir, path)
}

fn enqueue_all(store: &Store, queue: &str, items: impl IntoIterator<Item = u32>) {
    let q = store.blocking_queue::<u32>(queue).expect("queue");
    let mut tx = store.begin();
    for item in items {
        q.enqueue(&mut tx, item).expect("enqueue");
    }
    tx.blocking_commit().expect("commit");
}

fn dequeue_n(store: &Store, queue: &str, n: usize) -> Vec<u32> {
    let q = store.blocking_queue::<u32>(queue).expect("queue");
    let mut tx = store.begin();
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(
            q.blocking_try_dequeue(&mut tx)
                .expect("dequeue")
                .expect("an item"),
        );
    }
    tx.blocking_commit().expect("commit");
    got
}

fn contents(store: &Store, queue: &str) -> Vec<u32> {
    let q = store.blocking_queue::<u32>(queue).expect("queue");
    peek_all(store, &q)
}

/// Copies the store directory `from` to `to` (files only, one level of subdirectories, as a
/// store has), keeping it owner-only.
fn copy_store(from: &Path, to: &Path) {
    copy_dir(from, to);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

fn missing_records(
    result: reliable_queue::Result<Store>,
) -> (Vec<std::ops::RangeInclusive<u64>>, Vec<String>) {
    match result {
        Err(Error::MissingRecords {
            missing, queues, ..
        }) => (missing, queues),
        Err(other) => panic!("expected MissingRecords, got {other}"),
        Ok(store) => panic!(
            "expected MissingRecords, the store opened with queues {:?}",
            store.queue_names()
        ),
    }
}

/// The store the backup tests start from: queue "jobs" with 0..20 and "other" with 100..105,
/// closed.
fn first_state(path: &Path) {
    let store = Store::open(path).expect("open");
    enqueue_all(&store, "jobs", 0..20);
    enqueue_all(&store, "other", 100..105);
    store.blocking_close().expect("close");
}

/// An older copy of the store's log put back under a newer mark (a backup restored over part
/// of the store, or a disk that lost recent writes): the records written since are missing,
/// the error names them and the queues, the refusal is repeatable, and a salvaging open fences the
/// queues, reports the ranges and becomes the new starting point.
#[test]
fn an_older_log_under_a_newer_mark_is_refused_then_salvaged() {
    let (_dir, path) = temp_store();
    first_state(&path);
    let backup = path.with_file_name("backup");
    copy_store(&path, &backup);

    let store = Store::open(&path).expect("reopen");
    assert_eq!(dequeue_n(&store, "jobs", 10), (0..10).collect::<Vec<_>>());
    enqueue_all(&store, "later", [7]);
    store.blocking_close().expect("close");

    // Put back the older log, keep the newer mark.
    let marks = std::fs::read(path.join("marks")).expect("marks");
    std::fs::remove_dir_all(&path).expect("remove");
    copy_store(&backup, &path);
    std::fs::write(path.join("marks"), &marks).expect("write marks");

    let (missing, queues) = missing_records(Store::open(&path));
    assert!(!missing.is_empty());
    // The dequeue of "jobs" is lost: "jobs" cannot be trusted. "other" was created before
    // the missing records too, so they may have touched it; "later" is unknown to the old
    // catalog but the mark names it.
    assert!(queues.contains(&"jobs".to_owned()), "{queues:?}");
    // Refusing changed nothing: the same answer again.
    assert_eq!(missing_records(Store::open(&path)).0, missing);

    let store = Store::builder()
        .path(&path)
        .salvage(true)
        .open()
        .expect("salvage");
    assert_eq!(store.missing_records(), missing);
    match store.blocking_queue::<u32>("jobs") {
        Err(Error::Fenced { queue, reason, .. }) => {
            assert_eq!(queue, "jobs");
            assert!(reason.contains("missing"), "{reason}");
        }
        other => panic!("expected jobs fenced, got {other:?}"),
    }
    store.blocking_close().expect("close");

    // The next open opens plainly; the queue is still fenced; the ranges are still reported.
    let store = Store::open(&path).expect("plain open after salvage");
    assert_eq!(store.missing_records(), missing);
    assert!(matches!(
        store.blocking_queue::<u32>("jobs"),
        Err(Error::Fenced { .. })
    ));
    // Accepting the damage: the items as the older log has them.
    store.blocking_unfence("jobs").expect("unfence");
    assert_eq!(contents(&store, "jobs"), (0..20).collect::<Vec<_>>());
    store.blocking_close().expect("close");
}

/// The minimal case: 20 items committed, 10 of them consumed, then one bit flipped
/// near the end of sled's data file. The store must not come back with all 20 items.
#[test]
fn a_bit_flip_near_the_end_of_the_data_file_never_brings_consumed_items_back() {
    for back in [8u64, 16, 64, 200] {
        let (_dir, path) = temp_store();
        let store = Store::open(&path).expect("open");
        enqueue_all(&store, "jobs", 0..20);
        dequeue_n(&store, "jobs", 10);
        store.blocking_close().expect("close");

        let db = path.join("db");
        let mut bytes = std::fs::read(&db).expect("read db");
        let len = u64::try_from(bytes.len()).expect("len");
        let Some(at) = len.checked_sub(back) else {
            continue;
        };
        let at = usize::try_from(at).expect("offset");
        bytes[at] ^= 0x10;
        std::fs::write(&db, &bytes).expect("write db");

        let opened = Store::open(&path);
        eprintln!(
            "flip {back} bytes before the end: {:?}",
            opened.as_ref().map(|_| "opened").map_err(|e| e.to_string())
        );
        match opened {
            Ok(store) => {
                let fenced = matches!(
                    store.blocking_queue::<u32>("jobs"),
                    Err(Error::Fenced { .. })
                );
                if !fenced {
                    assert_eq!(
                        contents(&store, "jobs"),
                        (10..20).collect::<Vec<_>>(),
                        "bit flipped {back} bytes before the end: the queue must be exact or fenced"
                    );
                }
            }
            Err(Error::MissingRecords { queues, .. }) => {
                assert_eq!(queues, ["jobs"]);
            }
            Err(other) => {
                // Any other typed error is a report too; it must say what and where.
                assert!(!other.to_string().is_empty());
            }
        }
    }
}

/// sled's data file deleted (or emptied): the whole log is missing, every queue named.
#[test]
fn a_deleted_data_file_is_reported_with_every_queue() {
    for how in ["delete", "truncate"] {
        let (_dir, path) = temp_store();
        first_state(&path);
        let db = path.join("db");
        match how {
            "delete" => std::fs::remove_file(&db).expect("remove"),
            _ => std::fs::File::create(&db).map(drop).expect("truncate"),
        }
        match Store::open(&path) {
            Err(Error::MissingRecords { mut queues, .. }) => {
                queues.sort();
                assert_eq!(queues, ["jobs", "other"], "{how}");
            }
            Err(Error::Damaged { .. }) => {}
            Err(other) => panic!("{how}: expected MissingRecords or Damaged, got {other}"),
            Ok(_) => panic!("{how}: a store whose data file is gone opened"),
        }
        // Salvaging opens what can be trusted: nothing; both queues fenced, known by name
        // from the mark even though sled's catalog is gone.
        if let Ok(store) = Store::builder().path(&path).salvage(true).open() {
            assert!(!store.missing_records().is_empty(), "{how}");
            for queue in ["jobs", "other"] {
                assert!(
                    matches!(
                        store.blocking_queue::<u32>(queue),
                        Err(Error::Fenced { .. })
                    ),
                    "{how}: {queue} must be fenced"
                );
            }
        }
    }
}

/// The marks file deleted, or both of its copies damaged: the log cannot be checked, which
/// is reported; salvaging takes the log as it is and writes a new mark.
#[test]
fn a_lost_mark_is_reported() {
    for how in ["delete", "zero", "truncate"] {
        let (_dir, path) = temp_store();
        first_state(&path);
        let marks = path.join("marks");
        match how {
            "delete" => std::fs::remove_file(&marks).expect("remove"),
            "zero" => {
                let len = std::fs::metadata(&marks).expect("meta").len();
                let len = usize::try_from(len).expect("len");
                std::fs::write(&marks, vec![0u8; len]).expect("zero");
            }
            _ => std::fs::write(&marks, b"RQ").expect("truncate"),
        }
        match Store::open(&path) {
            Err(Error::Damaged {
                path: damaged,
                detail,
            }) => {
                assert_eq!(
                    damaged.file_name().and_then(|n| n.to_str()),
                    Some("marks"),
                    "{how}"
                );
                assert!(!detail.is_empty());
            }
            other => panic!("{how}: expected Damaged, got {other:?}"),
        }
        let store = Store::builder()
            .path(&path)
            .salvage(true)
            .open()
            .expect("salvage");
        assert_eq!(contents(&store, "jobs"), (0..20).collect::<Vec<_>>());
        store.blocking_close().expect("close");
        let store = Store::open(&path).expect("plain open after salvage");
        assert_eq!(contents(&store, "other"), (100..105).collect::<Vec<_>>());
    }
}

/// One copy of the mark damaged (what a write cut short leaves): the other copy is used, and
/// the store opens as it was.
#[test]
fn one_damaged_copy_of_the_mark_is_survived() {
    for slot in 0..2u64 {
        let (_dir, path) = temp_store();
        first_state(&path);
        let marks = path.join("marks");
        let mut bytes = std::fs::read(&marks).expect("marks");
        let half = bytes.len() / 2;
        let at = usize::try_from(slot).expect("slot") * half + 30;
        bytes[at] ^= 0xff;
        std::fs::write(&marks, &bytes).expect("write");
        let store = Store::open(&path).expect("open with one good copy");
        assert_eq!(contents(&store, "jobs"), (0..20).collect::<Vec<_>>());
        assert!(store.missing_records().is_empty());
    }
}

/// Many restarts with compaction deleting and rewriting records: never a false report, and
/// every restart sees exactly what was committed.
#[test]
fn restarts_and_compaction_never_report_records_missing() {
    let (_dir, path) = temp_store();
    let mut expected: Vec<u32> = Vec::new();
    let mut next = 0u32;
    for round in 0..12u32 {
        let store = Store::builder()
            .path(&path)
            .compaction_floor(1)
            .open()
            .expect("open");
        assert!(store.missing_records().is_empty());
        assert_eq!(contents(&store, "jobs"), expected, "round {round}");
        for _ in 0..30 {
            enqueue_all(&store, "jobs", next..next + 3);
            expected.extend(next..next + 3);
            next += 3;
            let n = if expected.len() > 4 { 2 } else { 0 };
            let got = dequeue_n(&store, "jobs", n);
            assert_eq!(got, expected.drain(..n).collect::<Vec<_>>());
        }
        if round % 3 == 0 {
            store.blocking_flush().expect("flush");
            drop(store);
        } else {
            store.blocking_close().expect("close");
        }
    }
    let store = Store::open(&path).expect("open");
    let q = store.blocking_queue::<u32>("jobs").expect("queue");
    assert_eq!(drain(&store, &q), expected);
}
