//! Opening a store: replay the log into queues, rebuild liveness, set aside bad records.
//!
//! Records are replayed in key (commit) order: an `Enqueue` adds an item, an `Ack` removes
//! it (an `Ack` for an id that is not live is ignored). A record that fails its checksum or
//! decode is copied to the `quarantine` tree and only then removed from the log; the queues it
//! names (every queue, when its header is unreadable too) are fenced until the user lifts the
//! fence. Items come back per queue in id order, which is commit order.

use std::collections::{HashMap, HashSet, VecDeque};

use super::catalog::{self, Fence};
use super::directory::DiskSync;
use super::liveness::Liveness;
use super::record::{self, Op};
use crate::core::{Entry, QueueId};
use crate::error::Result;

/// A record found bad, now or at an earlier open.
#[derive(Debug, Clone)]
pub(crate) struct BadRecord {
    pub(crate) record: u64,
    /// Queue ids named by the record's header, if it was readable.
    pub(crate) queues: Option<Vec<QueueId>>,
    pub(crate) reason: String,
}

/// Everything the store needs to start from what is on disk.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) queues: Vec<(String, QueueId)>,
    pub(crate) items: HashMap<QueueId, VecDeque<Entry>>,
    pub(crate) liveness: Liveness,
    pub(crate) next_id: u64,
    pub(crate) next_seq: u64,
    pub(crate) set_aside: Vec<BadRecord>,
    pub(crate) fences: Vec<Fence>,
}

/// The trees of an open store.
#[derive(Debug, Clone)]
pub(crate) struct Trees {
    pub(crate) db: sled::Db,
    pub(crate) log: sled::Tree,
    pub(crate) meta: sled::Tree,
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

fn seq_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Replays the log. Bad records are set aside as described in the module docs.
pub(crate) fn recover(trees: &Trees, disk: &DiskSync) -> Result<Recovered> {
    let fresh = trees.meta.is_empty() && trees.log.is_empty();
    catalog::check_format(&trees.meta, fresh)?;
    let queues = catalog::load_queues(&trees.meta)?;
    let known: Vec<QueueId> = queues.iter().map(|(_, id)| *id).collect();

    let replayed = replay(trees.log.iter(), &known);
    let Replayed {
        liveness,
        items,
        dead,
        max_id,
        last_seq,
        newly_bad,
    } = replayed?;

    set_aside(trees, disk, &known, newly_bad)?;

    let items = items
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
    let next_seq = last_seq.max(last_quarantined).map_or(0, |s| s + 1);
    let mut all_bad = Vec::new();
    for kv in trees.quarantine.iter() {
        let (k, v) = kv?;
        let (queues, reason) = match seq_of(&k).map(|_| record::decode(&v)) {
            Some(Err(e)) => (e.queues, e.reason),
            Some(Ok(rec)) => (
                Some(rec.queues),
                "names a queue missing from the catalog".to_owned(),
            ),
            None => (None, "key is not a sequence number".to_owned()),
        };
        all_bad.push(BadRecord {
            record: seq_of(&k).unwrap_or(u64::MAX),
            queues,
            reason,
        });
    }
    Ok(Recovered {
        queues,
        items,
        liveness,
        next_id: max_id.map_or(0, |m| m + 1),
        next_seq,
        set_aside: all_bad,
        fences: catalog::load_fences(&trees.meta)?,
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
            newly_bad.push((key, value, None, "key is not a sequence number".to_owned()));
            continue;
        };
        last_seq = Some(seq);
        let rec = match record::decode(&value) {
            Ok(rec) => rec,
            Err(e) => {
                newly_bad.push((key, value.clone(), e.queues, e.reason));
                continue;
            }
        };
        if let Some(q) = rec.queues.iter().find(|q| !known.contains(q)) {
            let reason = format!("names queue id {q}, missing from the catalog");
            newly_bad.push((key, value.clone(), Some(rec.queues.clone()), reason));
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
        let bytes = value.len() as u64;
        let first = ids.first().copied();
        let contiguous = ids.iter().zip(first.unwrap_or(0)..).all(|(&id, n)| id == n);
        match first {
            Some(first) if contiguous && liveness.fits_as_range(first) => {
                liveness.add_range(seq, first, ids.len() as u64, bytes);
            }
            None => liveness.add_range(seq, liveness.range_end(), 0, bytes),
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
                    if liveness.ack(id).is_some() {
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

type Bad = (sled::IVec, sled::IVec, Option<Vec<QueueId>>, String);

/// Moves bad records from the log to the quarantine tree and fences their queues. The copy
/// and the fences are flushed before the record leaves the log, so a crash in between only
/// repeats the work at the next open.
fn set_aside(trees: &Trees, disk: &DiskSync, known: &[QueueId], bad: Vec<Bad>) -> Result<()> {
    if bad.is_empty() {
        return Ok(());
    }
    for (key, value, queues, reason) in &bad {
        let record = seq_of(key).unwrap_or(u64::MAX);
        tracing::error!(record, %reason, "setting aside a corrupt log record");
        trees.quarantine.insert(key, value)?;
        let fenced: Vec<QueueId> = match queues {
            Some(qs) => qs.iter().copied().filter(|q| known.contains(q)).collect(),
            None => known.to_vec(),
        };
        for queue in fenced {
            let fence = Fence {
                queue,
                record,
                reason: reason.clone(),
            };
            catalog::add_fence(&trees.meta, &fence)?;
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
