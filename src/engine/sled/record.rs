//! The persisted record: one per commit group, the value of one key in the `log` tree.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "RQLG"
//!      4     1  format version (1 or 2)
//!      5     3  reserved, zero
//!      8     4  header length h (u32, little-endian)
//!     12     4  body length b (u32, little-endian)
//!     16     4  body CRC-32 (of the b body bytes)
//!     20     4  header CRC-32 (of bytes 4..20, then the h header bytes)
//!     24     h  header: postcard { queues: [u32] (ids touched, ascending), ops: u32,
//!                 version 2 only: time: u64 (the commit time, ms since the Unix epoch),
//!                 next_id: u64 (above every id given out so far) }
//!   24+h     b  body: `ops` operations, each a postcard `Op`, back to back
//! ```
//!
//! The header has its own checksum so that a record whose body is damaged still names the
//! queues it touched. The record's length must be exactly `24 + h + b`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::QueueId;
use crate::engine::catalog::BadRecord;

const MAGIC: [u8; 4] = *b"RQLG";
/// The record format this build writes; it reads this one and version 1 (no commit time).
pub(crate) const RECORD_VERSION: u8 = 2;
/// The first record format, written before records carried their commit time.
const RECORD_VERSION_1: u8 = 1;
const FIXED: usize = 24;

/// Item bytes, written as one length-prefixed run and read back without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bytes<'a>(pub(crate) &'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Bytes<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'a [u8]>::deserialize(deserializer).map(Bytes)
    }
}

/// One operation of a commit group. Variants are only ever added at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op<'a> {
    /// An item became part of a queue.
    Enqueue {
        queue: QueueId,
        id: u64,
        attempts: u32,
        not_before: u64,
        #[serde(borrow)]
        bytes: Bytes<'a>,
    },
    /// A committed dequeue: the item with this id is gone for good.
    Ack { queue: QueueId, id: u64 },
    /// A lease was granted: the item lives on under a new id with one more attempt. (The
    /// lease itself is not kept: a restart ends every lease of the previous process, and
    /// recovery puts the item back at the head.) Compaction copies a live one forward as a
    /// `Lease` with `from` `None`, not as a `Moved`, so that a restart still finds it leased.
    Lease(#[serde(borrow)] Version<'a>),
    /// A failed lease below the maximum attempts, or a lease given back with a delay: the item
    /// lives on under a new id, due at `not_before`.
    Retry(#[serde(borrow)] Version<'a>),
    /// The item moved to its queue's dead letters (`reason` says why).
    Bury(#[serde(borrow)] Version<'a>),
    /// A dead letter went back to its queue.
    Replay(#[serde(borrow)] Version<'a>),
    /// A dead letter was deleted for good.
    Purge { queue: QueueId, id: u64 },
    /// A live item copied forward by compaction, as it stands (`from` is `None`); a lease
    /// version is copied as a `Lease` instead. (Builds before that copied it as a `Moved`:
    /// such a copy comes back in id order, not at the head.)
    Moved(#[serde(borrow)] Version<'a>),
    /// A fresh item enqueued with a deduplication key (`from` is `None`).
    Keyed(#[serde(borrow)] Version<'a>),
}

/// An item as it stands after a processing-layer operation: every field the queue keeps of
/// it, so that no older record is needed to rebuild it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Version<'a> {
    pub(crate) queue: QueueId,
    /// The id this version replaces (gone for good once the record is in the log).
    pub(crate) from: Option<u64>,
    pub(crate) id: u64,
    pub(crate) attempts: u32,
    /// Milliseconds since the epoch before which the item is not due (0: due now).
    pub(crate) not_before: u64,
    /// Commit time of the item's first enqueue (0: unknown, written before times were kept).
    pub(crate) enqueued_at: u64,
    /// When its first and its latest lease were granted (0: never).
    pub(crate) first_attempt: u64,
    pub(crate) last_attempt: u64,
    /// Why it became a dead letter (`Bury`, and a dead letter `Moved`).
    #[serde(borrow)]
    pub(crate) reason: Option<&'a str>,
    /// Its deduplication key, if it has one.
    #[serde(borrow)]
    pub(crate) key: Option<Bytes<'a>>,
    #[serde(borrow)]
    pub(crate) bytes: Bytes<'a>,
}

impl<'a> Op<'a> {
    /// The item version the op writes, if it writes one (every op but `Enqueue`, `Ack` and
    /// `Purge`).
    pub(crate) fn version(&self) -> Option<&Version<'a>> {
        match self {
            Op::Lease(v)
            | Op::Retry(v)
            | Op::Bury(v)
            | Op::Replay(v)
            | Op::Moved(v)
            | Op::Keyed(v) => Some(v),
            Op::Enqueue { .. } | Op::Ack { .. } | Op::Purge { .. } => None,
        }
    }

    fn queue(&self) -> QueueId {
        match self {
            Op::Enqueue { queue, .. } | Op::Ack { queue, .. } | Op::Purge { queue, .. } => *queue,
            _ => self.version().map_or(0, |v| v.queue),
        }
    }

    /// The id of the item this op makes live, if it makes one.
    pub(crate) fn new_id(&self) -> Option<u64> {
        match self {
            Op::Enqueue { id, .. } => Some(*id),
            Op::Ack { .. } | Op::Purge { .. } => None,
            _ => self.version().map(|v| v.id),
        }
    }

    /// The id of the item this op ends, if it ends one.
    pub(crate) fn ended_id(&self) -> Option<u64> {
        match self {
            Op::Ack { id, .. } | Op::Purge { id, .. } => Some(*id),
            Op::Enqueue { .. } => None,
            _ => self.version().and_then(|v| v.from),
        }
    }

    /// The bytes of the item with id `id`, if this op makes it live.
    pub(crate) fn bytes_of(&self, id: u64) -> Option<&'a [u8]> {
        match self {
            Op::Enqueue { id: i, bytes, .. } if *i == id => Some(bytes.0),
            _ => self.version().filter(|v| v.id == id).map(|v| v.bytes.0),
        }
    }
}

/// The header of a version 1 record.
#[derive(Debug, Serialize, Deserialize)]
struct HeaderV1 {
    queues: Vec<QueueId>,
    ops: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    queues: Vec<QueueId>,
    ops: u32,
    /// Commit time, milliseconds since the Unix epoch.
    time: u64,
    /// Above every item id the store has given out when the record was written: ids (and so
    /// fencing tokens) are never given out twice, even once compaction has deleted every
    /// record that named the highest ones.
    next_id: u64,
}

/// Why a record could not be read. `queues` is known when the header was intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    pub(crate) queues: Option<Vec<QueueId>>,
    pub(crate) reason: String,
}

impl Damage {
    fn new(reason: impl Into<String>) -> Self {
        Damage {
            queues: None,
            reason: reason.into(),
        }
    }

    /// The bad record this damage makes of the record with sequence number `seq`.
    pub(crate) fn at(self, seq: u64) -> BadRecord {
        BadRecord {
            seq,
            queues: self.queues,
            reason: self.reason,
        }
    }
}

/// A decoded, verified record.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub(crate) queues: Vec<QueueId>,
    pub(crate) ops: Vec<Op<'a>>,
    /// Commit time in milliseconds since the Unix epoch; `None` in a version 1 record.
    pub(crate) time: Option<u64>,
    /// Above every id given out when it was written; `None` in a version 1 record.
    pub(crate) next_id: Option<u64>,
}

/// Builds one record; reused from group to group to keep its buffers.
#[derive(Debug, Default)]
pub(crate) struct RecordBuilder {
    body: Vec<u8>,
    queues: Vec<QueueId>,
    ops: u32,
}

impl RecordBuilder {
    /// Appends an operation. On error the builder is unchanged.
    pub(crate) fn push(&mut self, op: &Op<'_>) -> Result<(), postcard::Error> {
        let mark = self.body.len();
        if let Err(e) = crate::codec::append(op, &mut self.body) {
            self.body.truncate(mark);
            return Err(e);
        }
        let queue = op.queue();
        if self.queues.last() != Some(&queue) && !self.queues.contains(&queue) {
            self.queues.push(queue);
        }
        self.ops += 1;
        Ok(())
    }

    /// Bytes of ops pushed since the last `finish`.
    pub(crate) fn len(&self) -> usize {
        self.body.len()
    }

    /// Has nothing been pushed since the last `finish`?
    pub(crate) fn is_empty(&self) -> bool {
        self.ops == 0
    }

    /// Drops everything pushed since the last `finish`.
    pub(crate) fn reset(&mut self) {
        self.body.clear();
        self.queues.clear();
        self.ops = 0;
    }

    /// Seals the record, committed at `time` (ms since the epoch) when ids below `next_id`
    /// had been given out, and resets the builder for the next one.
    pub(crate) fn finish(&mut self, time: u64, next_id: u64) -> Result<Vec<u8>, postcard::Error> {
        self.queues.sort_unstable();
        let header = Header {
            queues: std::mem::take(&mut self.queues),
            ops: self.ops,
            time,
            next_id,
        };
        let mut header_bytes = Vec::with_capacity(8 + 5 * header.queues.len());
        let encoded = crate::codec::append(&header, &mut header_bytes);
        self.queues = header.queues;
        if let Err(e) = encoded {
            self.reset();
            return Err(e);
        }
        let mut out = Vec::with_capacity(FIXED + header_bytes.len() + self.body.len());
        out.extend_from_slice(&MAGIC);
        out.push(RECORD_VERSION);
        out.extend_from_slice(&[0, 0, 0]);
        let (header_len, body_len) = match (len_u32(header_bytes.len()), len_u32(self.body.len())) {
            (Ok(h), Ok(b)) => (h, b),
            (Err(e), _) | (_, Err(e)) => {
                self.reset();
                return Err(e);
            }
        };
        out.extend_from_slice(&header_len.to_le_bytes());
        out.extend_from_slice(&body_len.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&self.body).to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&out[4..20]);
        hasher.update(&header_bytes);
        out.extend_from_slice(&hasher.finalize().to_le_bytes());
        out.extend_from_slice(&header_bytes);
        out.extend_from_slice(&self.body);
        self.reset();
        Ok(out)
    }
}

fn len_u32(len: usize) -> Result<u32, postcard::Error> {
    // Config caps every size far below 4 GiB; a larger record is refused, never cut short.
    u32::try_from(len).map_err(|_| postcard::Error::SerializeBufferFull)
}

/// The little-endian u32 at `at`; 0 past the end (callers check the length first).
fn read_u32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at.saturating_add(4))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// A u32 length as usize (lossless on the 32- and 64-bit targets this crate supports).
fn to_usize(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Verifies and decodes a record. Never panics, whatever `bytes` holds.
pub(crate) fn decode(bytes: &[u8]) -> Result<Record<'_>, Damage> {
    if bytes.len() < FIXED {
        return Err(Damage::new(format!(
            "truncated: {} bytes, shorter than the fixed header",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(Damage::new("bad magic"));
    }
    let version = bytes[4];
    if version != RECORD_VERSION && version != RECORD_VERSION_1 {
        return Err(Damage::new(format!("unknown record version {version}")));
    }
    let header_len = to_usize(read_u32(bytes, 8));
    let body_len = to_usize(read_u32(bytes, 12));
    let expected = FIXED
        .checked_add(header_len)
        .and_then(|n| n.checked_add(body_len));
    if expected != Some(bytes.len()) {
        return Err(Damage::new(format!(
            "length mismatch: {} bytes, header says {}",
            bytes.len(),
            u64::from(read_u32(bytes, 8)) + u64::from(read_u32(bytes, 12)) + 24
        )));
    }
    let header_bytes = &bytes[FIXED..FIXED + header_len];
    let body = &bytes[FIXED + header_len..];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[4..20]);
    hasher.update(header_bytes);
    if hasher.finalize() != read_u32(bytes, 20) || bytes[5..8] != [0, 0, 0] {
        return Err(Damage::new("header checksum mismatch"));
    }
    let decoded = if version == RECORD_VERSION_1 {
        postcard::from_bytes::<HeaderV1>(header_bytes).map(|h| Header {
            queues: h.queues,
            ops: h.ops,
            time: 0,
            next_id: 0,
        })
    } else {
        postcard::from_bytes::<Header>(header_bytes)
    };
    let header = match decoded {
        Ok(header) => header,
        Err(e) => return Err(Damage::new(format!("undecodable header: {e}"))),
    };
    let v2 = version != RECORD_VERSION_1;
    let (time, next_id) = (v2.then_some(header.time), v2.then_some(header.next_id));
    let fail = |reason: String| Damage {
        queues: Some(header.queues.clone()),
        reason,
    };
    if crc32fast::hash(body) != read_u32(bytes, 16) {
        return Err(fail("body checksum mismatch".into()));
    }
    // Every op takes at least two bytes, which bounds the allocation.
    let mut ops = Vec::with_capacity(to_usize(header.ops).min(body.len() / 2));
    let mut rest = body;
    for n in 0..header.ops {
        match postcard::take_from_bytes::<Op<'_>>(rest) {
            Ok((op, tail)) => {
                if header.queues.binary_search(&op.queue()).is_err() {
                    return Err(fail(format!(
                        "op {n} names queue {} missing from the header",
                        op.queue()
                    )));
                }
                ops.push(op);
                rest = tail;
            }
            Err(e) => return Err(fail(format!("undecodable op {n}: {e}"))),
        }
    }
    if !rest.is_empty() {
        return Err(fail(format!("{} bytes after the last op", rest.len())));
    }
    Ok(Record {
        queues: header.queues,
        ops,
        time,
        next_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut b = RecordBuilder::default();
        b.push(&Op::Enqueue {
            queue: 3,
            id: 10,
            attempts: 0,
            not_before: 0,
            bytes: Bytes(b"\x01hello"),
        })
        .unwrap();
        b.push(&Op::Ack { queue: 1, id: 4 }).unwrap();
        b.finish(1, 11).unwrap()
    }

    #[test]
    fn round_trip() {
        let bytes = sample();
        let rec = decode(&bytes).unwrap();
        assert_eq!(rec.queues, vec![1, 3]);
        assert_eq!(rec.ops.len(), 2);
        assert_eq!(rec.ops[1], Op::Ack { queue: 1, id: 4 });
        match &rec.ops[0] {
            Op::Enqueue { id, bytes, .. } => assert_eq!((*id, bytes.0), (10, &b"\x01hello"[..])),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn builder_is_reusable() {
        let mut b = RecordBuilder::default();
        b.push(&Op::Ack { queue: 9, id: 1 }).unwrap();
        let first = b.finish(1, 11).unwrap();
        let second = b.finish(1, 11).unwrap();
        assert_eq!(decode(&first).unwrap().ops.len(), 1);
        let empty = decode(&second).unwrap();
        assert!(empty.ops.is_empty() && empty.queues.is_empty());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = sample();
        for i in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(decode(&bad).is_err(), "flip of bit {i} went unnoticed");
        }
    }

    #[test]
    fn body_damage_still_names_the_queues() {
        let mut bytes = sample();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        assert_eq!(decode(&bytes).unwrap_err().queues, Some(vec![1, 3]));
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = sample();
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "truncation to {len} went unnoticed"
            );
        }
    }
}

/// Decoder fuzzing, stable Rust only: a seeded loop over valid records, mutations of them,
/// uniformly random bytes and random bytes sealed with correct checksums.
#[cfg(test)]
mod fuzz {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Inputs fed to `decode` by default; `RELIABLE_QUEUE_FUZZ_INPUTS` sets another count.
    const DEFAULT_INPUTS: u64 = 1_000_000;

    /// One op of a generated record, owning its item bytes.
    #[derive(Debug, Clone)]
    enum OwnedOp {
        Enqueue {
            queue: QueueId,
            id: u64,
            attempts: u32,
            not_before: u64,
            bytes: Vec<u8>,
        },
        Ack {
            queue: QueueId,
            id: u64,
        },
    }

    impl OwnedOp {
        fn as_op(&self) -> Op<'_> {
            match self {
                OwnedOp::Enqueue {
                    queue,
                    id,
                    attempts,
                    not_before,
                    bytes,
                } => Op::Enqueue {
                    queue: *queue,
                    id: *id,
                    attempts: *attempts,
                    not_before: *not_before,
                    bytes: Bytes(bytes),
                },
                OwnedOp::Ack { queue, id } => Op::Ack {
                    queue: *queue,
                    id: *id,
                },
            }
        }
    }

    /// Picks from small values (the common case) and the whole range (the varint extremes).
    fn number<R: Rng>(rng: &mut R, small: u64) -> u64 {
        match rng.gen_range(0..8) {
            0 => rng.gen(),
            1 => u64::MAX - rng.gen_range(0..4),
            _ => rng.gen_range(0..small),
        }
    }

    fn random_ops(rng: &mut StdRng) -> Vec<OwnedOp> {
        let n = if rng.gen_ratio(1, 20) {
            0
        } else {
            rng.gen_range(1..12)
        };
        (0..n)
            .map(|_| {
                let queue = QueueId::try_from(number(rng, 6)).unwrap_or(QueueId::MAX);
                let id = number(rng, 10_000);
                if rng.gen_bool(0.6) {
                    let len = if rng.gen_ratio(1, 50) {
                        rng.gen_range(0..3000)
                    } else {
                        rng.gen_range(0..40)
                    };
                    OwnedOp::Enqueue {
                        queue,
                        id,
                        attempts: u32::try_from(number(rng, 4)).unwrap_or(u32::MAX),
                        not_before: number(rng, 2),
                        bytes: (0..len).map(|_| rng.gen()).collect(),
                    }
                } else {
                    OwnedOp::Ack { queue, id }
                }
            })
            .collect()
    }

    fn build(builder: &mut RecordBuilder, ops: &[OwnedOp]) -> Vec<u8> {
        for op in ops {
            builder.push(&op.as_op()).expect("push a generated op");
        }
        builder.finish(0, 0).expect("finish a generated record")
    }

    /// `decode` under `catch_unwind`, so a panic names its input.
    fn decode_or_report(bytes: &[u8]) -> Result<Vec<Op<'_>>, Damage> {
        match catch_unwind(AssertUnwindSafe(|| decode(bytes))) {
            Ok(result) => {
                if let Ok(rec) = &result {
                    for op in &rec.ops {
                        assert!(
                            rec.queues.contains(&op.queue()),
                            "decoded an op of a queue its header does not name: {bytes:02x?}"
                        );
                    }
                }
                result.map(|rec| rec.ops)
            }
            Err(_) => panic!("decode panicked on {} bytes: {bytes:02x?}", bytes.len()),
        }
    }

    /// The ways a stored record gets damaged.
    fn mutate(rng: &mut StdRng, good: &[u8], other: &[u8]) -> (&'static str, Vec<u8>) {
        let mut bad = good.to_vec();
        let len = bad.len();
        let kind = match rng.gen_range(0..9) {
            0 => {
                let bit = rng.gen_range(0..len * 8);
                bad[bit / 8] ^= 1 << (bit % 8);
                "bit flip"
            }
            1 => {
                for _ in 0..rng.gen_range(2..9) {
                    let bit = rng.gen_range(0..len * 8);
                    bad[bit / 8] ^= 1 << (bit % 8);
                }
                "bit flips"
            }
            2 => {
                for _ in 0..rng.gen_range(1..5) {
                    let at = rng.gen_range(0..len);
                    bad[at] = rng.gen();
                }
                "byte overwrite"
            }
            3 => {
                bad.truncate(rng.gen_range(0..len));
                "truncation"
            }
            4 => {
                let extra = rng.gen_range(1..16);
                bad.extend((0..extra).map(|_| rng.gen::<u8>()));
                "extension"
            }
            5 => {
                let cut = rng.gen_range(0..=len);
                let from = rng.gen_range(0..=other.len());
                bad.truncate(cut);
                bad.extend_from_slice(&other[from..]);
                "splice"
            }
            6 => {
                // A length field rewritten: random, off by one, or moved between the two.
                let field = if rng.gen_bool(0.5) { 8 } else { 12 };
                let value = read_u32(&bad, field);
                let new = match rng.gen_range(0..4) {
                    0 => rng.gen(),
                    1 => value.wrapping_add(1),
                    2 => value.wrapping_sub(1),
                    _ => {
                        let other_field = 20 - field;
                        let moved = read_u32(&bad, other_field).wrapping_add(1);
                        bad[other_field..other_field + 4].copy_from_slice(&moved.to_le_bytes());
                        value.wrapping_sub(1)
                    }
                };
                bad[field..field + 4].copy_from_slice(&new.to_le_bytes());
                "length edit"
            }
            7 => {
                let at = rng.gen_range(0..=len);
                bad.insert(at, rng.gen());
                "byte inserted"
            }
            _ => {
                bad.remove(rng.gen_range(0..len));
                "byte removed"
            }
        };
        (kind, bad)
    }

    /// Random header and body bytes behind a fixed header whose lengths and checksums are
    /// right: the postcard decoding of garbage is reached.
    fn sealed_garbage(rng: &mut StdRng, good: &[u8]) -> Vec<u8> {
        let (header, body): (Vec<u8>, Vec<u8>) = if rng.gen_bool(0.5) {
            let h = rng.gen_range(0..24);
            let b = rng.gen_range(0..200);
            (
                (0..h).map(|_| rng.gen()).collect(),
                (0..b).map(|_| rng.gen()).collect(),
            )
        } else {
            // A real record's parts with a few bytes changed: mostly well-formed postcard.
            let h = to_usize(read_u32(good, 8));
            let mut header = good[FIXED..FIXED + h].to_vec();
            let mut body = good[FIXED + h..].to_vec();
            for _ in 0..rng.gen_range(1..4) {
                let part = if body.is_empty() || rng.gen_bool(0.3) {
                    &mut header
                } else {
                    &mut body
                };
                if !part.is_empty() {
                    let at = rng.gen_range(0..part.len());
                    part[at] = rng.gen();
                }
            }
            (header, body)
        };
        let mut out = Vec::with_capacity(FIXED + header.len() + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[RECORD_VERSION, 0, 0, 0]);
        out.extend_from_slice(&len_u32(header.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&len_u32(body.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&out[4..20]);
        hasher.update(&header);
        out.extend_from_slice(&hasher.finalize().to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn decode_never_panics_and_rejects_every_damaged_record() {
        let inputs: u64 = std::env::var("RELIABLE_QUEUE_FUZZ_INPUTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_INPUTS);
        let started = std::time::Instant::now();
        let mut rng = StdRng::seed_from_u64(0x005E_EDDE_C0DE);
        let mut builder = RecordBuilder::default();
        let mut previous = build(&mut builder, &random_ops(&mut rng));
        let (mut tried, mut valid, mut damaged, mut no_ops, mut random, mut sealed) =
            (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        let mut sealed_ok = 0u64;
        while tried < inputs {
            // A valid record decodes to exactly its ops.
            let ops = random_ops(&mut rng);
            let good = build(&mut builder, &ops);
            let decoded = decode_or_report(&good).expect("a valid record decodes");
            assert_eq!(decoded.len(), ops.len());
            for (got, want) in decoded.iter().zip(&ops) {
                assert_eq!(*got, want.as_op());
            }
            valid += 1;

            // Damaged copies of it never decode, unless the damage left a valid record.
            for _ in 0..6 {
                let (kind, bad) = mutate(&mut rng, &good, &previous);
                if bad == good || bad == previous {
                    no_ops += 1;
                } else {
                    assert!(
                        decode_or_report(&bad).is_err(),
                        "{kind} went unnoticed: {good:02x?} became {bad:02x?}"
                    );
                    damaged += 1;
                }
            }

            // Uniformly random bytes, sometimes behind the right magic and version.
            let len = rng.gen_range(0..64);
            let mut noise: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len >= 8 && rng.gen_bool(0.5) {
                noise[..4].copy_from_slice(&MAGIC);
                noise[4] = RECORD_VERSION;
            }
            assert!(
                decode_or_report(&noise).is_err(),
                "noise decoded: {noise:02x?}"
            );
            random += 1;

            // Garbage with correct checksums: may decode or not, never panics.
            let garbage = sealed_garbage(&mut rng, &good);
            if decode_or_report(&garbage).is_ok() {
                sealed_ok += 1;
            }
            sealed += 1;

            tried += 1 + 6 + 1 + 1;
            previous = good;
        }
        println!(
            "decoder fuzz: {tried} inputs in {:.1?}: {valid} valid records, {damaged} damaged \
             (all rejected), {no_ops} mutations that changed nothing, {random} random, \
             {sealed} sealed garbage ({sealed_ok} decoded); 0 panics",
            started.elapsed()
        );
    }
}
