//! The memory engine: queues in the in-memory core only, nothing on disk.
//!
//! A commit applies in the committing thread: its items get ids from a counter and are
//! published to their queues; its dequeued entries are dropped.

use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::catalog::Catalog;
use super::processing::{apply, Timers};
use super::Work;
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
        let versions = work.moves.iter().filter(|m| m.makes_version()).count();
        let n = work.enqueues.len() + versions;
        if n > 0 || !work.moves.is_empty() {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            let first = self.next_id.fetch_add(n, Ordering::Relaxed);
            let now = timers.clock().now();
            let enqueued = u64::try_from(work.enqueues.len()).unwrap_or(u64::MAX);
            if enqueued > 0 {
                publish_all(std::mem::take(&mut work.enqueues), first, now);
            }
            let mut id = first + enqueued;
            for mv in work.moves.drain(..) {
                let takes_id = mv.makes_version();
                apply(mv, id, now, timers, false);
                id += u64::from(takes_id);
            }
        }
        work.release_held();
        work.release_keys();
        work.dequeued.clear();
        work.enqueued_bytes = 0;
    }
}
