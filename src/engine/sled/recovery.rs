//! Opening a store: replay the log into queues, rebuild liveness, set aside bad records.
//!
//! Records are replayed in key (commit) order: an `Enqueue` adds an item, an `Ack` removes
//! it (an `Ack` for an id that is not live is ignored). A record that fails its checksum or
//! decode is copied to the `quarantine` tree and only then removed from the log; the queues it
//! names (every queue, when its header is unreadable too) are fenced until the user lifts the
//! fence. Items come back per queue in id order, which is commit order, except that items
//! whose leases the restart ended come first (see below).
//!
//! The processing layer's ops (see `record::Op`) each end an item's current id and give it a
//! new version: a lease or a compaction copy comes back visible. A restart ends every lease of
//! the previous process, and an ended lease puts its item back at the head, as an abort does
//! (P2): an item whose live version a `Lease` wrote (or compaction's copy of one, which it
//! writes as a `Lease` replacing nothing) comes back at the head of its queue, those items in
//! lease (id) order, before the items that were merely queued. A retry or a delayed enqueue
//! comes back delayed until its due time, a `Bury` comes back as a dead letter (without its
//! bytes, which stay in the log), a `Purge` ends a dead letter.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::RangeInclusive;
use std::path::Path;

use super::directory::DiskSync;
use super::liveness::Liveness;
use super::marks::{self, Found, Mark, MarkedQueue};
use super::record::{self, Op, Version};
use super::trees::{self, seq_of, Trees};
use crate::core::{Entry, Meta, QueueId};
use crate::engine::catalog::{BadRecord, Fence};
use crate::engine::proc::DeadSlot;
use crate::error::{Error, Result};

/// The largest item id and record sequence number a store gives out: 2^63 - 1. Both are
/// counted up from 0, one at a time, so no store comes near it (at a million a second it
/// takes 290,000 years). A record read from the log with a higher one could not have been
/// written by this crate: it is set aside as damaged, so that the committer always has room
/// to count on (and ids stay clear of the timers' keys, which count down from `u64::MAX`).
pub(crate) const MAX_NUMBER: u64 = (1 << 63) - 1;

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
    /// Every queue of the catalog with its visible items, in id order.
    pub(crate) queues: Vec<(String, QueueId, VecDeque<Entry>)>,
    /// Items not due yet at the open, per queue.
    pub(crate) delayed: HashMap<QueueId, Vec<Entry>>,
    /// Dead letters, per queue, oldest first, without their bytes.
    pub(crate) dead_letters: HashMap<QueueId, Vec<DeadSlot>>,
    pub(crate) log: LogState,
    pub(crate) set_aside: Vec<BadRecord>,
    pub(crate) fences: Vec<Fence>,
    /// Ranges of records found missing by salvaging opens, this one included.
    pub(crate) missing: Vec<RangeInclusive<u64>>,
    /// The mark to start from: the log as it is now, and the catalog.
    pub(crate) mark: Mark,
    /// The counter of the marks file's newest slot (0 without a file).
    pub(crate) mark_counter: u64,
}

/// How to open: the store's directory, what its marks file holds, and whether to salvage a
/// log that lost records.
#[derive(Debug)]
pub(crate) struct Opening<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) found: Found,
    pub(crate) salvage: bool,
    /// The store clock's time: items due later come back delayed.
    pub(crate) now: u64,
}

/// Replays the log, after checking it against the mark (see `marks`). Bad records are set
/// aside as described in the module docs. The store writes nothing before the checks pass
/// (sled's own recovery, which ran before, may have cut its log at the damage and removed blob
/// files past it; that is sled's, and cannot be prevented from here).
pub(crate) fn recover(trees: &Trees, disk: &DiskSync, opening: Opening<'_>) -> Result<Recovered> {
    let fresh = trees.meta.is_empty() && trees.log.is_empty();
    if !fresh {
        trees::check_format(&trees.meta, false)?;
    }
    let mut queues = trees::load_queues(&trees.meta)?;
    let (mark, mark_counter) = checked_mark(trees, &opening)?;

    // Queues the mark knows and sled's catalog lost: restored (below, once the checks pass).
    let restored: Vec<MarkedQueue> = mark
        .iter()
        .flat_map(|m| &m.queues)
        .filter(|q| {
            !queues
                .iter()
                .any(|(name, id)| *name == q.name || *id == q.id)
        })
        .cloned()
        .collect();
    queues.extend(restored.iter().map(|q| (q.name.clone(), q.id)));
    queues.sort_by_key(|(_, id)| *id);
    let known: Vec<QueueId> = queues.iter().map(|(_, id)| *id).collect();

    let Replayed {
        liveness,
        items,
        leased,
        buried,
        dead,
        max_id,
        first_seq,
        last_seq,
        newly_bad,
        gaps,
    } = replay(trees.log.iter(), &known, mark.as_ref())?;

    let mut known_absent = trees::load_missing(&trees.meta)?;
    for key in trees.quarantine.iter().keys() {
        if let Some(seq) = seq_of(&key?) {
            known_absent.push(seq..=seq);
        }
    }
    let missing = without(gaps, &known_absent);
    let mut salvaged = Vec::new();
    if let (false, Some(mark)) = (missing.is_empty(), &mark) {
        let mut untrusted: Vec<&MarkedQueue> = Vec::new();
        for range in &missing {
            for q in mark.queues_touched_by(range) {
                if !untrusted.iter().any(|u| u.id == q.id) {
                    untrusted.push(q);
                }
            }
        }
        untrusted.sort_by_key(|q| q.id);
        if !opening.salvage {
            return Err(Error::MissingRecords {
                path: opening.dir.to_path_buf(),
                missing,
                queues: untrusted.iter().map(|q| q.name.clone()).collect(),
            });
        }
        for range in &missing {
            let ids: Vec<QueueId> = mark.queues_touched_by(range).iter().map(|q| q.id).collect();
            salvaged.push((range.clone(), ids));
        }
    }

    // The checks passed: from here on the store may be changed.
    let mut changed = false;
    if fresh {
        trees::check_format(&trees.meta, true)?;
    } else {
        changed |= trees::upgrade_format(&trees.meta)?;
    }
    for q in &restored {
        tracing::warn!(queue = %q.name, id = q.id, "restoring a queue missing from the catalog");
        trees::create_queue(&trees.meta, &q.name, q.id)?;
    }
    for (range, ids) in &salvaged {
        tracing::error!(
            first = range.start(),
            last = range.end(),
            "records missing from the log; fencing the queues they may have touched"
        );
        let bad = BadRecord {
            seq: *range.start(),
            queues: Some(ids.clone()),
            reason: format!(
                "log records {}..={} are missing (found at a salvaging open)",
                range.start(),
                range.end()
            ),
        };
        for &id in ids {
            trees::add_fence(&trees.meta, id, &bad)?;
        }
        trees::add_missing(&trees.meta, range)?;
    }
    if changed || !restored.is_empty() || !salvaged.is_empty() {
        trees.db.flush()?;
        disk.sync_flushed()?;
    }
    set_aside(trees, disk, &known, newly_bad)?;

    let mut delayed: HashMap<QueueId, Vec<Entry>> = HashMap::new();
    let mut dead_letters: HashMap<QueueId, Vec<DeadSlot>> = HashMap::new();
    for (queue, mut slots) in buried.0 {
        slots.retain(|s| !dead.contains(&s.entry.id));
        slots.sort_by_key(|s| s.entry.id);
        slots.dedup_by_key(|s| s.entry.id);
        if !slots.is_empty() {
            dead_letters.insert(queue, slots);
        }
    }
    let mut items: HashMap<QueueId, VecDeque<Entry>> = items
        .0
        .into_iter()
        .map(|(queue, mut entries)| {
            if !dead.is_empty() {
                entries.retain(|e| !dead.contains(&e.id));
            }
            if entries.iter().any(|e| e.not_before() > opening.now) {
                let (later, now): (Vec<Entry>, Vec<Entry>) = entries
                    .into_iter()
                    .partition(|e| e.not_before() > opening.now);
                delayed.insert(queue, later);
                entries = now;
            }
            // Commit groups come in id order; only items moved by compaction interleave.
            if !entries.is_sorted_by_key(|e| e.id) {
                entries.sort_by_key(|e| e.id);
            }
            entries.dedup_by_key(|e| e.id);
            // Items whose leases the restart ended go back at the head, as after an abort
            // (P2): before the items that were merely queued, in lease (id) order.
            if !leased.is_empty() && entries.iter().any(|e| leased.contains(&e.id)) {
                let (ended, queued): (Vec<Entry>, Vec<Entry>) =
                    entries.into_iter().partition(|e| leased.contains(&e.id));
                entries = ended;
                entries.extend(queued);
            }
            entries.shrink_to_fit();
            (queue, VecDeque::from(entries))
        })
        .collect();

    // The highest sequence number ever set aside. Not simply the last key: a key that is not
    // a sequence number (set aside as such) may sort after every real one.
    // A set-aside key past `MAX_NUMBER` was set aside for that very reason: it is no number
    // the store counts from.
    let mut last_quarantined = None;
    for key in trees.quarantine.iter().keys() {
        last_quarantined = last_quarantined.max(seq_of(&key?).filter(|s| *s <= MAX_NUMBER));
    }
    let next_seq = match last_seq.max(last_quarantined) {
        Some(last) => {
            debug_assert!(
                last <= MAX_NUMBER,
                "replay keeps no sequence number past the limit"
            );
            last + 1
        }
        None => 0,
    };
    let mut all_bad = Vec::new();
    for kv in trees.quarantine.iter() {
        let (k, v) = kv?;
        // `u64::MAX` stands for a key that is not a sequence number (see `BadRecord::seq`).
        let seq = seq_of(&k).unwrap_or(u64::MAX);
        let (queues, reason) = match seq_of(&k).map(|_| record::decode(&v)) {
            Some(Err(e)) => (e.queues, number_refused(seq).unwrap_or(e.reason)),
            Some(Ok(rec)) => {
                let reason = refused(seq, &rec, &known)
                    .unwrap_or_else(|| "names a queue missing from the catalog".to_owned());
                (Some(rec.queues), reason)
            }
            None => (None, "key is not a sequence number".to_owned()),
        };
        all_bad.push(BadRecord {
            seq,
            queues,
            reason,
        });
    }
    // The new mark: what the log holds now. A queue the old mark did not know was created
    // after it was written, so after every record it covered.
    let first_new = mark.as_ref().map_or(0, |m| m.end);
    let mark_queues = queues
        .iter()
        .map(|(name, id)| MarkedQueue {
            id: *id,
            name: name.clone(),
            first_seq: mark
                .iter()
                .flat_map(|m| &m.queues)
                .find(|q| q.id == *id && q.name == *name)
                .map_or(first_new, |q| q.first_seq),
        })
        .collect();
    let new_mark = Mark {
        start: first_seq.unwrap_or(next_seq).min(next_seq),
        end: next_seq,
        queues: mark_queues,
    };
    let queues = queues
        .into_iter()
        .map(|(name, id)| {
            let entries = items.remove(&id).unwrap_or_default();
            (name, id, entries)
        })
        .collect();
    Ok(Recovered {
        queues,
        delayed,
        dead_letters,
        log: LogState {
            liveness,
            next_id: match max_id {
                Some(max) => {
                    debug_assert!(max <= MAX_NUMBER, "replay keeps no id past the limit");
                    max + 1
                }
                None => 0,
            },
            next_seq,
        },
        set_aside: all_bad,
        fences: trees::load_fences(&trees.meta)?,
        missing: trees::load_missing(&trees.meta)?,
        mark: new_mark,
        mark_counter,
    })
}

/// The mark to check the log against, and the counter of its slot: none for a new store or
/// one written before marks were kept. A marks file that is missing although the store kept
/// one, or unreadable, is [`Error::Damaged`] unless salvaging (then the log is taken as it
/// is).
fn checked_mark(trees: &Trees, opening: &Opening<'_>) -> Result<(Option<Mark>, u64)> {
    let path = opening.dir.join(marks::FILE);
    let problem = match &opening.found {
        Found::Mark { mark, counter } => return Ok((Some(mark.clone()), *counter)),
        Found::Absent if !trees::keeps_marks(&trees.meta)? => return Ok((None, 0)),
        Found::Absent => "missing, though the store keeps one".to_owned(),
        Found::Unreadable { detail } => detail.clone(),
    };
    if opening.salvage {
        tracing::error!(
            ?path,
            problem = %problem,
            "the store's mark is lost; salvaging: taking the log as it is, unchecked"
        );
        return Ok((None, 0));
    }
    Err(Error::Damaged {
        path,
        detail: format!(
            "{problem}; without it the log cannot be checked for lost records (open with \
             Builder::salvage(true) to take the log as it is)"
        ),
    })
}

/// `gaps` without the sequence numbers in `known`: records set aside (in the quarantine
/// tree) or found missing by an earlier salvaging open, absent but not lost now.
fn without(
    gaps: Vec<RangeInclusive<u64>>,
    known: &[RangeInclusive<u64>],
) -> Vec<RangeInclusive<u64>> {
    let mut known = known.to_vec();
    known.sort_by_key(|r| *r.start());
    let mut out = Vec::new();
    for gap in gaps {
        let (mut from, end) = (*gap.start(), *gap.end());
        let mut covered = false;
        for k in &known {
            if *k.start() > end || *k.end() < from {
                continue;
            }
            if *k.start() > from {
                out.push(from..=*k.start() - 1);
            }
            if *k.end() >= end {
                covered = true;
                break;
            }
            from = from.max(*k.end() + 1);
        }
        if !covered {
            out.push(from..=end);
        }
    }
    out
}

/// Sequence numbers of `start .. end` (a mark's) absent from the log, found as the log's keys
/// go by in order.
#[derive(Debug)]
struct Gaps {
    next: u64,
    end: u64,
    found: Vec<RangeInclusive<u64>>,
}

impl Gaps {
    fn new(mark: Option<&Mark>) -> Self {
        let (next, end) = mark.map_or((0, 0), |m| (m.start, m.end));
        Gaps {
            next,
            end,
            found: Vec::new(),
        }
    }

    fn see(&mut self, seq: u64) {
        if seq < self.next || self.next >= self.end {
            return;
        }
        if seq > self.next {
            self.found.push(self.next..=(seq.min(self.end) - 1));
        }
        debug_assert!(
            seq <= MAX_NUMBER,
            "replay sees no sequence number past the limit"
        );
        self.next = seq + 1;
    }

    fn finish(mut self) -> Vec<RangeInclusive<u64>> {
        if self.next < self.end {
            self.found.push(self.next..=self.end - 1);
        }
        self.found
    }
}

/// Why a record at sequence number `seq` cannot be replayed although it decodes: it names a
/// queue missing from the catalog (`known`), or its sequence number or an id is past
/// [`MAX_NUMBER`].
fn refused(seq: u64, rec: &record::Record<'_>, known: &[QueueId]) -> Option<String> {
    if let Some(reason) = number_refused(seq) {
        return Some(reason);
    }
    if let Some(q) = rec.queues.iter().find(|q| !known.contains(q)) {
        return Some(format!("names queue id {q}, missing from the catalog"));
    }
    let mut ids = rec
        .ops
        .iter()
        .flat_map(|op| op.new_id().into_iter().chain(op.ended_id()));
    if let Some(id) = ids.find(|id| *id > MAX_NUMBER) {
        return Some(format!(
            "names item id {id}, past {MAX_NUMBER}, the largest id a store gives out"
        ));
    }
    // `next_id` is one past the ids given out: at most one past the largest.
    match rec.next_id {
        Some(next) if next > MAX_NUMBER + 1 => Some(format!(
            "says ids up to {next} were given out, past {MAX_NUMBER}, the largest id a store \
             gives out"
        )),
        _ => None,
    }
}

/// Why sequence number `seq` is not one a store gives out, if it is not.
fn number_refused(seq: u64) -> Option<String> {
    (seq > MAX_NUMBER).then(|| {
        format!("sequence number {seq} is past {MAX_NUMBER}, the largest a store gives out")
    })
}

/// What replaying the log produced.
struct Replayed {
    liveness: Liveness,
    items: PerQueue<Entry>,
    /// Ids of live items whose current version a lease wrote (`Lease`, or its copy by
    /// compaction): the restart ended those leases.
    leased: HashSet<u64>,
    /// Dead letters (some may be ended later in the log: see `dead`).
    buried: PerQueue<DeadSlot>,
    dead: HashSet<u64>,
    max_id: Option<u64>,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    newly_bad: Vec<Bad>,
    /// Records of the mark's range absent from the log.
    gaps: Vec<RangeInclusive<u64>>,
}

/// Replays records, in key order, noting the records of `mark`'s range that are absent.
fn replay(
    records: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    known: &[QueueId],
    mark: Option<&Mark>,
) -> Result<Replayed> {
    let mut gaps = Gaps::new(mark);
    let mut first_seq: Option<u64> = None;
    let mut liveness = Liveness::default();
    let mut items = PerQueue::default();
    let mut leased: HashSet<u64> = HashSet::new();
    let mut buried = PerQueue::default();
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
        if let Some(reason) = number_refused(seq) {
            // Not a number the store gives out, so neither a gap nor the log's end.
            let queues = match record::decode(&value) {
                Ok(rec) => Some(rec.queues),
                Err(damage) => damage.queues,
            };
            let bad = BadRecord {
                seq,
                queues,
                reason,
            };
            newly_bad.push((key, value, bad));
            continue;
        }
        gaps.see(seq);
        first_seq = first_seq.or(Some(seq));
        last_seq = Some(seq);
        let rec = match record::decode(&value) {
            Ok(rec) => rec,
            Err(damage) => {
                newly_bad.push((key.clone(), value.clone(), damage.at(seq)));
                continue;
            }
        };
        if let Some(reason) = refused(seq, &rec, known) {
            let bad = BadRecord {
                seq,
                queues: Some(rec.queues.clone()),
                reason,
            };
            newly_bad.push((key.clone(), value.clone(), bad));
            continue;
        }
        ids.clear();
        for op in &rec.ops {
            max_id = max_id.max(op.new_id()).max(op.ended_id());
            if let Some(id) = op.new_id() {
                ids.push(id);
            }
        }
        let time = rec.time.unwrap_or(0);
        // Ids below a record's `next_id` were given out, even if no record names them now.
        max_id = max_id.max(rec.next_id.and_then(|n| n.checked_sub(1)));
        // Lossless: a `usize` is at most 64 bits on every target Rust supports.
        let bytes = u64::try_from(value.len()).unwrap_or(u64::MAX);
        let first = ids.first().copied();
        // No overflow: every id is at most `MAX_NUMBER` (checked above), and a record holds
        // fewer than 2^32 ops.
        let contiguous = ids.iter().zip(first.unwrap_or(0)..).all(|(&id, n)| id == n);
        match first {
            Some(first) if contiguous && liveness.fits_as_range(first) => {
                let end = first + u64::try_from(ids.len()).unwrap_or(u64::MAX);
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
            if let Some(id) = op.ended_id() {
                if liveness.ack(id) {
                    dead.insert(id);
                }
                leased.remove(&id);
            }
            match op {
                Op::Enqueue {
                    queue,
                    id,
                    attempts,
                    not_before,
                    bytes,
                } => items.push(
                    queue,
                    Entry::with(
                        id,
                        bytes.0.into(),
                        time,
                        Meta {
                            attempts,
                            not_before,
                            ..Meta::default()
                        },
                    ),
                ),
                Op::Lease(v) => {
                    leased.insert(v.id);
                    items.push(v.queue, entry_of(&v, true));
                }
                Op::Retry(v)
                | Op::Replay(v)
                | Op::Keyed(v)
                | Op::Moved(v @ Version { reason: None, .. }) => {
                    items.push(v.queue, entry_of(&v, true));
                }
                Op::Bury(v) | Op::Moved(v) => buried.push(
                    v.queue,
                    DeadSlot {
                        entry: entry_of(&v, false),
                        reason: v.reason.unwrap_or_default().to_owned(),
                        has_bytes: false,
                    },
                ),
                Op::Ack { .. } | Op::Purge { .. } => {}
            }
        }
    }

    Ok(Replayed {
        liveness,
        items,
        leased,
        buried,
        dead,
        max_id,
        first_seq,
        last_seq,
        newly_bad,
        gaps: gaps.finish(),
    })
}

/// The item a version op describes; its bytes only when `with_bytes` (a dead letter's stay
/// in the log).
fn entry_of(v: &Version<'_>, with_bytes: bool) -> Entry {
    Entry::with(
        v.id,
        if with_bytes {
            v.bytes.0.into()
        } else {
            Box::default()
        },
        v.enqueued_at,
        Meta {
            attempts: v.attempts,
            not_before: v.not_before,
            first_attempt: v.first_attempt,
            last_attempt: v.last_attempt,
            key: v.key.map(|k| k.0.into()),
        },
    )
}

/// Replayed items, per queue, in log order.
#[derive(Debug)]
struct PerQueue<T>(Vec<(QueueId, Vec<T>)>);

impl<T> Default for PerQueue<T> {
    fn default() -> Self {
        PerQueue(Vec::new())
    }
}

impl<T> PerQueue<T> {
    fn push(&mut self, queue: QueueId, entry: T) {
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
    disk.sync_flushed()?;
    for (key, ..) in bad {
        trees.log.remove(key)?;
    }
    trees.db.flush()?;
    disk.sync_flushed()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use record::{Bytes, RecordBuilder};

    fn enqueue(id: u64, next_id: u64) -> Vec<u8> {
        let mut b = RecordBuilder::default();
        b.push(&Op::Enqueue {
            queue: 0,
            id,
            attempts: 0,
            not_before: 0,
            bytes: Bytes(b"\x01x"),
        })
        .unwrap();
        b.finish(1, next_id).unwrap()
    }

    fn replayed(records: Vec<(u64, Vec<u8>)>) -> Replayed {
        let kvs = records
            .into_iter()
            .map(|(seq, v)| Ok((sled::IVec::from(&seq.to_be_bytes()[..]), v.into())));
        replay(kvs, &[0], None).unwrap()
    }

    #[test]
    fn numbers_past_the_limit_are_set_aside_and_leave_room_to_count() {
        let r = replayed(vec![
            (0, enqueue(0, 1)),
            (1, enqueue(MAX_NUMBER + 1, MAX_NUMBER + 2)),
            (2, enqueue(1, MAX_NUMBER + 2)),
            (3, enqueue(MAX_NUMBER, MAX_NUMBER + 1)),
            (MAX_NUMBER + 1, enqueue(2, 3)),
        ]);
        let bad: Vec<(u64, Option<Vec<QueueId>>)> = r
            .newly_bad
            .iter()
            .map(|(_, _, b)| (b.seq, b.queues.clone()))
            .collect();
        assert_eq!(
            bad,
            [
                (1, Some(vec![0])),
                (2, Some(vec![0])),
                (MAX_NUMBER + 1, Some(vec![0]))
            ]
        );
        assert!(
            r.newly_bad[0].2.reason.contains("item id"),
            "{:?}",
            r.newly_bad[0].2
        );
        assert!(
            r.newly_bad[1].2.reason.contains("given out"),
            "{:?}",
            r.newly_bad[1].2
        );
        assert!(
            r.newly_bad[2].2.reason.contains("sequence number"),
            "{:?}",
            r.newly_bad[2].2
        );
        // The largest id and sequence number a store gives out are still taken.
        assert_eq!((r.max_id, r.last_seq), (Some(MAX_NUMBER), Some(3)));
        assert_eq!(r.liveness.groups(), 2);
    }
}
