//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;
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
/// let queue = store.queue::<String>("mail")?;
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
    Serialize {
        /// The queue the item was meant for.
        queue: String,
        /// What the serializer reported.
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
        /// The encoded size of the item.
        size: usize,
        /// The store's limit ([`Builder::max_item_size`](crate::Builder::max_item_size)).
        limit: usize,
    },

    /// The transaction's enqueued bytes would go over the store's transaction size limit.
    /// The item that would have crossed the limit was not added; the rest of the transaction
    /// is intact.
    TransactionTooLarge {
        /// The size the transaction would have reached.
        size: usize,
        /// The store's limit ([`Builder::max_transaction_size`](crate::Builder::max_transaction_size)).
        limit: usize,
    },

    /// A record of the log failed its checksum or could not be decoded. The record was set
    /// aside, not deleted; see [`Store::set_aside_records`](crate::Store::set_aside_records).
    Corrupted {
        /// The queue the record touched (`None` when the record's header is unreadable too).
        queue: Option<String>,
        /// The record's sequence number (its key in the log).
        record: u64,
        /// What was wrong with it.
        reason: String,
    },

    /// The storage engine failed (I/O error, disk full, ...). A commit that fails this way
    /// is rolled back: its dequeued items are back in their queues.
    Storage {
        /// What the storage engine reported.
        source: Source,
    },

    /// A transaction was used with a queue that belongs to another store.
    WrongStore {
        /// The queue the operation was called on.
        queue: String,
    },

    /// The store can no longer commit: its committer stopped after a storage failure or a
    /// bug. Reopen the store.
    Closed,

    /// The store's directory is already open, in this process or another.
    AlreadyOpen {
        /// The directory.
        path: PathBuf,
    },

    /// A builder setting or an argument is out of range.
    InvalidConfig(String),

    /// The directory holds a store written in a format this version does not read.
    UnsupportedFormat {
        /// The version found in the directory.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Serialize { queue, .. } => {
                write!(f, "item for queue {queue:?} could not be serialized")
            }
            Error::Deserialize { queue, item_id, .. } => {
                write!(
                    f,
                    "item {item_id} of queue {queue:?} could not be deserialized"
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
            Error::Corrupted {
                queue,
                record,
                reason,
            } => match queue {
                Some(queue) => write!(
                    f,
                    "queue {queue:?} is fenced: log record {record} is corrupt ({reason})"
                ),
                None => write!(f, "log record {record} is corrupt ({reason})"),
            },
            Error::Storage { .. } => f.write_str("storage failure"),
            Error::WrongStore { queue } => write!(
                f,
                "queue {queue:?} belongs to another store than the transaction"
            ),
            Error::Closed => f.write_str("store is closed"),
            Error::AlreadyOpen { path } => {
                write!(f, "store directory {} is already open", path.display())
            }
            Error::InvalidConfig(what) => write!(f, "invalid configuration: {what}"),
            Error::UnsupportedFormat { found, supported } => write!(
                f,
                "unsupported store format version {found} (this build reads {supported})"
            ),
        }
    }
}

impl std::error::Error for Error {
    /// The underlying error itself (not a wrapper), so callers can downcast it, e.g. to
    /// `std::io::Error` or `sled::Error`.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Serialize { source, .. }
            | Error::Deserialize { source, .. }
            | Error::Storage { source } => Some(&**source),
            _ => None,
        }
    }
}

impl Error {
    pub(crate) fn storage(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Storage {
            source: Arc::new(source),
        }
    }

    pub(crate) fn serialize(queue: &str, source: postcard::Error) -> Self {
        Error::Serialize {
            queue: queue.to_owned(),
            source: Arc::new(source),
        }
    }
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
        assert_eq!(e.to_string(), "storage failure");
    }
}
