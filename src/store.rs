//! [`Store`]: the handle on a set of named queues and their log.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{Builder, Config, Durability};
use crate::core::{QueueCore, QueueId};
use crate::error::{Error, Result};
use crate::log::catalog::Fence;
use crate::log::{BadRecord, DurableLog};
use crate::queue::ReliableConcurrentQueue;
use crate::sync::process::{AtomicU64, Mutex, Ordering};
use crate::transaction::Transaction;

/// Longest queue name accepted, in bytes.
const MAX_NAME_LEN: usize = 1024;

/// A set of named queues, in memory or in a directory on disk, and the log behind them.
///
/// Cheap to clone: clones share one store. Dropping the last handle (stores, queues and
/// transactions all count) closes it: the log is flushed and the directory released, so it
/// can be opened again, by this process or another. After a storage failure ([`Error::Storage`]
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
/// let store = Store::open(dir.path())?;
/// let jobs = store.queue::<String>("jobs")?;
///
/// let mut tx = store.begin();
/// jobs.enqueue(&mut tx, "resize image 17".to_owned())?;
/// tx.commit()?; // durable once this returns
///
/// let mut tx = store.begin();
/// assert_eq!(jobs.try_dequeue(&mut tx)?.as_deref(), Some("resize image 17"));
/// tx.commit()?; // gone for good
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

/// A record of the log that failed its checksum or decode and was set aside at open.
///
/// The record's bytes are kept in the store's `quarantine` tree. The queues it names stay
/// fenced ([`Error::Corrupted`] from [`Store::queue`]) until [`Store::unfence`] is called.
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

pub(crate) struct StoreInner {
    pub(crate) config: Config,
    catalog: Mutex<Catalog>,
    pub(crate) backend: Backend,
    /// Released last, after the backend has closed the directory.
    _dir: Option<DirLock>,
}

struct Catalog {
    queues: HashMap<String, Arc<QueueCore>>,
    next_id: QueueId,
    fences: Vec<Fence>,
    set_aside: Vec<BadRecord>,
}

pub(crate) enum Backend {
    /// Nothing on disk: commits apply in the caller's thread.
    Memory {
        next_id: AtomicU64,
    },
    Durable(DurableLog),
}

/// Directories open in this process. sled's file lock catches other processes.
static OPEN_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

struct DirLock(PathBuf);

impl DirLock {
    fn acquire(path: PathBuf) -> Result<Self> {
        let mut open = OPEN_DIRS.lock();
        if open.contains(&path) {
            return Err(Error::AlreadyOpen { path });
        }
        open.push(path.clone());
        Ok(DirLock(path))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        OPEN_DIRS.lock().retain(|p| p != &self.0);
    }
}

fn create_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path)
}

impl Store {
    /// Opens (or creates) the store in directory `path` with the default settings:
    /// [`Durability::Sync`], 4 MiB items.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyOpen`] if the directory is in use (by another process, this is reported
    /// after waiting up to 2 s, the time a store closed a moment ago may take to release the
    /// directory), [`Error::UnsupportedFormat`] for a store this build cannot read,
    /// [`Error::Storage`] if the directory cannot be created or read. Records that fail their
    /// checksum do not fail the open: see
    /// [`set_aside_records`](Store::set_aside_records).
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path())?;
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
        let Some(path) = config.path.clone() else {
            let inner = StoreInner {
                config,
                catalog: Mutex::new(Catalog {
                    queues: HashMap::new(),
                    next_id: 0,
                    fences: Vec::new(),
                    set_aside: Vec::new(),
                }),
                backend: Backend::Memory {
                    next_id: AtomicU64::new(0),
                },
                _dir: None,
            };
            return Ok(Store {
                inner: Arc::new(inner),
            });
        };
        create_dir(&path)?;
        let path = path.canonicalize()?;
        let dir = DirLock::acquire(path.clone())?;
        let opened = DurableLog::open(&path, &config)?;
        let next_id = opened
            .queues
            .iter()
            .map(|(_, id, _)| id + 1)
            .max()
            .unwrap_or(0);
        let queues = opened
            .queues
            .into_iter()
            .map(|(name, id, items)| {
                let core = QueueCore::new(id, Arc::from(name.as_str()), items);
                (name, Arc::new(core))
            })
            .collect();
        let inner = StoreInner {
            config,
            catalog: Mutex::new(Catalog {
                queues,
                next_id,
                fences: opened.fences,
                set_aside: opened.set_aside,
            }),
            backend: Backend::Durable(opened.log),
            _dir: Some(dir),
        };
        Ok(Store {
            inner: Arc::new(inner),
        })
    }

    /// Opens the queue `name`, creating it if it does not exist yet.
    ///
    /// The queue's items are `T`s; the store does not record `T`, so opening one name with
    /// two different types makes dequeues fail with [`Error::Deserialize`].
    ///
    /// # Errors
    ///
    /// [`Error::Corrupted`] if the queue is fenced by a record set aside at open,
    /// [`Error::InvalidConfig`] for an empty name or one over 1024 bytes, [`Error::Storage`]
    /// if the new queue cannot be recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let orders = store.queue::<(u64, String)>("orders")?;
    /// assert_eq!(orders.name(), "orders");
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn queue<T>(&self, name: &str) -> Result<ReliableConcurrentQueue<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(Error::InvalidConfig(format!(
                "queue names must be 1 to {MAX_NAME_LEN} bytes long"
            )));
        }
        let mut catalog = self.inner.catalog.lock();
        if let Some(core) = catalog.queues.get(name) {
            if let Some(fence) = catalog.fences.iter().find(|f| f.queue == core.id()) {
                return Err(Error::Corrupted {
                    queue: Some(name.to_owned()),
                    record: fence.record,
                    reason: fence.reason.clone(),
                });
            }
            return Ok(ReliableConcurrentQueue::new(
                self.inner.clone(),
                core.clone(),
            ));
        }
        let id = catalog.next_id;
        if let Backend::Durable(log) = &self.inner.backend {
            log.create_queue(name, id)?;
        }
        let core = Arc::new(QueueCore::new(id, Arc::from(name), VecDeque::new()));
        catalog.queues.insert(name.to_owned(), core.clone());
        catalog.next_id += 1;
        Ok(ReliableConcurrentQueue::new(self.inner.clone(), core))
    }

    /// Starts a transaction. It may touch any queues of this store; it does nothing until
    /// [`commit`](Transaction::commit)ted, and dropping it aborts it.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let a = store.queue::<u32>("a")?;
    /// let b = store.queue::<String>("b")?;
    /// let mut tx = store.begin();
    /// a.enqueue(&mut tx, 1)?;
    /// b.enqueue(&mut tx, "one".into())?;
    /// tx.commit()?;
    /// assert_eq!((a.count(), b.count()), (1, 1));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn begin(&self) -> Transaction {
        Transaction::new(self.inner.clone())
    }

    /// Makes every commit so far durable. Under [`Durability::Sync`] they already are; under
    /// [`Durability::Buffered`] this waits for a flush. In memory it does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if the flush fails, [`Error::Closed`] if the store stopped
    /// committing.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Durability, Store};
    /// let dir = tempfile::tempdir()?;
    /// let store = Store::builder().path(dir.path()).durability(Durability::Buffered).open()?;
    /// let q = store.queue::<u8>("q")?;
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 1)?;
    /// tx.commit()?;
    /// store.flush()?; // now on disk
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&self) -> Result<()> {
        match &self.inner.backend {
            Backend::Durable(log) => log.flush(),
            Backend::Memory { .. } => Ok(()),
        }
    }

    /// Names of every queue in the store, sorted.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.queue::<u8>("b")?;
    /// store.queue::<u8>("a")?;
    /// assert_eq!(store.queue_names(), ["a", "b"]);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner.catalog.lock().queues.keys().cloned().collect();
        names.sort();
        names
    }

    /// Records that failed their checksum or decode, set aside at this or an earlier open.
    /// Empty for a healthy store.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::open(dir.path())?;
    /// assert!(store.set_aside_records().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_aside_records(&self) -> Vec<SetAsideRecord> {
        let catalog = self.inner.catalog.lock();
        let name_of = |id: QueueId| {
            catalog
                .queues
                .values()
                .find(|q| q.id() == id)
                .map_or_else(|| format!("#{id}"), |q| q.name().to_owned())
        };
        catalog
            .set_aside
            .iter()
            .map(|bad| SetAsideRecord {
                record: bad.record,
                queues: bad
                    .queues
                    .as_ref()
                    .map(|ids| ids.iter().map(|&id| name_of(id)).collect()),
                reason: bad.reason.clone(),
            })
            .collect()
    }

    /// Lifts the fence that set-aside records put on queue `name`, accepting the damage: the
    /// items the bad records enqueued are missing, and items they dequeued are back in the
    /// queue. The records themselves stay in the quarantine tree.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if the change cannot be recorded. Unknown or unfenced names are
    /// not an error.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// store.unfence("never-fenced")?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn unfence(&self, name: &str) -> Result<()> {
        let mut catalog = self.inner.catalog.lock();
        let Some(id) = catalog.queues.get(name).map(|q| q.id()) else {
            return Ok(());
        };
        if let Backend::Durable(log) = &self.inner.backend {
            log.unfence(id)?;
        }
        catalog.fences.retain(|f| f.queue != id);
        Ok(())
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
        self.inner.config.path.as_deref()
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
        self.inner.config.durability
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.config.path)
            .field("durability", &self.inner.config.durability)
            .field("queues", &self.inner.catalog.lock().queues.len())
            .finish()
    }
}

impl StoreInner {
    /// Takes the next `n` ids of the in-memory backend.
    pub(crate) fn memory_ids(next_id: &AtomicU64, n: u64) -> u64 {
        next_id.fetch_add(n, Ordering::Relaxed)
    }
}
