//! sled's trees of an open store, and the keys of its `meta` tree.
//!
//! - `log`: the records (see `record`), keyed by sequence number (u64 big-endian).
//! - `meta`: format version, queue catalog, fences:
//!
//! ```text
//! key                                   value
//! "format"                              u32 LE: the store format version
//! "queue/" name                         u32 LE: the queue's id
//! "fence/" queue id (u32 BE) seq (u64 BE)  UTF-8 reason: the queue is fenced by that record
//! "marks"                               empty: the store keeps a marks file (see `marks`)
//! "missing/" first (u64 BE) last (u64 BE)   empty: records found missing by a salvaging open
//! "policy/" queue id (u32 BE)            postcard `RetryPolicy`: the queue's retry policy
//! ```

use std::collections::HashMap;

use crate::core::QueueId;
use crate::engine::catalog::{BadRecord, Fence};
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;

/// The trees of an open store.
#[derive(Debug, Clone)]
pub(crate) struct Trees {
    pub(crate) db: sled::Db,
    pub(crate) log: sled::Tree,
    pub(crate) meta: sled::Tree,
    /// Records set aside at open, under their original keys.
    pub(crate) quarantine: sled::Tree,
}

impl Trees {
    pub(crate) fn open(db: sled::Db) -> Result<Self> {
        Ok(Trees {
            log: db.open_tree("log")?,
            meta: db.open_tree("meta")?,
            quarantine: db.open_tree("quarantine")?,
            db,
        })
    }
}

/// A sequence number from a `log` or `quarantine` key.
pub(crate) fn seq_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// The store format this build writes. Version 2 added the processing layer's record ops
/// and the commit time in each record; a version 1 store opens and is marked version 2 (so
/// that a build that knows only version 1 refuses it instead of misreading its new records).
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The oldest store format this build reads.
const FORMAT_VERSION_1: u32 = 1;

const FORMAT_KEY: &[u8] = b"format";
const QUEUE_PREFIX: &[u8] = b"queue/";
const FENCE_PREFIX: &[u8] = b"fence/";
const MARKS_KEY: &[u8] = b"marks";
const MISSING_PREFIX: &[u8] = b"missing/";
const POLICY_PREFIX: &[u8] = b"policy/";

fn u32_of(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Checks (or, in a new store, writes) the format version.
pub(crate) fn check_format(meta: &sled::Tree, fresh: bool) -> Result<()> {
    match meta.get(FORMAT_KEY)? {
        Some(v) => match u32_of(&v) {
            Some(FORMAT_VERSION | FORMAT_VERSION_1) => Ok(()),
            Some(found) => Err(Error::UnsupportedFormat {
                found,
                supported: FORMAT_VERSION,
            }),
            None => Err(Error::UnsupportedFormat {
                found: u32::MAX,
                supported: FORMAT_VERSION,
            }),
        },
        None if fresh => {
            meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_le_bytes())?;
            Ok(())
        }
        // Queues or records without a format key: not a store this build wrote.
        None => Err(Error::UnsupportedFormat {
            found: 0,
            supported: FORMAT_VERSION,
        }),
    }
}

/// Marks a store of an older format as this build's (once it opened).
pub(crate) fn upgrade_format(meta: &sled::Tree) -> Result<bool> {
    match meta.get(FORMAT_KEY)?.as_deref().and_then(u32_of) {
        Some(FORMAT_VERSION_1) => {
            meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_le_bytes())?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Stores the retry policy of queue `queue`.
pub(crate) fn set_policy(meta: &sled::Tree, queue: QueueId, policy: &[u8]) -> Result<()> {
    let mut key = POLICY_PREFIX.to_vec();
    key.extend_from_slice(&queue.to_be_bytes());
    meta.insert(key, policy)?;
    Ok(())
}

/// Every stored retry policy, by queue (a policy that does not decode is skipped with a
/// warning: the queue uses the default).
pub(crate) fn load_policies(meta: &sled::Tree) -> Result<HashMap<QueueId, RetryPolicy>> {
    let mut out = HashMap::new();
    for kv in meta.scan_prefix(POLICY_PREFIX) {
        let (k, v) = kv?;
        let id = k[POLICY_PREFIX.len()..]
            .try_into()
            .ok()
            .map(u32::from_be_bytes);
        match (id, RetryPolicy::from_bytes(&v)) {
            (Some(id), Some(policy)) => {
                out.insert(id, policy);
            }
            _ => {
                tracing::warn!(key = ?k, "a stored retry policy is unreadable; the default applies")
            }
        }
    }
    Ok(out)
}

/// Every queue of the catalog, by id order.
pub(crate) fn load_queues(meta: &sled::Tree) -> Result<Vec<(String, QueueId)>> {
    let mut queues = Vec::new();
    for kv in meta.scan_prefix(QUEUE_PREFIX) {
        let (k, v) = kv?;
        let name = String::from_utf8(k[QUEUE_PREFIX.len()..].to_vec());
        match (name, u32_of(&v)) {
            (Ok(name), Some(id)) => queues.push((name, id)),
            _ => {
                return Err(Error::storage(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("catalog entry {:?} is damaged", String::from_utf8_lossy(&k)),
                )))
            }
        }
    }
    queues.sort_by_key(|(_, id)| *id);
    Ok(queues)
}

/// Records a new queue.
pub(crate) fn create_queue(meta: &sled::Tree, name: &str, id: QueueId) -> Result<()> {
    let mut key = QUEUE_PREFIX.to_vec();
    key.extend_from_slice(name.as_bytes());
    meta.insert(key, &id.to_le_bytes())?;
    Ok(())
}

fn fence_key(queue: QueueId, record: u64) -> Vec<u8> {
    let mut key = FENCE_PREFIX.to_vec();
    key.extend_from_slice(&queue.to_be_bytes());
    key.extend_from_slice(&record.to_be_bytes());
    key
}

/// Every fence in place.
pub(crate) fn load_fences(meta: &sled::Tree) -> Result<Vec<Fence>> {
    let mut fences = Vec::new();
    for kv in meta.scan_prefix(FENCE_PREFIX) {
        let (k, v) = kv?;
        let rest = &k[FENCE_PREFIX.len()..];
        let (Some(queue), Some(seq)) = (
            rest.get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes),
            rest.get(4..).and_then(seq_of),
        ) else {
            continue;
        };
        let bad = BadRecord {
            seq,
            queues: Some(vec![queue]),
            reason: String::from_utf8_lossy(&v).into_owned(),
        };
        fences.push((queue, bad));
    }
    Ok(fences)
}

/// Fences `queue` because of the record `bad`.
pub(crate) fn add_fence(meta: &sled::Tree, queue: QueueId, bad: &BadRecord) -> Result<()> {
    meta.insert(fence_key(queue, bad.seq), bad.reason.as_bytes())?;
    Ok(())
}

/// Lifts every fence of `queue`.
pub(crate) fn remove_fences(meta: &sled::Tree, queue: QueueId) -> Result<()> {
    let mut prefix = FENCE_PREFIX.to_vec();
    prefix.extend_from_slice(&queue.to_be_bytes());
    let mut batch = sled::Batch::default();
    for kv in meta.scan_prefix(prefix) {
        batch.remove(kv?.0);
    }
    meta.apply_batch(batch)?;
    Ok(())
}

/// Does the store keep a marks file? (Set once its first one is written.)
pub(crate) fn keeps_marks(meta: &sled::Tree) -> Result<bool> {
    Ok(meta.contains_key(MARKS_KEY)?)
}

/// Records that the store keeps a marks file, so that losing the file is noticed.
pub(crate) fn set_keeps_marks(meta: &sled::Tree) -> Result<()> {
    meta.insert(MARKS_KEY, &[])?;
    Ok(())
}

/// Records a range of records found missing by a salvaging open.
pub(crate) fn add_missing(meta: &sled::Tree, range: &std::ops::RangeInclusive<u64>) -> Result<()> {
    let mut key = MISSING_PREFIX.to_vec();
    key.extend_from_slice(&range.start().to_be_bytes());
    key.extend_from_slice(&range.end().to_be_bytes());
    meta.insert(key, &[])?;
    Ok(())
}

/// Every range of records found missing by salvaging opens, in order.
pub(crate) fn load_missing(meta: &sled::Tree) -> Result<Vec<std::ops::RangeInclusive<u64>>> {
    let mut ranges = Vec::new();
    for kv in meta.scan_prefix(MISSING_PREFIX) {
        let (k, _) = kv?;
        let rest = &k[MISSING_PREFIX.len()..];
        if let (Some(first), Some(last)) = (
            rest.get(..8).and_then(seq_of),
            rest.get(8..).and_then(seq_of),
        ) {
            if first <= last {
                ranges.push(first..=last);
            }
        }
    }
    Ok(ranges)
}
