//! The committer: the one thread that writes the log.
//!
//! It takes every commit waiting in its channel (up to the group size), assigns the new items
//! their ids, writes the group as one record in one sled operation, flushes once under
//! `Durability::Sync`, then makes the enqueued items visible, marks the dequeued ones
//! acknowledged and answers every commit of the group. After each group it compacts the front
//! of the log a little. It owns the authoritative view of what is live ([`Liveness`]).

use std::sync::Arc;

use crossbeam_channel::Receiver;

use super::directory::{BlobFiles, DiskSync, BLOB_CANDIDATE};
use super::liveness::Liveness;
use super::record::{self, Bytes, Op, RecordBuilder};
use super::recovery::Trees;
use super::reply::Reply;
use crate::config::{Config, Durability};
use crate::core::{publish_all, restore_all, Enqueues, Held};
use crate::error::{Error, Result};
use crate::sync::process::Mutex;

/// Records larger than this are split: sled 0.34 stores a value over about 128 KiB as a file
/// of its own and reclaims its space late, while several values of this size in one batch
/// and one flush go to disk at close to the disk's sequential rate.
const PART_SIZE: usize = 64 << 10;

/// One record of a commit group: enqueues with ids `first .. first + len`, and acks.
#[derive(Debug)]
struct Part {
    record: Vec<u8>,
    first: u64,
    len: u64,
}

/// The most live bytes one compaction round moves, so no commit waits long behind it.
const REWRITE_BUDGET: u64 = 4 << 20;

/// A transaction on its way to the log.
#[derive(Debug)]
pub(crate) struct CommitRequest {
    /// Encoded items to add, in enqueue order.
    pub(crate) enqueues: Enqueues,
    /// Items the transaction dequeued; acknowledged on success, given back on failure.
    pub(crate) dequeued: Held,
    pub(crate) reply: Reply,
}

impl CommitRequest {
    /// Approximate bytes the request adds to a record.
    fn size(&self) -> usize {
        let items: usize = self.enqueues.iter().map(|(_, b)| b.len() + 24).sum();
        items + self.dequeued.len() * 12
    }

    /// Answers the request with a failure, giving its dequeued items back to their queues.
    pub(crate) fn fail(self, error: Error) {
        restore_all(self.dequeued);
        self.reply.send(Err(error));
    }
}

/// The committer's first storage failure, shared with the store's handles.
///
/// Once it is set nothing may touch sled again: after some failures sled 0.34 cannot make
/// anything stable any more (a failed blob write leaves a log buffer no flush can complete),
/// so a flush, including the one sled makes when its last handle is dropped, would wait
/// forever.
#[derive(Debug, Default)]
pub(crate) struct Failure(Mutex<Option<Error>>);

impl Failure {
    /// The failure, if the committer stopped on one.
    pub(crate) fn get(&self) -> Option<Error> {
        self.0.lock().clone()
    }

    fn set(&self, e: &Error) {
        self.0.lock().get_or_insert_with(|| e.clone());
    }
}

/// What the committer is asked to do.
#[derive(Debug)]
pub(crate) enum Message {
    Commit(CommitRequest),
    /// Flush everything written so far to disk, then reply.
    Flush(Reply),
}

#[derive(Debug)]
pub(crate) struct Committer {
    trees: Trees,
    disk: DiskSync,
    durability: Durability,
    group_size: usize,
    compaction_floor: u64,
    rx: Receiver<Message>,
    liveness: Liveness,
    next_id: u64,
    next_seq: u64,
    builder: RecordBuilder,
    /// Set by the first storage failure: sled stops accepting writes after one, so every
    /// later commit fails with the same error until the store is reopened.
    failed: Option<Error>,
    /// `failed`, as the store's handles see it.
    failure: Arc<Failure>,
    /// Set when compaction met a record it could not read; it then stops for this run.
    compaction_stopped: bool,
}

impl Committer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        trees: Trees,
        disk: DiskSync,
        config: &Config,
        rx: Receiver<Message>,
        liveness: Liveness,
        next_id: u64,
        next_seq: u64,
        failure: Arc<Failure>,
    ) -> Self {
        Committer {
            trees,
            disk,
            durability: config.durability,
            group_size: config.group_size,
            compaction_floor: config.compaction_floor,
            rx,
            liveness,
            next_id,
            next_seq,
            builder: RecordBuilder::default(),
            failed: None,
            failure,
            compaction_stopped: false,
        }
    }

    /// Serves commits until every sender is gone, then flushes.
    pub(crate) fn run(mut self) {
        let mut group = Vec::new();
        let mut flushes = Vec::new();
        while let Ok(first) = self.rx.recv() {
            let mut size = 0;
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Commit(req) => {
                        size += req.size();
                        group.push(req);
                    }
                    Message::Flush(reply) => flushes.push(reply),
                }
                if size < self.group_size {
                    next = self.rx.try_recv().ok();
                }
            }
            if !group.is_empty() {
                self.commit_group(std::mem::take(&mut group));
                self.compact();
            }
            for reply in flushes.drain(..) {
                reply.send(self.flush());
            }
        }
        if let Err(e) = self.flush() {
            tracing::error!(error = %e, "final flush of the store failed");
        }
    }

    fn flush(&self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.trees.db.flush()?;
        self.disk.sync_log()?;
        Ok(())
    }

    /// The blob files present now, if any of `sizes` may become one.
    fn blobs_before(&self, sizes: impl IntoIterator<Item = usize>) -> Result<Option<BlobFiles>> {
        if sizes.into_iter().any(|size| size >= BLOB_CANDIDATE) {
            Ok(Some(self.disk.blob_files()?))
        } else {
            Ok(None)
        }
    }

    /// Stops committing after a storage failure.
    fn stop(&mut self, e: &Error) {
        self.failure.set(e);
        self.failed = Some(e.clone());
    }

    fn commit_group(&mut self, group: Vec<CommitRequest>) {
        if let Some(e) = &self.failed {
            group.into_iter().for_each(|req| req.fail(e.clone()));
            return;
        }
        let first = self.next_id;
        let parts = match self.encode(&group, first) {
            Ok(parts) => parts,
            Err(e) => {
                // Only a bug can get here; fail the group, keep the store going.
                self.builder.reset();
                let e = Error::storage(e);
                group.into_iter().for_each(|req| req.fail(e.clone()));
                return;
            }
        };
        let seq = self.next_seq;
        let sizes: Vec<(u64, u64, u64)> = parts
            .iter()
            .map(|p| (p.first, p.len, p.record.len() as u64))
            .collect();
        let written = self
            .blobs_before(sizes.iter().map(|&(_, _, bytes)| bytes as usize))
            .and_then(|blobs| {
                self.write(seq, parts)?;
                if self.durability == Durability::Sync {
                    self.trees.db.flush()?;
                    self.disk.sync_log()?;
                }
                if let Some(before) = &blobs {
                    self.disk.sync_new_blobs(before)?;
                }
                Ok(())
            });
        if let Err(e) = written {
            tracing::error!(error = %e, seq, "writing a commit group failed; the store stops committing");
            self.stop(&e);
            group.into_iter().for_each(|req| req.fail(e.clone()));
            return;
        }
        for (i, &(first, len, bytes)) in sizes.iter().enumerate() {
            self.liveness.add_range(seq + i as u64, first, len, bytes);
            self.next_id = first + len;
        }
        self.next_seq += sizes.len() as u64;
        let mut id = first;
        for req in group {
            for (_, entry) in &req.dequeued {
                self.liveness.ack(entry.id);
            }
            let n = req.enqueues.len() as u64;
            publish_all(req.enqueues, id);
            id += n;
            drop(req.dequeued);
            req.reply.send(Ok(()));
        }
    }

    /// Writes the parts of a group under consecutive sequence numbers from `seq`, atomically.
    fn write(&self, seq: u64, parts: Vec<Part>) -> sled::Result<()> {
        if let [part] = &parts[..] {
            return self
                .trees
                .log
                .insert(seq.to_be_bytes(), &part.record[..])
                .map(drop);
        }
        let mut batch = sled::Batch::default();
        for (i, part) in parts.into_iter().enumerate() {
            batch.insert(&(seq + i as u64).to_be_bytes()[..], part.record);
        }
        self.trees.log.apply_batch(batch)
    }

    /// Encodes a group as one record, or as several when it is larger than [`PART_SIZE`].
    fn encode(
        &mut self,
        group: &[CommitRequest],
        first: u64,
    ) -> Result<Vec<Part>, postcard::Error> {
        let mut parts = Vec::new();
        let mut id = first;
        let mut part_first = first;
        for req in group {
            for (queue, bytes) in &req.enqueues {
                self.builder.push(&Op::Enqueue {
                    queue: queue.id(),
                    id,
                    attempts: 0,
                    not_before: 0,
                    bytes: Bytes(bytes),
                })?;
                id += 1;
                if self.builder.len() >= PART_SIZE {
                    parts.push(self.finish_part(part_first, id)?);
                    part_first = id;
                }
            }
            for (queue, entry) in &req.dequeued {
                self.builder.push(&Op::Ack {
                    queue: queue.id(),
                    id: entry.id,
                })?;
                if self.builder.len() >= PART_SIZE {
                    parts.push(self.finish_part(part_first, id)?);
                    part_first = id;
                }
            }
        }
        if !self.builder.is_empty() || parts.is_empty() {
            parts.push(self.finish_part(part_first, id)?);
        }
        Ok(parts)
    }

    fn finish_part(&mut self, first: u64, end: u64) -> Result<Part, postcard::Error> {
        Ok(Part {
            record: self.builder.finish()?,
            first,
            len: end - first,
        })
    }

    /// Deletes the fully acknowledged front of the log, and moves the few live items that
    /// pin an old group to a new group when the log has grown well past the live backlog.
    fn compact(&mut self) {
        if self.failed.is_some() || self.compaction_stopped {
            return;
        }
        let mut batch = sled::Batch::default();
        let mut changed = false;
        let mut moved_bytes = 0;
        let mut largest = 0;
        while let Some(front) = self.liveness.front() {
            if front.is_last {
                break;
            }
            if front.live == 0 {
                batch.remove(&front.seq.to_be_bytes()[..]);
                self.liveness.pop_front();
                changed = true;
                continue;
            }
            let log = self.liveness.log_bytes();
            let crowded = log > self.compaction_floor && log > 2 * self.liveness.live_bytes();
            if !crowded || moved_bytes >= REWRITE_BUDGET {
                break;
            }
            match self.rewrite_front(front.seq, &mut batch) {
                Ok(bytes) => {
                    moved_bytes += bytes;
                    largest = largest.max(bytes as usize);
                    changed = true;
                }
                Err(reason) => {
                    tracing::error!(seq = front.seq, %reason, "compaction stopped: a record cannot be read");
                    self.compaction_stopped = true;
                    break;
                }
            }
        }
        if changed {
            // The batch becomes durable with the next group's flush; a record sled keeps as a
            // file of its own must be synced here, since that flush does not cover it.
            let applied = self.blobs_before([largest]).and_then(|blobs| {
                self.trees.log.apply_batch(batch)?;
                if let Some(before) = &blobs {
                    self.disk.sync_new_blobs(before)?;
                }
                Ok(())
            });
            if let Err(e) = applied {
                tracing::error!(error = %e, "compaction failed; the store stops committing");
                self.stop(&e);
            }
        }
    }

    /// Copies the live items of the front group into a new group and queues the old group's
    /// deletion, both in `batch`. Returns the bytes written.
    fn rewrite_front(&mut self, seq: u64, batch: &mut sled::Batch) -> Result<u64, String> {
        let raw = match self.trees.log.get(seq.to_be_bytes()) {
            Ok(Some(raw)) => raw,
            Ok(None) => return Err("record missing from the log".into()),
            Err(e) => return Err(e.to_string()),
        };
        let rec = record::decode(&raw).map_err(|e| e.reason)?;
        let live = self.liveness.front_live();
        let mut kept = Vec::with_capacity(live.len());
        for op in &rec.ops {
            if let Op::Enqueue { id, .. } = op {
                if live.binary_search(id).is_ok() {
                    if let Err(e) = self.builder.push(op) {
                        self.builder.reset();
                        return Err(e.to_string());
                    }
                    kept.push(*id);
                }
            }
        }
        kept.sort_unstable();
        if kept != live {
            self.builder.reset();
            return Err("the record lacks items the log counts as live".into());
        }
        let record = self.builder.finish().map_err(|e| e.to_string())?;
        let bytes = record.len() as u64;
        let new_seq = self.next_seq;
        batch.insert(&new_seq.to_be_bytes()[..], record);
        batch.remove(&seq.to_be_bytes()[..]);
        self.next_seq += 1;
        self.liveness.pop_front();
        self.liveness.add_list(new_seq, kept, bytes);
        Ok(bytes)
    }
}
