//! The peers every bench compares, behind one set of traits, and the workloads they all run.
//!
//! A [`Peer`] opens a [`Queue`]; a queue hands out [`Producer`]s and [`Consumer`]s, one per
//! thread. `Producer::send(item, n)` is "enqueue `n` items in one transaction and commit";
//! `Consumer::recv(n)` is "dequeue `n` items in one transaction (waiting for them if need be)
//! and commit". Each peer maps these two calls onto its own API as closely as it allows; the
//! doc comment of each implementation says how. The workloads at the bottom of this file
//! ([`round_trips`], [`pipeline`], [`async_round_trips`]) only ever talk to the traits, so
//! every peer runs exactly the same workload.
//!
//! The async traits ([`AsyncPeer`] and friends) are the same two calls for tokio tasks.
#![allow(dead_code, unreachable_pub)] // each bench file uses a part of this module

use std::future::Future;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use crossbeam_utils::Backoff;
use parking_lot::Mutex;
use reliable_queue::{Durability, ReliableConcurrentQueue, Store};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Size of one item, in bytes, unless a workload says otherwise.
pub const ITEM_SIZE: usize = 100;

/// The bytes of one item: `ITEM_SIZE` bytes of a fixed, non-constant pattern.
pub fn item() -> Vec<u8> {
    (0..ITEM_SIZE).map(|i| (i * 31 + 7) as u8).collect()
}

/// An item as `reliable-queue` stores it: a byte string, serialized as bytes (one length prefix
/// and the bytes, as `serde_bytes` would do), not as a sequence of `u8`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(pub Vec<u8>);

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Payload;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Payload, E> {
                Ok(Payload(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Payload, E> {
                Ok(Payload(v))
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

/// A small job record, the kind of struct services enqueue: an id, a timestamp and a short
/// name. Built from the workload's bytes (the same way by every peer that stores it), so that
/// building it costs every peer the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id.
    pub id: u64,
    /// When it was asked for, in milliseconds.
    pub at: u64,
    /// What to run: 24 lowercase letters.
    pub name: String,
}

impl Job {
    /// The job made from `bytes` (at least 40 of them).
    pub fn from_bytes(bytes: &[u8]) -> Job {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Job {
            id: word(0),
            at: word(8),
            name: bytes[16..40]
                .iter()
                .map(|b| char::from(b'a' + b % 26))
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The traits

/// One implementation under test, with its settings. Opens queues.
pub trait Peer: Sync {
    /// The queue it opens.
    type Queue: Queue;
    /// Short name, used as the criterion function id.
    fn name(&self) -> &'static str;
    /// Opens the queue kept in `dir` (an empty directory for a fresh queue), recovering what
    /// is there. Peers that live in memory ignore `dir`.
    fn open(&self, dir: &Path) -> Self::Queue;
}

/// An open queue. Dropping it closes it.
pub trait Queue: Send + Sync + 'static {
    /// Handle for one producing thread.
    type Producer: Producer;
    /// Handle for one consuming thread.
    type Consumer: Consumer;
    /// A new producer handle.
    fn producer(&self) -> Self::Producer;
    /// A new consumer handle.
    fn consumer(&self) -> Self::Consumer;
    /// Items in the queue now (checks only; never timed).
    fn len(&self) -> u64;
    /// The storage engine's own figure for its size on disk, if the peer can give it.
    fn engine_size_on_disk(&self) -> Option<u64> {
        None
    }
    /// Makes everything committed so far durable, for peers that were opened without
    /// per-commit durability (building stores for the recovery bench).
    fn sync(&self) {}
}

/// The producing side of a queue, used by one thread.
pub trait Producer: Send + 'static {
    /// Enqueues `n` copies of `item` in one transaction and commits it; when this returns the
    /// items are durable (for peers on disk) and visible to consumers.
    fn send(&mut self, item: &[u8], n: usize);
}

/// The consuming side of a queue, used by one thread.
pub trait Consumer: Send + 'static {
    /// Dequeues `n` items in one transaction, waiting for items as needed, and commits it;
    /// when this returns the removals are durable (for peers on disk).
    fn recv(&mut self, n: usize);
}

/// [`Peer`] for tokio tasks.
pub trait AsyncPeer: Sync {
    /// The queue it opens.
    type Queue: AsyncQueue;
    /// Short name, used as the criterion function id.
    fn name(&self) -> &'static str;
    /// Opens a fresh queue in the empty directory `dir`, inside `runtime` if it needs one.
    fn open_async(&self, dir: &Path, runtime: &tokio::runtime::Runtime) -> Self::Queue;
}

/// [`Queue`] for tokio tasks.
pub trait AsyncQueue: Send + Sync + 'static {
    /// Handle for one producing task.
    type Producer: AsyncProducer;
    /// Handle for one consuming task.
    type Consumer: AsyncConsumer;
    /// A new producer handle.
    fn producer(&self) -> Self::Producer;
    /// A new consumer handle.
    fn consumer(&self) -> Self::Consumer;
}

/// [`Producer`] for tokio tasks.
pub trait AsyncProducer: Send + 'static {
    /// As [`Producer::send`], without blocking the runtime's threads.
    fn send(&mut self, item: &[u8], n: usize) -> impl Future<Output = ()> + Send;
}

/// [`Consumer`] for tokio tasks.
pub trait AsyncConsumer: Send + 'static {
    /// As [`Consumer::recv`], without blocking the runtime's threads.
    fn recv(&mut self, n: usize) -> impl Future<Output = ()> + Send;
}

/// Waits for `poll` to return something: spins briefly, then yields, then sleeps 20 µs between
/// polls so that idle consumers leave the CPUs to the producers. Used by peers that have no
/// waiting dequeue of their own.
fn poll_until<T>(mut poll: impl FnMut() -> Option<T>) -> T {
    let backoff = Backoff::new();
    loop {
        if let Some(value) = poll() {
            return value;
        }
        if backoff.is_completed() {
            thread::sleep(Duration::from_micros(20));
        } else {
            backoff.snooze();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// reliable-queue

/// `reliable-queue`: `Store::in_memory()` (`durability: None`) or `Store::builder().path(dir)
/// .durability(d)` with every other setting at its default; one queue of [`Payload`]s.
///
/// `send`: `begin`, `n` × `enqueue`, `blocking_commit`. `recv`: `begin`, `n` ×
/// (`blocking_try_dequeue`, or `blocking_dequeue` when nothing is visible), `blocking_commit`.
/// Async: the same with `try_dequeue().await`, `dequeue().await` and `commit().await`.
#[derive(Debug, Clone, Copy)]
pub struct Ours {
    /// `None` for `Store::in_memory()`.
    pub durability: Option<Durability>,
}

impl Ours {
    /// In memory.
    pub const MEMORY: Ours = Ours { durability: None };
    /// On disk, `Durability::Sync` (the default): every commit fsync'd before it returns.
    pub const SYNC: Ours = Ours {
        durability: Some(Durability::Sync),
    };
    /// On disk, `Durability::Buffered` with the default flush interval (100 ms).
    pub const BUFFERED: Ours = Ours {
        durability: Some(Durability::Buffered),
    };
}

/// [`Ours`] in memory with items of type `T` instead of [`Payload`]s (`Vec<u8>`, or [`Job`]: a
/// small serde struct), each enqueue building its item from the workload's bytes as `Ours`
/// builds a `Payload`: the same calls, so the difference measures the item type alone.
#[derive(Debug)]
pub struct OursOf<T>(PhantomData<fn() -> T>);

impl<T> OursOf<T> {
    /// In memory.
    pub const MEMORY: OursOf<T> = OursOf(PhantomData);
}

/// An item type the `reliable-queue` peers store: built from the workload's bytes.
pub trait OursItem: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The item holding a copy of `bytes`.
    fn from_bytes(bytes: &[u8]) -> Self;
}

impl OursItem for Payload {
    fn from_bytes(bytes: &[u8]) -> Self {
        Payload(bytes.to_vec())
    }
}

impl OursItem for Job {
    fn from_bytes(bytes: &[u8]) -> Self {
        Job::from_bytes(bytes)
    }
}

impl OursItem for Vec<u8> {
    fn from_bytes(bytes: &[u8]) -> Self {
        bytes.to_vec()
    }
}

/// An open `reliable-queue` store and its one queue, of `T`s.
#[derive(Debug)]
pub struct OursQueue<T = Payload> {
    store: Store,
    queue: ReliableConcurrentQueue<T>,
}

impl<T> Clone for OursQueue<T> {
    fn clone(&self) -> Self {
        OursQueue {
            store: self.store.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl<T: OursItem> OursQueue<T> {
    fn open(durability: Option<Durability>, dir: &Path) -> Self {
        let store = match durability {
            None => Store::in_memory(),
            Some(durability) => Store::builder().path(dir).durability(durability).open(),
        }
        .expect("open reliable-queue store");
        let queue = store.blocking_queue::<T>("bench").expect("open queue");
        OursQueue { store, queue }
    }
}

impl<T> OursQueue<T> {
    /// The store (for benches that need more than the traits).
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl Peer for Ours {
    type Queue = OursQueue;
    fn name(&self) -> &'static str {
        match self.durability {
            Some(Durability::Buffered) => "reliable-queue-buffered",
            _ => "reliable-queue",
        }
    }
    fn open(&self, dir: &Path) -> OursQueue {
        OursQueue::open(self.durability, dir)
    }
}

impl<T: OursItem> Peer for OursOf<T> {
    type Queue = OursQueue<T>;
    fn name(&self) -> &'static str {
        "reliable-queue"
    }
    fn open(&self, dir: &Path) -> OursQueue<T> {
        OursQueue::open(None, dir)
    }
}

impl<T: OursItem> Queue for OursQueue<T> {
    type Producer = OursQueue<T>;
    type Consumer = OursQueue<T>;
    fn producer(&self) -> OursQueue<T> {
        self.clone()
    }
    fn consumer(&self) -> OursQueue<T> {
        self.clone()
    }
    fn len(&self) -> u64 {
        self.queue.blocking_count().expect("count")
    }
    fn sync(&self) {
        self.store.blocking_flush().expect("flush store");
    }
}

impl<T: OursItem> Producer for OursQueue<T> {
    fn send(&mut self, item: &[u8], n: usize) {
        let mut tx = self.store.begin();
        for _ in 0..n {
            self.queue
                .enqueue(&mut tx, T::from_bytes(item))
                .expect("enqueue");
        }
        tx.blocking_commit().expect("commit");
    }
}

impl<T: OursItem> Consumer for OursQueue<T> {
    fn recv(&mut self, n: usize) {
        let mut tx = self.store.begin();
        for _ in 0..n {
            let item = match self.queue.blocking_try_dequeue(&mut tx).expect("dequeue") {
                Some(item) => item,
                None => self.queue.blocking_dequeue(&mut tx).expect("dequeue"),
            };
            std::hint::black_box(item);
        }
        tx.blocking_commit().expect("commit");
    }
}

impl AsyncPeer for Ours {
    type Queue = OursQueue;
    fn name(&self) -> &'static str {
        "reliable-queue"
    }
    fn open_async(&self, dir: &Path, _runtime: &tokio::runtime::Runtime) -> OursQueue {
        OursQueue::open(self.durability, dir)
    }
}

impl<T: OursItem> AsyncQueue for OursQueue<T> {
    type Producer = OursQueue<T>;
    type Consumer = OursQueue<T>;
    fn producer(&self) -> OursQueue<T> {
        self.clone()
    }
    fn consumer(&self) -> OursQueue<T> {
        self.clone()
    }
}

impl<T: OursItem> AsyncProducer for OursQueue<T> {
    async fn send(&mut self, item: &[u8], n: usize) {
        let mut tx = self.store.begin();
        for _ in 0..n {
            self.queue
                .enqueue(&mut tx, T::from_bytes(item))
                .expect("enqueue");
        }
        tx.commit().await.expect("commit");
    }
}

impl<T: OursItem> AsyncConsumer for OursQueue<T> {
    async fn recv(&mut self, n: usize) {
        let mut tx = self.store.begin();
        for _ in 0..n {
            let item = match self.queue.try_dequeue(&mut tx).await.expect("dequeue") {
                Some(item) => item,
                None => self.queue.dequeue(&mut tx).await.expect("dequeue"),
            };
            std::hint::black_box(item);
        }
        tx.commit().await.expect("commit");
    }
}

// ---------------------------------------------------------------------------------------------
// crossbeam-queue's SegQueue (in memory)

/// `crossbeam_queue::SegQueue<Vec<u8>>`. `send`: `n` × `push`. `recv`: `n` × `pop` (polling
/// while empty). No transactions, no durability: the least an unbounded MPMC queue costs.
#[derive(Debug, Clone, Copy)]
pub struct SegQueuePeer;

/// An open [`SegQueuePeer`].
#[derive(Debug, Clone, Default)]
pub struct SegQueueQueue(Arc<SegQueue<Vec<u8>>>);

impl Peer for SegQueuePeer {
    type Queue = SegQueueQueue;
    fn name(&self) -> &'static str {
        "segqueue"
    }
    fn open(&self, _dir: &Path) -> SegQueueQueue {
        SegQueueQueue::default()
    }
}

impl Queue for SegQueueQueue {
    type Producer = SegQueueQueue;
    type Consumer = SegQueueQueue;
    fn producer(&self) -> SegQueueQueue {
        self.clone()
    }
    fn consumer(&self) -> SegQueueQueue {
        self.clone()
    }
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

impl Producer for SegQueueQueue {
    fn send(&mut self, item: &[u8], n: usize) {
        for _ in 0..n {
            self.0.push(item.to_vec());
        }
    }
}

impl Consumer for SegQueueQueue {
    fn recv(&mut self, n: usize) {
        for _ in 0..n {
            std::hint::black_box(poll_until(|| self.0.pop()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mutex<VecDeque> (in memory)

/// `parking_lot::Mutex<VecDeque<Vec<u8>>>`. `send`: one lock, `n` × `push_back`. `recv`: one
/// lock, up to `n` × `pop_front`, polling while empty. The lock stands in for the transaction.
#[derive(Debug, Clone, Copy)]
pub struct MutexDequePeer;

/// An open [`MutexDequePeer`].
#[derive(Debug, Clone, Default)]
pub struct MutexDeque(Arc<Mutex<std::collections::VecDeque<Vec<u8>>>>);

impl Peer for MutexDequePeer {
    type Queue = MutexDeque;
    fn name(&self) -> &'static str {
        "mutex-vecdeque"
    }
    fn open(&self, _dir: &Path) -> MutexDeque {
        MutexDeque::default()
    }
}

impl Queue for MutexDeque {
    type Producer = MutexDeque;
    type Consumer = MutexDeque;
    fn producer(&self) -> MutexDeque {
        self.clone()
    }
    fn consumer(&self) -> MutexDeque {
        self.clone()
    }
    fn len(&self) -> u64 {
        self.0.lock().len() as u64
    }
}

impl Producer for MutexDeque {
    fn send(&mut self, item: &[u8], n: usize) {
        let mut deque = self.0.lock();
        for _ in 0..n {
            deque.push_back(item.to_vec());
        }
    }
}

impl Consumer for MutexDeque {
    fn recv(&mut self, n: usize) {
        let mut left = n;
        while left > 0 {
            let taken = poll_until(|| {
                let mut deque = self.0.lock();
                let take = left.min(deque.len());
                (take > 0).then(|| {
                    for _ in 0..take {
                        std::hint::black_box(deque.pop_front());
                    }
                    take
                })
            });
            left -= taken;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// persistent-queue 0.2

/// Where a [`Pq`] keeps its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PqBackend {
    /// `MemStore` (nothing on disk).
    Memory,
    /// `SledStore` over `sled::open(dir)` (sled's default configuration).
    Sled,
}

/// `persistent-queue` 0.2: `Builder::new(store).capacity(2^30).durability(d)`.
///
/// It is an MPSC queue without transactions, so:
/// - `send` is `n` × `Producer::push` (each push is its own commit: under `Group`, concurrent
///   pushes from different threads share one fsync; under `Sync` each push fsyncs);
/// - `recv` is `n` × (`Consumer::reserve`, polling while it finds nothing, then
///   `Reserved::ack`); every ack is its own fsync under both `Sync` and `Group`
///   (`durable_acks` left at its default, `true`, so a dequeue is as durable as ours).
/// - It is single-consumer (MPSC): its one `Consumer` is not `Clone`. The workload's consumer
///   threads share it behind a `Mutex`, held for one `reserve` + `ack`, so exactly one
///   reserve-or-ack is in progress at a time, as with a single consumer thread. (Calling
///   `reserve` concurrently through an `Arc`, which its types allow since `Consumer` is
///   `Sync`, is not safe: a `reserve` racing an `ack` can hand out the acknowledged item again
///   and its item count then drifts until producers block for good.) This is its design, but
///   it disfavours it wherever the workload has several consumers: its acks, one fsync each,
///   are serialized.
/// - The capacity is raised to 2^30 items so that `push` never waits for room (reliable-queue
///   is unbounded).
/// - Async: `open_async`, whose calls run the same code on tokio's blocking pool; its one
///   `AsyncConsumer` shared by all consumer tasks behind a `tokio::sync::Mutex`, held for
///   one `reserve` + `ack`.
#[derive(Debug, Clone, Copy)]
pub struct Pq {
    /// Store backend.
    pub backend: PqBackend,
    /// Durability policy.
    pub durability: persistent_queue::Durability,
}

impl Pq {
    /// `MemStore`. Its durability policy is `None`: `MemStore` ignores fsync requests, and
    /// `Group` would only add its batching overhead.
    pub const MEMORY: Pq = Pq {
        backend: PqBackend::Memory,
        durability: persistent_queue::Durability::None,
    };
    /// `SledStore`, `Durability::Group` (concurrent pushes share an fsync).
    pub const SLED_GROUP: Pq = Pq {
        backend: PqBackend::Sled,
        durability: persistent_queue::Durability::Group,
    };
    /// `SledStore`, `Durability::Sync` (every push and ack fsync'd on its own).
    pub const SLED_SYNC: Pq = Pq {
        backend: PqBackend::Sled,
        durability: persistent_queue::Durability::Sync,
    };
    /// `SledStore`, no fsync: only for building stores quickly (recovery bench).
    pub const SLED_UNSYNCED: Pq = Pq {
        backend: PqBackend::Sled,
        durability: persistent_queue::Durability::None,
    };

    fn builder<S: persistent_queue::Store>(&self, store: S) -> persistent_queue::Builder<S> {
        persistent_queue::Builder::new(store)
            .capacity(1 << 30)
            .durability(self.durability)
    }
}

/// The ends of an open [`Pq`] queue over store `S`.
pub struct PqQueue<S: persistent_queue::Store> {
    producer: persistent_queue::Producer<S>,
    consumer: Arc<Mutex<persistent_queue::Consumer<S>>>,
    db: Option<sled::Db>,
}

/// An open [`Pq`] queue: over `MemStore` or `SledStore`.
pub enum PqAny {
    /// Over `MemStore`.
    Memory(PqQueue<persistent_queue::MemStore>),
    /// Over `SledStore`.
    Sled(PqQueue<persistent_queue::SledStore>),
}

impl Peer for Pq {
    type Queue = PqAny;
    fn name(&self) -> &'static str {
        use persistent_queue::Durability as D;
        match (self.backend, self.durability) {
            (PqBackend::Memory, _) => "pq-memstore",
            (PqBackend::Sled, D::Group) => "pq-sled-group",
            (PqBackend::Sled, D::Sync) => "pq-sled-sync",
            (PqBackend::Sled, D::None) => "pq-sled-nosync",
        }
    }
    fn open(&self, dir: &Path) -> PqAny {
        match self.backend {
            PqBackend::Memory => {
                let (producer, consumer) = self
                    .builder(persistent_queue::MemStore::new())
                    .open()
                    .expect("open persistent-queue");
                PqAny::Memory(PqQueue {
                    producer,
                    consumer: Arc::new(Mutex::new(consumer)),
                    db: None,
                })
            }
            PqBackend::Sled => {
                let db = sled::open(dir).expect("open sled");
                let store = persistent_queue::SledStore::from_db(db.clone());
                let (producer, consumer) =
                    self.builder(store).open().expect("open persistent-queue");
                PqAny::Sled(PqQueue {
                    producer,
                    consumer: Arc::new(Mutex::new(consumer)),
                    db: Some(db),
                })
            }
        }
    }
}

/// A producer or consumer handle of [`PqAny`].
pub enum PqHandle<P, C> {
    /// Over `MemStore`.
    Memory(P),
    /// Over `SledStore`.
    Sled(C),
}

type PqProducerAny = PqHandle<
    persistent_queue::Producer<persistent_queue::MemStore>,
    persistent_queue::Producer<persistent_queue::SledStore>,
>;
type PqConsumerAny = PqHandle<
    Arc<Mutex<persistent_queue::Consumer<persistent_queue::MemStore>>>,
    Arc<Mutex<persistent_queue::Consumer<persistent_queue::SledStore>>>,
>;

impl Queue for PqAny {
    type Producer = PqProducerAny;
    type Consumer = PqConsumerAny;
    fn producer(&self) -> PqProducerAny {
        match self {
            PqAny::Memory(q) => PqHandle::Memory(q.producer.clone()),
            PqAny::Sled(q) => PqHandle::Sled(q.producer.clone()),
        }
    }
    fn consumer(&self) -> PqConsumerAny {
        match self {
            PqAny::Memory(q) => PqHandle::Memory(q.consumer.clone()),
            PqAny::Sled(q) => PqHandle::Sled(q.consumer.clone()),
        }
    }
    fn len(&self) -> u64 {
        match self {
            PqAny::Memory(q) => q.producer.len() as u64,
            PqAny::Sled(q) => q.producer.len() as u64,
        }
    }
    fn engine_size_on_disk(&self) -> Option<u64> {
        match self {
            PqAny::Memory(_) => None,
            PqAny::Sled(q) => q.db.as_ref().and_then(|db| db.size_on_disk().ok()),
        }
    }
    fn sync(&self) {
        if let PqAny::Sled(PqQueue { db: Some(db), .. }) = self {
            db.flush().expect("flush sled");
        }
    }
}

fn pq_send<S: persistent_queue::Store>(producer: &persistent_queue::Producer<S>, item: &[u8]) {
    producer.push(item).expect("push");
}

/// One reserve + ack, with the consumer locked throughout (see [`Pq`]); polls while it finds
/// nothing, unlocked between polls. `look` sees the reserved bytes before the ack.
fn pq_recv<S: persistent_queue::Store>(
    consumer: &Mutex<persistent_queue::Consumer<S>>,
    mut look: impl FnMut(&[u8]),
) {
    poll_until(|| {
        let consumer = consumer.lock();
        let reserved = consumer.reserve().expect("reserve")?;
        look(&reserved);
        reserved.ack().expect("ack");
        Some(())
    })
}

/// What [`pq_recv`] does with bytes nobody decodes: keeps the read from being optimized away.
fn glance(bytes: &[u8]) {
    std::hint::black_box(bytes);
}

impl Producer for PqProducerAny {
    fn send(&mut self, item: &[u8], n: usize) {
        for _ in 0..n {
            match self {
                PqHandle::Memory(p) => pq_send(p, item),
                PqHandle::Sled(p) => pq_send(p, item),
            }
        }
    }
}

impl Consumer for PqConsumerAny {
    fn recv(&mut self, n: usize) {
        for _ in 0..n {
            match self {
                PqHandle::Memory(c) => pq_recv(c, glance),
                PqHandle::Sled(c) => pq_recv(c, glance),
            }
        }
    }
}

/// `persistent-queue` 0.2 over `MemStore` (as [`Pq::MEMORY`]) storing [`Job`]s: its queue
/// holds bytes, so each push encodes the job with postcard (the encoding `reliable-queue` uses)
/// and each reserve decodes it, as a user of it with a struct would.
#[derive(Debug, Clone, Copy)]
pub struct PqJob;

/// The ends of a [`PqJob`] queue.
pub struct PqJobQueue(PqQueue<persistent_queue::MemStore>);

/// The producer of a [`PqJobQueue`].
pub struct PqJobProducer(persistent_queue::Producer<persistent_queue::MemStore>);

/// The consumer of a [`PqJobQueue`], shared as in [`Pq`].
pub struct PqJobConsumer(Arc<Mutex<persistent_queue::Consumer<persistent_queue::MemStore>>>);

impl Peer for PqJob {
    type Queue = PqJobQueue;
    fn name(&self) -> &'static str {
        "pq-memstore"
    }
    fn open(&self, dir: &Path) -> PqJobQueue {
        match Pq::MEMORY.open(dir) {
            PqAny::Memory(q) => PqJobQueue(q),
            PqAny::Sled(_) => unreachable!("Pq::MEMORY opens a MemStore"),
        }
    }
}

impl Queue for PqJobQueue {
    type Producer = PqJobProducer;
    type Consumer = PqJobConsumer;
    fn producer(&self) -> PqJobProducer {
        PqJobProducer(self.0.producer.clone())
    }
    fn consumer(&self) -> PqJobConsumer {
        PqJobConsumer(self.0.consumer.clone())
    }
    fn len(&self) -> u64 {
        self.0.producer.len() as u64
    }
}

impl Producer for PqJobProducer {
    fn send(&mut self, item: &[u8], n: usize) {
        for _ in 0..n {
            let bytes = postcard::to_allocvec(&Job::from_bytes(item)).expect("encode job");
            pq_send(&self.0, &bytes);
        }
    }
}

impl Consumer for PqJobConsumer {
    fn recv(&mut self, n: usize) {
        for _ in 0..n {
            pq_recv(&self.0, |bytes| {
                let job: Job = postcard::from_bytes(bytes).expect("decode job");
                std::hint::black_box(job);
            });
        }
    }
}

/// The async ends of a [`Pq`] queue over sled.
pub struct PqAsyncQueue {
    producer: persistent_queue::AsyncProducer<persistent_queue::SledStore>,
    consumer: Arc<tokio::sync::Mutex<persistent_queue::AsyncConsumer<persistent_queue::SledStore>>>,
}

impl AsyncPeer for Pq {
    type Queue = PqAsyncQueue;
    fn name(&self) -> &'static str {
        Peer::name(self)
    }
    fn open_async(&self, dir: &Path, runtime: &tokio::runtime::Runtime) -> PqAsyncQueue {
        assert_eq!(self.backend, PqBackend::Sled, "async runs on disk only");
        let db = sled::open(dir).expect("open sled");
        let store = persistent_queue::SledStore::from_db(db);
        let (producer, consumer) = runtime
            .block_on(self.builder(store).open_async())
            .expect("open persistent-queue");
        PqAsyncQueue {
            producer,
            consumer: Arc::new(tokio::sync::Mutex::new(consumer)),
        }
    }
}

/// Producer handle of a [`PqAsyncQueue`].
pub struct PqAsyncProducer(persistent_queue::AsyncProducer<persistent_queue::SledStore>);
/// Consumer handle of a [`PqAsyncQueue`].
pub struct PqAsyncConsumer(
    Arc<tokio::sync::Mutex<persistent_queue::AsyncConsumer<persistent_queue::SledStore>>>,
);

impl AsyncQueue for PqAsyncQueue {
    type Producer = PqAsyncProducer;
    type Consumer = PqAsyncConsumer;
    fn producer(&self) -> PqAsyncProducer {
        PqAsyncProducer(self.producer.clone())
    }
    fn consumer(&self) -> PqAsyncConsumer {
        PqAsyncConsumer(self.consumer.clone())
    }
}

impl AsyncProducer for PqAsyncProducer {
    async fn send(&mut self, item: &[u8], n: usize) {
        for _ in 0..n {
            self.0.push(item.to_vec()).await.expect("push");
        }
    }
}

impl AsyncConsumer for PqAsyncConsumer {
    async fn recv(&mut self, n: usize) {
        for _ in 0..n {
            let consumer = self.0.lock().await;
            let reserved = consumer
                .reserve()
                .await
                .expect("reserve")
                .expect("queue is open");
            std::hint::black_box(&*reserved);
            reserved.ack().await.expect("ack");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw sled: one key per item

/// sled 0.34.7 used directly as a queue with one key per item: what a queue built the obvious
/// way on sled must do at least.
///
/// `send`: take `n` ids from an atomic counter, one `sled::Batch` inserting `n` keys (id,
/// big-endian) with the item as value, `apply_batch`, `Db::flush`, then publish the
/// `(key, item)` pairs to an in-memory `SegQueue` index. `recv`: pop `n` index entries
/// (polling while empty), one batch removing their keys, `apply_batch`, `Db::flush`. Items
/// are kept in memory as `reliable-queue` keeps them, so a dequeue never reads sled. Open
/// (`sled::open(dir)`, default configuration) scans every key to rebuild the index. Async:
/// the batch and flush run on tokio's blocking pool (`spawn_blocking`).
#[derive(Debug, Clone, Copy)]
pub struct RawSled;

/// An open [`RawSled`] queue.
#[derive(Debug, Clone)]
pub struct RawSledQueue(Arc<RawSledInner>);

#[derive(Debug)]
struct RawSledInner {
    db: sled::Db,
    next: AtomicU64,
    ready: SegQueue<(u64, Vec<u8>)>,
}

impl Peer for RawSled {
    type Queue = RawSledQueue;
    fn name(&self) -> &'static str {
        "sled-batch-flush"
    }
    fn open(&self, dir: &Path) -> RawSledQueue {
        let db = sled::open(dir).expect("open sled");
        let ready = SegQueue::new();
        let mut next = 0;
        for kv in db.iter() {
            let (key, value) = kv.expect("scan sled");
            let id = u64::from_be_bytes(key.as_ref().try_into().expect("8-byte key"));
            next = id + 1;
            ready.push((id, value.to_vec()));
        }
        RawSledQueue(Arc::new(RawSledInner {
            db,
            next: AtomicU64::new(next),
            ready,
        }))
    }
}

impl RawSledInner {
    fn insert_batch(&self, item: &[u8], n: usize) -> (u64, sled::Batch) {
        let first = self.next.fetch_add(n as u64, Ordering::Relaxed);
        let mut batch = sled::Batch::default();
        for id in first..first + n as u64 {
            batch.insert(&id.to_be_bytes(), item);
        }
        (first, batch)
    }

    fn publish(&self, first: u64, item: &[u8], n: usize) {
        for id in first..first + n as u64 {
            self.ready.push((id, item.to_vec()));
        }
    }

    fn commit(&self, batch: sled::Batch) {
        self.db.apply_batch(batch).expect("apply batch");
        self.db.flush().expect("flush");
    }
}

impl Queue for RawSledQueue {
    type Producer = RawSledQueue;
    type Consumer = RawSledQueue;
    fn producer(&self) -> RawSledQueue {
        self.clone()
    }
    fn consumer(&self) -> RawSledQueue {
        self.clone()
    }
    fn len(&self) -> u64 {
        self.0.ready.len() as u64
    }
    fn engine_size_on_disk(&self) -> Option<u64> {
        self.0.db.size_on_disk().ok()
    }
    fn sync(&self) {
        self.0.db.flush().expect("flush sled");
    }
}

impl Producer for RawSledQueue {
    fn send(&mut self, item: &[u8], n: usize) {
        let (first, batch) = self.0.insert_batch(item, n);
        self.0.commit(batch);
        self.0.publish(first, item, n);
    }
}

impl Consumer for RawSledQueue {
    fn recv(&mut self, n: usize) {
        let mut batch = sled::Batch::default();
        for _ in 0..n {
            let (id, value) = poll_until(|| self.0.ready.pop());
            std::hint::black_box(value);
            batch.remove(&id.to_be_bytes());
        }
        self.0.commit(batch);
    }
}

impl AsyncPeer for RawSled {
    type Queue = RawSledQueue;
    fn name(&self) -> &'static str {
        Peer::name(self)
    }
    fn open_async(&self, dir: &Path, _runtime: &tokio::runtime::Runtime) -> RawSledQueue {
        Peer::open(self, dir)
    }
}

impl AsyncQueue for RawSledQueue {
    type Producer = RawSledQueue;
    type Consumer = RawSledQueue;
    fn producer(&self) -> RawSledQueue {
        self.clone()
    }
    fn consumer(&self) -> RawSledQueue {
        self.clone()
    }
}

impl AsyncProducer for RawSledQueue {
    async fn send(&mut self, item: &[u8], n: usize) {
        let (first, batch) = self.0.insert_batch(item, n);
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.commit(batch))
            .await
            .expect("sled commit");
        self.0.publish(first, item, n);
    }
}

impl AsyncConsumer for RawSledQueue {
    async fn recv(&mut self, n: usize) {
        let mut batch = sled::Batch::default();
        for _ in 0..n {
            let (id, value) = loop {
                match self.0.ready.pop() {
                    Some(entry) => break entry,
                    None => tokio::task::yield_now().await,
                }
            };
            std::hint::black_box(value);
            batch.remove(&id.to_be_bytes());
        }
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.commit(batch))
            .await
            .expect("sled commit");
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Where fresh stores are created: `$RQ_BENCH_DIR`, or the system's temporary directory. It
/// must be on the disk being measured (not a tmpfs) for the durable benches to mean anything.
pub fn bench_root() -> PathBuf {
    std::env::var_os("RQ_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A fresh, empty directory under [`bench_root`], removed when dropped.
pub fn fresh_dir() -> tempfile::TempDir {
    let root = bench_root();
    std::fs::create_dir_all(&root).expect("create the bench directory");
    let dir = tempfile::Builder::new()
        .prefix("rq-bench-")
        .tempdir_in(root)
        .expect("create a temporary directory");
    // reliable-queue refuses a store directory open to others; tempfile creates it with the
    // umask's mode.
    #[cfg(unix)]
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("make the temporary directory owner-only");
    dir
}

/// Whether the peer named `name` is selected by `$RQ_BENCH_PEERS` (a comma-separated list of
/// names; all peers when unset). For benches whose setup is too costly to leave to criterion's
/// filter.
pub fn selected(name: &str) -> bool {
    match std::env::var("RQ_BENCH_PEERS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|n| n.trim() == name),
        _ => true,
    }
}

/// Splits `total` units of work over `workers` as evenly as possible.
fn share(total: u64, workers: usize, index: usize) -> u64 {
    let workers = workers as u64;
    total / workers + u64::from((index as u64) < total % workers)
}

/// Runs `jobs` on threads that all start together; returns the time from the start until the
/// last one finishes. Spawning the threads is not timed.
fn timed_threads(jobs: Vec<Box<dyn FnOnce() + Send>>) -> Duration {
    let start = Arc::new(Barrier::new(jobs.len() + 1));
    let handles: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                job();
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for handle in handles {
        handle.join().expect("bench thread panicked");
    }
    began.elapsed()
}

/// `threads` threads each alternate `send(batch)` and `recv(batch)` (enqueue a transaction of
/// `batch` items and commit, then dequeue `batch` items and commit) until `rounds` round trips
/// are done in all. A thread's dequeues never wait: the items it just committed are there.
pub fn round_trips<Q: Queue>(queue: &Q, threads: usize, batch: usize, rounds: u64) -> Duration {
    let item = item();
    let jobs = (0..threads)
        .map(|i| {
            let mut producer = queue.producer();
            let mut consumer = queue.consumer();
            let item = item.clone();
            let mine = share(rounds, threads, i);
            Box::new(move || {
                for _ in 0..mine {
                    producer.send(&item, batch);
                    consumer.recv(batch);
                }
            }) as Box<dyn FnOnce() + Send>
        })
        .collect();
    timed_threads(jobs)
}

/// `producers` threads commit `txs` transactions of `batch` enqueues in all; `consumers`
/// threads commit `txs` transactions of `batch` dequeues in all, each taking the next
/// transaction from a shared counter and waiting for items as needed. Ends when every item has
/// been enqueued and dequeued.
pub fn pipeline<Q: Queue>(
    queue: &Q,
    producers: usize,
    consumers: usize,
    batch: usize,
    txs: u64,
) -> Duration {
    let item = item();
    let left = Arc::new(AtomicU64::new(txs));
    let mut jobs: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    for i in 0..producers {
        let mut producer = queue.producer();
        let item = item.clone();
        let mine = share(txs, producers, i);
        jobs.push(Box::new(move || {
            for _ in 0..mine {
                producer.send(&item, batch);
            }
        }));
    }
    for _ in 0..consumers {
        let mut consumer = queue.consumer();
        let left = left.clone();
        jobs.push(Box::new(move || {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                consumer.recv(batch);
            }
        }));
    }
    timed_threads(jobs)
}

/// `tasks` tokio tasks on `runtime` each alternate `send(batch)` and `recv(batch)` until
/// `rounds` round trips are done in all. Returns the time from the first spawn until the last
/// task finishes.
pub fn async_round_trips<Q: AsyncQueue>(
    runtime: &tokio::runtime::Runtime,
    queue: &Q,
    tasks: usize,
    batch: usize,
    rounds: u64,
) -> Duration {
    let item: Arc<[u8]> = item().into();
    let work: Vec<_> = (0..tasks)
        .map(|i| (queue.producer(), queue.consumer(), share(rounds, tasks, i)))
        .collect();
    runtime.block_on(async move {
        let began = Instant::now();
        let handles: Vec<_> = work
            .into_iter()
            .map(|(mut producer, mut consumer, mine)| {
                let item = item.clone();
                tokio::spawn(async move {
                    for _ in 0..mine {
                        producer.send(&item, batch).await;
                        consumer.recv(batch).await;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("bench task panicked");
        }
        began.elapsed()
    })
}

// ---------------------------------------------------------------------------------------------
// Measurements other than time

/// Resident set size of this process, in bytes: `/proc/self/statm`'s second field times the
/// page size (`getconf PAGESIZE`, 4096 if that fails). `None` where there is no `/proc`.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Bytes used by the files under `dir`: `(apparent, allocated)`, where apparent is the sum of
/// file lengths and allocated the blocks the file system reserved for them (what `du` shows).
/// Files that vanish during the walk are skipped.
pub fn dir_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut apparent, mut allocated) = (0, 0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (a, b) = dir_size(&entry.path());
            apparent += a;
            allocated += b;
        } else {
            apparent += meta.len();
            allocated += meta.blocks() * 512;
        }
    }
    (apparent, allocated)
}

/// `bytes` in MiB, for printing.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
