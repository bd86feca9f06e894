//! The persisted record: one per commit group, the value of one key in the `log` tree.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "RQLG"
//!      4     1  format version (1)
//!      5     3  reserved, zero
//!      8     4  header length h (u32, little-endian)
//!     12     4  body length b (u32, little-endian)
//!     16     4  body CRC-32 (of the b body bytes)
//!     20     4  header CRC-32 (of bytes 4..20, then the h header bytes)
//!     24     h  header: postcard { queues: [u32] (ids touched, ascending), ops: u32 }
//!   24+h     b  body: `ops` operations, each a postcard `Op`, back to back
//! ```
//!
//! The header has its own checksum so that a record whose body is damaged still names the
//! queues it touched. The record's length must be exactly `24 + h + b`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::QueueId;

const MAGIC: [u8; 4] = *b"RQLG";
/// The record format this build writes and reads.
pub(crate) const RECORD_VERSION: u8 = 1;
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
}

impl Op<'_> {
    fn queue(&self) -> QueueId {
        match self {
            Op::Enqueue { queue, .. } | Op::Ack { queue, .. } => *queue,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    queues: Vec<QueueId>,
    ops: u32,
}

/// Why a record could not be read. `queues` is known when the header was intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordError {
    pub(crate) queues: Option<Vec<QueueId>>,
    pub(crate) reason: String,
}

impl RecordError {
    fn new(reason: impl Into<String>) -> Self {
        RecordError {
            queues: None,
            reason: reason.into(),
        }
    }
}

/// A decoded, verified record.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub(crate) queues: Vec<QueueId>,
    pub(crate) ops: Vec<Op<'a>>,
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

    /// Drops everything pushed since the last `finish`.
    pub(crate) fn reset(&mut self) {
        self.body.clear();
        self.queues.clear();
        self.ops = 0;
    }

    /// Seals the record and resets the builder for the next one.
    pub(crate) fn finish(&mut self) -> Result<Vec<u8>, postcard::Error> {
        self.queues.sort_unstable();
        let header = Header {
            queues: std::mem::take(&mut self.queues),
            ops: self.ops,
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
        out.extend_from_slice(&len_u32(header_bytes.len()).to_le_bytes());
        out.extend_from_slice(&len_u32(self.body.len()).to_le_bytes());
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

fn len_u32(len: usize) -> u32 {
    // Config caps every size far below 4 GiB.
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

/// Verifies and decodes a record. Never panics, whatever `bytes` holds.
pub(crate) fn decode(bytes: &[u8]) -> Result<Record<'_>, RecordError> {
    if bytes.len() < FIXED {
        return Err(RecordError::new(format!(
            "truncated: {} bytes, shorter than the fixed header",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(RecordError::new("bad magic"));
    }
    if bytes[4] != RECORD_VERSION {
        return Err(RecordError::new(format!(
            "unknown record version {}",
            bytes[4]
        )));
    }
    let header_len = read_u32(bytes, 8) as usize;
    let body_len = read_u32(bytes, 12) as usize;
    let expected = FIXED
        .checked_add(header_len)
        .and_then(|n| n.checked_add(body_len));
    if expected != Some(bytes.len()) {
        return Err(RecordError::new(format!(
            "length mismatch: {} bytes, header says {}",
            bytes.len(),
            FIXED as u64 + header_len as u64 + body_len as u64
        )));
    }
    let header_bytes = &bytes[FIXED..FIXED + header_len];
    let body = &bytes[FIXED + header_len..];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[4..20]);
    hasher.update(header_bytes);
    if hasher.finalize() != read_u32(bytes, 20) || bytes[5..8] != [0, 0, 0] {
        return Err(RecordError::new("header checksum mismatch"));
    }
    let header: Header = match postcard::from_bytes(header_bytes) {
        Ok(h) => h,
        Err(e) => return Err(RecordError::new(format!("undecodable header: {e}"))),
    };
    let fail = |reason: String| RecordError {
        queues: Some(header.queues.clone()),
        reason,
    };
    if crc32fast::hash(body) != read_u32(bytes, 16) {
        return Err(fail("body checksum mismatch".into()));
    }
    // Every op takes at least two bytes, which bounds the allocation.
    let mut ops = Vec::with_capacity((header.ops as usize).min(body.len() / 2));
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
        b.finish().unwrap()
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
        let first = b.finish().unwrap();
        let second = b.finish().unwrap();
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
