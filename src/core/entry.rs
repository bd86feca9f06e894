//! One queued item as the core and the engines see it.

/// A queue's id in the store's catalog; the log refers to queues by it.
pub(crate) type QueueId = u32;

/// One item: its id, its delivery metadata, and its enveloped bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Unique within the store; assigned in commit order, so it is also the FIFO order.
    pub(crate) id: u64,
    /// How many times the item has been leased (reserved for the processing layer).
    pub(crate) attempts: u32,
    /// Unix time in milliseconds before which the item is not due (0: due now).
    pub(crate) not_before: u64,
    /// When it was enqueued and leased (milliseconds since the epoch; 0: unknown or never).
    pub(crate) times: Times,
    /// The enveloped item (see `crate::codec`).
    pub(crate) bytes: Box<[u8]>,
    /// Its deduplication key, if it was enqueued with one: while the item is in its queue, an
    /// enqueue with the same key is a no-op (see `QueueCore::reserve_key`).
    pub(crate) key: Option<Box<[u8]>>,
}

/// An item's times, in milliseconds since the Unix epoch (0: unknown, or never).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Times {
    /// Commit time of its first enqueue.
    pub(crate) enqueued_at: u64,
    /// When its first lease was granted.
    pub(crate) first_attempt: u64,
    /// When its latest lease was granted.
    pub(crate) last_attempt: u64,
}

impl Entry {
    /// A fresh item, never leased, due now, committed at `enqueued_at`.
    pub(crate) fn new(id: u64, bytes: Box<[u8]>, enqueued_at: u64) -> Self {
        Entry {
            id,
            attempts: 0,
            not_before: 0,
            times: Times {
                enqueued_at,
                first_attempt: 0,
                last_attempt: 0,
            },
            bytes,
            key: None,
        }
    }
}
