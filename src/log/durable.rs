//! [`DurableLog`]: an open store directory: sled, the committer thread, and closing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use super::catalog::{self, Fence};
use super::committer::{CommitRequest, Committer, Failure, Message};
use super::directory::{
    close_after_failure, complete_torn_sled_config, open_sled, wait_until_released, DiskSync,
};
use super::recovery::{recover, BadRecord, Recovered, Trees};
use super::reply::Completion;
use crate::config::{Config, Durability};
use crate::core::{Entry, QueueId};
use crate::error::{Error, Result};

/// What the store needs from the log it opened.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) log: DurableLog,
    pub(crate) queues: Vec<(String, QueueId, std::collections::VecDeque<Entry>)>,
    pub(crate) fences: Vec<Fence>,
    pub(crate) set_aside: Vec<BadRecord>,
}

/// The log of an open store directory. Dropping it closes the directory: the committer
/// flushes and stops, sled closes, and drop returns once the directory can be opened again.
#[derive(Debug)]
pub(crate) struct DurableLog {
    path: PathBuf,
    durability: Durability,
    /// `None` once closing has begun.
    trees: Option<Trees>,
    sender: Option<Sender<Message>>,
    committer: Option<JoinHandle<()>>,
    failure: Arc<Failure>,
}

impl DurableLog {
    /// Opens the directory `path` (already created and registered by the store), recovers it
    /// and starts the committer.
    pub(crate) fn open(path: &Path, config: &Config) -> Result<Opened> {
        let flush_every = match config.durability {
            Durability::Sync => None,
            Durability::Buffered => Some((config.flush_interval.as_millis() as u64).max(1)),
        };
        complete_torn_sled_config(path)?;
        let trees = Trees::open(open_sled(path, config, flush_every)?)?;
        let disk = DiskSync::open(path)?;
        let mut recovered = recover(&trees, &disk)?;
        let Recovered {
            queues,
            ref mut items,
            ..
        } = recovered;
        let queues = queues
            .into_iter()
            .map(|(name, id)| {
                let entries = items.remove(&id).unwrap_or_default();
                (name, id, entries)
            })
            .collect();
        let (sender, receiver) = crossbeam_channel::unbounded();
        let failure = Arc::new(Failure::default());
        let committer = Committer::new(
            trees.clone(),
            disk,
            config,
            receiver,
            recovered.liveness,
            recovered.next_id,
            recovered.next_seq,
            failure.clone(),
        );
        let committer = std::thread::Builder::new()
            .name("reliable-queue-committer".into())
            .spawn(move || committer.run())?;
        Ok(Opened {
            log: DurableLog {
                path: path.to_path_buf(),
                durability: config.durability,
                trees: Some(trees),
                sender: Some(sender),
                committer: Some(committer),
                failure,
            },
            queues,
            fences: recovered.fences,
            set_aside: recovered.set_aside,
        })
    }

    /// Hands a commit to the committer; if it is gone, fails the commit with
    /// [`Error::Closed`] (its dequeued items go back).
    pub(crate) fn submit(&self, request: CommitRequest) {
        let Some(sender) = &self.sender else {
            return request.fail(Error::Closed);
        };
        if let Err(e) = sender.send(Message::Commit(request)) {
            if let Message::Commit(request) = e.into_inner() {
                request.fail(Error::Closed);
            }
        }
    }

    /// Waits until everything committed so far is on disk.
    pub(crate) fn flush(&self) -> Result<()> {
        let Some(sender) = &self.sender else {
            return Err(Error::Closed);
        };
        let (completion, reply) = Completion::new();
        sender
            .send(Message::Flush(reply))
            .map_err(|_| Error::Closed)?;
        completion.wait()
    }

    /// Records a new queue; under `Durability::Sync`, durably before returning.
    pub(crate) fn create_queue(&self, name: &str, id: QueueId) -> Result<()> {
        let trees = self.trees()?;
        catalog::create_queue(&trees.meta, name, id)?;
        if self.durability == Durability::Sync {
            // Through the committer, which also makes sled's flush durable.
            self.flush()?;
        }
        Ok(())
    }

    /// Lifts every fence of queue `id`, durably.
    pub(crate) fn unfence(&self, id: QueueId) -> Result<()> {
        let trees = self.trees()?;
        catalog::remove_fences(&trees.meta, id)?;
        self.flush()
    }

    /// The sled trees, unless the committer stopped on a storage failure: then sled is not
    /// touched again (see [`Failure`]) and this returns that failure.
    fn trees(&self) -> Result<&Trees> {
        if let Some(e) = self.failure.get() {
            return Err(e);
        }
        self.trees.as_ref().ok_or(Error::Closed)
    }
}

impl Drop for DurableLog {
    fn drop(&mut self) {
        // No handle is left, so no commit is in flight: closing the channel lets the
        // committer finish its last flush and exit.
        drop(self.sender.take());
        if let Some(thread) = self.committer.take() {
            if thread.join().is_err() {
                tracing::error!("the committer thread panicked");
            }
        }
        let Some(trees) = self.trees.take() else {
            return;
        };
        if self.failure.get().is_some() {
            close_after_failure(trees);
            return;
        }
        drop(trees);
        if !wait_until_released(&self.path) {
            tracing::warn!(path = ?self.path, "sled still holds the directory after closing");
        }
    }
}
