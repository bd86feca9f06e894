//! The committer: the one thread that touches sled once the store is open.
//!
//! It takes every commit waiting in its channel (up to the group size) as one group, assigns
//! the new items their ids, writes the group as one or more records in one atomic sled
//! operation, flushes once under `Durability::Sync`, then makes the enqueued items visible,
//! marks the dequeued ones acknowledged and answers every commit of the group. After each
//! group it compacts the front of the log a little (see `compaction`). It owns the
//! authoritative view of what is live ([`Liveness`]).
//!
//! Catalog changes (a new queue, lifted fences), flushes and the close reach it through the
//! same channel, so they take effect in the order they were sent: a queue is in the catalog
//! before any record that names it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tokio::sync::oneshot;

use super::directory::{close_after_failure, wait_until_released, DirLock, DiskSync};
use super::liveness::Liveness;
use super::marks::{MarkedQueue, Marker};
use super::record::{self, Bytes, Op, RecordBuilder, Version};
use super::recovery::LogState;
use super::trees::{self, Trees};
use crate::config::{Config, Durability};
use crate::core::{publish_all, Entry, QueueId, QueueTable};
use crate::engine::moves::{apply, due_after, Move, MoveKind};
use crate::engine::timers::Timers;
use crate::engine::work::Work;
use crate::error::{Error, Result};

/// Records larger than this are split: sled 0.34 stores a value over about 128 KiB as a file
/// of its own and reclaims its space late, while several values of this size in one batch
/// and one flush go to disk at close to the disk's sequential rate.
const RECORD_SIZE: usize = 64 << 10;

/// Compaction rounds a closing store runs at most (see `compact_before_close`).
const CLOSING_ROUNDS: usize = 4;

/// How the committer answers a request. A reply dropped unanswered (the committer stopped)
/// reads as [`Error::Closed`].
pub(crate) type Reply = oneshot::Sender<Result<()>>;

/// Where the committer's answer arrives.
pub(crate) type Answer = oneshot::Receiver<Result<()>>;

/// Waits for the committer's answer.
pub(crate) async fn answer(rx: Answer) -> Result<()> {
    rx.await.unwrap_or(Err(Error::Closed))
}

/// Items' bytes by id, as the committer reads them from the log.
pub(crate) type ItemBytes = Vec<(u64, Box<[u8]>)>;

/// Where the committer's answer to a read arrives.
pub(crate) type ItemsAnswer = oneshot::Receiver<Result<ItemBytes>>;

/// How the committer answers a read.
pub(crate) type ItemsReply = oneshot::Sender<Result<ItemBytes>>;

/// One record of a commit group: enqueues with ids `first .. first + len`, and acks.
#[derive(Debug)]
struct NewRecord {
    record: Vec<u8>,
    ids: std::ops::Range<u64>,
}

/// A transaction on its way to the log: its enqueues (in order) and the items it dequeued
/// (acknowledged on success, given back on failure).
#[derive(Debug)]
pub(crate) struct CommitRequest {
    pub(crate) work: Work,
    pub(crate) reply: Reply,
}

impl CommitRequest {
    /// Approximate bytes the request adds to a record.
    fn size(&self) -> usize {
        let items: usize = self.work.enqueues.iter().map(|(_, b)| b.len() + 24).sum();
        items + self.work.dequeued.len() * 12
    }

    /// Answers the request with a failure, giving its dequeued items back to their queues
    /// and undoing its moves.
    fn fail(self, error: Error, table: &QueueTable) {
        crate::engine::work::abort(self.work, table);
        drop(self.reply.send(Err(error)));
    }
}

/// What the committer is asked to do.
#[derive(Debug)]
// The commit is the message nearly every send carries: boxing it would add an allocation
// per commit for the sake of the rare small ones.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Message {
    Commit(CommitRequest),
    /// Record a new queue (durably before answering, under `Durability::Sync`).
    CreateQueue {
        name: String,
        id: QueueId,
        reply: Reply,
    },
    /// Lift every fence of a queue, durably.
    Unfence {
        queue: QueueId,
        reply: Reply,
    },
    /// Store a queue's retry policy (encoded), durably.
    SetPolicy {
        queue: QueueId,
        policy: Vec<u8>,
        reply: Reply,
    },
    /// Read live items' bytes from the log (dead letters, which are not kept in memory).
    ReadItems {
        ids: Vec<u64>,
        reply: ItemsReply,
    },
    /// Flush everything written so far to disk, then answer.
    Flush(Reply),
    /// Finish what was sent before, flush, close sled, release the directory, answer with
    /// the final flush's outcome, and stop.
    Close(Reply),
}

impl Message {
    /// Answers the message with `error` without doing it.
    pub(crate) fn fail(self, error: Error, table: &QueueTable) {
        match self {
            Message::Commit(req) => req.fail(error, table),
            Message::ReadItems { reply, .. } => drop(reply.send(Err(error))),
            Message::CreateQueue { reply, .. }
            | Message::SetPolicy { reply, .. }
            | Message::Unfence { reply, .. }
            | Message::Flush(reply)
            | Message::Close(reply) => drop(reply.send(Err(error))),
        }
    }
}

/// The files the committer owns.
#[derive(Debug)]
pub(crate) struct Storage {
    pub(crate) trees: Trees,
    pub(crate) disk: DiskSync,
    pub(crate) path: PathBuf,
    /// Released last, after sled let go of the directory.
    pub(crate) dir: DirLock,
}

#[derive(Debug)]
pub(crate) struct Committer {
    pub(super) storage: Storage,
    durability: Durability,
    /// Under `Buffered`, how long a written group may wait for the flush that makes it
    /// durable; the committer flushes on its own timer.
    flush_interval: Duration,
    /// When the next `Buffered` flush is due: set by the first group written after a flush.
    flush_due: Option<Instant>,
    /// Writes the mark: how far the log is known durable, and where compaction may delete.
    pub(super) marker: Option<Marker>,
    /// One past the highest record made durable by a flush (what the mark may claim).
    durable_end: u64,
    /// Compaction may delete (or rewrite) records below this: a mark saying so is on disk.
    pub(super) delete_below: u64,
    /// What compaction last asked the mark's `start` to move to.
    pub(super) wanted_start: u64,
    group_size: usize,
    pub(super) compaction_floor: u64,
    rx: Receiver<Message>,
    /// The store's clock (commit times) and timers (delayed items, lease deadlines).
    timers: Arc<Timers>,
    /// The store's queues, which the requests' work names by index.
    table: Arc<QueueTable>,
    pub(super) liveness: Liveness,
    next_id: u64,
    pub(super) next_seq: u64,
    pub(super) builder: RecordBuilder,
    /// Set by the first storage failure: sled stops accepting writes after one, so every
    /// later request fails with [`Error::PreviousFailure`] until the store is reopened.
    ///
    /// Once it is set nothing may touch sled again: after some failures sled 0.34 cannot make
    /// anything stable any more (a failed blob write leaves a log buffer no flush can
    /// complete), so a flush, including the one sled makes when its last handle is dropped,
    /// would wait forever.
    pub(super) failed: Option<Error>,
    /// Set when compaction met a record it could not read; it then stops for this run.
    pub(super) compaction_stopped: bool,
    /// Group sizes and fsync times, registered when the store opened.
    metrics: crate::metrics::Handles,
}

/// Answers waiting for the flush that ends the current round.
#[derive(Debug, Default)]
struct AfterFlush {
    /// Answered with the flush's outcome.
    flushes: Vec<Reply>,
    close: Option<Reply>,
}

impl Committer {
    pub(crate) fn new(
        storage: Storage,
        log: LogState,
        marker: Marker,
        config: &Config,
        timers: Arc<Timers>,
        table: Arc<QueueTable>,
        rx: Receiver<Message>,
    ) -> Self {
        Committer {
            storage,
            durability: config.durability,
            flush_interval: config.flush_interval,
            flush_due: None,
            marker: Some(marker),
            durable_end: log.next_seq,
            delete_below: 0,
            wanted_start: 0,
            group_size: config.group_size,
            compaction_floor: config.compaction_floor,
            rx,
            timers,
            table,
            liveness: log.liveness,
            next_id: log.next_id,
            next_seq: log.next_seq,
            builder: RecordBuilder::default(),
            failed: None,
            compaction_stopped: false,
            metrics: crate::metrics::Handles::register(),
        }
    }

    /// Serves requests until asked to close (or every sender is gone), then flushes and lets
    /// the directory go.
    pub(crate) fn run(mut self) {
        let mut group = Vec::new();
        let mut after = AfterFlush::default();
        loop {
            let received = match self.flush_due {
                Some(due) => self.rx.recv_deadline(due),
                None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let first = match received {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    // A `Buffered` flush is due.
                    let flushed = self.flush();
                    drop(self.sticky(flushed));
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut size = 0;
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Commit(req) => {
                        size += req.size();
                        group.push(req);
                    }
                    Message::CreateQueue { name, id, reply } => {
                        self.create_queue(&name, id, reply, &mut after);
                    }
                    Message::Unfence { queue, reply } => {
                        match self
                            .usable()
                            .and_then(|trees| trees::remove_fences(&trees.meta, queue))
                        {
                            Ok(()) => after.flushes.push(reply),
                            Err(e) => drop(reply.send(Err(e))),
                        }
                    }
                    Message::SetPolicy {
                        queue,
                        policy,
                        reply,
                    } => match self
                        .usable()
                        .and_then(|trees| trees::set_policy(&trees.meta, queue, &policy))
                    {
                        Ok(()) => after.flushes.push(reply),
                        Err(e) => drop(reply.send(Err(e))),
                    },
                    Message::ReadItems { ids, reply } => {
                        drop(reply.send(self.read_items(&ids)));
                    }
                    Message::Flush(reply) => after.flushes.push(reply),
                    Message::Close(reply) => after.close = Some(reply),
                }
                if size < self.group_size && after.close.is_none() {
                    next = self.rx.try_recv().ok();
                }
            }
            if !group.is_empty() {
                self.commit_group(std::mem::take(&mut group));
                self.compact();
            }
            if self.flush_due.is_some_and(|due| Instant::now() >= due) && after.flushes.is_empty() {
                let flushed = self.flush();
                drop(self.sticky(flushed));
            }
            if !after.flushes.is_empty() {
                // A flush also writes the mark, so that once it returns everything committed
                // before it is protected against a silent rollback.
                let flushed = self.flush().and_then(|()| self.write_mark_now());
                let flushed = self.sticky(flushed);
                for reply in after.flushes.drain(..) {
                    drop(reply.send(flushed.clone()));
                }
            }
            if let Some(reply) = after.close.take() {
                return self.close(Some(reply));
            }
        }
        self.close(None);
    }

    /// Records a new queue; its answer waits for the round's flush under `Sync`.
    fn create_queue(&mut self, name: &str, id: QueueId, reply: Reply, after: &mut AfterFlush) {
        match self
            .usable()
            .and_then(|trees| trees::create_queue(&trees.meta, name, id))
        {
            Ok(()) => {
                if let Some(marker) = &self.marker {
                    // No record below the next sequence number names the new queue.
                    marker.add_queue(MarkedQueue {
                        id,
                        name: name.to_owned(),
                        first_seq: self.next_seq,
                    });
                }
                if self.durability == Durability::Sync {
                    after.flushes.push(reply);
                } else {
                    drop(reply.send(Ok(())));
                }
            }
            Err(e) => {
                self.stop(&e);
                drop(reply.send(Err(e)));
            }
        }
    }

    /// The final flush, then sled closed and the directory released; then `reply` gets the
    /// flush's outcome and whatever is still in the channel is refused.
    fn close(mut self, reply: Option<Reply>) {
        let flushed = self.flush().and_then(|()| self.compact_before_close());
        // The last mark: after a clean close it covers the whole log.
        let marked = self.marker.take().map_or(Ok(()), Marker::close);
        let flushed = flushed.and(marked);
        let flushed = self.sticky(flushed);
        if let Err(e) = &flushed {
            if reply.is_none() {
                tracing::error!(error = %e, "final flush of the store failed");
            }
        }
        let Storage {
            trees, path, dir, ..
        } = self.storage;
        if self.failed.is_some() {
            close_after_failure(trees);
        } else {
            drop(trees);
            if !wait_until_released(&path) {
                tracing::warn!(?path, "sled still holds the directory after closing");
            }
        }
        drop(dir);
        if let Some(reply) = reply {
            drop(reply.send(flushed));
        }
        // Requests sent after the close: refused. A request that arrives after this drain
        // finds its reply dropped, which reads as `Closed` too.
        while let Ok(message) = self.rx.try_recv() {
            message.fail(Error::Closed, &self.table);
        }
    }

    /// The id the next new item would get: above every id given out.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The store clock's time.
    pub(super) fn timers_now(&self) -> u64 {
        self.timers.clock().now()
    }

    /// sled's trees, unless a storage failure stopped the store.
    fn usable(&self) -> Result<&Trees> {
        match &self.failed {
            Some(e) => Err(Error::previous(e)),
            None => Ok(&self.storage.trees),
        }
    }

    /// Makes everything written so far durable, and lets the mark claim it.
    fn flush(&mut self) -> Result<()> {
        self.flush_due = None;
        let end = self.next_seq;
        let trees = self.usable()?;
        let started = std::time::Instant::now();
        trees.db.flush()?;
        self.storage.disk.sync_flushed()?;
        self.metrics.fsync(started);
        self.made_durable(end)
    }

    /// Records that every record below `end` is durable: the marker may write it, and says
    /// below which sequence number compaction may delete now.
    fn made_durable(&mut self, end: u64) -> Result<()> {
        self.durable_end = self.durable_end.max(end);
        if let Some(marker) = &self.marker {
            self.delete_below = marker
                .advance(self.durable_end, self.wanted_start)
                .map_err(|e| e.at(&self.storage.path))?;
        }
        Ok(())
    }

    /// Writes the mark now and waits for it.
    fn write_mark_now(&mut self) -> Result<()> {
        match &self.marker {
            Some(marker) => marker
                .write_now(false)
                .map_err(|e| e.at(&self.storage.path)),
            None => Ok(()),
        }
    }

    /// Before closing: lets compaction do at once what the mark's lag would have it do later
    /// (the mark's `start` written to both slots), then makes its work durable. So a closed
    /// store's log is as compact as compaction would have it.
    fn compact_before_close(&mut self) -> Result<()> {
        // Each round rewrites at most one compaction budget; a few rounds end any backlog a
        // closing store has reason to keep.
        for _ in 0..CLOSING_ROUNDS {
            if self.failed.is_some() {
                return Ok(());
            }
            self.want_start(true);
            if self.wanted_start <= self.delete_below {
                return Ok(());
            }
            self.made_durable(self.durable_end)?;
            if let Some(marker) = &self.marker {
                marker.write_now(true)?;
                marker.write_now(true)?;
                self.delete_below = marker.delete_below();
            }
            self.compact();
            self.flush()?;
        }
        Ok(())
    }

    /// Passes `result` on; a storage failure in it stops the store.
    fn sticky<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e @ (Error::Storage { .. } | Error::Damaged { .. })) = &result {
            self.stop(e);
        }
        result
    }

    /// Stops writing after a storage failure.
    pub(super) fn stop(&mut self, e: &Error) {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
        }
    }

    /// Reads the bytes of live items from their records.
    fn read_items(&self, ids: &[u64]) -> Result<ItemBytes> {
        let trees = self.usable()?;
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let Some(seq) = self.liveness.seq_of(id) else {
                continue;
            };
            let Some(raw) = trees.log.get(seq.to_be_bytes())? else {
                continue;
            };
            let rec = record::decode(&raw).map_err(|damage| Error::Damaged {
                path: self.storage.path.join("db"),
                detail: format!("log record {seq}: {}", damage.reason),
            })?;
            let bytes = rec.ops.iter().find_map(|op| op.bytes_of(id));
            if let Some(bytes) = bytes {
                out.push((id, bytes.into()));
            }
        }
        Ok(out)
    }

    /// Reads the bytes of the dead letters a request replays; a request whose dead letter
    /// cannot be read fails.
    fn resolve_replays(&self, group: Vec<CommitRequest>) -> Vec<CommitRequest> {
        let mut kept = Vec::with_capacity(group.len());
        for mut req in group {
            let mut wanted = Vec::new();
            for mv in &req.work.moves {
                if let MoveKind::Replay { slot, .. } = &mv.kind {
                    if !slot.has_bytes {
                        wanted.push(slot.entry.id);
                    }
                }
            }
            if wanted.is_empty() {
                kept.push(req);
                continue;
            }
            match self.read_items(&wanted) {
                Ok(read) if read.len() == wanted.len() => {
                    for mv in &mut req.work.moves {
                        if let MoveKind::Replay { slot, .. } = &mut mv.kind {
                            if let Some((_, bytes)) =
                                read.iter().find(|(id, _)| *id == slot.entry.id)
                            {
                                slot.entry.bytes = bytes.clone();
                                slot.has_bytes = true;
                            }
                        }
                    }
                    kept.push(req);
                }
                Ok(_) => req.fail(
                    Error::Bug {
                        invariant: "a dead letter's record is in the log",
                    },
                    &self.table,
                ),
                Err(e) => req.fail(e, &self.table),
            }
        }
        kept
    }

    /// Answers every request of `group` with `error` (their dequeued items go back).
    fn fail_all(&self, group: Vec<CommitRequest>, error: &Error) {
        group
            .into_iter()
            .for_each(|req| req.fail(error.clone(), &self.table));
    }

    fn commit_group(&mut self, group: Vec<CommitRequest>) {
        if let Some(e) = &self.failed {
            let e = Error::previous(e);
            self.fail_all(group, &e);
            return;
        }
        let group = if group.iter().any(|r| !r.work.moves.is_empty()) {
            let group = self.resolve_replays(group);
            if group.is_empty() {
                return;
            }
            group
        } else {
            group
        };
        let first = self.next_id;
        let now = self.timers.clock().now();
        let records = match self.encode(&group, first, now) {
            Ok(records) => records,
            Err(e) => {
                // Only a bug can get here; fail the group, keep the store going.
                self.builder.reset();
                let e = Error::storage(e);
                self.fail_all(group, &e);
                return;
            }
        };
        let seq = self.next_seq;
        let sizes: Vec<(std::ops::Range<u64>, usize)> = records
            .iter()
            .map(|p| (p.ids.clone(), p.record.len()))
            .collect();
        // No overflow: recovery leaves sequence numbers at most 2^63 (`MAX_NUMBER + 1`), and
        // a `usize` converts losslessly.
        let end = seq + u64::try_from(records.len()).unwrap_or(u64::MAX);
        let bytes: usize = sizes.iter().map(|(_, bytes)| bytes).sum();
        let span = tracing::trace_span!("commit_group", transactions = group.len(), bytes, seq);
        let _entered = span.enter();
        self.metrics.group(group.len(), bytes);
        let written = self
            .write(seq, records)
            .map_err(Error::from)
            .and_then(|()| {
                if self.durability == Durability::Sync {
                    let started = std::time::Instant::now();
                    self.storage.trees.db.flush()?;
                    self.storage.disk.sync_flushed()?;
                    self.metrics.fsync(started);
                }
                Ok(())
            });
        if let Err(e) = written {
            tracing::error!(error = %e, seq, "writing a commit group failed; the store stops writing");
            self.stop(&e);
            self.fail_all(group, &e);
            return;
        }
        // The group is written (and under `Sync` durable): its commits succeed whatever
        // happens to the mark; a failure writing the mark stops the store for what follows.
        match self.durability {
            Durability::Sync => {
                if let Err(e) = self.made_durable(end) {
                    tracing::error!(error = %e, "writing the store's mark failed; the store stops writing");
                    self.stop(&e);
                }
            }
            Durability::Buffered => {
                if self.flush_due.is_none() {
                    self.flush_due = Instant::now().checked_add(self.flush_interval);
                }
            }
        }
        let mut record_seq = seq;
        for (ids, bytes) in sizes {
            debug_assert!(ids.start >= self.next_id, "item ids increase");
            self.next_id = ids.end;
            // Lossless: a `usize` is at most 64 bits on every target Rust supports.
            self.liveness
                .add_range(record_seq, ids, u64::try_from(bytes).unwrap_or(u64::MAX));
            record_seq += 1;
        }
        debug_assert_eq!(record_seq, end, "one sequence number per record written");
        self.next_seq = record_seq;
        debug_assert!(
            self.durable_end <= self.next_seq,
            "the mark claims only records written (durable end {}, next record {})",
            self.durable_end,
            self.next_seq
        );
        let mut id = first;
        for mut req in group {
            for (_, entry) in &req.work.dequeued {
                debug_assert!(
                    entry.id < first,
                    "an ack points to an item of an older record"
                );
                let was_live = self.liveness.ack(entry.id);
                debug_assert!(
                    was_live,
                    "a dequeued item is live in the log until its one transaction commits \
                     (item {} acknowledged twice?)",
                    entry.id
                );
            }
            // Lossless: a `usize` is at most 64 bits on every target Rust supports.
            let n = u64::try_from(req.work.enqueues.len()).unwrap_or(u64::MAX);
            publish_all(&self.table, std::mem::take(&mut req.work.enqueues), id, now);
            id += n;
            for mv in req.work.moves.drain(..) {
                if let Some(ended) = ended_id(&mv) {
                    let was_live = self.liveness.ack(ended);
                    debug_assert!(
                        was_live,
                        "a move ends a version live in the log (item {ended} ended twice?)"
                    );
                }
                let takes_id = mv.makes_version();
                // A dead letter's bytes stay in the log only.
                apply(mv, id, now, &self.timers, true);
                id += u64::from(takes_id);
            }
            req.work.settle_dequeued(&self.table);
            drop(req.reply.send(Ok(())));
        }
        debug_assert_eq!(id, self.next_id, "every new id was published");
    }

    /// Writes the records of a group under consecutive sequence numbers from `seq`,
    /// atomically.
    fn write(&self, seq: u64, records: Vec<NewRecord>) -> sled::Result<()> {
        let log = &self.storage.trees.log;
        if let [record] = &records[..] {
            return log.insert(seq.to_be_bytes(), &record.record[..]).map(drop);
        }
        let mut batch = sled::Batch::default();
        for (record_seq, record) in (seq..).zip(records) {
            batch.insert(&record_seq.to_be_bytes()[..], record.record);
        }
        log.apply_batch(batch)
    }

    /// Encodes a group as one record, or as several when it is larger than [`RECORD_SIZE`].
    fn encode(
        &mut self,
        group: &[CommitRequest],
        first: u64,
        now: u64,
    ) -> Result<Vec<NewRecord>, postcard::Error> {
        let mut records = Vec::new();
        let mut id = first;
        let mut record_first = first;
        for req in group {
            for (queue, bytes) in &req.work.enqueues {
                self.builder.push(&Op::Enqueue {
                    queue: self.table.get(*queue).id(),
                    id,
                    attempts: 0,
                    not_before: 0,
                    bytes: Bytes(bytes),
                })?;
                id += 1;
                self.split_if_full(&mut records, &mut record_first, id, now)?;
            }
            for (queue, entry) in &req.work.dequeued {
                self.builder.push(&Op::Ack {
                    queue: self.table.get(*queue).id(),
                    id: entry.id,
                })?;
                self.split_if_full(&mut records, &mut record_first, id, now)?;
            }
            for mv in &req.work.moves {
                self.builder.push(&op_of(mv, id, now))?;
                if mv.makes_version() {
                    id += 1;
                }
                self.split_if_full(&mut records, &mut record_first, id, now)?;
            }
        }
        if !self.builder.is_empty() || records.is_empty() {
            records.push(self.finish_record(record_first..id, now)?);
        }
        Ok(records)
    }

    /// Seals the record being built once it reaches [`RECORD_SIZE`]; `end` is the id the
    /// next enqueue would get.
    fn split_if_full(
        &mut self,
        records: &mut Vec<NewRecord>,
        record_first: &mut u64,
        end: u64,
        now: u64,
    ) -> Result<(), postcard::Error> {
        if self.builder.len() >= RECORD_SIZE {
            records.push(self.finish_record(*record_first..end, now)?);
            *record_first = end;
        }
        Ok(())
    }

    fn finish_record(
        &mut self,
        ids: std::ops::Range<u64>,
        now: u64,
    ) -> Result<NewRecord, postcard::Error> {
        Ok(NewRecord {
            record: self.builder.finish(now, ids.end.max(self.next_id))?,
            ids,
        })
    }
}

/// The id a move ends, if it ends one (a delayed enqueue ends none).
fn ended_id(mv: &Move) -> Option<u64> {
    match &mv.kind {
        MoveKind::Enqueue { .. } | MoveKind::Import { .. } => None,
        MoveKind::Lease { entry, .. }
        | MoveKind::Retry { entry }
        | MoveKind::Bury { entry, .. } => Some(entry.id),
        MoveKind::Replay { slot, .. } | MoveKind::Purge { slot } => Some(slot.entry.id),
        MoveKind::Ack { token, claimed } => {
            debug_assert!(
                claimed.as_ref().is_some_and(|l| l.entry.id == *token),
                "an acknowledged lease is claimed before its commit, under its item's id"
            );
            Some(*token)
        }
    }
}

/// The version op of `entry` moving to new id `id`.
fn version<'a>(queue: QueueId, entry: &'a Entry, id: u64, reason: Option<&'a str>) -> Version<'a> {
    Version {
        queue,
        from: Some(entry.id),
        id,
        attempts: entry.attempts(),
        not_before: entry.not_before(),
        enqueued_at: entry.enqueued_at,
        first_attempt: entry.first_attempt(),
        last_attempt: entry.last_attempt(),
        reason,
        key: entry.key().map(Bytes),
        bytes: Bytes(&entry.bytes),
    }
}

/// The log op of a move committed at `now`; `id` is the new version's id (unused by moves
/// that make none).
fn op_of(mv: &Move, id: u64, now: u64) -> Op<'_> {
    let queue = mv.proc.core.id();
    match &mv.kind {
        MoveKind::Enqueue { entry, delay } if entry.key().is_some() => {
            let mut v = version(queue, entry, id, None);
            v.from = None;
            v.enqueued_at = now;
            v.not_before = due_after(entry, *delay, now);
            Op::Keyed(v)
        }
        MoveKind::Enqueue { entry, delay } => Op::Enqueue {
            queue,
            id,
            attempts: entry.attempts(),
            not_before: due_after(entry, *delay, now),
            bytes: Bytes(&entry.bytes),
        },
        MoveKind::Lease { entry, .. } => Op::Lease(version(queue, entry, id, None)),
        MoveKind::Retry { entry } => Op::Retry(version(queue, entry, id, None)),
        MoveKind::Bury { entry, reason } => Op::Bury(version(queue, entry, id, Some(reason))),
        MoveKind::Replay { slot, reset } => {
            let mut v = version(queue, &slot.entry, id, None);
            v.not_before = 0;
            if *reset {
                v.attempts = 0;
            }
            Op::Replay(v)
        }
        MoveKind::Ack { token, .. } => Op::Ack { queue, id: *token },
        MoveKind::Purge { slot } => Op::Purge {
            queue,
            id: slot.entry.id,
        },
        // Written as compaction writes an item it copies forward: the version as it
        // stands, replacing none (`from` is `None`), a dead letter with its reason.
        MoveKind::Import { entry, reason } => {
            let mut v = version(queue, entry, id, reason.as_deref());
            v.from = None;
            if v.enqueued_at == 0 {
                v.enqueued_at = now;
            }
            if reason.is_some() {
                v.not_before = 0;
            }
            Op::Moved(v)
        }
    }
}
