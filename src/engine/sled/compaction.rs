//! Compaction: keeping the log proportional to the live backlog, not to history.
//!
//! After each group the committer deletes the fully acknowledged front of the log. When the
//! log has grown well past the live backlog (over the compaction floor and over twice the
//! live bytes), the few live items that pin the oldest record are rewritten into a new record
//! in the same atomic batch that deletes the old one. A round moves at most
//! [`REWRITE_BUDGET`] bytes, so no commit waits long behind it.
//!
//! Compaction deletes a record only below the mark's durable `start` (see `marks`): it asks
//! the mark to move first, and deletes once the marker has written that in both of its
//! copies. So the oldest records of a log can be told lost from deleted.

use super::committer::Committer;
use super::record::{self, Op, Version};
use crate::error::{Error, Result};

/// The most live bytes one compaction round moves.
const REWRITE_BUDGET: u64 = 4 << 20;

impl Committer {
    /// Deletes the fully acknowledged front of the log, and moves the few live items that
    /// pin an old record to a new one when the log has grown well past the live backlog.
    pub(super) fn compact(&mut self) {
        if self.failed.is_some() || self.compaction_stopped {
            return;
        }
        debug_assert!(
            self.delete_below <= self.next_seq,
            "compaction may delete only records written (the mark's start is below its end)"
        );
        let mut batch = sled::Batch::default();
        let mut changed = false;
        let mut moved_bytes = 0;
        let (mut deleted, mut rewritten) = (0u64, 0u64);
        while let Some(front) = self.liveness.front() {
            if front.is_last || front.seq >= self.delete_below {
                break;
            }
            if front.live == 0 {
                batch.remove(&front.seq.to_be_bytes()[..]);
                self.liveness.pop_front();
                changed = true;
                deleted += 1;
                continue;
            }
            let log = self.liveness.log_bytes();
            let crowded = log > self.compaction_floor && log > 2 * self.liveness.live_bytes();
            if !crowded || moved_bytes >= REWRITE_BUDGET {
                break;
            }
            match self.rewrite_front(front.seq, &mut batch) {
                Ok(bytes) => {
                    // Lossless: a `usize` is at most 64 bits on every target Rust supports.
                    moved_bytes += u64::try_from(bytes).unwrap_or(u64::MAX);
                    changed = true;
                    rewritten += 1;
                }
                Err(e) => {
                    tracing::error!(seq = front.seq, error = %e, "compaction stopped: a record cannot be read");
                    self.compaction_stopped = true;
                    break;
                }
            }
        }
        self.want_start(false);
        if changed {
            // Only a round that did something is traced (one runs after every group): at
            // DEBUG when it moved live items, at TRACE when it only deleted settled records.
            let span = tracing::debug_span!(
                "compaction",
                deleted,
                rewritten,
                moved_bytes,
                log_bytes = self.liveness.log_bytes(),
                live_bytes = self.liveness.live_bytes()
            );
            let _entered = span.enter();
            if rewritten > 0 {
                tracing::debug!("compaction moved live items forward");
            } else {
                tracing::trace!("compaction deleted settled records");
            }
            // The batch becomes durable with the next flush, which syncs any blob file it
            // made as well.
            let applied = self
                .storage
                .trees
                .log
                .apply_batch(batch)
                .map_err(Error::from);
            if let Err(e) = applied {
                tracing::error!(error = %e, "compaction failed; the store stops writing");
                self.stop(&e);
            }
        }
    }

    /// Asks the mark's `start` to move past what compaction would do next (the mark takes it
    /// with the next durable group). Crowded logs get one round's rewrite budget at a time,
    /// once compaction has caught up with what it was allowed.
    /// `closing`: no need to wait for the last permission to be used first.
    pub(super) fn want_start(&mut self, closing: bool) {
        let Some(front) = self.liveness.front() else {
            return;
        };
        let log = self.liveness.log_bytes();
        let crowded = log > self.compaction_floor && log > 2 * self.liveness.live_bytes();
        let budget = if crowded && (closing || self.wanted_start <= self.delete_below) {
            REWRITE_BUDGET
        } else {
            0
        };
        let from = front.seq.max(self.wanted_start);
        let wanted = self.liveness.compactable_end(from, budget);
        self.wanted_start = self.wanted_start.max(wanted);
    }

    /// Copies the live items of the front record into a new record and queues the old one's
    /// deletion, both in `batch`. Returns the bytes written.
    fn rewrite_front(&mut self, seq: u64, batch: &mut sled::Batch) -> Result<usize> {
        let Some(raw) = self.storage.trees.log.get(seq.to_be_bytes())? else {
            return Err(Error::Bug {
                invariant: "a live record is in the log",
            });
        };
        let rec = record::decode(&raw).map_err(|damage| {
            Error::storage(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("record {seq}: {}", damage.reason),
            ))
        })?;
        let live = self.liveness.front_live();
        let mut kept = Vec::with_capacity(live.len());
        let time = rec.time.unwrap_or(0);
        for op in &rec.ops {
            let Some(id) = op.new_id() else { continue };
            if live.binary_search(&id).is_err() {
                continue;
            }
            // The copy stands on its own: it ends nothing, and keeps the enqueue time the
            // old record's header gave a plain enqueue.
            let copy = match op {
                Op::Enqueue {
                    queue,
                    id,
                    attempts,
                    not_before,
                    bytes,
                } => Op::Moved(Version {
                    queue: *queue,
                    from: None,
                    id: *id,
                    attempts: *attempts,
                    not_before: *not_before,
                    enqueued_at: time,
                    first_attempt: 0,
                    last_attempt: 0,
                    reason: None,
                    key: None,
                    bytes: *bytes,
                }),
                // A lease version stays a `Lease`, so that recovery still puts the item back
                // at the head when a restart ends its lease; as `Moved` it would come back in
                // id order, behind items that were merely queued.
                Op::Lease(v) => Op::Lease(Version {
                    from: None,
                    ..v.clone()
                }),
                Op::Retry(v) | Op::Replay(v) | Op::Moved(v) | Op::Keyed(v) => Op::Moved(Version {
                    from: None,
                    ..v.clone()
                }),
                Op::Bury(v) => Op::Bury(Version {
                    from: None,
                    ..v.clone()
                }),
                Op::Ack { .. } | Op::Purge { .. } => continue,
            };
            if let Err(e) = self.builder.push(&copy) {
                self.builder.reset();
                return Err(Error::storage(e));
            }
            kept.push(id);
        }
        kept.sort_unstable();
        if kept != live {
            self.builder.reset();
            return Err(Error::Bug {
                invariant: "a record holds every item the log counts as live in it",
            });
        }
        let record = self
            .builder
            .finish(self.timers_now(), self.next_id())
            .map_err(Error::storage)?;
        let bytes = record.len();
        let new_seq = self.next_seq;
        batch.insert(&new_seq.to_be_bytes()[..], record);
        batch.remove(&seq.to_be_bytes()[..]);
        self.next_seq += 1;
        self.liveness.pop_front();
        // Lossless: a `usize` is at most 64 bits on every target Rust supports.
        self.liveness
            .add_list(new_seq, kept, u64::try_from(bytes).unwrap_or(u64::MAX));
        Ok(bytes)
    }
}
