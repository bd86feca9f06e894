//! An in-process, transactional, concurrent work queue that does not lose work.
//!
//! A [`Store`] (a directory on disk, or memory) holds named
//! [`ReliableConcurrentQueue`]s. A [`Transaction`] spans any number of them:
//!
//! - `enqueue` is invisible until commit, even to its own transaction;
//! - `try_dequeue` hides the item from everyone else at once;
//! - `commit` applies everything atomically and, by default, durably (fsync) before it
//!   returns; concurrent commits share one write and one fsync;
//! - abort, drop or a failed commit put the dequeued items back at the front.
//!
//! `count()` is a non-transactional snapshot and order is best-effort FIFO: the queue trades
//! strict order for concurrency, in the model of Service Fabric's ReliableConcurrentQueue.
//!
//! Calls that may wait on I/O are `async fn`s (tokio's convention); each has a `blocking_`
//! form for threads, which never panics inside a runtime. `Store::open`, `begin` and
//! `enqueue` are synchronous.
//!
//! ```
//! use reliable_queue::Store;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("store"))?;
//! let jobs = store.queue::<String>("jobs").await?;
//!
//! let mut tx = store.begin();
//! jobs.enqueue(&mut tx, "send welcome mail".to_owned())?;
//! tx.commit().await?;
//!
//! let mut tx = store.begin();
//! if let Some(job) = jobs.try_dequeue(&mut tx).await? {
//!     println!("working on {job}");
//! }
//! tx.commit().await?;
//! store.close().await?;
//! # Ok(()) }
//! ```
//!
//! The same with threads:
//!
//! ```
//! use reliable_queue::Store;
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("store"))?;
//! let jobs = store.blocking_queue::<String>("jobs")?;
//!
//! let mut tx = store.begin();
//! jobs.enqueue(&mut tx, "send welcome mail".to_owned())?;
//! tx.blocking_commit()?;
//!
//! let mut tx = store.begin();
//! if let Some(job) = jobs.blocking_try_dequeue(&mut tx)? {
//!     println!("working on {job}");
//! }
//! tx.blocking_commit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `ARCHITECTURE.md` for the layers, the commit path and the log format.

#![forbid(unsafe_code)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

mod admin;
mod clock;
mod codec;
mod config;
mod core;
mod engine;
mod error;
pub mod metrics;
mod processing;
mod queue;
mod store;
mod sync;
mod transaction;

pub use crate::admin::Decoders;
pub use crate::clock::ManualClock;
pub use crate::codec::RawItem;
pub use crate::config::Durability;
pub use crate::engine::SetAsideRecord;
pub use crate::error::{DirectoryProblem, Error, Result};
pub use crate::processing::{
    BrowsedItem, DeadLetter, ItemState, QueueStats, Replay, RetryPolicy, MAX_ATTEMPTS, MAX_DELAY,
    MAX_TTL,
};
pub use crate::queue::delays::Enqueued;
pub use crate::queue::dequeue::Dequeue;
pub use crate::queue::import::ImportedItem;
pub use crate::queue::lease::{Failed, Lease};
pub use crate::queue::set::{QueueSet, SetOrder};
pub use crate::queue::ReliableConcurrentQueue;
pub use crate::store::Builder;
pub use crate::store::Store;
pub use crate::transaction::Transaction;

/// The PostgreSQL client types that [`Transaction::execute`] and [`Transaction::query`] take
/// and return (re-exported from `tokio-postgres`, so that a service uses the same version).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use tokio_postgres::types::ToSql;
    pub use tokio_postgres::Row;
}
