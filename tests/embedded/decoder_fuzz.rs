//! End-to-end corruption: random bytes and damaged copies of real records written into the
//! `log` tree of a closed store, then the store reopened.
//!
//! The record decoder itself is fuzzed with a million inputs by the unit test at the bottom of
//! `src/engine/sled/record.rs`; this test checks what a user sees. In each round, for a store with a
//! known history:
//!
//! - the store opens (no panic, no error);
//! - exactly the damaged and planted records are reported by `set_aside_records`, are kept
//!   byte for byte in the `quarantine` tree and are gone from the `log` tree;
//! - every queue a bad record names is fenced (`Error::Fenced`) until unfenced;
//! - after unfencing, the queues hold exactly the items of the intact records (enqueues not
//!   acknowledged by an intact record), every item intact: damaged bytes never come back as
//!   an item.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{Durability, Error, Store};
use serde::{Deserialize, Serialize};

const QUEUES: [&str; 3] = ["q0", "q1", "q2"];
const ROUNDS: u64 = 40;
const COMMITS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Item {
    id: u64,
    pad: Vec<u8>,
}

impl Item {
    fn new(id: u64) -> Self {
        Item {
            id,
            pad: vec![id as u8; (id % 23) as usize + 1],
        }
    }

    fn is_intact(&self) -> bool {
        *self == Item::new(self.id)
    }
}

/// What one commit did: its enqueues and its acknowledged dequeues.
#[derive(Debug, Default)]
struct Commit {
    enq: Vec<(usize, u64)>,
    deq: Vec<u64>,
}

fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn damage(rng: &mut StdRng, good: &[u8], other: &[u8]) -> (&'static str, Vec<u8>) {
    loop {
        let mut bad = good.to_vec();
        let kind = match rng.gen_range(0..5) {
            0 => {
                let bit = rng.gen_range(0..bad.len() * 8);
                bad[bit / 8] ^= 1 << (bit % 8);
                "bit flip"
            }
            1 => {
                bad.truncate(rng.gen_range(0..bad.len()));
                "truncation"
            }
            2 => {
                for _ in 0..rng.gen_range(1..6) {
                    let at = rng.gen_range(0..bad.len());
                    bad[at] = rng.gen();
                }
                "overwrite"
            }
            3 => {
                bad.truncate(rng.gen_range(0..bad.len()));
                bad.extend_from_slice(&other[rng.gen_range(0..other.len())..]);
                "splice"
            }
            _ => {
                let len = rng.gen_range(0..120);
                bad = (0..len).map(|_| rng.gen()).collect();
                "random bytes"
            }
        };
        if bad != good && bad != other {
            return (kind, bad);
        }
    }
}

fn round(seed: u64) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (_guard, path) = common::temp_dir();

    // A history of commits, one log record each.
    let mut commits = Vec::new();
    {
        let store = Store::builder()
            .path(&path)
            .durability(Durability::Buffered)
            .open()
            .unwrap();
        let queues: Vec<_> = QUEUES
            .iter()
            .map(|n| store.blocking_queue::<Item>(n).unwrap())
            .collect();
        let mut next_id = 0;
        for _ in 0..COMMITS {
            let mut tx = store.begin();
            let mut commit = Commit::default();
            for _ in 0..rng.gen_range(1..5) {
                let q = rng.gen_range(0..QUEUES.len());
                queues[q].enqueue(&mut tx, Item::new(next_id)).unwrap();
                commit.enq.push((q, next_id));
                next_id += 1;
            }
            for _ in 0..rng.gen_range(0..3) {
                let q = rng.gen_range(0..QUEUES.len());
                if let Some(item) = queues[q].blocking_try_dequeue(&mut tx).unwrap() {
                    commit.deq.push(item.id);
                }
            }
            tx.blocking_commit().unwrap();
            commits.push(commit);
        }
    }

    // Damage some records, plant garbage after the last one.
    let mut bad: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let present: Vec<u64>;
    {
        let db = common::open_raw_sled(&path);
        let log = db.open_tree("log").unwrap();
        let records: Vec<(u64, Vec<u8>)> = log
            .iter()
            .map(|kv| {
                let (k, v) = kv.unwrap();
                (
                    u64::from_be_bytes(k.as_ref().try_into().unwrap()),
                    v.to_vec(),
                )
            })
            .collect();
        assert!(
            records.len() > 5,
            "the history left {} records",
            records.len()
        );
        present = records.iter().map(|(seq, _)| *seq).collect();
        for _ in 0..rng.gen_range(1..6) {
            let (seq, good) = &records[rng.gen_range(0..records.len())];
            let (_, other) = &records[rng.gen_range(0..records.len())];
            let (_kind, damaged) = damage(&mut rng, good, other);
            log.insert(key(*seq), damaged.clone()).unwrap();
            bad.insert(*seq, damaged);
        }
        let last = *present.last().unwrap();
        for i in 0..rng.gen_range(0..3) {
            let len = rng.gen_range(0..200);
            let garbage: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            log.insert(key(last + 1 + i), garbage.clone()).unwrap();
            bad.insert(last + 1 + i, garbage);
        }
        db.flush().unwrap();
    }

    // The intact records' effect: commit i wrote record i (nothing was compacted away but
    // fully acknowledged groups, whose items are gone either way).
    let mut expected: [BTreeSet<u64>; 3] = Default::default();
    let mut location = BTreeMap::new();
    for (seq, commit) in commits.iter().enumerate() {
        let seq = seq as u64;
        if !present.contains(&seq) || bad.contains_key(&seq) {
            continue;
        }
        for &(q, id) in &commit.enq {
            expected[q].insert(id);
            location.insert(id, q);
        }
        for id in &commit.deq {
            if let Some(q) = location.get(id) {
                expected[*q].remove(id);
            }
        }
    }

    let store = Store::open(&path).expect("a store with damaged records opens");
    let set_aside = store.set_aside_records();
    let reported: BTreeSet<u64> = set_aside.iter().map(|r| r.record).collect();
    assert_eq!(
        reported,
        bad.keys().copied().collect::<BTreeSet<_>>(),
        "seed {seed}: set-aside records"
    );
    for record in &set_aside {
        assert!(!record.reason.is_empty());
        let named: Vec<String> = match &record.queues {
            Some(names) => names.clone(),
            None => QUEUES.iter().map(|s| s.to_string()).collect(),
        };
        for name in named {
            match store.blocking_queue::<Item>(&name) {
                Err(Error::Fenced { .. }) => {}
                other => panic!("seed {seed}: queue {name} not fenced by a bad record: {other:?}"),
            }
        }
    }
    let mut found = 0;
    for (q, name) in QUEUES.iter().enumerate() {
        store.blocking_unfence(name).unwrap();
        let queue = store.blocking_queue::<Item>(name).unwrap();
        let items = common::peek_all(&store, &queue);
        for item in &items {
            assert!(
                item.is_intact(),
                "seed {seed}: damaged item {item:?} returned"
            );
        }
        let ids: BTreeSet<u64> = items.iter().map(|i| i.id).collect();
        assert_eq!(
            ids.len(),
            items.len(),
            "seed {seed}: an item twice in {name}"
        );
        assert_eq!(ids, expected[q], "seed {seed}: items of {name}");
        found += items.len();
    }
    drop(store);

    // The bad records are kept byte for byte in the quarantine, and gone from the log.
    let db = common::open_raw_sled(&path);
    let quarantine = db.open_tree("quarantine").unwrap();
    let log = db.open_tree("log").unwrap();
    for (seq, bytes) in &bad {
        let kept = quarantine.get(key(*seq)).unwrap();
        assert_eq!(
            kept.as_deref(),
            Some(&bytes[..]),
            "seed {seed}: record {seq} in quarantine"
        );
        assert!(
            log.get(key(*seq)).unwrap().is_none(),
            "seed {seed}: record {seq} left in the log"
        );
    }
    (bad.len(), found)
}

#[test]
fn damaged_and_planted_records_are_set_aside_and_never_returned() {
    let mut bad = 0;
    let mut items = 0;
    for seed in 0..ROUNDS {
        let (b, i) = round(seed);
        bad += b;
        items += i;
    }
    println!("end-to-end corruption: {ROUNDS} stores, {bad} bad records set aside, {items} intact items recovered");
}
