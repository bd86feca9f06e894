//! The workload of the pristine store and the items it holds.
//!
//! Every item is a `Vec<u8>` whose bytes name it: a header (`RQ`, queue index, item index,
//! length) followed by filler that depends on queue and index. An item read back is turned into
//! a token (`a17` for item 17 of queue `alpha`) only if every byte is what it should be;
//! anything else becomes `?<length>`, so a changed byte can never pass for an item.
//!
//! The build makes the store in two sessions of committed transactions, each in a child
//! process (so that sled's threads are gone and its files are still when the parent copies
//! them; the parent keeps a copy of the store as the first session left it): 303 items over
//! three queues, one in twenty-five of 200 KiB (their commit groups go to sled's `blobs/`
//! files), and 91 committed dequeues, some in the same transactions as enqueues, the last ones
//! alone. Every fourth step also runs a transaction that enqueues and dequeues and is then
//! aborted (by `abort` or by drop): its items must never show up, its dequeued items must
//! stay.

use std::collections::BTreeSet;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reliable_queue::{ReliableConcurrentQueue, Store};

/// The three queues of the store.
pub(crate) const QUEUES: [&str; 3] = ["alpha", "beta", "gamma"];
/// The letter of each queue in item tokens.
const LETTERS: [char; 3] = ['a', 'b', 'c'];
/// Items committed by the workload.
pub(crate) const ITEMS: u32 = 303;
/// Items removed by committed dequeues.
pub(crate) const DEQUEUES: usize = 91;
/// Size of the large items: over sled's 128 KiB limit for a value kept in its log.
const LARGE: usize = 200 << 10;
/// Indexes of items enqueued by aborted transactions start here.
const ABORTED_BASE: u32 = 100_000;
/// Seed of the workload's choices: the same store every run.
const WORKLOAD_SEED: u64 = 0x5eed_da4a_9e00_0001;
/// The header: magic (2), queue (1), index (4), length (4).
const HEADER: usize = 11;

/// Whether item `index` is one of the 200 KiB ones.
fn is_large(index: u32) -> bool {
    index % 25 == 12
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bytes of item `index` of queue `queue`.
pub(crate) fn item(queue: usize, index: u32) -> Vec<u8> {
    let len = if is_large(index) {
        LARGE
    } else {
        HEADER + 5 + (index as usize * 37) % 1500
    };
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(b"RQ");
    bytes.push(queue as u8);
    bytes.extend_from_slice(&index.to_le_bytes());
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    let mut state = ((queue as u64) << 32) | u64::from(index);
    while bytes.len() < len {
        let word = splitmix(&mut state).to_le_bytes();
        let take = (len - bytes.len()).min(8);
        bytes.extend_from_slice(&word[..take]);
    }
    bytes
}

/// The token of item `index` of queue `queue`.
pub(crate) fn token_of(queue: usize, index: u32) -> String {
    format!("{}{index}", LETTERS[queue])
}

/// The queue (index into [`QUEUES`]) of an item token; `None` for `?<length>`.
pub(crate) fn queue_of(token: &str) -> Option<usize> {
    let letter = token.chars().next()?;
    LETTERS.iter().position(|&l| l == letter)
}

/// The token of bytes read back: the item's token if they are exactly an item, else
/// `?<length>`.
pub(crate) fn token(bytes: &[u8]) -> String {
    let parsed = (|| {
        if bytes.len() < HEADER || &bytes[..2] != b"RQ" {
            return None;
        }
        let queue = usize::from(bytes[2]);
        let index = u32::from_le_bytes(bytes[3..7].try_into().ok()?);
        if queue >= QUEUES.len() || item(queue, index) != bytes {
            return None;
        }
        Some(token_of(queue, index))
    })();
    parsed.unwrap_or_else(|| format!("?{}", bytes.len()))
}

/// What the workload left in the store.
#[derive(Debug, Default, Clone)]
pub(crate) struct Expected {
    /// Per queue, the tokens of its items in item-id order (the order a reopened store gives).
    pub(crate) queues: [Vec<String>; 3],
    /// Tokens of the items removed by committed dequeues.
    pub(crate) consumed: BTreeSet<String>,
    /// Tokens of the items enqueued by aborted transactions.
    pub(crate) aborted: BTreeSet<String>,
    /// Committed transactions.
    pub(crate) transactions: usize,
}

impl Expected {
    /// The lines the build child prints (each after `RQD\t`).
    pub(crate) fn to_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (q, tokens) in self.queues.iter().enumerate() {
            lines.push(format!(
                "build\tqueue={}\titems={}",
                QUEUES[q],
                tokens.join(",")
            ));
        }
        let join = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
        lines.push(format!("build\tconsumed={}", join(&self.consumed)));
        lines.push(format!("build\taborted={}", join(&self.aborted)));
        lines.push(format!("build\ttransactions={}", self.transactions));
        lines
    }

    /// Parses the build child's lines (each after `RQD\t`); `None` if one is missing.
    pub(crate) fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<Expected> {
        let mut expected = Expected::default();
        let mut seen = 0;
        let split = |list: &str| -> Vec<String> {
            list.split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect()
        };
        for line in lines {
            let Some(rest) = line.strip_prefix("build\t") else {
                continue;
            };
            if let Some(rest) = rest.strip_prefix("queue=") {
                let (name, items) = rest.split_once("\titems=")?;
                let q = QUEUES.iter().position(|n| *n == name)?;
                expected.queues[q] = split(items);
                seen |= 1 << q;
            } else if let Some(list) = rest.strip_prefix("consumed=") {
                expected.consumed = split(list).into_iter().collect();
                seen |= 8;
            } else if let Some(list) = rest.strip_prefix("aborted=") {
                expected.aborted = split(list).into_iter().collect();
                seen |= 16;
            } else if let Some(n) = rest.strip_prefix("transactions=") {
                expected.transactions = n.parse().ok()?;
                seen |= 32;
            }
        }
        (seen == 63).then_some(expected)
    }

    /// Items still in the store.
    pub(crate) fn live(&self) -> usize {
        self.queues.iter().map(Vec::len).sum()
    }
}

/// What one session of the workload did.
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionLog {
    /// Tokens of the items committed, in enqueue order.
    pub(crate) enqueued: Vec<String>,
    /// Tokens of the items removed by committed dequeues.
    pub(crate) consumed: Vec<String>,
    /// Tokens of the items enqueued by aborted transactions.
    pub(crate) aborted: Vec<String>,
    /// Committed transactions.
    pub(crate) transactions: usize,
}

impl SessionLog {
    /// The lines the build child prints (each after `RQD\t`).
    pub(crate) fn to_lines(&self) -> Vec<String> {
        vec![
            format!("session\tenqueued={}", self.enqueued.join(",")),
            format!("session\tconsumed={}", self.consumed.join(",")),
            format!("session\taborted={}", self.aborted.join(",")),
            format!("session\ttransactions={}", self.transactions),
        ]
    }

    /// Parses the build child's lines (each after `RQD\t`); `None` if one is missing.
    pub(crate) fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<SessionLog> {
        let mut log = SessionLog::default();
        let mut seen = 0;
        let split = |list: &str| -> Vec<String> {
            list.split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect()
        };
        for line in lines {
            let Some(rest) = line.strip_prefix("session\t") else {
                continue;
            };
            if let Some(list) = rest.strip_prefix("enqueued=") {
                log.enqueued = split(list);
                seen |= 1;
            } else if let Some(list) = rest.strip_prefix("consumed=") {
                log.consumed = split(list);
                seen |= 2;
            } else if let Some(list) = rest.strip_prefix("aborted=") {
                log.aborted = split(list);
                seen |= 4;
            } else if let Some(n) = rest.strip_prefix("transactions=") {
                log.transactions = n.parse().ok()?;
                seen |= 8;
            }
        }
        (seen == 15).then_some(log)
    }
}

impl Expected {
    /// What the store holds after `sessions`, run in that order.
    pub(crate) fn after(sessions: &[SessionLog]) -> Expected {
        let mut expected = Expected::default();
        for s in sessions {
            expected.consumed.extend(s.consumed.iter().cloned());
            expected.aborted.extend(s.aborted.iter().cloned());
            expected.transactions += s.transactions;
        }
        for token in sessions.iter().flat_map(|s| &s.enqueued) {
            if !expected.consumed.contains(token) {
                let q = queue_of(token).expect("an item token");
                expected.queues[q].push(token.clone());
            }
        }
        expected
    }
}

/// The sessions of the workload: the store is closed after each (the process exits), and
/// the parent keeps a copy of the store as the first session left it.
pub(crate) const SESSIONS: usize = 2;

/// Runs session `number` (0 or 1) of the workload on the store at `path`; `consumed_before`:
/// the dequeues committed by the sessions before.
pub(crate) fn session(
    path: &Path,
    number: usize,
    consumed_before: usize,
) -> reliable_queue::Result<SessionLog> {
    let mut rng = StdRng::seed_from_u64(WORKLOAD_SEED + number as u64);
    let (mut next, end) = if number == 0 {
        (0, ITEMS / 2)
    } else {
        (ITEMS / 2, ITEMS)
    };
    let mut next_aborted = ABORTED_BASE * (number as u32 + 1);
    let last = number + 1 == SESSIONS;
    let mut log = SessionLog::default();
    let store = Store::open(path)?;
    let queues = QUEUES
        .iter()
        .map(|name| store.blocking_queue::<Vec<u8>>(name))
        .collect::<reliable_queue::Result<Vec<_>>>()?;
    let mut step = 0usize;
    while next < end || (last && consumed_before + log.consumed.len() < DEQUEUES) {
        step += 1;
        let mut tx = store.begin();
        let enqueues = rng.gen_range(4..=24).min(end - next);
        let mut enqueued = Vec::new();
        for _ in 0..enqueues {
            let q = rng.gen_range(0..QUEUES.len());
            queues[q].enqueue(&mut tx, item(q, next))?;
            enqueued.push(token_of(q, next));
            next += 1;
        }
        // Dequeues in two steps of three, none before the first items.
        let wanted = if step % 3 != 1 && (number > 0 || step > 2) {
            rng.gen_range(1..=7)
                .min(DEQUEUES - consumed_before - log.consumed.len())
        } else {
            0
        };
        let mut got = Vec::new();
        let mut q = rng.gen_range(0..QUEUES.len());
        let mut empty_in_a_row = 0;
        while got.len() < wanted && empty_in_a_row < QUEUES.len() {
            match queues[q].blocking_try_dequeue(&mut tx)? {
                Some(bytes) => {
                    got.push(token(&bytes));
                    empty_in_a_row = 0;
                }
                None => empty_in_a_row += 1,
            }
            q = (q + 1) % QUEUES.len();
        }
        tx.blocking_commit()?;
        log.transactions += 1;
        log.enqueued.extend(enqueued);
        log.consumed.extend(got);
        if step.is_multiple_of(4) {
            aborted_step(&store, &queues, &mut rng, &mut next_aborted, &mut log)?;
        }
    }
    store.blocking_close()?;
    Ok(log)
}

/// A transaction that enqueues and dequeues, then is aborted (explicitly or by drop).
fn aborted_step(
    store: &Store,
    queues: &[ReliableConcurrentQueue<Vec<u8>>],
    rng: &mut StdRng,
    next_aborted: &mut u32,
    log: &mut SessionLog,
) -> reliable_queue::Result<()> {
    let mut tx = store.begin();
    for _ in 0..rng.gen_range(1..=3) {
        let q = rng.gen_range(0..QUEUES.len());
        queues[q].enqueue(&mut tx, item(q, *next_aborted))?;
        log.aborted.push(token_of(q, *next_aborted));
        *next_aborted += 1;
    }
    for _ in 0..rng.gen_range(1..=3) {
        let q = rng.gen_range(0..QUEUES.len());
        let _ = queues[q].blocking_try_dequeue(&mut tx)?;
    }
    if rng.gen_bool(0.5) {
        tx.blocking_abort()?;
    } else {
        drop(tx);
    }
    Ok(())
}
