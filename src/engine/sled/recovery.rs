//! Opening a store: replay the log into queues, rebuild liveness, set aside bad records.
//!
//! Records are replayed in key (commit) order: an `Enqueue` adds an item, an `Ack` removes
//! it (an `Ack` for an id that is not live is ignored). A record that fails its checksum or
//! decode is copied to the `quarantine` tree and only then removed from the log; the queues it
//! names (every queue, when its header is unreadable too) are fenced until the user lifts the
//! fence. Items come back per queue in id order, which is commit order.

use std::collections::{HashMap, HashSet, VecDeque};

use super::directory::DiskSync;
use super::liveness::Liveness;
use super::record::{self, Op};
use super::trees::{self, seq_of, Trees};
use crate::core::{Entry, QueueId};
use crate::engine::catalog::{BadRecord, Fence};
use crate::error::Result;

/// Where the committer starts from: what is live in the log and the next numbers to use.
#[derive(Debug)]
pub(crate) struct LogState {
    pub(crate) liveness: Liveness,
    /// The id the next enqueued item gets: above every id the log still names.
    pub(crate) next_id: u64,
    /// The sequence number of the next record: above every record ever written or set aside.
    pub(crate) next_seq: u64,
}

/// Everything the store needs to start from what is on disk.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// Every queue of the catalog with its items, in id order.
    pub(crate) queues: Vec<(String, QueueId, VecDeque<Entry>)>,
    pub(crate) log: LogState,
    pub(crate) set_aside: Vec<BadRecord>,
    pub(crate) fences: Vec<Fence>,
}

/// Replays the log. Bad records are set aside as described in the module docs.
pub(crate) fn recover(trees: &Trees, disk: &DiskSync) -> Result<Recovered> {
    let fresh = trees.meta.is_empty() && trees.log.is_empty();
    trees::check_format(&trees.meta, fresh)?;
    let queues = trees::load_queues(&trees.meta)?;
    let known: Vec<QueueId> = queues.iter().map(|(_, id)| *id).collect();

    let Replayed {
        liveness,
        items,
        dead,
        max_id,
        last_seq,
        newly_bad,
    } = replay(trees.log.iter(), &known)?;
    set_aside(trees, disk, &known, newly_bad)?;

    let mut items: HashMap<QueueId, VecDeque<Entry>> = items
        .0
        .into_iter()
        .map(|(queue, mut entries)| {
            if !dead.is_empty() {
                entries.retain(|e| !dead.contains(&e.id));
            }
            // Commit groups come in id order; only items moved by compaction interleave.
            if !entries.is_sorted_by_key(|e| e.id) {
                entries.sort_by_key(|e| e.id);
            }
            entries.dedup_by_key(|e| e.id);
            entries.shrink_to_fit();
            (queue, VecDeque::from(entries))
        })
        .collect();

    // The highest sequence number ever set aside. Not simply the last key: a key that is not
    // a sequence number (set aside as such) may sort after every real one.
    let mut last_quarantined = None;
    for key in trees.quarantine.iter().keys() {
        last_quarantined = last_quarantined.max(seq_of(&key?));
    }
    let next_seq = last_seq
        .max(last_quarantined)
        .map_or(0, |s| s.saturating_add(1));
    let mut all_bad = Vec::new();
    for kv in trees.quarantine.iter() {
        let (k, v) = kv?;
        let seq = seq_of(&k).unwrap_or(u64::MAX);
        let (queues, reason) = match seq_of(&k).map(|_| record::decode(&v)) {
            Some(Err(e)) => (e.queues, e.reason),
            Some(Ok(rec)) => (
                Some(rec.queues),
                "names a queue missing from the catalog".to_owned(),
            ),
            None => (None, "key is not a sequence number".to_owned()),
        };
        all_bad.push(BadRecord {
            seq,
            queues,
            reason,
        });
    }
    let queues = queues
        .into_iter()
        .map(|(name, id)| {
            let entries = items.remove(&id).unwrap_or_default();
            (name, id, entries)
        })
        .collect();
    Ok(Recovered {
        queues,
        log: LogState {
            liveness,
            next_id: max_id.map_or(0, |m| m.saturating_add(1)),
            next_seq,
        },
        set_aside: all_bad,
        fences: trees::load_fences(&trees.meta)?,
    })
}

/// What replaying the log produced.
struct Replayed {
    liveness: Liveness,
    items: PerQueue,
    dead: HashSet<u64>,
    max_id: Option<u64>,
    last_seq: Option<u64>,
    newly_bad: Vec<Bad>,
}

/// Replays records, in key order.
fn replay(
    records: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    known: &[QueueId],
) -> Result<Replayed> {
    let mut liveness = Liveness::default();
    let mut items = PerQueue::default();
    // Ids of items enqueued earlier in the log and acknowledged later: removed at the end, so
    // that replay never searches a queue.
    let mut dead: HashSet<u64> = HashSet::new();
    let mut ids = Vec::new();
    let mut max_id: Option<u64> = None;
    let mut last_seq: Option<u64> = None;
    let mut newly_bad = Vec::new();

    for kv in records {
        let (key, value) = kv?;
        let Some(seq) = seq_of(&key) else {
            let bad = BadRecord {
                seq: u64::MAX,
                queues: None,
                reason: "key is not a sequence number".to_owned(),
            };
            newly_bad.push((key, value, bad));
            continue;
        };
        last_seq = Some(seq);
        let rec = match record::decode(&value) {
            Ok(rec) => rec,
            Err(damage) => {
                newly_bad.push((key.clone(), value.clone(), damage.at(seq)));
                continue;
            }
        };
        if let Some(q) = rec.queues.iter().find(|q| !known.contains(q)) {
            let bad = BadRecord {
                seq,
                queues: Some(rec.queues.clone()),
                reason: format!("names queue id {q}, missing from the catalog"),
            };
            newly_bad.push((key.clone(), value.clone(), bad));
            continue;
        }
        ids.clear();
        for op in &rec.ops {
            let (Op::Enqueue { id, .. } | Op::Ack { id, .. }) = *op;
            max_id = max_id.max(Some(id));
            if let Op::Enqueue { id, .. } = *op {
                ids.push(id);
            }
        }
        let bytes = u64::try_from(value.len()).unwrap_or(u64::MAX);
        let first = ids.first().copied();
        let contiguous = ids.iter().zip(first.unwrap_or(0)..).all(|(&id, n)| id == n);
        match first {
            Some(first) if contiguous && liveness.fits_as_range(first) => {
                let end = first.saturating_add(u64::try_from(ids.len()).unwrap_or(u64::MAX));
                liveness.add_range(seq, first..end, bytes);
            }
            None => {
                let end = liveness.range_end();
                liveness.add_range(seq, end..end, bytes);
            }
            Some(_) => {
                // A group written by compaction: moved items, in any order.
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                sorted.dedup();
                liveness.add_list(seq, sorted, bytes);
            }
        }
        for op in rec.ops {
            match op {
                Op::Enqueue {
                    queue,
                    id,
                    attempts,
                    not_before,
                    bytes,
                } => items.push(
                    queue,
                    Entry {
                        id,
                        attempts,
                        not_before,
                        bytes: bytes.0.into(),
                    },
                ),
                Op::Ack { id, .. } => {
                    if liveness.ack(id) {
                        dead.insert(id);
                    }
                }
            }
        }
    }

    Ok(Replayed {
        liveness,
        items,
        dead,
        max_id,
        last_seq,
        newly_bad,
    })
}

/// Replayed items, per queue, in log order.
#[derive(Debug, Default)]
struct PerQueue(Vec<(QueueId, Vec<Entry>)>);

impl PerQueue {
    fn push(&mut self, queue: QueueId, entry: Entry) {
        // Records mostly touch one queue; look at the last one used first.
        match self.0.iter().rposition(|(q, _)| *q == queue) {
            Some(i) => self.0[i].1.push(entry),
            None => self.0.push((queue, vec![entry])),
        }
    }
}

/// A bad record found by this replay: its key, its bytes, and what is wrong with it.
type Bad = (sled::IVec, sled::IVec, BadRecord);

/// Moves bad records from the log to the quarantine tree and fences their queues. The copy
/// and the fences are flushed before the record leaves the log, so a crash in between only
/// repeats the work at the next open.
fn set_aside(trees: &Trees, disk: &DiskSync, known: &[QueueId], bad: Vec<Bad>) -> Result<()> {
    if bad.is_empty() {
        return Ok(());
    }
    for (key, value, record) in &bad {
        tracing::error!(record = record.seq, reason = %record.reason, "setting aside a damaged log record");
        trees.quarantine.insert(key, value)?;
        let fenced: Vec<QueueId> = match &record.queues {
            Some(qs) => qs.iter().copied().filter(|q| known.contains(q)).collect(),
            None => known.to_vec(),
        };
        for queue in fenced {
            trees::add_fence(&trees.meta, queue, record)?;
        }
    }
    trees.db.flush()?;
    disk.sync_log()?;
    for (key, ..) in bad {
        trees.log.remove(key)?;
    }
    trees.db.flush()?;
    disk.sync_log()?;
    Ok(())
}
