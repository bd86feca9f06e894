//! The embedded engines' catalog: queue names to their cores, fences and set-aside records.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::core::{Entry, QueueCore, QueueId, QueueTable};
use crate::error::{Error, Result};
use crate::sync::process::Mutex;

/// Longest queue name accepted, in bytes.
pub(crate) const MAX_NAME_LEN: usize = 1024;

/// A record of the log that failed its checksum or decode and was set aside at open.
///
/// The record's bytes are kept in the store's `quarantine` tree. The queues it names stay
/// fenced ([`Error::Fenced`] from [`Store::queue`](crate::Store::queue)) until
/// [`Store::unfence`](crate::Store::unfence) is called.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetAsideRecord {
    /// The record's sequence number (its key in the log).
    pub record: u64,
    /// The queues the record names; `None` when its header is unreadable (then every queue
    /// that existed at the time was fenced).
    pub queues: Option<Vec<String>>,
    /// What was wrong with it.
    pub reason: String,
}

/// A record found bad, now or at an earlier open: the one internal form of a bad record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRecord {
    /// Its sequence number (`u64::MAX` when its key is not one).
    pub(crate) seq: u64,
    /// Queue ids named by the record's header, if it was readable.
    pub(crate) queues: Option<Vec<QueueId>>,
    pub(crate) reason: String,
}

/// A queue fenced by a bad record.
pub(crate) type Fence = (QueueId, BadRecord);

#[derive(Debug, Default)]
struct Inner {
    queues: HashMap<String, Arc<QueueCore>>,
    next_id: QueueId,
    fences: Vec<Fence>,
    set_aside: Vec<BadRecord>,
    missing: Vec<std::ops::RangeInclusive<u64>>,
}

/// The queues of one open store: by name (under a lock), and in the [`QueueTable`] that a
/// transaction's work names them by (read without one).
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    inner: Mutex<Inner>,
    table: Arc<QueueTable>,
}

/// Checks the name of a queue to create: 1 to [`MAX_NAME_LEN`] bytes, no NUL character (the
/// same rule on every engine: PostgreSQL's text cannot hold a NUL, so no engine makes such a
/// name, and an export of any store imports into any other).
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains('\0') {
        return Err(Error::InvalidQueueName {
            name: name.chars().take(64).collect(),
            expected: "1 to 1024 bytes of UTF-8, without NUL characters",
        });
    }
    Ok(())
}

impl Catalog {
    /// A catalog of recovered queues (name, id, items in order), with the fences and
    /// set-aside records found on disk.
    pub(crate) fn recovered(
        queues: Vec<(String, QueueId, VecDeque<Entry>)>,
        fences: Vec<Fence>,
        set_aside: Vec<BadRecord>,
        missing: Vec<std::ops::RangeInclusive<u64>>,
    ) -> Self {
        // Saturating is meant: `QueueId::MAX` is never given out (see `open_queue`), so a
        // next id of `QueueId::MAX` says the ids are used up, and `open_queue` refuses it.
        let next_id = queues
            .iter()
            .map(|(_, id, _)| id.saturating_add(1))
            .max()
            .unwrap_or(0);
        let table = Arc::new(QueueTable::default());
        let queues = queues
            .into_iter()
            .map(|(name, id, items)| {
                let core =
                    table.add(|index| QueueCore::new(id, index, Arc::from(name.as_str()), items));
                (name, core)
            })
            .collect();
        Catalog {
            inner: Mutex::new(Inner {
                queues,
                next_id,
                fences,
                set_aside,
                missing,
            }),
            table,
        }
    }

    /// The store's queues by index.
    pub(crate) fn table(&self) -> &Arc<QueueTable> {
        &self.table
    }

    /// Finds queue `name`, or adds it with the next id after `record(id)` succeeds. Both run
    /// under the catalog's lock, so `record` is called in id order and before anyone else can
    /// see the new queue: an engine that logs the creation (and only submits it, without
    /// waiting) has it in its log before any commit that names the queue. A fenced queue is
    /// an error. The name of a new queue must pass [`check_name`]; one that exists already
    /// opens whatever its name (a store written before NUL characters were refused may have
    /// one: its items stay reachable).
    pub(crate) fn open_queue<R>(
        &self,
        name: &str,
        record: impl FnOnce(QueueId) -> Result<R>,
    ) -> Result<(Arc<QueueCore>, Option<R>)> {
        let mut inner = self.inner.lock();
        if let Some(core) = inner.queues.get(name) {
            if let Some((_, bad)) = inner.fences.iter().find(|(q, _)| *q == core.id()) {
                return Err(Error::Fenced {
                    queue: name.to_owned(),
                    record: bad.seq,
                    reason: bad.reason.clone(),
                });
            }
            return Ok((core.clone(), None));
        }
        check_name(name)?;
        let id = inner.next_id;
        // Ids are used up only by 2^32 - 1 queues created, or by a catalog read from disk
        // that names the largest one: a limit, not a bug.
        let next = id.checked_add(1).ok_or(Error::InvalidConfig {
            setting: "queues",
            expected: "at most 2^32 - 1 queues created over the store's life",
        })?;
        debug_assert!(
            inner.queues.values().all(|q| q.id() != id),
            "a new queue's id is no other queue's"
        );
        let recorded = record(id)?;
        // Under the catalog's lock: queues are added to the table one at a time.
        let core = self
            .table
            .add(|index| QueueCore::new(id, index, Arc::from(name), VecDeque::new()));
        inner.queues.insert(name.to_owned(), core.clone());
        inner.next_id = next;
        Ok((core, Some(recorded)))
    }

    /// Every queue's core.
    pub(crate) fn cores(&self) -> Vec<Arc<QueueCore>> {
        self.inner.lock().queues.values().cloned().collect()
    }

    /// Takes back queue `name` (id `id`) when its creation could not be recorded. Its id is
    /// not given out again.
    pub(crate) fn forget(&self, name: &str, id: QueueId) {
        let mut inner = self.inner.lock();
        if inner.queues.get(name).is_some_and(|q| q.id() == id) {
            inner.queues.remove(name);
        }
    }

    /// The id of queue `name`, if it exists.
    pub(crate) fn id_of(&self, name: &str) -> Option<QueueId> {
        self.inner.lock().queues.get(name).map(|q| q.id())
    }

    /// Lifts every fence of queue `id` (already recorded durably by the engine).
    pub(crate) fn remove_fences(&self, id: QueueId) {
        self.inner.lock().fences.retain(|(q, _)| *q != id);
    }

    /// Names of every queue, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner.lock().queues.keys().cloned().collect();
        names.sort();
        names
    }

    /// The set-aside records, with queue names.
    pub(crate) fn set_aside_records(&self) -> Vec<SetAsideRecord> {
        let inner = self.inner.lock();
        let name_of = |id: QueueId| {
            inner
                .queues
                .values()
                .find(|q| q.id() == id)
                .map_or_else(|| format!("#{id}"), |q| q.name().to_owned())
        };
        inner
            .set_aside
            .iter()
            .map(|bad| SetAsideRecord {
                record: bad.seq,
                queues: bad
                    .queues
                    .as_ref()
                    .map(|ids| ids.iter().map(|&id| name_of(id)).collect()),
                reason: bad.reason.clone(),
            })
            .collect()
    }

    /// Ranges of records found missing by a salvaging open, at this or an earlier open.
    pub(crate) fn missing_records(&self) -> Vec<std::ops::RangeInclusive<u64>> {
        self.inner.lock().missing.clone()
    }

    /// Closes every queue's core: waiting consumers are woken and find the store closed.
    pub(crate) fn close_queues(&self) {
        let queues: Vec<Arc<QueueCore>> = self.inner.lock().queues.values().cloned().collect();
        queues.iter().for_each(|q| q.close());
    }
}
