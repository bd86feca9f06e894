//! The log: the only code that touches sled.
//!
//! One record per commit group in the `log` tree (see [`record`] for the layout), the queue
//! catalog in the `meta` tree, records that failed their checksum in the `quarantine` tree.
//! [`committer`] writes, [`recovery`] reads, [`liveness`] tracks what compaction may delete.

pub(crate) mod catalog;
pub(crate) mod committer;
mod directory;
mod durable;
pub(crate) mod liveness;
pub(crate) mod record;
pub(crate) mod recovery;
mod reply;

pub(crate) use committer::CommitRequest;
pub(crate) use durable::DurableLog;
pub(crate) use recovery::BadRecord;
pub(crate) use reply::{Completion, Reply};
