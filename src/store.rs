//! [`Store`]: the handle on a set of named queues and their log.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{Builder, Config, Durability};
use crate::core::{QueueCore, QueueId};
use crate::error::{Error, Result};
use crate::log::catalog::{self, Fence};
use crate::log::{recover, BadRecord, CommitRequest, Committer, Failure, Message, Reply, Trees};
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
    Durable(Durable),
}

pub(crate) struct Durable {
    /// `None` once closing has begun.
    trees: Option<Trees>,
    sender: Option<Sender<Message>>,
    committer: Option<JoinHandle<()>>,
    failure: Arc<Failure>,
}

/// How long closing a store waits for sled after a storage failure.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

impl Durable {
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

    /// The sled trees, unless the committer stopped on a storage failure: then sled is not
    /// touched again (see [`Failure`]) and this returns that failure.
    fn trees(&self) -> Result<&Trees> {
        if let Some(e) = self.failure.get() {
            return Err(e);
        }
        self.trees.as_ref().ok_or(Error::Closed)
    }
}

impl Drop for Durable {
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
        }
    }
}

/// Drops sled's handles after a storage failure without risking a hang.
///
/// sled flushes when its last handle is dropped, and after some failures that flush never
/// returns (see [`Failure`]). The handles are dropped on a thread of their own, waited for
/// [`CLOSE_PATIENCE`]; past that the thread is left to it and the directory stays locked
/// until the process exits.
fn close_after_failure(trees: Trees) {
    let (done, closed) = crossbeam_channel::bounded::<()>(1);
    let closer = std::thread::Builder::new()
        .name("reliable-queue-close".into())
        .spawn(move || {
            drop(trees);
            drop(done);
        });
    if let Err(e) = closer {
        tracing::error!(error = %e, "cannot start a thread to close the store; closing in place");
        return;
    }
    if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = closed.recv_timeout(CLOSE_PATIENCE) {
        tracing::error!(
            "the storage engine did not close within {CLOSE_PATIENCE:?} after a storage failure; \
             the directory stays locked until the process exits"
        );
    }
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

/// How long `open` waits for sled's lock on the directory when it is taken.
///
/// Dropping a `sled::Db` does not release its lock at once: sled's background threads (log
/// buffer writes, file truncation and its fsync) keep the file open until they finish. So a
/// store closed a moment ago, by this process or another, can look locked for a few
/// milliseconds, longer under I/O load. A directory that stays locked this long is in use.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Pause between two attempts to take sled's lock.
const LOCK_RETRY: Duration = Duration::from_millis(2);

/// Opens sled in `path`, waiting up to [`LOCK_PATIENCE`] for its lock.
fn open_sled(path: &Path, config: &Config, flush_every: Option<u64>) -> Result<sled::Db> {
    let give_up = Instant::now() + LOCK_PATIENCE;
    let mut snapshots_checked = false;
    loop {
        let opened = sled::Config::new()
            .path(path)
            .cache_capacity(config.cache_capacity)
            .flush_every_ms(flush_every)
            .open();
        match opened {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if Instant::now() >= give_up {
                    return Err(Error::AlreadyOpen {
                        path: path.to_path_buf(),
                    });
                }
                std::thread::sleep(LOCK_RETRY);
            }
            Err(sled::Error::Corruption { .. })
                if !snapshots_checked && discard_torn_sled_snapshots(path)? =>
            {
                snapshots_checked = true;
            }
            Err(other) => return Err(Error::from(other)),
        }
    }
}

/// Removes snapshot files sled did not finish writing; true if there were any.
///
/// sled's snapshot is an index of its log, rebuilt from the log at every open. sled 0.34
/// writes it to `snap.<position>.generating` and renames the file once it is complete, but
/// when it looks for the newest snapshot it does not skip `.generating` files: a write cut
/// short (a crash or an I/O error during an open) leaves one that sorts after every complete
/// snapshot, and sled then reports the directory corrupt at every open. Such a file holds
/// nothing the log does not; without it sled starts from the previous snapshot (or none) and
/// replays the log from there.
///
/// Called only after sled refused the directory as corrupt, so no process held it then. A
/// process opening the same directory in that instant could see its own snapshot removed:
/// its open then fails with an error and can be retried; nothing is lost.
fn discard_torn_sled_snapshots(path: &Path) -> Result<bool> {
    let mut removed = false;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(
                ?path,
                file = %name,
                "removing a snapshot file whose writing was cut short"
            );
            std::fs::remove_file(entry.path())?;
            removed = true;
        }
    }
    Ok(removed)
}

/// Finishes sled's `conf` file if a crash cut its first write short.
///
/// The first open of a directory writes sled's settings to `conf` in two writes, the text and
/// then its CRC-32, before sled creates its data file. A process killed between the two
/// leaves the text alone, and sled 0.34 then reads the end of the text as the checksum and
/// reports the directory corrupt at every later open. When `conf` holds exactly sled's three
/// settings lines and the data file is absent or empty (so nothing was ever stored), this
/// appends the missing checksum: the write sled did not get to make. Anything else is left
/// to sled.
fn complete_torn_sled_config(path: &Path) -> Result<()> {
    let conf = path.join("conf");
    let text = match std::fs::read(&conf) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let keys: Option<Vec<&str>> = std::str::from_utf8(&text).ok().map(|t| {
        t.lines()
            .map(|line| line.split(": ").next().unwrap_or_default())
            .collect()
    });
    let settings_only = text.ends_with(b"\n")
        && keys.as_deref() == Some(&["segment_size", "use_compression", "version"][..]);
    let stored_nothing = match std::fs::metadata(path.join("db")) {
        Ok(meta) => meta.len() == 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e.into()),
    };
    if !settings_only || !stored_nothing {
        return Ok(());
    }
    tracing::warn!(
        ?path,
        "completing sled's configuration file, cut short by a crash"
    );
    let mut file = std::fs::OpenOptions::new().append(true).open(&conf)?;
    std::io::Write::write_all(&mut file, &crc32fast::hash(&text).to_le_bytes())?;
    file.sync_all()?;
    Ok(())
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
        let flush_every = match config.durability {
            Durability::Sync => None,
            Durability::Buffered => Some((config.flush_interval.as_millis() as u64).max(1)),
        };
        complete_torn_sled_config(&path)?;
        let db = open_sled(&path, &config, flush_every)?;
        let trees = Trees::open(db)?;
        let mut recovered = recover(&trees)?;
        let mut queues = HashMap::new();
        for (name, id) in &recovered.queues {
            let items = recovered.items.remove(id).unwrap_or_else(VecDeque::new);
            let core = QueueCore::new(*id, Arc::from(name.as_str()), items);
            queues.insert(name.clone(), Arc::new(core));
        }
        let next_id = recovered
            .queues
            .iter()
            .map(|(_, id)| id + 1)
            .max()
            .unwrap_or(0);
        let (sender, receiver) = crossbeam_channel::unbounded();
        let failure = Arc::new(Failure::default());
        let committer = Committer::new(
            trees.clone(),
            &config,
            receiver,
            recovered.liveness,
            recovered.next_id,
            recovered.next_seq,
            failure.clone(),
        );
        let committer = std::thread::Builder::new()
            .name("reliable-queue-committer".into())
            .spawn(move || committer.run())?;
        let inner = StoreInner {
            config,
            catalog: Mutex::new(Catalog {
                queues,
                next_id,
                fences: recovered.fences,
                set_aside: recovered.set_aside,
            }),
            backend: Backend::Durable(Durable {
                trees: Some(trees),
                sender: Some(sender),
                committer: Some(committer),
                failure,
            }),
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
        if let Backend::Durable(durable) = &self.inner.backend {
            catalog::create_queue(&durable.trees()?.meta, name, id)?;
            if self.inner.config.durability == Durability::Sync {
                durable.trees()?.db.flush()?;
            }
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
        let Backend::Durable(durable) = &self.inner.backend else {
            return Ok(());
        };
        let Some(sender) = &durable.sender else {
            return Err(Error::Closed);
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        sender
            .send(Message::Flush(Reply::Blocking(tx)))
            .map_err(|_| Error::Closed)?;
        rx.recv().unwrap_or(Err(Error::Closed))
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
        if let Backend::Durable(durable) = &self.inner.backend {
            catalog::remove_fences(&durable.trees()?.meta, id)?;
            durable.trees()?.db.flush()?;
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
