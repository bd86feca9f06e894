//! [`Store`]: the handle on a set of named queues and the engine that keeps them; its
//! [`Builder`] is a child module.

mod builder;

pub use self::builder::Builder;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{Config, Durability};
use crate::engine::{block_on, Engine, SetAsideRecord};
use crate::error::Result;
use crate::queue::ReliableConcurrentQueue;
use crate::transaction::Transaction;

/// A set of named queues, in memory or in a directory on disk, and the engine behind them.
///
/// Cheap to clone: clones share one store. The store closes when [`close`](Store::close) is
/// called on any clone, or when the last handle is dropped (stores, queues and transactions
/// all count): the log is flushed and the directory released, so it can be opened again, by
/// this process or another. After a storage failure ([`Error::Storage`](crate::Error::Storage)
/// from a commit), closing waits at most 5 s for the storage engine to let go; if it is stuck
/// (sled 0.34 can be, after a disk filled up), the directory stays locked until the process
/// exits.
///
/// # Examples
///
/// ```
/// use reliable_queue::Store;
///
/// let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("store"))?;
/// let jobs = store.blocking_queue::<String>("jobs")?;
///
/// let mut tx = store.begin();
/// jobs.enqueue(&mut tx, "resize image 17".to_owned())?;
/// tx.blocking_commit()?; // durable once this returns
///
/// let mut tx = store.begin();
/// assert_eq!(jobs.blocking_try_dequeue(&mut tx)?.as_deref(), Some("resize image 17"));
/// tx.blocking_commit()?; // gone for good
/// store.blocking_close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Store {
    engine: Arc<Engine>,
}

impl Store {
    /// Opens (or creates) the store in directory `path` with the default settings:
    /// [`Durability::Sync`], 4 MiB items.
    ///
    /// Synchronous: opening a directory reads and recovers its log, file I/O like
    /// `std::fs`. In async code, open stores at start-up or in `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyOpen`](crate::Error::AlreadyOpen) if the directory is in use (by
    /// another process, this is reported after waiting up to 2 s, the time a store closed a
    /// moment ago may take to release the directory),
    /// [`Error::UnsupportedFormat`](crate::Error::UnsupportedFormat) for a store this build
    /// cannot read, [`Error::UnsafeDirectory`](crate::Error::UnsafeDirectory) for a path
    /// that is not a directory, a symbolic link in or to it, or (Unix) an existing directory
    /// owned by another user or open to others (see
    /// [`Builder::allow_shared_directory`](crate::Builder::allow_shared_directory)),
    /// [`Error::Storage`](crate::Error::Storage) if the directory cannot be
    /// created or read. Records that fail their checksum do not fail the open: see
    /// [`set_aside_records`](Store::set_aside_records).
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Builder::new().path(path).open()
    }

    /// A store that lives in memory only: nothing touches the disk, and everything is gone
    /// with the last handle.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for resource limits.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn in_memory() -> Result<Store> {
        Builder::new().open()
    }

    /// A [`Builder`] to set durability, limits and path.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().max_item_size(1 << 16).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn builder() -> Builder {
        Builder::new()
    }

    pub(crate) fn open_with(config: Config) -> Result<Store> {
        Ok(Store {
            engine: Engine::open(config)?,
        })
    }

    pub(crate) fn from_engine(engine: Arc<Engine>) -> Store {
        Store { engine }
    }

    /// Connects to the store on the server `url` names, in the default namespace: the URL's
    /// scheme chooses the engine (`redis://`, `rediss://`, `redis+unix://` with feature
    /// `redis`; `postgres://`, `postgresql://` or a libpq key-value string with feature
    /// `postgres`). [`Builder::url`] with [`Builder::connect`].
    ///
    /// # Cancel safety
    ///
    /// As [`Builder::connect`].
    ///
    /// # Errors
    ///
    /// As [`Builder::connect`]; [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// (`url`) for a scheme no engine of this build serves.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::connect("postgresql://app@localhost/app").await?;
    /// let q = store.queue::<String>("mail").await?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, "hello".to_string())?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Store> {
        Builder::new().url(url).connect().await
    }

    /// [`connect`](Store::connect) for threads.
    ///
    /// # Errors
    ///
    /// As [`Builder::connect`].
    pub fn blocking_connect(url: &str) -> Result<Store> {
        Builder::new().url(url).open()
    }

    /// Opens the queue `name`, creating it if it does not exist yet. On disk, creating a
    /// queue is recorded in the log (durably, under [`Durability::Sync`]) before this
    /// returns.
    ///
    /// The queue's items are `T`s; the store does not record `T`, so opening one name with
    /// two different types makes dequeues fail with
    /// [`Error::Deserialize`](crate::Error::Deserialize) when the bytes do not decode as the
    /// other type (and decode to nonsense when they happen to).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a queue whose creation was submitted is created whether or not the future
    /// is still awaited; calling again opens it.
    ///
    /// # Errors
    ///
    /// [`Error::Fenced`](crate::Error::Fenced) if the queue is fenced by a record set aside
    /// at open, [`Error::InvalidQueueName`](crate::Error::InvalidQueueName) for an empty
    /// name, one over 1024 bytes or one with a NUL character (on every engine),
    /// [`Error::Storage`](crate::Error::Storage) if the new queue cannot be recorded,
    /// [`Error::Closed`](crate::Error::Closed) after [`close`](Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// let orders = store.queue::<(u64, String)>("orders").await?;
    /// assert_eq!(orders.name(), "orders");
    /// # Ok(()) }
    /// ```
    pub async fn queue<T>(&self, name: &str) -> Result<ReliableConcurrentQueue<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let queue = self.engine.queue(name).await?;
        Ok(ReliableConcurrentQueue::new(self.engine.clone(), queue))
    }

    /// [`queue`](Store::queue) for threads: blocks until the queue is opened.
    ///
    /// # Errors
    ///
    /// As [`queue`](Store::queue).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let orders = store.blocking_queue::<(u64, String)>("orders")?;
    /// assert_eq!(orders.name(), "orders");
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_queue<T>(&self, name: &str) -> Result<ReliableConcurrentQueue<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        block_on(self.queue(name))
    }

    /// Starts a transaction. It may touch any queues of this store; it does nothing until
    /// [`commit`](Transaction::commit)ted, and dropping it aborts it.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let a = store.blocking_queue::<u32>("a")?;
    /// let b = store.blocking_queue::<String>("b")?;
    /// let mut tx = store.begin();
    /// a.enqueue(&mut tx, 1)?;
    /// b.enqueue(&mut tx, "one".to_owned())?;
    /// tx.blocking_commit()?;
    /// assert_eq!((a.blocking_count()?, b.blocking_count()?), (1, 1));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn begin(&self) -> Transaction {
        match self.engine.transaction_timeout() {
            // Built where the caller keeps it: no copy of the transaction on the way out.
            None => Transaction::new(self.engine.clone()),
            Some(timeout) => self.begin_with_timeout(timeout),
        }
    }

    /// [`begin`](Self::begin) under the store's default transaction timeout.
    #[cold]
    #[inline(never)]
    fn begin_with_timeout(&self, timeout: u64) -> Transaction {
        let mut tx = Transaction::new(self.engine.clone());
        // A fresh transaction is live, so this cannot fail.
        drop(self.engine.set_timeout(tx.work_mut(), timeout));
        tx
    }

    /// Makes every commit so far durable. Under [`Durability::Sync`] they already are; under
    /// [`Durability::Buffered`] this waits for a flush. In memory it does nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future only loses the answer; the flush happens anyway.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`](crate::Error::Storage) if the flush fails,
    /// [`Error::PreviousFailure`](crate::Error::PreviousFailure) after an earlier storage
    /// failure, [`Error::Closed`](crate::Error::Closed) after [`close`](Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Durability, Store};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = Store::builder().path(dir.path().join("store")).durability(Durability::Buffered).open()?;
    /// let q = store.queue::<u8>("q").await?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// tx.commit().await?;
    /// store.flush().await?; // now on disk
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self) -> Result<()> {
        self.engine.flush().await
    }

    /// [`flush`](Store::flush) for threads.
    ///
    /// # Errors
    ///
    /// As [`flush`](Store::flush).
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Durability, Store};
    /// let dir = tempfile::tempdir()?;
    /// let store = Store::builder().path(dir.path().join("store")).durability(Durability::Buffered).open()?;
    /// let q = store.blocking_queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// tx.blocking_commit()?;
    /// store.blocking_flush()?; // now on disk
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking_flush(&self) -> Result<()> {
        block_on(self.flush())
    }

    /// Closes the store, for every clone of it: waiting consumers wake with
    /// [`Error::Closed`](crate::Error::Closed), commits already submitted finish, the log is
    /// flushed and the directory released (it can be opened again once this returns). Every
    /// later call on any handle of this store fails with `Closed`; items held by open
    /// transactions stay on disk as they were before those transactions. Does not wait for
    /// the other clones to be dropped.
    ///
    /// Returns the final flush's outcome: the one place where a failure to make the last
    /// commits durable is reported (dropping the last handle only logs it).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after its first poll does not stop the close; only its outcome is
    /// lost.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`](crate::Error::Storage) if the final flush fails,
    /// [`Error::PreviousFailure`](crate::Error::PreviousFailure) after an earlier storage
    /// failure, [`Error::Closed`](crate::Error::Closed) if the store was closed already.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// let other = store.clone();
    /// store.close().await?;
    /// assert!(matches!(other.flush().await, Err(reliable_queue::Error::Closed)));
    /// let reopened = reliable_queue::Store::open(dir.path().join("store"))?; // released at once
    /// # Ok(()) }
    /// ```
    pub async fn close(self) -> Result<()> {
        self.engine.close().await
    }

    /// [`close`](Store::close) for threads.
    ///
    /// # Errors
    ///
    /// As [`close`](Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// store.blocking_close()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking_close(self) -> Result<()> {
        block_on(self.close())
    }

    /// Names of every queue in the store, sorted. On PostgreSQL, every queue of the store's
    /// schema, including those only other processes have used (see
    /// [`queue_names`](Store::queue_names) for those this handle knows).
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`](crate::Error::Postgres) if the database cannot be asked,
    /// [`Error::Closed`](crate::Error::Closed) after [`close`](Store::close).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.queue::<u8>("b").await?;
    /// store.queue::<u8>("a").await?;
    /// assert_eq!(store.list_queues().await?, ["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub async fn list_queues(&self) -> Result<Vec<String>> {
        self.engine.list_queues().await
    }

    /// Sets the queue-depth gauges ([`metrics::DEPTH`](crate::metrics::DEPTH): visible,
    /// delayed, leased, held and dead items per queue, and
    /// [`metrics::FRONT_AGE_SECONDS`](crate::metrics::FRONT_AGE_SECONDS)) from every queue's
    /// [`stats`](crate::ReliableConcurrentQueue::stats). Depths cost nothing on the hot
    /// paths this way: a service calls this as often as its metrics are scraped (every few
    /// seconds, say). On PostgreSQL it is one read per queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads; a cancelled call leaves some gauges set, others not yet.
    ///
    /// # Errors
    ///
    /// As [`list_queues`](Store::list_queues) and
    /// [`stats`](crate::ReliableConcurrentQueue::stats).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.queue::<u8>("jobs").await?;
    /// store.report_metrics().await?; // reliable_queue_queue_depth{queue="jobs",state=...}
    /// # Ok(()) }
    /// ```
    pub async fn report_metrics(&self) -> Result<()> {
        for name in self.list_queues().await? {
            let queue = self.queue::<crate::RawItem>(&name).await?;
            let stats = queue.stats().await?;
            crate::metrics::depth(&name, &stats, self.engine.now());
        }
        Ok(())
    }

    /// What this store's handles committed since the first call of this method: items
    /// enqueued and done, lease failures (see [`Activity`](crate::metrics::Activity)). A
    /// dashboard reads it every second and charts the differences. Counting starts at the
    /// first call (until then a commit pays one branch for it), so the first call returns
    /// zeros.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.blocking_queue::<u8>("jobs")?;
    /// let before = store.activity();
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// q.enqueue(&mut tx, 2)?;
    /// tx.blocking_commit()?;
    /// let mut tx = store.begin();
    /// q.blocking_try_dequeue(&mut tx)?;
    /// tx.blocking_commit()?;
    /// let after = store.activity();
    /// assert_eq!((after.enqueued - before.enqueued, after.done - before.done), (2, 1));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn activity(&self) -> crate::metrics::Activity {
        self.engine.metrics.activity.read()
    }

    /// [`report_metrics`](Store::report_metrics) for threads.
    ///
    /// # Errors
    ///
    /// As [`report_metrics`](Store::report_metrics).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.blocking_queue::<u8>("jobs")?;
    /// store.blocking_report_metrics()?; // reliable_queue_queue_depth{queue="jobs",state=...}
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_report_metrics(&self) -> Result<()> {
        for name in self.blocking_list_queues()? {
            let queue = self.blocking_queue::<crate::RawItem>(&name)?;
            let stats = queue.blocking_stats()?;
            crate::metrics::depth(&name, &stats, self.engine.now());
        }
        Ok(())
    }

    /// [`list_queues`](Store::list_queues) for threads.
    ///
    /// # Errors
    ///
    /// As [`list_queues`](Store::list_queues).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.blocking_queue::<u8>("jobs")?;
    /// assert_eq!(store.blocking_list_queues()?, ["jobs"]);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_list_queues(&self) -> Result<Vec<String>> {
        crate::engine::block_on(self.engine.list_queues())
    }

    /// Names of the queues this handle knows, sorted: on the embedded engines every queue
    /// of the store; on PostgreSQL those opened through this handle.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.blocking_queue::<u8>("b")?;
    /// store.blocking_queue::<u8>("a")?;
    /// assert_eq!(store.queue_names(), ["a", "b"]);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn queue_names(&self) -> Vec<String> {
        self.engine.queue_names()
    }

    /// Records that failed their checksum or decode, set aside at this or an earlier open.
    /// Empty for a healthy store.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// assert!(store.set_aside_records().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_aside_records(&self) -> Vec<SetAsideRecord> {
        self.engine.set_aside_records()
    }

    /// The ranges of log records (sequence numbers, inclusive) found missing when the store
    /// was opened with [`Builder::salvage`](crate::Builder::salvage), at this or an earlier
    /// open. Empty for a store that never lost records.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path().join("store"))?;
    /// assert!(store.missing_records().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn missing_records(&self) -> Vec<std::ops::RangeInclusive<u64>> {
        self.engine.missing_records()
    }

    /// Lifts the fence that set-aside records put on queue `name`, accepting the damage: the
    /// items the bad records enqueued are missing, and items they dequeued are back in the
    /// queue. The records themselves stay in the quarantine tree.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after its first poll does not stop the change; call again to
    /// learn its outcome (lifting a lifted fence does nothing).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`](crate::Error::Storage) if the change cannot be recorded,
    /// [`Error::Closed`](crate::Error::Closed) after [`close`](Store::close). Unknown or
    /// unfenced names are not an error.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.unfence("never-fenced").await?;
    /// # Ok(()) }
    /// ```
    pub async fn unfence(&self, name: &str) -> Result<()> {
        self.engine.unfence(name).await
    }

    /// [`unfence`](Store::unfence) for threads.
    ///
    /// # Errors
    ///
    /// As [`unfence`](Store::unfence).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.blocking_unfence("never-fenced")?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_unfence(&self, name: &str) -> Result<()> {
        block_on(self.unfence(name))
    }

    /// The store's directory, `None` in memory.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(reliable_queue::Store::in_memory()?.path().is_none());
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn path(&self) -> Option<&Path> {
        self.engine.config().path.as_deref()
    }

    /// The store's durability setting.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Durability, Store};
    /// assert_eq!(Store::in_memory()?.durability(), Durability::Sync);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn durability(&self) -> Durability {
        self.engine.config().durability
    }
}

// Opening is the builder's last step and makes a `Store`: here, so that the builder (a child
// module) does not import its parent.
impl Builder {
    /// Validates the settings and opens the store (recovering it from disk if it has a path).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a setting out of range or one
    /// the named store does not take (`postgres_*` settings without a PostgreSQL URL),
    /// [`Error::AlreadyOpen`](crate::Error::AlreadyOpen) if the
    /// directory is in use, [`Error::UnsupportedFormat`](crate::Error::UnsupportedFormat) for a store of another format
    /// version, [`Error::UnsafeDirectory`](crate::Error::UnsafeDirectory) for a path that is
    /// not a directory, a symbolic link in or to it, or (Unix) a directory owned by another
    /// user or open to others (see [`allow_shared_directory`](Builder::allow_shared_directory)),
    /// [`Error::Storage`](crate::Error::Storage) when the directory cannot be created or read.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::builder().path(dir.path().join("store")).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(self) -> Result<Store> {
        Store::open_with(self.config.validate()?)
    }

    /// Validates the settings and connects to the store on the server set by
    /// [`url`](Builder::url) (or [`postgres`](Builder::postgres)): checks that the server
    /// answers and, on PostgreSQL, creates the store's tables or checks their version.
    /// Without a server's URL it opens the store as [`open`](Builder::open) does.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped future leaves at most the schema created.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a malformed URL or schema
    /// name, or a setting the engine does not take (`postgres_*` settings without a
    /// PostgreSQL URL, or with a Redis one);
    /// [`Error::Postgres`](crate::Error::Postgres) or [`Error::Redis`](crate::Error::Redis)
    /// when the server cannot be reached or refuses (or, with
    /// [`require_fsync`](Builder::require_fsync), does not fsync every commit);
    /// [`Error::SchemaVersion`](crate::Error::SchemaVersion) when the schema was made by
    /// another version of this crate.
    pub async fn connect(self) -> Result<Store> {
        Ok(Store::from_engine(
            crate::engine::Engine::connect(self.config.validate()?).await?,
        ))
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path())
            .field("durability", &self.durability())
            .field("queues", &self.engine.queue_names().len())
            .finish()
    }
}
