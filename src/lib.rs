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
//! ```
//! use reliable_queue::Store;
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! let jobs = store.queue::<String>("jobs")?;
//!
//! let mut tx = store.begin();
//! jobs.enqueue(&mut tx, "send welcome mail".to_owned())?;
//! tx.commit()?;
//!
//! let mut tx = store.begin();
//! if let Some(job) = jobs.try_dequeue(&mut tx)? {
//!     println!("working on {job}");
//! }
//! tx.commit()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `ARCHITECTURE.md` for the layers, the commit path and the log format.

#![forbid(unsafe_code)]

mod codec;
mod config;
mod core;
mod dequeue;
mod error;
mod log;
mod queue;
mod store;
mod sync;
mod transaction;

pub use crate::config::{Builder, Durability};
pub use crate::dequeue::Dequeue;
pub use crate::error::{Error, Result};
pub use crate::queue::ReliableConcurrentQueue;
pub use crate::store::{SetAsideRecord, Store};
pub use crate::transaction::Transaction;
