//! The memory engine: queues in the in-memory core only, nothing on disk.
//!
//! A commit applies in the committing thread: its items get ids from a counter and are
//! published to their queues; its dequeued entries are dropped.

use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::catalog::Catalog;
use super::moves::apply;
use super::timers::Timers;
use super::work::Work;
use crate::core::{publish_all, QueueCore};
use crate::error::Result;
use crate::sync::process::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Memory {
    catalog: Catalog,
    /// The id of the next committed item; written by every commit, so on a line of its own.
    next_id: CachePadded<AtomicU64>,
}

impl Memory {
    pub(crate) fn new() -> Self {
        Memory::default()
    }

    /// Takes `n` ids for a commit's items and versions; returns the first.
    pub(crate) fn take_ids(&self, n: u64) -> u64 {
        self.next_id.fetch_add(n, Ordering::Relaxed)
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub(crate) fn queue(&self, name: &str) -> Result<Arc<QueueCore>> {
        self.catalog
            .open_queue(name, |_| Ok(()))
            .map(|(core, _)| core)
    }

    /// Applies a commit, leaving `work` empty: ids in commit order, items visible at once,
    /// then the processing-layer moves (prepared already: see `Engine::prepare_moves`).
    #[inline]
    pub(crate) fn commit(&self, work: &mut Work, timers: &Timers) {
        if work.moves.is_empty() {
            if !work.enqueues.is_empty() {
                let n = u64::try_from(work.enqueues.len()).unwrap_or(u64::MAX);
                let first = self.next_id.fetch_add(n, Ordering::Relaxed);
                // Plain items need the time only to report it (their enqueue time).
                let now = timers.clock().now_coarse();
                publish_all(
                    self.catalog.table(),
                    std::mem::take(&mut work.enqueues),
                    first,
                    now,
                );
            }
        } else {
            self.commit_moves(work, timers);
        }
        if !work.dequeued.is_empty() {
            work.settle_dequeued(self.catalog.table());
        }
        work.enqueued_bytes = 0;
    }

    /// The part of a commit with processing-layer moves: ids for the enqueues, then one for
    /// each new version, in that order.
    fn commit_moves(&self, work: &mut Work, timers: &Timers) {
        let versions = work.moves.iter().filter(|m| m.makes_version()).count();
        let n = u64::try_from(work.enqueues.len() + versions).unwrap_or(u64::MAX);
        let first = self.next_id.fetch_add(n, Ordering::Relaxed);
        let now = timers.clock().now();
        let enqueued = u64::try_from(work.enqueues.len()).unwrap_or(u64::MAX);
        if enqueued > 0 {
            publish_all(
                self.catalog.table(),
                std::mem::take(&mut work.enqueues),
                first,
                now,
            );
        }
        let mut id = first + enqueued;
        for mv in work.moves.drain(..) {
            let takes_id = mv.makes_version();
            apply(mv, id, now, timers, false);
            id += u64::from(takes_id);
        }
    }
}
