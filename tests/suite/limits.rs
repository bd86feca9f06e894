//! The item and transaction size limits: an item over the item limit is refused while it is
//! encoded (not after), and the transaction limit counts each buffered item's real cost. On
//! every engine of the conformance suite (`tests/common/engines.rs`).

use crate::common;
use crate::engine_case;

use common::drain;
use common::engines::{Engine, EngineStore};
use reliable_queue::Error;
use serde::{Deserialize, Serialize};

const MIB: usize = 1 << 20;

/// A struct holding many strings: encoded through serde, not the byte fast path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Documents {
    id: u32,
    parts: Vec<String>,
}

/// A store of `engine` with a 1 MiB item limit.
fn store_with_item_limit(engine: &'static Engine) -> EngineStore {
    engine.store_with(|b| b.max_item_size(MIB))
}

fn a_huge_byte_item_is_refused_with_its_exact_size(engine: &'static Engine) {
    let item = vec![7u8; 64 * MIB];
    {
        let at = store_with_item_limit(engine);
        let store = &at.store;
        let q = store.blocking_queue::<Vec<u8>>("bytes").unwrap();
        let mut tx = store.begin();
        match q.enqueue(&mut tx, &item) {
            // Envelope byte, a 4-byte varint length, the bytes.
            Err(Error::ItemTooLarge { queue, size, limit }) => {
                assert_eq!((queue.as_str(), size, limit), ("bytes", 64 * MIB + 5, MIB));
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 0);
    }
}

fn a_huge_struct_is_refused_as_soon_as_it_crosses_the_limit(engine: &'static Engine) {
    // 64 MiB of strings of 1 KiB each.
    let item = Documents {
        id: 1,
        parts: (0..64 * 1024).map(|_| "d".repeat(1024)).collect(),
    };
    {
        let at = store_with_item_limit(engine);
        let store = &at.store;
        let q = store.blocking_queue::<Documents>("docs").unwrap();
        let mut tx = store.begin();
        match q.enqueue(&mut tx, &item) {
            Err(Error::ItemTooLarge { queue, size, limit }) => {
                assert_eq!((queue.as_str(), limit), ("docs", MIB));
                // Encoding stopped at the string that crossed the limit, not at the end.
                assert!(size > MIB && size <= MIB + 1024 + 2, "{size}");
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 0);
        // The transaction is still usable.
        let small = Documents {
            id: 2,
            parts: vec!["ok".to_owned()],
        };
        q.enqueue(&mut tx, &small).expect("a small item fits");
        tx.blocking_commit().unwrap();
        assert_eq!(drain(store, &q), [small]);
    }
}

fn items_of_exactly_the_limit_are_accepted_and_one_byte_more_is_not(engine: &'static Engine) {
    {
        let at = store_with_item_limit(engine);
        let store = &at.store;
        // Bytes: envelope byte, 3-byte varint (the length is under 2^21), the bytes.
        let bytes = store.blocking_queue::<Vec<u8>>("bytes").unwrap();
        let fits = vec![1u8; MIB - 4];
        let mut tx = store.begin();
        bytes.enqueue(&mut tx, &fits).expect("exactly the limit");
        match bytes.enqueue(&mut tx, vec![2u8; MIB - 3]) {
            Err(Error::ItemTooLarge { size, limit, .. }) => {
                assert_eq!((size, limit), (MIB + 1, MIB))
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        // Through serde: envelope byte, `id` (1 byte under 128), the vector's length (1 byte),
        // the string's length (3 bytes), the string.
        let docs = store.blocking_queue::<Documents>("docs").unwrap();
        let fits = Documents {
            id: 3,
            parts: vec!["e".repeat(MIB - 6)],
        };
        docs.enqueue(&mut tx, &fits).expect("exactly the limit");
        let over = Documents {
            id: 4,
            parts: vec!["f".repeat(MIB - 5)],
        };
        match docs.enqueue(&mut tx, &over) {
            Err(Error::ItemTooLarge { size, limit, .. }) => {
                assert_eq!((size, limit), (MIB + 1, MIB))
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        assert_eq!(tx.enqueued(), 2);
        tx.blocking_commit().unwrap();
        assert_eq!(drain(store, &bytes), [vec![1u8; MIB - 4]]);
        assert_eq!(drain(store, &docs), [fits]);
    }
}

/// What the transaction limit counts for each item beyond its encoded bytes: its slot in the
/// transaction plus the smallest heap block (the crate's `ITEM_OVERHEAD`, 56 on 64-bit).
const ITEM_OVERHEAD: usize = std::mem::size_of::<(std::sync::Arc<()>, Box<[u8]>)>() + 32;

fn zero_sized_items_count_against_the_transaction_limit(engine: &'static Engine) {
    {
        let at = engine.store_with(|b| b.max_item_size(1024).max_transaction_size(MIB));
        let store = &at.store;
        let q = store.blocking_queue::<()>("units").unwrap();
        let mut tx = store.begin();
        let bound = MIB / ITEM_OVERHEAD;
        let mut added = 0;
        let refused = loop {
            match q.enqueue(&mut tx, ()) {
                Ok(()) => added += 1,
                Err(e) => break e,
            }
            assert!(
                added <= bound,
                "more than {bound} zero-sized items in 1 MiB"
            );
        };
        match refused {
            Error::TransactionTooLarge { size, limit } => {
                assert_eq!(limit, MIB);
                assert!(size > MIB, "{size}");
            }
            other => panic!("expected TransactionTooLarge, got {other:?}"),
        }
        // Each `()` is one encoded byte (the envelope) and its overhead.
        assert_eq!(added, MIB / (1 + ITEM_OVERHEAD));
        assert_eq!(tx.enqueued(), added);
        // The transaction is intact and commits what it had.
        tx.blocking_commit().expect("commit");
        assert_eq!(q.blocking_count().unwrap(), added as u64);
    }
}

fn a_lone_item_of_the_item_limit_fits_a_transaction_of_the_same_limit(engine: &'static Engine) {
    let at = engine.store_with(|b| b.max_item_size(1024).max_transaction_size(1024));
    let store = &at.store;
    let q = store.blocking_queue::<Vec<u8>>("q").unwrap();
    let mut tx = store.begin();
    // 1 + 2 (varint of 1021) + 1021 = 1024 encoded bytes.
    q.enqueue(&mut tx, vec![1u8; 1021])
        .expect("a lone item within the item limit fits");
    match q.enqueue(&mut tx, Vec::new()) {
        Err(Error::TransactionTooLarge { size, limit }) => {
            assert_eq!((size, limit), (1024 + 2 + 2 * ITEM_OVERHEAD, 1024));
        }
        other => panic!("expected TransactionTooLarge, got {other:?}"),
    }
    tx.blocking_commit().unwrap();
    assert_eq!(drain(store, &q), [vec![1u8; 1021]]);
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(a_huge_byte_item_is_refused_with_its_exact_size),
        engine_case!(a_huge_struct_is_refused_as_soon_as_it_crosses_the_limit),
        engine_case!(items_of_exactly_the_limit_are_accepted_and_one_byte_more_is_not),
        engine_case!(zero_sized_items_count_against_the_transaction_limit),
        engine_case!(a_lone_item_of_the_item_limit_fits_a_transaction_of_the_same_limit),
    ]
}
