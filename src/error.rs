//! The crate's one error type.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The result type of every fallible operation in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cheaply clonable, thread-safe error source.
type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, one variant per cause a caller can act on.
///
/// Every variant says which queue, record or path it concerns where there is one. New
/// variants may be added in minor releases, so match with a wildcard arm.
///
/// # Examples
///
/// ```
/// use reliable_queue::{Error, Store};
///
/// let store = Store::builder().max_item_size(16).open()?;
/// let queue = store.blocking_queue::<String>("mail")?;
/// let mut tx = store.begin();
/// match queue.enqueue(&mut tx, "x".repeat(100)) {
///     Err(Error::ItemTooLarge { size, limit, .. }) => assert!(size > limit),
///     other => panic!("expected ItemTooLarge, got {other:?}"),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// An item could not be serialized at `enqueue`. Nothing was added to the transaction.
    ///
    /// The message includes what the item's `Serialize` implementation reported, its own
    /// text included when it failed with `serde::ser::Error::custom` (for example
    /// `item for queue "mail" could not be serialized: no widgets on Tuesdays`).
    Serialize {
        /// The queue the item was meant for.
        queue: String,
        /// What the serializer reported: the custom message of the item's `Serialize`
        /// implementation when it gave one, otherwise postcard's error (a `postcard::Error`).
        source: Source,
    },

    /// An item dequeued from the queue could not be deserialized as the queue's `T`.
    ///
    /// The item stays held by the transaction: abort (or drop) the transaction to put it back,
    /// or commit to remove it for good.
    Deserialize {
        /// The queue the item came from.
        queue: String,
        /// The item's id in the log.
        item_id: u64,
        /// What the deserializer reported.
        source: Source,
    },

    /// An item's encoded size is over the store's item size limit. Nothing was added.
    ItemTooLarge {
        /// The queue the item was meant for.
        queue: String,
        /// The encoded size reached when encoding stopped: at least this (exact for byte
        /// payloads such as `Vec<u8>` and `String`).
        size: usize,
        /// The store's limit ([`Builder::max_item_size`](crate::Builder::max_item_size)).
        limit: usize,
    },

    /// The transaction's size (its items' encoded bytes plus a fixed per-item overhead) would
    /// go over the store's transaction size limit.
    /// The item that would have crossed the limit was not added; the rest of the transaction
    /// is intact.
    TransactionTooLarge {
        /// The size the transaction would have reached.
        size: usize,
        /// The store's limit ([`Builder::max_transaction_size`](crate::Builder::max_transaction_size)).
        limit: usize,
    },

    /// The queue is fenced: a record of the log that touched it failed its checksum or decode
    /// and was set aside at open (see
    /// [`Store::set_aside_records`](crate::Store::set_aside_records)). Lift the fence with
    /// [`Store::unfence`](crate::Store::unfence) once the damage is accepted.
    Fenced {
        /// The fenced queue.
        queue: String,
        /// The sequence number of the set-aside record that fenced it.
        record: u64,
        /// What was wrong with the record.
        reason: String,
    },

    /// The storage engine failed (I/O error, disk full, a permission problem, ...). A commit
    /// that fails this way is rolled back: its dequeued items are back in their queues. The
    /// store stops writing after such a failure: later calls get [`Error::PreviousFailure`].
    ///
    /// The message says where and what: `storage failure in <path>: <cause>`, for example
    /// `storage failure in /var/lib/app/store/db: Permission denied (os error 13)`
    /// (`storage failure: <cause>` when the path is not known). A file that the storage
    /// engine finds damaged is [`Error::Damaged`] instead.
    Storage {
        /// The store's directory, or the file in it the failure concerns, when known.
        path: Option<PathBuf>,
        /// What the storage engine reported (for sled, a `sled::Error`; for a failure of the
        /// crate's own file handling, a `std::io::Error`).
        source: Source,
    },

    /// An earlier storage failure stopped the store; nothing is written any more. Reopen the
    /// store. `source` is that first failure; the message repeats it.
    PreviousFailure {
        /// The failure that stopped the store.
        source: Source,
    },

    /// A transaction was used with a queue that belongs to another store.
    WrongStore {
        /// The queue the operation was called on.
        queue: String,
    },

    /// The store was closed ([`Store::close`](crate::Store::close)), or its engine stopped.
    Closed,

    /// The store's directory is already open, in this process or another.
    AlreadyOpen {
        /// The directory.
        path: PathBuf,
    },

    /// A queue name that is empty, over 1024 bytes, or has a NUL character (which no engine
    /// takes: PostgreSQL's text cannot hold one, so no engine makes such a queue). Nothing was
    /// created.
    InvalidQueueName {
        /// The rejected name (cut to its first 64 characters).
        name: String,
        /// What a name must be.
        expected: &'static str,
    },

    /// A builder setting is out of range.
    InvalidConfig {
        /// The setting, as the builder method is named.
        setting: &'static str,
        /// Its allowed range.
        expected: &'static str,
    },

    /// The directory holds a store written in a format this version does not read.
    UnsupportedFormat {
        /// The version found in the directory.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },

    /// The store's directory is not safe to open: it is not a directory, it or one of the
    /// storage engine's files in it is a symbolic link, or (Unix) it is owned by another user
    /// or open to its group or others. Nothing in it was opened. The message says how to fix
    /// it; see [`Builder::allow_shared_directory`](crate::Builder::allow_shared_directory).
    UnsafeDirectory {
        /// The directory, or the entry in it, that was refused (as given, not canonical).
        path: PathBuf,
        /// What is wrong with it.
        problem: DirectoryProblem,
    },

    /// The store's log came back shorter than it was, or with a hole: records the store had
    /// made durable are missing (a file was deleted, truncated, restored from an older backup,
    /// or damaged where the storage engine's own recovery drops everything after the damage).
    /// A crash never causes this: the store only counts a record as made once it is durable.
    /// Nothing was opened. Open with [`Builder::salvage`](crate::Builder::salvage) to open what
    /// can be trusted, with `queues` fenced.
    MissingRecords {
        /// The store's directory.
        path: PathBuf,
        /// The sequence numbers of the missing records, as inclusive ranges.
        missing: Vec<std::ops::RangeInclusive<u64>>,
        /// The queues the missing records may have touched: their contents can no longer be
        /// trusted (items consumed by a missing record may be back, items it enqueued gone).
        queues: Vec<String>,
    },

    /// A file of the store is damaged in a way that no record-level check can set aside: the
    /// storage engine's own files (its configuration `conf`, its log `db`, its snapshot
    /// `snap.*`, a large value kept in a file of its own in `blobs/`) or the store's mark
    /// file. Found at open, nothing was opened; found later, the call failed.
    ///
    /// The message names the file and what was found, for example `store file
    /// /var/lib/app/store/conf is damaged: its checksum does not match its contents ...`.
    /// Restore the file (or the store) from a backup; the detail says when there is a
    /// simpler way.
    Damaged {
        /// The file found damaged, or the store's directory when the storage engine did not
        /// say which file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },

    /// An argument is out of range: a zero or too long lease time, a delay past what the
    /// clock can count, a time before the Unix epoch. Nothing was done.
    InvalidArgument {
        /// The argument, as the method names it.
        argument: &'static str,
        /// Its allowed range.
        expected: &'static str,
    },

    /// The lease ended before it was settled: its deadline passed (the item went back to its
    /// queue, or to its dead letters), or it was settled already. Nothing was done; when the
    /// lease was acknowledged in a transaction, the whole commit failed and nothing of it
    /// applied. The item is someone else's to process now.
    LeaseExpired {
        /// The item's queue.
        queue: String,
        /// The lease's fencing token.
        token: u64,
    },

    /// The transaction ran past its deadline ([`Transaction::set_timeout`](crate::Transaction::set_timeout),
    /// [`Builder::transaction_timeout`](crate::Builder::transaction_timeout)): the items it
    /// held went back to their queues then, and nothing of it will apply. Begin a new one.
    TransactionExpired,

    /// A dead letter asked for by id is not among the queue's dead letters (it was never
    /// one, or it was replayed or purged since). Nothing was done.
    NotDeadLetter {
        /// The queue.
        queue: String,
        /// The id asked for.
        id: u64,
    },

    /// The PostgreSQL server could not be reached, refused a statement or lost the
    /// connection (the `postgres` engine). Nothing of the transaction applied: its database
    /// transaction was rolled back (or its connection is gone, which rolls it back), so every
    /// item it dequeued is back in its queue. Retry once the server is back: the store
    /// reconnects by itself.
    Postgres {
        /// What the store was doing: `"connect"`, `"migrate"`, `"dequeue"`, `"commit"`, ...
        operation: &'static str,
        /// The client's error (a `tokio_postgres::Error`, or the pool's).
        source: Source,
    },

    /// The Redis server could not be reached, refused a command, lost the connection, or
    /// answered with data this store did not write (a key of the store tampered with: a
    /// wrong type, a missing or malformed record) (the `redis` engine). Nothing of the
    /// transaction applied; its dequeued items go back to their queues (at the latest when
    /// the transaction's hold on them ends, if the server was out of reach). Retry once the
    /// server is back: the store reconnects by itself.
    Redis {
        /// What the store was doing: `"connect"`, `"dequeue"`, `"commit"`, ...
        operation: &'static str,
        /// The client's error (a `redis::RedisError`), or what was wrong with the data.
        source: Source,
    },

    /// The connection to PostgreSQL was lost while the commit was in flight (its `COMMIT`, or
    /// the one statement of a commit that only enqueues): the transaction may have committed
    /// or not, and this process cannot tell. Its dequeued items are either
    /// gone for good or back in their queues, never both; its enqueues are either all in or
    /// all out. An enqueue made with a deduplication key can be retried safely.
    CommitOutcomeUnknown {
        /// The client's error.
        source: Source,
    },

    /// The transaction's database transaction was rolled back before its commit (the
    /// `postgres` engine): a call on it failed inside the database transaction, or was
    /// cancelled (its future dropped) while the database was working on it. On the `redis`
    /// engine: a dequeue of it failed, so what the server took for it is not known. Nothing
    /// of the transaction applies; the items it dequeued are back in their queues. Begin a
    /// new one.
    TransactionAborted {
        /// What happened.
        reason: &'static str,
    },

    /// The database's schema for this store was written by another version of this crate
    /// than this build supports. Nothing was changed.
    SchemaVersion {
        /// The PostgreSQL schema (namespace) the store lives in.
        schema: String,
        /// The version found.
        found: i64,
        /// The version this build reads and writes.
        supported: i64,
    },

    /// The database has no schema for this store, and the store was told not to create one
    /// ([`Builder::postgres_migrate`](crate::Builder::postgres_migrate)`(false)`, as `rq`'s
    /// reading commands do): a mistyped schema or database, or a store never started with a
    /// role allowed to create it. On Redis: the namespace holds no store and
    /// [`Builder::redis_create`](crate::Builder::redis_create)`(false)` was given. Nothing was
    /// changed.
    SchemaMissing {
        /// The PostgreSQL schema (namespace) looked for; on Redis the namespace.
        schema: String,
    },

    /// The operation is not available on this store's engine (yet): for example the
    /// processing layer on the `postgres` engine while it is being built. Nothing was done.
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// The engine: `"postgres"`.
        engine: &'static str,
    },

    /// An internal invariant did not hold: a bug in this crate. The operation was not
    /// applied. Please report it with the message.
    Bug {
        /// The invariant that failed.
        invariant: &'static str,
    },
}

/// What made a store directory unsafe to open ([`Error::UnsafeDirectory`]).
///
/// New problems may be added in minor releases, so match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectoryProblem {
    /// The path exists and is not a directory.
    NotADirectory,
    /// The path is a symbolic link: the store's directory itself (the last component of the
    /// given path), or one of the storage engine's files in it.
    Symlink,
    /// The directory is owned by another user than the process's effective user (Unix).
    OwnedByOther {
        /// The directory's owner.
        owner: u32,
        /// The process's effective user id.
        process: u32,
    },
    /// The directory's permissions give its group or others some access (Unix).
    OpenToOthers {
        /// The directory's permission bits (e.g. `0o755`).
        mode: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Serialize { queue, source } => {
                write!(
                    f,
                    "item for queue {queue:?} could not be serialized: {source}"
                )
            }
            Error::Deserialize {
                queue,
                item_id,
                source,
            } => {
                write!(
                    f,
                    "item {item_id} of queue {queue:?} could not be deserialized: {source}"
                )
            }
            Error::ItemTooLarge { queue, size, limit } => write!(
                f,
                "item for queue {queue:?} is {size} bytes, over the limit of {limit}"
            ),
            Error::TransactionTooLarge { size, limit } => write!(
                f,
                "transaction would hold {size} bytes, over the limit of {limit}"
            ),
            Error::Fenced {
                queue,
                record,
                reason,
            } => write!(
                f,
                "queue {queue:?} is fenced: log record {record} was set aside ({reason})"
            ),
            Error::Storage {
                path: Some(path),
                source,
            } => write!(f, "storage failure in {}: {source}", path.display()),
            Error::Storage { path: None, source } => write!(f, "storage failure: {source}"),
            Error::PreviousFailure { source } => write!(
                f,
                "the store stopped after an earlier storage failure ({source}); reopen it"
            ),
            Error::WrongStore { queue } => write!(
                f,
                "queue {queue:?} belongs to another store than the transaction"
            ),
            Error::Closed => f.write_str("store is closed"),
            Error::InvalidArgument { argument, expected } => {
                write!(f, "invalid argument `{argument}`: expected {expected}")
            }
            Error::LeaseExpired { queue, token } => write!(
                f,
                "lease {token} on queue {queue:?} has ended (expired or settled); nothing was done"
            ),
            Error::TransactionExpired => f.write_str(
                "the transaction ran past its deadline: its held items went back and nothing of it applies",
            ),
            Error::NotDeadLetter { queue, id } => {
                write!(f, "item {id} is not a dead letter of queue {queue:?}")
            }
            Error::AlreadyOpen { path } => {
                write!(f, "store directory {} is already open", path.display())
            }
            Error::InvalidQueueName { name, expected } => {
                write!(f, "invalid queue name {name:?}: names are {expected}")
            }
            Error::InvalidConfig { setting, expected } => {
                write!(f, "invalid configuration: {setting} must be {expected}")
            }
            Error::UnsafeDirectory { path, problem } => {
                let path = path.display();
                let allow = "or open it with Builder::allow_shared_directory(true)";
                match problem {
                    DirectoryProblem::NotADirectory => {
                        write!(f, "store path {path} exists and is not a directory")
                    }
                    DirectoryProblem::Symlink => write!(
                        f,
                        "store path {path} is a symbolic link, and the store follows none in \
                         or to its directory; give the real path, or remove the link"
                    ),
                    DirectoryProblem::OwnedByOther { owner, process } => write!(
                        f,
                        "store directory {path} is owned by uid {owner}, not by this process \
                         (uid {process}); change its owner, {allow}"
                    ),
                    DirectoryProblem::OpenToOthers { mode } => write!(
                        f,
                        "store directory {path} has mode {mode:04o}, which lets its group or \
                         others in; make it owner-only (chmod 700), {allow}"
                    ),
                }
            }
            Error::MissingRecords {
                path,
                missing,
                queues,
            } => {
                write!(
                    f,
                    "the log of store {} is missing records it had made durable: ",
                    path.display()
                )?;
                for (i, range) in missing.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    if range.start() == range.end() {
                        write!(f, "{sep}{}", range.start())?;
                    } else {
                        write!(f, "{sep}{}..={}", range.start(), range.end())?;
                    }
                }
                write!(f, "; queues that can no longer be trusted: ")?;
                if queues.is_empty() {
                    f.write_str("none")?;
                }
                for (i, queue) in queues.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{queue:?}")?;
                }
                f.write_str(
                    "; restore the store from a backup, or open it with Builder::salvage(true) \
                     to open what can be trusted with those queues fenced",
                )
            }
            Error::Damaged { path, detail } => {
                write!(f, "store file {} is damaged: {detail}", path.display())
            }
            Error::Postgres { operation, source } => {
                write!(f, "PostgreSQL failed during {operation}: ")?;
                describe_chain(&**source, f)
            }
            Error::Redis { operation, source } => {
                write!(f, "Redis failed during {operation}: ")?;
                describe_chain(&**source, f)
            }
            Error::CommitOutcomeUnknown { source } => {
                write!(
                    f,
                    "the connection to PostgreSQL was lost during COMMIT; the transaction may \
                     or may not have committed: "
                )?;
                describe_chain(&**source, f)
            }
            Error::TransactionAborted { reason } => write!(
                f,
                "the transaction was rolled back before its commit ({reason}); nothing of it \
                 applies"
            ),
            Error::SchemaVersion {
                schema,
                found,
                supported,
            } => write!(
                f,
                "PostgreSQL schema {schema:?} is at version {found}; this build supports \
                 version {supported}"
            ),
            Error::SchemaMissing { schema } => write!(
                f,
                "no reliable-queue schema {schema:?} in this database (a mistyped schema, \
                 namespace or database? a store connected once with the right to create it \
                 makes it)"
            ),
            Error::Unsupported { operation, engine } => {
                write!(f, "{operation} is not available on the {engine} engine yet")
            }
            Error::Bug { invariant } => write!(
                f,
                "internal invariant broken ({invariant}); this is a bug in reliable-queue"
            ),
            Error::UnsupportedFormat { found, supported } => write!(
                f,
                "unsupported store format version {found} (this build reads {supported})"
            ),
        }
    }
}

/// A client's error as a person reads it: every level of its chain (the client's own top
/// line, such as "db error", says nothing alone), and for a server's refusal its severity,
/// message, SQLSTATE, detail and hint. Levels that repeat the one above are left out.
fn describe_chain(
    error: &(dyn std::error::Error + 'static),
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let mut parts: Vec<String> = Vec::new();
    let mut level = Some(error);
    while let Some(e) = level {
        #[cfg(feature = "postgres")]
        if let Some(db) = e.downcast_ref::<tokio_postgres::error::DbError>() {
            let mut text = format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            );
            if let Some(detail) = db.detail() {
                text.push_str("; DETAIL: ");
                text.push_str(detail);
            }
            if let Some(hint) = db.hint() {
                text.push_str("; HINT: ");
                text.push_str(hint);
            }
            parts.push(text);
            break;
        }
        let text = e.to_string();
        let text = text
            .strip_suffix(": db error")
            .map_or(text.clone(), str::to_owned);
        let said = parts.last().is_some_and(|last| last.contains(&text));
        #[cfg(feature = "postgres")]
        let said = said
            || e.downcast_ref::<tokio_postgres::Error>()
                .is_some_and(|pg| pg.as_db_error().is_some());
        if !said && !text.is_empty() {
            // A level that quotes the one below it ("...: db error") is kept: the part below
            // is what it lacked.
            parts.push(text);
        }
        level = e.source();
    }
    f.write_str(&parts.join(": "))
}

impl std::error::Error for Error {
    /// The underlying error itself (not a wrapper), so callers can downcast it, e.g. to
    /// `std::io::Error` or `sled::Error`.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Serialize { source, .. }
            | Error::Deserialize { source, .. }
            | Error::Storage { source, .. }
            | Error::Postgres { source, .. }
            | Error::Redis { source, .. }
            | Error::CommitOutcomeUnknown { source }
            | Error::PreviousFailure { source } => Some(&**source),
            _ => None,
        }
    }
}

impl Error {
    /// A storage failure whose place is not known yet (see [`Error::at`]).
    pub(crate) fn storage(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Storage {
            path: None,
            source: Arc::new(source),
        }
    }

    /// Says where a storage failure happened: `path` is the store's directory, or the file
    /// in it that the failure concerns.
    ///
    /// A [`Error::Storage`] without a path gets `path`; one that is sled reporting corrupted
    /// data becomes [`Error::Damaged`], naming the file sled points at when it does (`db` and
    /// the offset in it, or the large value's file in `blobs/`), `path` itself when it does
    /// not: for corruption, `path` must be the store's directory. Every other error, a
    /// `Storage` error that has its path already included, is returned unchanged.
    pub(crate) fn at(self, path: &Path) -> Error {
        match self {
            Error::Storage { path: None, source } => match source.downcast_ref::<sled::Error>() {
                Some(sled::Error::Corruption { at, .. }) => sled_corruption(path, *at),
                _ => Error::Storage {
                    path: Some(path.to_path_buf()),
                    source,
                },
            },
            other => other,
        }
    }

    /// The sticky form of a storage failure, for calls after the first.
    pub(crate) fn previous(first: &Error) -> Self {
        match first {
            Error::Storage { source, .. } | Error::PreviousFailure { source } => {
                Error::PreviousFailure {
                    source: source.clone(),
                }
            }
            other => other.clone(),
        }
    }

    /// An item for `queue` that did not serialize: the source is the item's own message when
    /// it gave one, postcard's error otherwise.
    pub(crate) fn serialize(queue: &str, source: crate::codec::SerializeError) -> Self {
        let source: Source = match source {
            crate::codec::SerializeError::Postcard(e) => Arc::new(e),
            crate::codec::SerializeError::Custom(message) => Arc::new(message),
        };
        Error::Serialize {
            queue: queue.to_owned(),
            source,
        }
    }
}

/// What sled's `Corruption { at }` says about the store in `dir`, as [`Error::Damaged`].
fn sled_corruption(dir: &Path, at: Option<sled::DiskPtr>) -> Error {
    let (path, detail) = match at {
        Some(sled::DiskPtr::Inline(offset)) => (
            dir.join("db"),
            format!(
                "the storage engine (sled) found no valid data at offset {offset} of its log, \
                 where its own index says there is some"
            ),
        ),
        Some(sled::DiskPtr::Blob(_, blob)) => (
            dir.join("blobs").join(blob.to_string()),
            "the storage engine (sled) could not use the large value it keeps in this file: \
             its checksum does not match its contents"
                .to_owned(),
        ),
        None => (
            dir.to_path_buf(),
            "the storage engine (sled) reported corrupted data without saying in which file"
                .to_owned(),
        ),
    };
    Error::Damaged { path, detail }
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::storage(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::storage(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_is_the_underlying_error() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        let e = Error::storage(io);
        let source = std::error::Error::source(&e).expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(e.to_string(), "storage failure: disk full");
    }

    #[test]
    fn a_storage_failure_says_where_and_what() {
        let denied = || std::io::Error::from_raw_os_error(13);
        let e = Error::storage(denied()).at(Path::new("/x/store/db"));
        let cause = denied().to_string();
        assert_eq!(
            e.to_string(),
            format!("storage failure in /x/store/db: {cause}")
        );
        let Error::Storage { path, .. } = &e else {
            panic!("expected Storage, got {e:?}");
        };
        assert_eq!(path.as_deref(), Some(Path::new("/x/store/db")));
        // The first place given stays.
        let again = e.clone().at(Path::new("/x/store"));
        assert_eq!(again.to_string(), e.to_string());
        // The source is still the error itself.
        let source = std::error::Error::source(&again).expect("a source");
        assert_eq!(
            source.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(denied().kind())
        );

        let sled = Error::from(sled::Error::Io(denied())).at(Path::new("/x/store"));
        assert_eq!(
            sled.to_string(),
            format!("storage failure in /x/store: IO error: {cause}")
        );
        assert!(std::error::Error::source(&sled)
            .and_then(|s| s.downcast_ref::<sled::Error>())
            .is_some());
    }

    #[test]
    fn the_sticky_failure_says_what_the_first_one_was() {
        let first = Error::storage(std::io::Error::other("disk on fire")).at(Path::new("/s"));
        let later = Error::previous(&first);
        assert_eq!(
            later.to_string(),
            "the store stopped after an earlier storage failure (disk on fire); reopen it"
        );
        assert_eq!(
            Error::previous(&later).to_string(),
            later.to_string(),
            "still the first failure"
        );
    }

    #[test]
    fn sled_corruption_becomes_damage_of_the_file_sled_points_at() {
        let corrupt = |at| Error::from(sled::Error::Corruption { at, bt: () });
        let dir = Path::new("/x/store");
        match corrupt(Some(sled::DiskPtr::Inline(4096))).at(dir) {
            Error::Damaged { path, detail } => {
                assert_eq!(path, dir.join("db"));
                assert!(detail.contains("offset 4096"), "{detail}");
            }
            other => panic!("expected Damaged, got {other:?}"),
        }
        match corrupt(Some(sled::DiskPtr::Blob(0, 118))).at(dir) {
            Error::Damaged { path, detail } => {
                assert_eq!(path, dir.join("blobs").join("118"));
                assert!(detail.contains("checksum"), "{detail}");
            }
            other => panic!("expected Damaged, got {other:?}"),
        }
        let e = corrupt(None).at(dir);
        assert!(
            matches!(&e, Error::Damaged { path, .. } if path == dir),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("store file /x/store is damaged: "),
            "{e}"
        );
        // Unplaced, it stays a storage failure.
        assert!(matches!(corrupt(None), Error::Storage { path: None, .. }));
    }

    #[test]
    fn other_errors_pass_through_at_unchanged() {
        let e = Error::Closed.at(Path::new("/x"));
        assert!(matches!(e, Error::Closed));
        let e = Error::AlreadyOpen {
            path: PathBuf::from("/y"),
        }
        .at(Path::new("/x"));
        assert!(matches!(e, Error::AlreadyOpen { path } if path == Path::new("/y")));
    }
}
