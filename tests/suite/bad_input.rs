//! Bad input never panics and never loses data: items that cannot be serialized or are too
//! large, items that are not a `T`, invalid settings, and damaged log records on disk.
//!
//! The cases about items and settings run on every engine of the conformance suite
//! (`tests/common/engines.rs`); the damaged records are sled's, checked once.

use crate::common;
use crate::{engine_case, once_case};

use std::path::Path;

use common::engines::Engine;
use common::{drain, peek_all, temp_dir};
use reliable_queue::{Error, SetAsideRecord, Store};
use serde::ser::{Error as _, Serializer};
use serde::{Deserialize, Deserializer, Serialize};

/// An item whose serialization fails when its value is `u32::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Picky(u32);

impl Serialize for Picky {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 == u32::MAX {
            return Err(S::Error::custom("this value refuses to be serialized"));
        }
        serializer.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for Picky {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u32::deserialize(deserializer).map(Picky)
    }
}

/// Runs `case` against a fresh store of `engine`.
fn on(engine: &'static Engine, case: impl Fn(&Store)) {
    case(&engine.store());
}

fn unserialisable_item_is_rejected_and_the_transaction_is_unchanged(engine: &'static Engine) {
    on(engine, |store| {
        let queue = store.blocking_queue::<Picky>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, Picky(1)).unwrap();
        match queue.enqueue(&mut tx, Picky(u32::MAX)) {
            Err(Error::Serialize { queue: name, .. }) => assert_eq!(name, "q"),
            other => panic!("expected Serialize, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 1);
        queue.enqueue(&mut tx, Picky(2)).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(drain(store, &queue), [Picky(1), Picky(2)]);
    });
}

fn item_failing_halfway_through_serialization_leaves_nothing_behind(engine: &'static Engine) {
    on(engine, |store| {
        // The failing element comes after two good ones: part of the item was already written.
        let queue = store.blocking_queue::<Vec<Picky>>("q").unwrap();
        let mut tx = store.begin();
        let err = queue
            .enqueue(&mut tx, vec![Picky(1), Picky(2), Picky(u32::MAX), Picky(3)])
            .unwrap_err();
        assert!(matches!(err, Error::Serialize { .. }), "{err:?}");
        assert!(
            std::error::Error::source(&err).is_some(),
            "the serializer's error is chained"
        );
        assert_eq!(tx.enqueued(), 0);
        queue.enqueue(&mut tx, vec![Picky(7)]).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(drain(store, &queue), [vec![Picky(7)]]);
    });
}

fn oversized_item_is_rejected_and_the_transaction_keeps_the_rest(engine: &'static Engine) {
    {
        let at = engine.store_with(|b| b.max_item_size(64));
        let store = &at.store;
        let queue = store.blocking_queue::<Vec<u8>>("q").unwrap();
        let mut held = store.begin();
        let mut setup = store.begin();
        queue.enqueue(&mut setup, vec![1; 10]).unwrap();
        setup.blocking_commit().unwrap();
        assert_eq!(
            queue.blocking_try_dequeue(&mut held).unwrap(),
            Some(vec![1; 10])
        );

        queue.enqueue(&mut held, vec![2; 40]).unwrap();
        match queue.enqueue(&mut held, vec![3; 100]) {
            Err(Error::ItemTooLarge {
                queue: name,
                size,
                limit,
            }) => {
                assert_eq!((name.as_str(), limit), ("q", 64));
                assert!(size > 100, "size {size} is the encoded item's");
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        assert_eq!((held.enqueued(), held.dequeued()), (1, 1), "nothing lost");
        held.blocking_commit().unwrap();
        assert_eq!(drain(store, &queue), [vec![2; 40]]);
    }
}

fn item_over_the_default_limit_is_rejected(engine: &'static Engine) {
    let at = engine.store();
    let store = &at.store;
    let queue = store.blocking_queue::<Vec<u8>>("big").unwrap();
    let mut tx = store.begin();
    let err = queue.enqueue(&mut tx, vec![0; 5 << 20]).unwrap_err();
    assert!(matches!(err, Error::ItemTooLarge { .. }), "{err:?}");
    queue.enqueue(&mut tx, vec![0; 1 << 20]).unwrap();
    tx.blocking_commit().unwrap();
    assert_eq!(queue.blocking_count().unwrap(), 1);
}

fn transaction_over_its_size_limit_is_rejected_item_by_item(engine: &'static Engine) {
    on_limits(engine, |store| {
        let queue = store.blocking_queue::<Vec<u8>>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, vec![1; 90]).unwrap();
        queue.enqueue(&mut tx, vec![2; 90]).unwrap();
        match queue.enqueue(&mut tx, vec![3; 90]) {
            Err(Error::TransactionTooLarge { size, limit }) => {
                assert_eq!(limit, 400);
                assert!(size > limit);
            }
            other => panic!("expected TransactionTooLarge, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 2);
        // The rejected item was not counted: a small one still fits.
        queue.enqueue(&mut tx, vec![4; 10]).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(
            drain(store, &queue),
            [vec![1; 90], vec![2; 90], vec![4; 10]]
        );
        // The limit is per transaction.
        let mut tx = store.begin();
        queue.enqueue(&mut tx, vec![5; 90]).unwrap();
        queue.enqueue(&mut tx, vec![6; 90]).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(queue.blocking_count().unwrap(), 2);
    });
}

fn on_limits(engine: &'static Engine, case: impl Fn(&Store)) {
    // Two items of 92 encoded bytes fit (each counts its bookkeeping too, about 50 bytes),
    // a third does not, and a 12-byte one does.
    case(&engine.store_with(|b| b.max_item_size(100).max_transaction_size(400)));
}

fn item_that_is_not_a_t_gives_deserialize_and_stays_held(engine: &'static Engine) {
    on(engine, |store| {
        let as_bytes = store.blocking_queue::<Vec<u8>>("mixed").unwrap();
        let mut tx = store.begin();
        as_bytes.enqueue(&mut tx, vec![0xff; 20]).unwrap();
        tx.blocking_commit().unwrap();

        // The same queue opened with another type.
        let as_number = store.blocking_queue::<u64>("mixed").unwrap();
        let mut tx = store.begin();
        match as_number.blocking_try_dequeue(&mut tx) {
            Err(Error::Deserialize { queue, .. }) => assert_eq!(queue, "mixed"),
            other => panic!("expected Deserialize, got {other:?}"),
        }
        assert_eq!(tx.dequeued(), 1, "the item is held by the transaction");
        assert_eq!(as_number.blocking_count().unwrap(), 0);
        tx.blocking_abort().expect("abort");
        assert_eq!(as_number.blocking_count().unwrap(), 1, "abort put it back");
        assert_eq!(drain(store, &as_bytes), [vec![0xff; 20]]);
    });
}

fn undecodable_item_can_be_discarded_by_commit(engine: &'static Engine) {
    on(engine, |store| {
        let as_text = store.blocking_queue::<String>("mixed").unwrap();
        let mut tx = store.begin();
        as_text.enqueue(&mut tx, "not a number".to_owned()).unwrap();
        as_text.enqueue(&mut tx, "next".to_owned()).unwrap();
        tx.blocking_commit().unwrap();

        let as_pair = store.blocking_queue::<(u8, u8)>("mixed").unwrap();
        let mut tx = store.begin();
        assert!(matches!(
            as_pair.blocking_try_dequeue(&mut tx),
            Err(Error::Deserialize { .. })
        ));
        tx.blocking_commit().unwrap();
        assert_eq!(drain(store, &as_text), ["next"]);
    });
}

fn invalid_builder_settings_are_rejected(engine: &'static Engine) {
    use std::time::Duration;
    let (builder, _place) = engine.fresh_builder();
    // Each case names the builder method whose setting is refused.
    let cases = [
        (
            "zero item size",
            "max_item_size",
            builder.clone().max_item_size(0),
        ),
        (
            "item size over 1 GiB",
            "max_item_size",
            builder.clone().max_item_size(2 << 30),
        ),
        (
            "transaction smaller than an item",
            "max_transaction_size",
            builder
                .clone()
                .max_item_size(1000)
                .max_transaction_size(999),
        ),
        (
            "zero group size",
            "group_size",
            builder.clone().group_size(0),
        ),
        (
            "zero flush interval",
            "flush_interval",
            builder.clone().flush_interval(Duration::ZERO),
        ),
        (
            "flush interval over an hour",
            "flush_interval",
            builder.clone().flush_interval(Duration::from_secs(7200)),
        ),
        (
            "tiny cache",
            "cache_capacity",
            builder.clone().cache_capacity(1024),
        ),
    ];
    for (what, refused, builder) in cases {
        match builder.open() {
            Err(Error::InvalidConfig { setting, expected }) => {
                assert_eq!(setting, refused, "{what}");
                assert!(!expected.is_empty(), "{what}");
            }
            other => panic!("{what}: expected InvalidConfig, got {other:?}"),
        }
    }
    // The place of the refused opens (a directory, a schema) is still free.
    builder.open().unwrap();
}

fn bad_queue_names_are_rejected(engine: &'static Engine) {
    on(engine, |store| {
        for (bad, reported) in [
            (String::new(), String::new()),
            ("x".repeat(1025), "x".repeat(64)),
        ] {
            match store.blocking_queue::<u8>(&bad) {
                Err(Error::InvalidQueueName { name, expected }) => {
                    assert_eq!(name, reported, "the name, cut to its first 64 characters");
                    assert!(!expected.is_empty());
                }
                other => panic!(
                    "name of {} bytes: expected InvalidQueueName, got {other:?}",
                    bad.len()
                ),
            }
        }
        store.blocking_queue::<u8>(&"x".repeat(1024)).unwrap();
        assert_eq!(store.queue_names(), ["x".repeat(1024)]);
    });
}

/// PostgreSQL's settings (`postgres_*`) without a PostgreSQL URL are refused at open, whatever
/// else names the store: nothing connects to a server the settings do not name (before, the
/// store went to PostgreSQL with an empty URL, a Redis URL beside it ignored).
#[cfg(feature = "postgres")]
fn postgres_settings_without_a_postgres_url_are_refused() {
    let refused = |what: &str, builder: reliable_queue::Builder| match builder.open() {
        Err(Error::InvalidConfig {
            setting: "url",
            expected,
        }) => assert!(!expected.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidConfig for url, got {other:?}"),
    };
    refused("no URL", Store::builder().postgres_pool_size(4));
    let (_guard, path) = temp_dir();
    refused(
        "a path",
        Store::builder().path(&path).postgres_schema("elsewhere"),
    );
    #[cfg(feature = "redis")]
    {
        let redis = || Store::builder().url("redis://127.0.0.1:1");
        refused(
            "a Redis URL",
            redis().postgres_poll_interval(std::time::Duration::from_secs(5)),
        );
        refused(
            "a Redis URL and a PostgreSQL one",
            redis().postgres("postgres://rq@127.0.0.1:1/postgres"),
        );
    }
}

/// A queue whose name has a NUL character, made on sled before such names were refused (no
/// engine makes one now: PostgreSQL's text cannot hold it), still opens, so that its items
/// can be drained or moved; a new queue with such a name is refused.
fn a_queue_made_with_a_nul_in_its_name_before_the_rule_still_opens() {
    let (_guard, path) = temp_dir();
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<u32>("legacy").unwrap();
    let mut tx = store.begin();
    q.enqueue(&mut tx, 1).unwrap();
    q.enqueue(&mut tx, 2).unwrap();
    tx.blocking_commit().unwrap();
    drop(q);
    store.blocking_close().unwrap();
    {
        // What an earlier version wrote for a queue named "leg\0acy": its catalog entry.
        let db = common::open_raw_sled(&path);
        let meta = db.open_tree("meta").unwrap();
        let id = meta
            .remove(b"queue/legacy")
            .unwrap()
            .expect("the catalog entry");
        meta.insert(&b"queue/leg\0acy"[..], id).unwrap();
        db.flush().unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.queue_names(), ["leg\0acy"]);
    let q = store.blocking_queue::<u32>("leg\0acy").unwrap();
    assert_eq!(drain(&store, &q), [1, 2]);
    assert!(matches!(
        store.blocking_queue::<u32>("new\0"),
        Err(Error::InvalidQueueName { .. })
    ));
}

// ---- damaged records on disk ----

/// Offset of a record's fixed header, its header length field and its body (see the format
/// at the top of `src/engine/sled/record.rs`).
const FIXED: usize = 24;

fn body_start(record: &[u8]) -> usize {
    let header_len = u32::from_le_bytes(record[8..12].try_into().unwrap()) as usize;
    FIXED + header_len
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Opens the closed store's sled database directly.
fn raw(path: &Path) -> (sled::Db, sled::Tree) {
    let db = common::open_raw_sled(path);
    let log = db.open_tree("log").unwrap();
    (db, log)
}

/// The one log record whose bytes contain `marker`: its sequence number and bytes.
fn record_with(log: &sled::Tree, marker: &[u8]) -> (u64, Vec<u8>) {
    let mut found: Vec<(u64, Vec<u8>)> = log
        .iter()
        .map(|kv| kv.unwrap())
        .filter(|(_, v)| contains(v, marker))
        .map(|(k, v)| {
            (
                u64::from_be_bytes(k.as_ref().try_into().unwrap()),
                v.to_vec(),
            )
        })
        .collect();
    assert_eq!(found.len(), 1, "exactly one record holds the marker");
    found.pop().unwrap()
}

/// Rewrites the record holding `marker` with `damage` applied; returns its sequence number
/// and damaged bytes.
fn damage_record(path: &Path, marker: &[u8], damage: impl FnOnce(&mut Vec<u8>)) -> (u64, Vec<u8>) {
    let (db, log) = raw(path);
    let (seq, mut bytes) = record_with(&log, marker);
    damage(&mut bytes);
    log.insert(seq.to_be_bytes(), bytes.clone()).unwrap();
    db.flush().unwrap();
    (seq, bytes)
}

fn strings(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// Writes, in separate commits: intact "bad" items, "good" items, the "bad" items whose
/// record will be damaged, more "good" items. Returns (good items, intact bad items).
fn write_good_and_bad(path: &Path) -> (Vec<String>, Vec<String>) {
    let store = Store::open(path).unwrap();
    let good = store.blocking_queue::<String>("good").unwrap();
    let bad = store.blocking_queue::<String>("bad").unwrap();
    let commit = |queue: &reliable_queue::ReliableConcurrentQueue<String>, items: &[String]| {
        let mut tx = store.begin();
        for item in items {
            queue.enqueue(&mut tx, item.clone()).unwrap();
        }
        tx.blocking_commit().unwrap();
    };
    let kept = strings("bad-kept", 5);
    let good_items = strings("good", 20);
    commit(&bad, &kept);
    commit(&good, &good_items[..10]);
    commit(&bad, &strings("bad-damaged", 5));
    commit(&good, &good_items[10..]);
    (good_items, kept)
}

fn assert_fenced(store: &Store, name: &str, seq: u64) {
    match store.blocking_queue::<String>(name) {
        Err(Error::Fenced {
            queue,
            record,
            reason,
        }) => {
            assert_eq!(queue, name);
            assert_eq!(record, seq);
            assert!(!reason.is_empty());
        }
        other => panic!("queue {name}: expected Fenced, got {other:?}"),
    }
}

/// Everything in any queue of the store, opened as strings: nothing damaged may show up.
fn assert_nothing_damaged_is_returned(items: &[String]) {
    assert!(
        items.iter().all(|i| !i.starts_with("bad-damaged")),
        "an item of the damaged record came back: {items:?}"
    );
}

fn damaged_record_body_fences_its_queue_only() {
    let (_guard, path) = temp_dir();
    let (good_items, kept) = write_good_and_bad(&path);
    let (seq, damaged) = damage_record(&path, b"bad-damaged-002", |bytes| {
        let at = body_start(bytes) + 7;
        bytes[at] ^= 0x5a;
    });

    {
        let store = Store::open(&path).expect("open succeeds despite the damage");
        let set_aside: Vec<SetAsideRecord> = store.set_aside_records();
        assert_eq!(set_aside.len(), 1, "{set_aside:?}");
        assert_eq!(set_aside[0].record, seq);
        assert_eq!(set_aside[0].queues, Some(vec!["bad".to_owned()]));
        assert!(!set_aside[0].reason.is_empty());

        assert_fenced(&store, "bad", seq);
        let good = store.blocking_queue::<String>("good").unwrap();
        assert_eq!(peek_all(&store, &good), good_items);
        // New work on the healthy queue goes on.
        let mut tx = store.begin();
        good.enqueue(&mut tx, "after".to_owned()).unwrap();
        tx.blocking_commit().unwrap();
    }

    // The raw record is kept in quarantine and gone from the log; the fence persists.
    {
        let (db, log) = raw(&path);
        let quarantine = db.open_tree("quarantine").unwrap();
        let kept_raw = quarantine
            .get(seq.to_be_bytes())
            .unwrap()
            .expect("quarantined");
        assert_eq!(kept_raw.as_ref(), damaged.as_slice());
        assert!(log.get(seq.to_be_bytes()).unwrap().is_none());
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.set_aside_records().len(), 1);
    assert_fenced(&store, "bad", seq);

    store.blocking_unfence("bad").unwrap();
    let bad = store.blocking_queue::<String>("bad").expect("unfenced");
    let bad_items = drain(&store, &bad);
    assert_eq!(bad_items, kept, "the intact items of the fenced queue");
    assert_nothing_damaged_is_returned(&bad_items);
    let good = store.blocking_queue::<String>("good").unwrap();
    let mut expected = good_items.clone();
    expected.push("after".into());
    assert_eq!(drain(&store, &good), expected);
    drop((bad, good, store));

    // Unfencing is durable; the record stays listed as set aside.
    let store = Store::open(&path).unwrap();
    assert!(store.blocking_queue::<String>("bad").is_ok());
    assert_eq!(store.set_aside_records()[0].record, seq);
}

fn damaged_record_header_fences_every_queue() {
    // Each byte range of the fixed header: lengths, body checksum, header checksum.
    for at in [9, 13, 17, 22] {
        let (_guard, path) = temp_dir();
        let (good_items, kept) = write_good_and_bad(&path);
        let (seq, _) = damage_record(&path, b"bad-damaged-002", |bytes| bytes[at] ^= 0x01);

        let store = Store::open(&path).expect("open succeeds despite the damage");
        let set_aside = store.set_aside_records();
        assert_eq!(set_aside.len(), 1, "byte {at}: {set_aside:?}");
        assert_eq!(set_aside[0].record, seq);
        assert_eq!(
            set_aside[0].queues, None,
            "byte {at}: the header is unreadable"
        );
        assert_fenced(&store, "good", seq);
        assert_fenced(&store, "bad", seq);

        store.blocking_unfence("good").unwrap();
        store.blocking_unfence("bad").unwrap();
        let good = drain(&store, &store.blocking_queue::<String>("good").unwrap());
        let bad = drain(&store, &store.blocking_queue::<String>("bad").unwrap());
        assert_eq!(good, good_items, "byte {at}");
        assert_eq!(bad, kept, "byte {at}");
        assert_nothing_damaged_is_returned(&bad);
    }
}

fn truncated_record_is_set_aside() {
    for keep in [0, 10, FIXED, 40] {
        let (_guard, path) = temp_dir();
        let (good_items, kept) = write_good_and_bad(&path);
        let (seq, _) = damage_record(&path, b"bad-damaged-002", |bytes| {
            let len = if keep == 40 { bytes.len() - 3 } else { keep };
            bytes.truncate(len);
        });

        let store = Store::open(&path).expect("open succeeds despite the damage");
        let set_aside = store.set_aside_records();
        assert_eq!(set_aside.len(), 1, "kept {keep}: {set_aside:?}");
        assert_eq!(set_aside[0].record, seq);
        assert_fenced(&store, "good", seq);
        assert_fenced(&store, "bad", seq);
        store.blocking_unfence("good").unwrap();
        store.blocking_unfence("bad").unwrap();
        assert_eq!(
            drain(&store, &store.blocking_queue::<String>("good").unwrap()),
            good_items
        );
        let bad = drain(&store, &store.blocking_queue::<String>("bad").unwrap());
        assert_eq!(bad, kept);
        assert_nothing_damaged_is_returned(&bad);
    }
}

fn damaged_acknowledgement_brings_the_dequeued_item_back_after_unfence() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<String>("q").unwrap();
        let mut tx = store.begin();
        for item in strings("item", 3) {
            queue.enqueue(&mut tx, item).unwrap();
        }
        tx.blocking_commit().unwrap();
        // A commit made of one acknowledgement only.
        let mut tx = store.begin();
        assert_eq!(
            queue.blocking_try_dequeue(&mut tx).unwrap().as_deref(),
            Some("item-000")
        );
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, "later".to_owned()).unwrap();
        tx.blocking_commit().unwrap();
    }
    let ack_seq = {
        let (db, log) = raw(&path);
        // The record without any item bytes is the acknowledgement.
        let (seq, mut bytes) = log
            .iter()
            .map(|kv| kv.unwrap())
            .map(|(k, v)| {
                (
                    u64::from_be_bytes(k.as_ref().try_into().unwrap()),
                    v.to_vec(),
                )
            })
            .find(|(_, v)| !contains(v, b"item-") && !contains(v, b"later"))
            .expect("the acknowledgement record");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        log.insert(seq.to_be_bytes(), bytes).unwrap();
        db.flush().unwrap();
        seq
    };
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.set_aside_records()[0].queues,
        Some(vec!["q".to_owned()])
    );
    assert_fenced(&store, "q", ack_seq);
    store.blocking_unfence("q").unwrap();
    let queue = store.blocking_queue::<String>("q").unwrap();
    assert_eq!(
        drain(&store, &queue),
        ["item-000", "item-001", "item-002", "later"],
        "the lost acknowledgement gives the item back, documented by unfence"
    );
}

fn a_healthy_store_sets_nothing_aside() {
    let (_guard, path) = temp_dir();
    let (good_items, _) = write_good_and_bad(&path);
    let store = Store::open(&path).unwrap();
    assert!(store.set_aside_records().is_empty());
    assert_eq!(
        drain(&store, &store.blocking_queue::<String>("good").unwrap()),
        good_items
    );
}

fn damaged_newest_record_does_not_disturb_later_commits() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<String>("q").unwrap();
        for batch in ["first", "newest"] {
            let mut tx = store.begin();
            for item in strings(batch, 3) {
                queue.enqueue(&mut tx, item).unwrap();
            }
            tx.blocking_commit().unwrap();
        }
    }
    let (seq, _) = damage_record(&path, b"newest-001", |bytes| {
        let at = body_start(bytes) + 3;
        bytes[at] ^= 0x10;
    });
    {
        let store = Store::open(&path).unwrap();
        assert_fenced(&store, "q", seq);
        store.blocking_unfence("q").unwrap();
        let queue = store.blocking_queue::<String>("q").unwrap();
        assert_eq!(peek_all(&store, &queue), strings("first", 3));
        // New commits after the set-aside record: an enqueue, and a dequeue of an old item.
        let mut tx = store.begin();
        queue.enqueue(&mut tx, "fresh".to_owned()).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        assert_eq!(
            queue.blocking_try_dequeue(&mut tx).unwrap().as_deref(),
            Some("first-000")
        );
        tx.blocking_commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    let set_aside = store.set_aside_records();
    assert_eq!(set_aside.len(), 1);
    assert_eq!(set_aside[0].record, seq);
    let queue = store
        .blocking_queue::<String>("q")
        .expect("the fence stays lifted");
    assert_eq!(
        drain(&store, &queue),
        ["first-001", "first-002", "fresh"],
        "the new commits replay; the set-aside record stays out"
    );
}

fn damaged_move_between_queues_is_undone_as_a_whole() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let from = store.blocking_queue::<String>("from").unwrap();
        let to = store.blocking_queue::<String>("to").unwrap();
        let mut tx = store.begin();
        for item in strings("job", 3) {
            from.enqueue(&mut tx, item).unwrap();
        }
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        let job = from.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        to.enqueue(&mut tx, format!("moved {job}")).unwrap();
        tx.blocking_commit().unwrap();
    }
    let (seq, _) = damage_record(&path, b"moved job-000", |bytes| {
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
    });
    let store = Store::open(&path).unwrap();
    let set_aside = store.set_aside_records();
    assert_eq!(set_aside.len(), 1);
    let mut named = set_aside[0].queues.clone().expect("the header is intact");
    named.sort();
    assert_eq!(named, ["from", "to"], "the record names both queues");
    assert_fenced(&store, "from", seq);
    assert_fenced(&store, "to", seq);
    store.blocking_unfence("from").unwrap();
    store.blocking_unfence("to").unwrap();
    // Neither half of the move applies: the job is back where it was, nothing is doubled.
    assert_eq!(
        drain(&store, &store.blocking_queue::<String>("from").unwrap()),
        strings("job", 3)
    );
    assert!(drain(&store, &store.blocking_queue::<String>("to").unwrap()).is_empty());
}

fn log_entry_under_a_foreign_key_is_set_aside_and_sequence_numbers_stay_unique() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<String>("q").unwrap();
        for batch in ["first", "newest"] {
            let mut tx = store.begin();
            for item in strings(batch, 2) {
                queue.enqueue(&mut tx, item).unwrap();
            }
            tx.blocking_commit().unwrap();
        }
    }
    // The newest record is damaged, and an entry whose key is no sequence number appears.
    let (seq, damaged) = damage_record(&path, b"newest-001", |bytes| {
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
    });
    {
        let (db, log) = raw(&path);
        log.insert([0xff; 9], &b"junk"[..]).unwrap();
        db.flush().unwrap();
    }
    {
        let store = Store::open(&path).unwrap();
        let set_aside = store.set_aside_records();
        assert_eq!(set_aside.len(), 2, "{set_aside:?}");
        assert!(set_aside.iter().any(|r| r.record == seq));
        assert!(matches!(
            store.blocking_queue::<String>("q"),
            Err(Error::Fenced { .. })
        ));
        store.blocking_unfence("q").unwrap();
    }
    // Two more opens, each with a commit: new records must not take the set-aside record's
    // sequence number.
    for round in 0..2 {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<String>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, format!("fresh-{round}")).unwrap();
        tx.blocking_commit().unwrap();
    }
    let (db, log) = raw(&path);
    let quarantine = db.open_tree("quarantine").unwrap();
    assert_eq!(
        quarantine.get(seq.to_be_bytes()).unwrap().as_deref(),
        Some(damaged.as_slice()),
        "the set-aside record is kept as it was"
    );
    assert!(
        log.get(seq.to_be_bytes()).unwrap().is_none(),
        "a new record reused the sequence number {seq} of a set-aside record"
    );
    drop((quarantine, log, db));
    let store = Store::open(&path).unwrap();
    store.blocking_unfence("q").unwrap();
    let queue = store.blocking_queue::<String>("q").unwrap();
    assert_eq!(
        drain(&store, &queue),
        ["first-000", "first-001", "fresh-0", "fresh-1"]
    );
}

fn store_of_another_format_version_is_refused_and_released() {
    let (_guard, path) = temp_dir();
    {
        let store = Store::open(&path).unwrap();
        let queue = store.blocking_queue::<u8>("q").unwrap();
        let mut tx = store.begin();
        queue.enqueue(&mut tx, 1).unwrap();
        tx.blocking_commit().unwrap();
    }
    let set_format = |version: u32| {
        // sled's threads may hold its lock a moment after a store (or a refused open) let go.
        let db = common::open_raw_sled(&path);
        let meta = db.open_tree("meta").unwrap();
        let old = meta.insert("format", &version.to_le_bytes()).unwrap();
        db.flush().unwrap();
        old.map(|v| u32::from_le_bytes(v.as_ref().try_into().unwrap()))
    };
    let current = set_format(u32::MAX).expect("the store records its format");
    match Store::open(&path) {
        Err(Error::UnsupportedFormat { found, supported }) => {
            assert_eq!((found, supported), (u32::MAX, current));
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
    // The refused open let go of the directory, and changed nothing.
    assert_eq!(set_format(current), Some(u32::MAX));
    let store = Store::open(&path).unwrap();
    assert_eq!(
        drain(&store, &store.blocking_queue::<u8>("q").unwrap()),
        [1]
    );
}

fn database_that_is_not_a_store_is_refused() {
    let (_guard, path) = temp_dir();
    {
        let db = sled::open(&path).unwrap();
        db.open_tree("log")
            .unwrap()
            .insert(0u64.to_be_bytes(), &b"somebody else's data"[..])
            .unwrap();
        db.flush().unwrap();
    }
    // sled created the directory with the umask's mode, which the store refuses by itself.
    #[cfg(unix)]
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    assert!(matches!(
        Store::open(&path),
        Err(Error::UnsupportedFormat { found: 0, .. })
    ));
    // sled's threads may hold its lock a moment after the refused open let go of it.
    let db = common::open_raw_sled(&path);
    let log = db.open_tree("log").unwrap();
    assert_eq!(log.len(), 1, "the foreign data is untouched");
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(unserialisable_item_is_rejected_and_the_transaction_is_unchanged),
        engine_case!(item_failing_halfway_through_serialization_leaves_nothing_behind),
        engine_case!(oversized_item_is_rejected_and_the_transaction_keeps_the_rest),
        engine_case!(item_over_the_default_limit_is_rejected),
        engine_case!(transaction_over_its_size_limit_is_rejected_item_by_item),
        engine_case!(item_that_is_not_a_t_gives_deserialize_and_stays_held),
        engine_case!(undecodable_item_can_be_discarded_by_commit),
        engine_case!(invalid_builder_settings_are_rejected),
        engine_case!(bad_queue_names_are_rejected),
        #[cfg(feature = "postgres")]
        once_case!(postgres_settings_without_a_postgres_url_are_refused),
        once_case!(a_queue_made_with_a_nul_in_its_name_before_the_rule_still_opens),
        once_case!(damaged_record_body_fences_its_queue_only),
        once_case!(damaged_record_header_fences_every_queue),
        once_case!(truncated_record_is_set_aside),
        once_case!(damaged_acknowledgement_brings_the_dequeued_item_back_after_unfence),
        once_case!(a_healthy_store_sets_nothing_aside),
        once_case!(damaged_newest_record_does_not_disturb_later_commits),
        once_case!(damaged_move_between_queues_is_undone_as_a_whole),
        once_case!(log_entry_under_a_foreign_key_is_set_aside_and_sequence_numbers_stay_unique),
        once_case!(store_of_another_format_version_is_refused_and_released),
        once_case!(database_that_is_not_a_store_is_refused),
    ]
}
