//! Which items of which commit group are still live: the committer's authoritative view,
//! rebuilt by recovery, used by compaction.
//!
//! A group made by a commit holds a contiguous run of fresh ids (`first .. first + len`), so
//! an id finds its group by binary search and costs one bit of memory. A group written by
//! compaction holds items moved from older groups (old, scattered ids); those few ids are
//! indexed in `moved`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;

/// Lossless: a `usize` is at most 64 bits on every target Rust supports.
fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A position in a group or a group's length: below 2^32 (a record counts its ops in a
/// `u32`), so lossless on the 32- and 64-bit targets this crate supports.
fn as_usize(n: u64) -> usize {
    debug_assert!(
        u32::try_from(n).is_ok(),
        "a group holds fewer than 2^32 items"
    );
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A fixed-size set of live positions.
#[derive(Debug)]
struct Bits {
    words: Box<[u64]>,
    live: u32,
}

impl Bits {
    fn all(len: usize) -> Self {
        let mut words = vec![u64::MAX; len.div_ceil(64)].into_boxed_slice();
        if !len.is_multiple_of(64) {
            if let Some(last) = words.last_mut() {
                *last = (1u64 << (len % 64)) - 1;
            }
        }
        debug_assert!(
            u32::try_from(len).is_ok(),
            "a group holds fewer than 2^32 items (a record counts its ops in a u32)"
        );
        Bits {
            words,
            live: u32::try_from(len).unwrap_or(u32::MAX),
        }
    }

    /// Clears `index`; true if it was set.
    fn clear(&mut self, index: usize) -> bool {
        let Some(word) = self.words.get_mut(index / 64) else {
            return false;
        };
        let mask = 1u64 << (index % 64);
        let was = *word & mask != 0;
        *word &= !mask;
        if was {
            debug_assert!(self.live > 0, "a group's live count covers its set bits");
            self.live -= 1;
        }
        was
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            (0..64)
                .filter(move |b| word & (1u64 << b) != 0)
                .map(move |b| w * 64 + b)
        })
    }
}

#[derive(Debug)]
struct RangeGroup {
    seq: u64,
    first: u64,
    len: u64,
    bytes: u64,
    bits: Bits,
}

#[derive(Debug)]
struct ListGroup {
    ids: Box<[u64]>,
    bytes: u64,
    bits: Bits,
}

/// What compaction needs to know of the oldest group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Front {
    pub(crate) seq: u64,
    pub(crate) live: u32,
    /// Is it also the newest group? (The newest group is never deleted: it carries the
    /// highest sequence number and ids forward.)
    pub(crate) is_last: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// Commit groups, oldest first; `first` ascends with `seq`.
    ranges: VecDeque<RangeGroup>,
    /// Compaction groups, by sequence number.
    lists: BTreeMap<u64, ListGroup>,
    /// id -> sequence number of the compaction group holding it.
    moved: HashMap<u64, u64>,
    log_bytes: u64,
    /// Estimate of the log bytes the live items take: each group's bytes spread evenly over
    /// its items.
    live_bytes: u64,
    /// Highest id ever added, so recovery can tell a commit group from a compaction group.
    range_end: u64,
}

fn per_item(bytes: u64, len: u64) -> u64 {
    bytes.checked_div(len).unwrap_or(0)
}

impl Liveness {
    /// Total size of the records of all groups.
    pub(crate) fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// Estimated log bytes held by live items.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Number of groups in the log.
    pub(crate) fn groups(&self) -> usize {
        self.ranges.len() + self.lists.len()
    }

    /// The id a commit group added now would have to start at or above.
    pub(crate) fn range_end(&self) -> u64 {
        self.range_end
    }

    /// Can `first .. first + len` be added as a commit group after the existing ones?
    pub(crate) fn fits_as_range(&self, first: u64) -> bool {
        first >= self.range_end
    }

    /// Adds record `seq`, of `bytes` bytes, whose items have the ids `ids`, all live.
    pub(crate) fn add_range(&mut self, seq: u64, ids: Range<u64>, bytes: u64) {
        debug_assert!(
            ids.start >= self.range_end,
            "ids increase from record to record"
        );
        debug_assert!(ids.start <= ids.end, "a record's id range is not reversed");
        self.check_new_seq(seq);
        let len = ids.end.saturating_sub(ids.start);
        self.ranges.push_back(RangeGroup {
            seq,
            first: ids.start,
            len,
            bytes,
            bits: Bits::all(as_usize(len)),
        });
        self.range_end = self.range_end.max(ids.end);
        self.log_bytes += bytes;
        self.live_bytes += per_item(bytes, len) * len;
        self.check();
    }

    /// Checks that a group added now has a sequence number above every group's: records are
    /// added in log order, and compaction writes its copy under a fresh one.
    fn check_new_seq(&self, seq: u64) {
        debug_assert!(
            self.ranges.back().is_none_or(|g| g.seq < seq)
                && self.lists.last_key_value().is_none_or(|(s, _)| *s < seq),
            "record sequence numbers increase (record {seq} added after a later one)"
        );
    }

    /// Checks the byte accounting: live items never take more than the log holds.
    fn check(&self) {
        debug_assert!(
            self.live_bytes <= self.log_bytes,
            "live bytes {} over log bytes {}",
            self.live_bytes,
            self.log_bytes
        );
    }

    /// Adds a group holding `ids` (ascending), all live.
    pub(crate) fn add_list(&mut self, seq: u64, ids: Vec<u64>, bytes: u64) {
        debug_assert!(ids.is_sorted(), "a moved group's ids are sorted");
        self.check_new_seq(seq);
        let len = as_u64(ids.len());
        for &id in &ids {
            self.moved.insert(id, seq);
        }
        self.lists.insert(
            seq,
            ListGroup {
                bits: Bits::all(ids.len()),
                ids: ids.into_boxed_slice(),
                bytes,
            },
        );
        self.log_bytes += bytes;
        self.live_bytes += per_item(bytes, len) * len;
        self.check();
    }

    /// Marks `id` acknowledged. False for an id that is not live (unknown, or acknowledged
    /// before).
    pub(crate) fn ack(&mut self, id: u64) -> bool {
        let (bytes, len, cleared) = if let Some(seq) = self.moved.remove(&id) {
            let Some(group) = self.lists.get_mut(&seq) else {
                return false;
            };
            let Ok(index) = group.ids.binary_search(&id) else {
                return false;
            };
            (
                group.bytes,
                as_u64(group.ids.len()),
                group.bits.clear(index),
            )
        } else {
            let Some(at) = self
                .ranges
                .partition_point(|g| g.first <= id)
                .checked_sub(1)
            else {
                return false;
            };
            let Some(group) = self.ranges.get_mut(at) else {
                return false;
            };
            let offset = id - group.first;
            let cleared = offset < group.len && group.bits.clear(as_usize(offset));
            (group.bytes, group.len, cleared)
        };
        if cleared {
            let freed = per_item(bytes, len);
            debug_assert!(
                self.live_bytes >= freed,
                "live bytes count every live item's share"
            );
            self.live_bytes = self.live_bytes.saturating_sub(freed);
            self.check();
        }
        cleared
    }

    /// The sequence number of the record holding live item `id`.
    pub(crate) fn seq_of(&self, id: u64) -> Option<u64> {
        if let Some(&seq) = self.moved.get(&id) {
            return Some(seq);
        }
        let at = self
            .ranges
            .partition_point(|g| g.first <= id)
            .checked_sub(1)?;
        let group = self.ranges.get(at)?;
        (id - group.first < group.len).then_some(group.seq)
    }

    /// The oldest group.
    pub(crate) fn front(&self) -> Option<Front> {
        let range = self.ranges.front().map(|g| (g.seq, g.bits.live));
        let list = self.lists.first_key_value().map(|(s, g)| (*s, g.bits.live));
        let (seq, live) = match (range, list) {
            (Some(r), Some(l)) => r.min(l),
            (r, l) => r.or(l)?,
        };
        Some(Front {
            seq,
            live,
            is_last: self.groups() == 1,
        })
    }

    /// One past the groups, from the oldest at or after `from`, that compaction would delete
    /// or rewrite if it could: groups whose items are all acknowledged, then groups with
    /// live items while their live bytes fit in `rewrite_budget`. Never past the newest
    /// group, which is never deleted. At least `from`.
    pub(crate) fn compactable_end(&self, from: u64, mut rewrite_budget: u64) -> u64 {
        let last = self
            .ranges
            .back()
            .map(|g| g.seq)
            .max(self.lists.last_key_value().map(|(s, _)| *s));
        let first_range = self.ranges.partition_point(|g| g.seq < from);
        let mut ranges = self
            .ranges
            .range(first_range..)
            .map(|g| {
                let live = u64::from(g.bits.live);
                // At most `g.bytes`: `live <= len`; saturating only for that reason.
                (g.seq, live, per_item(g.bytes, g.len).saturating_mul(live))
            })
            .peekable();
        let mut lists = self
            .lists
            .range(from..)
            .map(|(seq, g)| {
                let live = u64::from(g.bits.live);
                let len = as_u64(g.ids.len());
                (*seq, live, per_item(g.bytes, len).saturating_mul(live))
            })
            .peekable();
        let mut end = from;
        loop {
            let take_range = match (ranges.peek(), lists.peek()) {
                (Some(r), Some(l)) => r.0 < l.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let next = if take_range {
                ranges.next()
            } else {
                lists.next()
            };
            let Some((seq, live, live_bytes)) = next else {
                break;
            };
            if Some(seq) == last {
                break;
            }
            if live > 0 {
                if live_bytes > rewrite_budget {
                    break;
                }
                rewrite_budget -= live_bytes;
            }
            // Below `last`, so below `u64::MAX`.
            end = seq + 1;
        }
        end
    }

    /// The ids still live in the oldest group, ascending.
    pub(crate) fn front_live(&self) -> Vec<u64> {
        let Some(front) = self.front() else {
            return Vec::new();
        };
        match self.ranges.front() {
            Some(g) if g.seq == front.seq => g.bits.iter().map(|i| g.first + as_u64(i)).collect(),
            _ => match self.lists.get(&front.seq) {
                Some(g) => g.bits.iter().map(|i| g.ids[i]).collect(),
                None => Vec::new(),
            },
        }
    }

    /// Removes the oldest group (deleted from the log, or rewritten by compaction, which
    /// adds its live items again as a new group).
    pub(crate) fn pop_front(&mut self) {
        let Some(front) = self.front() else {
            return;
        };
        let (bytes, len, live) = if self.ranges.front().map(|g| g.seq) == Some(front.seq) {
            let Some(g) = self.ranges.pop_front() else {
                return;
            };
            (g.bytes, g.len, g.bits.live)
        } else {
            let Some(g) = self.lists.remove(&front.seq) else {
                return;
            };
            for i in g.bits.iter() {
                if let Some(id) = g.ids.get(i) {
                    self.moved.remove(id);
                }
            }
            (g.bytes, as_u64(g.ids.len()), g.bits.live)
        };
        let freed = per_item(bytes, len) * u64::from(live);
        debug_assert!(
            self.log_bytes >= bytes && self.live_bytes >= freed,
            "the log's byte counts include every group's"
        );
        self.log_bytes = self.log_bytes.saturating_sub(bytes);
        self.live_bytes = self.live_bytes.saturating_sub(freed);
        self.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_find_their_groups() {
        let mut l = Liveness::default();
        l.add_range(1, 0..3, 300);
        l.add_range(2, 3..3, 10); // ack-only group
        l.add_range(3, 3..5, 200);
        assert!(l.ack(4));
        assert!(!l.ack(4), "a second ack is not live");
        assert!(!l.ack(9), "unknown id");
        assert!(l.ack(0));
        assert_eq!(l.front().unwrap().live, 2);
        assert_eq!(l.front_live(), vec![1, 2]);
        l.pop_front();
        assert_eq!(l.front().unwrap().seq, 2);
        assert_eq!(l.front().unwrap().live, 0);
    }

    #[test]
    fn moved_items_are_tracked_in_their_new_group() {
        let mut l = Liveness::default();
        l.add_range(1, 0..100, 10_000);
        for id in 0..98 {
            assert!(l.ack(id));
        }
        let live = l.front_live();
        assert_eq!(live, vec![98, 99]);
        l.pop_front();
        l.add_range(2, 100..101, 100);
        l.add_list(3, live, 200);
        assert_eq!(l.front().unwrap().seq, 2);
        assert!(l.ack(99));
        assert!(!l.ack(99));
        assert_eq!(l.log_bytes(), 300);
        l.pop_front();
        assert_eq!(l.front_live(), vec![98]);
        l.pop_front();
        assert_eq!(l.groups(), 0);
        assert_eq!(l.live_bytes(), 0);
    }

    #[test]
    fn bits_cover_partial_words() {
        let mut b = Bits::all(70);
        assert_eq!(b.iter().count(), 70);
        assert!(b.clear(69));
        assert!(!b.clear(69));
        assert!(!b.clear(70));
        assert_eq!(b.live, 69);
    }
}
