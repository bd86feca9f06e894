//! The sled engine: an embedded store in one directory, kept as a log in sled.
//!
//! Opening recovers the log into the in-memory core ([`recovery`]) and starts the
//! [`committer`] thread, which from then on is the only code that touches sled: commits, new
//! queues, fences, flushes and compaction ([`compaction`]) all reach it as [`Message`]s, in
//! the order they were sent. Closing (or dropping the last handle) sends it [`Message::Close`]:
//! it finishes what was sent before, flushes, closes sled and releases the directory, then
//! answers.
//!
//! Files: [`record`] is the log's record format, [`trees`] sled's trees and the `meta` tree's
//! keys, [`liveness`] what compaction may delete, [`directory`] the directory as sled sees it
//! (and which directories this process has open).

mod committer;
mod compaction;
mod directory;
mod liveness;
mod marks;
pub(crate) mod record;
mod recovery;
mod trees;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use tokio::sync::oneshot;

pub(crate) use self::committer::{answer, Answer};
use self::committer::{CommitRequest, Committer, ItemBytes, ItemsAnswer, Message, Reply};
use self::directory::{
    complete_torn_sled_config, open_sled, prepare_dir, restrict_blobs, DirLock, DiskSync,
};
use self::marks::{Marker, MarksFile};
use self::recovery::{recover, Opening, Recovered};
use self::trees::Trees;
use super::catalog::Catalog;
use super::proc::DeadSlot;
use super::timers::Timers;
use super::work::Work;
use crate::config::Config;
use crate::core::{Entry, QueueCore, QueueId};
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;
use crate::sync::process::Mutex;

/// A queue as recovered, with what the processing layer keeps of it.
#[derive(Debug)]
pub(crate) struct RecoveredQueue {
    pub(crate) core: Arc<QueueCore>,
    pub(crate) policy: RetryPolicy,
    /// Items not due yet.
    pub(crate) delayed: Vec<Entry>,
    /// Dead letters, oldest first, without their bytes.
    pub(crate) dead: Vec<DeadSlot>,
}

/// An open store directory.
#[derive(Debug)]
pub(crate) struct Sled {
    path: PathBuf,
    catalog: Catalog,
    sender: Sender<Message>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl Sled {
    /// Opens (creating it if need be) the store in directory `path`: checks that the
    /// directory is safe to use ([`directory::prepare_dir`]), takes it, recovers the log and
    /// starts the committer.
    pub(crate) fn open(
        path: &Path,
        config: &Config,
        timers: Arc<Timers>,
    ) -> Result<(Sled, Vec<RecoveredQueue>)> {
        Sled::open_at(path, config, timers).map_err(|e| e.at(path))
    }

    fn open_at(
        path: &Path,
        config: &Config,
        timers: Arc<Timers>,
    ) -> Result<(Sled, Vec<RecoveredQueue>)> {
        let shared = config.allow_shared_directory;
        prepare_dir(path, shared)?;
        let path = path.canonicalize()?;
        let dir = DirLock::acquire(path.clone())?;
        complete_torn_sled_config(&path, shared)?;
        let found = marks::read(&path)?;
        let opening = Opening {
            dir: &path,
            found,
            salvage: config.salvage,
            now: timers.clock().now(),
        };
        // The open, with what recovery found as fields once it is known; one INFO line.
        let span = tracing::info_span!(
            "open",
            store = %path.display(),
            records = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty
        );
        let _entered = span.enter();
        let started = std::time::Instant::now();
        let (trees, disk, recovered) = {
            let recovery = tracing::debug_span!(
                "recovery",
                records = tracing::field::Empty,
                log_bytes = tracing::field::Empty
            );
            let _entered = recovery.enter();
            let opened = open_and_recover(&path, config, opening)?;
            let liveness = &opened.2.log.liveness;
            recovery.record("records", liveness.groups());
            recovery.record("log_bytes", liveness.log_bytes());
            opened
        };
        // The log's records (liveness keeps one group per record).
        let records = recovered.log.liveness.groups();
        let Recovered {
            queues,
            mut delayed,
            mut dead_letters,
            log,
            set_aside,
            fences,
            missing,
            mark,
            mark_counter,
        } = recovered;
        // The log as it is now becomes the mark to check the next open against.
        let file = MarksFile::create(&path, &mark, mark_counter.wrapping_add(1), shared)?;
        if !trees::keeps_marks(&trees.meta)? {
            trees::set_keeps_marks(&trees.meta)?;
            trees.db.flush()?;
            disk.sync_flushed()?;
        }
        let marker = Marker::start(file, mark)?;
        let mut policies = trees::load_policies(&trees.meta)?;
        crate::metrics::quarantined(set_aside.len());
        if !set_aside.is_empty() || !missing.is_empty() {
            tracing::warn!(
                set_aside = set_aside.len(),
                missing = missing.len(),
                "records are damaged or missing; their queues are fenced (see Store::set_aside_records)"
            );
        }
        let catalog = Catalog::recovered(queues, fences, set_aside, missing);
        let recovered_queues = catalog
            .cores()
            .into_iter()
            .map(|core| {
                let id: QueueId = core.id();
                RecoveredQueue {
                    policy: policies.remove(&id).unwrap_or_default(),
                    delayed: delayed.remove(&id).unwrap_or_default(),
                    dead: dead_letters.remove(&id).unwrap_or_default(),
                    core,
                }
            })
            .collect::<Vec<RecoveredQueue>>();
        // Only logged: an open longer than 584 million years may read as that.
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        span.record("records", records);
        span.record("elapsed_ms", elapsed_ms);
        tracing::info!(
            queues = recovered_queues.len(),
            items = recovered_queues.iter().map(|q| q.core.count()).sum::<u64>(),
            delayed = recovered_queues
                .iter()
                .map(|q| q.delayed.len())
                .sum::<usize>(),
            dead_letters = recovered_queues.iter().map(|q| q.dead.len()).sum::<usize>(),
            records,
            elapsed_ms,
            "store opened"
        );
        let (sender, receiver) = crossbeam_channel::unbounded();
        let committer = Committer::new(
            committer::Storage {
                trees,
                disk,
                path: path.clone(),
                dir,
            },
            log,
            marker,
            config,
            timers,
            Arc::clone(catalog.table()),
            receiver,
        );
        let committer = std::thread::Builder::new()
            .name("reliable-queue-committer".into())
            .spawn(move || committer.run())?;
        Ok((
            Sled {
                path,
                catalog,
                sender,
                committer: Mutex::new(Some(committer)),
            },
            recovered_queues,
        ))
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Sends `message` to the committer; if it is gone, answers the message with
    /// [`Error::Closed`] (a commit's dequeued items go back).
    fn send(&self, message: Message) {
        if let Err(e) = self.sender.send(message) {
            e.into_inner().fail(Error::Closed, self.catalog.table());
        }
    }

    /// Sends a request and waits for its answer.
    async fn ask(&self, message: impl FnOnce(Reply) -> Message) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(message(tx));
        answer(rx).await
    }

    /// Opens queue `name`, creating it if need be. A new queue is logged before anyone can
    /// see it; under [`Durability::Sync`] this returns once the catalog change is on disk.
    pub(crate) async fn queue(&self, name: &str) -> Result<Arc<QueueCore>> {
        let (core, created) = self.catalog.open_queue(name, |id| {
            let (tx, rx) = oneshot::channel();
            self.send(Message::CreateQueue {
                name: name.to_owned(),
                id,
                reply: tx,
            });
            Ok(rx)
        })?;
        if let Some(rx) = created {
            if let Err(e) = answer(rx).await {
                self.catalog.forget(name, core.id());
                return Err(e);
            }
        }
        Ok(core)
    }

    /// Lifts every fence of queue `name`, durably. Unknown or unfenced names are no error.
    pub(crate) async fn unfence(&self, name: &str) -> Result<()> {
        let Some(id) = self.catalog.id_of(name) else {
            return Ok(());
        };
        self.ask(|reply| Message::Unfence { queue: id, reply })
            .await?;
        self.catalog.remove_fences(id);
        Ok(())
    }

    /// Hands a commit to the committer; its outcome arrives on the returned receiver once
    /// its group is written (and, under `Sync`, on disk).
    pub(crate) fn submit(&self, work: Work) -> Answer {
        let (reply, answer) = oneshot::channel();
        self.send(Message::Commit(CommitRequest { work, reply }));
        answer
    }

    /// Stores the retry policy of queue `queue`, durably.
    pub(crate) async fn set_policy(&self, queue: QueueId, policy: RetryPolicy) -> Result<()> {
        self.ask(|reply| Message::SetPolicy {
            queue,
            policy: policy.to_bytes(),
            reply,
        })
        .await
    }

    /// Reads the bytes of live items (dead letters) from the log.
    pub(crate) async fn read_items(&self, ids: Vec<u64>) -> Result<ItemBytes> {
        let (reply, answer): (_, ItemsAnswer) = oneshot::channel();
        self.send(Message::ReadItems { ids, reply });
        answer.await.unwrap_or(Err(Error::Closed))
    }

    /// Waits until everything committed so far is on disk.
    pub(crate) async fn flush(&self) -> Result<()> {
        self.ask(Message::Flush).await
    }

    /// Lets the committer finish what was sent before, flush, and release the directory.
    pub(crate) async fn close(&self) -> Result<()> {
        self.ask(Message::Close).await
    }
}

/// Opens sled in `path` and recovers the log. sled panics on some damaged files (a large
/// value whose file in `blobs/` is gone, for one); such a panic is caught here and reported
/// as [`Error::Damaged`], with nothing opened.
fn open_and_recover(
    path: &Path,
    config: &Config,
    opening: Opening<'_>,
) -> Result<(Trees, DiskSync, Recovered)> {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The store drives sled's flushes itself (see `committer`): none in the background.
        let trees = Trees::open(open_sled(path, config, None)?)?;
        restrict_blobs(path, config.allow_shared_directory)?;
        let disk = DiskSync::open(path)?;
        let recovered = recover(&trees, &disk, opening)?;
        Ok((trees, disk, recovered))
    }));
    match opened {
        Ok(result) => result.map_err(|e: Error| e.at(path)),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(Error::Damaged {
                path: path.to_path_buf(),
                detail: format!("the storage engine failed reading its files: {message}"),
            })
        }
    }
}

impl Drop for Sled {
    fn drop(&mut self) {
        // `Engine` closed the store before dropping this, so the committer is stopping or
        // stopped.
        if let Some(thread) = self.committer.lock().take() {
            if thread.join().is_err() {
                tracing::error!(path = ?self.path, "the committer thread panicked");
            }
        }
    }
}
