//! One queued item as the core and the engines see it.

/// A queue's id in the store's catalog; the log refers to queues by it.
pub(crate) type QueueId = u32;

/// A queue's place in its store's `QueueTable`: how a transaction's work names the queues it
/// enqueued to and holds items of, without a counted reference (two atomic operations per
/// item, a large part of an in-memory round trip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueIndex(pub(super) u32);

/// One item: its id, its enqueue time, its enveloped bytes and, once it has any, its delivery
/// metadata.
///
/// A plain item (never leased, not delayed, no deduplication key) has no metadata, and the
/// entry is 40 bytes: the queues hold one per item, so this is most of what an item costs
/// beside its bytes. The metadata, when set, is behind one box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Unique within the store; assigned in commit order, so it is also the FIFO order.
    pub(crate) id: u64,
    /// When it was enqueued (milliseconds since the epoch; 0: unknown).
    pub(crate) enqueued_at: u64,
    /// The enveloped item (see `crate::codec`).
    pub(crate) bytes: Box<[u8]>,
    /// Everything else, `None` while all of it is at its default (see [`Meta`]).
    meta: Option<Box<Meta>>,
}

/// An entry's delivery metadata (see [`Entry`]): all of it at its default for a plain item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// How many times the item has been leased.
    pub(crate) attempts: u32,
    /// Unix time in milliseconds before which the item is not due (0: due now).
    pub(crate) not_before: u64,
    /// When it was first and last leased (milliseconds since the epoch; 0: never).
    pub(crate) first_attempt: u64,
    pub(crate) last_attempt: u64,
    /// Its deduplication key, if it was enqueued with one: while the item is in its queue, an
    /// enqueue with the same key is a no-op (see `QueueCore::reserve_key`).
    pub(crate) key: Option<Box<[u8]>>,
}

impl Entry {
    /// A plain item: no attempts, due now, no key.
    pub(crate) fn new(id: u64, bytes: Box<[u8]>, enqueued_at: u64) -> Self {
        Entry {
            id,
            enqueued_at,
            bytes,
            meta: None,
        }
    }

    /// An item with its metadata, kept only if any of it is other than the default.
    pub(crate) fn with(id: u64, bytes: Box<[u8]>, enqueued_at: u64, meta: Meta) -> Self {
        Entry {
            id,
            enqueued_at,
            bytes,
            meta: (meta != Meta::default()).then(|| Box::new(meta)),
        }
    }

    /// Sets one field of the metadata: makes the metadata only for a value other than the
    /// default, so that an entry without any keeps none.
    fn put<T: Default + PartialEq>(&mut self, value: T, field: impl FnOnce(&mut Meta) -> &mut T) {
        if value != T::default() || self.meta.is_some() {
            *field(self.meta.get_or_insert_with(Box::default)) = value;
        }
    }

    /// How many times the item has been leased.
    pub(crate) fn attempts(&self) -> u32 {
        self.meta.as_ref().map_or(0, |m| m.attempts)
    }

    pub(crate) fn set_attempts(&mut self, attempts: u32) {
        self.put(attempts, |m| &mut m.attempts);
    }

    /// Unix time in milliseconds before which the item is not due (0: due now).
    pub(crate) fn not_before(&self) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.not_before)
    }

    pub(crate) fn set_not_before(&mut self, not_before: u64) {
        self.put(not_before, |m| &mut m.not_before);
    }

    /// When it was first leased (0: never).
    pub(crate) fn first_attempt(&self) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.first_attempt)
    }

    /// When it was last leased (0: never).
    pub(crate) fn last_attempt(&self) -> u64 {
        self.meta.as_ref().map_or(0, |m| m.last_attempt)
    }

    pub(crate) fn set_first_attempt(&mut self, at: u64) {
        self.put(at, |m| &mut m.first_attempt);
    }

    pub(crate) fn set_last_attempt(&mut self, at: u64) {
        self.put(at, |m| &mut m.last_attempt);
    }

    /// Its deduplication key, if it has one.
    pub(crate) fn key(&self) -> Option<&[u8]> {
        self.meta.as_ref().and_then(|m| m.key.as_deref())
    }

    pub(crate) fn set_key(&mut self, key: Option<Box<[u8]>>) {
        self.put(key, |m| &mut m.key);
    }

    /// Takes its deduplication key out, leaving it without one.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn take_key(&mut self) -> Option<Box<[u8]>> {
        self.meta.as_mut().and_then(|m| m.key.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_entry_is_40_bytes_and_keeps_no_metadata() {
        assert!(std::mem::size_of::<Entry>() <= 40);
        let mut e = Entry::new(1, Box::new([1]), 5);
        e.set_attempts(0);
        e.set_not_before(0);
        e.set_key(None);
        e.set_first_attempt(0);
        assert!(e.meta.is_none());
        e.set_attempts(2);
        e.set_key(Some(Box::new(*b"k")));
        assert_eq!((e.attempts(), e.key()), (2, Some(&b"k"[..])));
        e.set_key(None);
        assert_eq!((e.attempts(), e.key()), (2, None));
    }
}
