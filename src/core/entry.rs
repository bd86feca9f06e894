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
    /// Unix time in milliseconds before which the item is not due (0: due now; reserved for
    /// delayed items).
    pub(crate) not_before: u64,
    /// The enveloped item (see `crate::codec`).
    pub(crate) bytes: Box<[u8]>,
}

impl Entry {
    /// A fresh item, never leased, due now.
    pub(crate) fn new(id: u64, bytes: Box<[u8]>) -> Self {
        Entry {
            id,
            attempts: 0,
            not_before: 0,
            bytes,
        }
    }
}
