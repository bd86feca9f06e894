//! The item envelope: one version byte, then the item in postcard.
//!
//! Items are encoded once, at `enqueue`, so a serialization error surfaces there and the
//! bytes are what the log, the core and an aborting transaction carry around. They are decoded
//! once, when a transaction dequeues them.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Envelope version written in front of every item.
const ENVELOPE_V1: u8 = 1;

/// Why an item's bytes could not be turned back into a `T`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("empty item")]
    Empty,
    #[error("unknown item envelope version {0}")]
    Version(u8),
    #[error("postcard: {0}")]
    Postcard(#[from] postcard::Error),
    #[error("{0} trailing bytes after the item")]
    Trailing(usize),
}

/// A postcard output that appends to a caller's buffer.
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends the postcard encoding of `value` to `buf`. On error `buf` may hold a partial
/// encoding after its old end; callers truncate it back.
pub(crate) fn append<T: Serialize + ?Sized>(
    value: &T,
    buf: &mut Vec<u8>,
) -> Result<(), postcard::Error> {
    postcard::serialize_with_flavor(value, AppendTo(buf))
}

thread_local! {
    /// Where items are encoded before being copied into an allocation of their exact size:
    /// one allocation per item instead of a growing buffer and a shrinking copy.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Scratch buffers larger than this are released after use instead of kept.
const SCRATCH_KEEP: usize = 64 << 10;

/// Encodes `item` in the envelope. The result has no spare capacity.
pub(crate) fn encode<T: Serialize>(item: &T) -> Result<Box<[u8]>, postcard::Error> {
    fn into_exact(buf: &mut Vec<u8>, item: &impl Serialize) -> Result<Box<[u8]>, postcard::Error> {
        buf.clear();
        buf.push(ENVELOPE_V1);
        let encoded = append(item, buf).map(|()| Box::from(&buf[..]));
        if buf.capacity() > SCRATCH_KEEP {
            *buf = Vec::new();
        }
        encoded
    }
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => into_exact(&mut buf, item),
        // Re-entered from inside a `Serialize` impl: use a buffer of its own.
        Err(_) => into_exact(&mut Vec::new(), item),
    })
}

/// Decodes an enveloped item.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (&version, rest) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if version != ENVELOPE_V1 {
        return Err(DecodeError::Version(version));
    }
    let (item, trailing) = postcard::take_from_bytes(rest)?;
    if !trailing.is_empty() {
        return Err(DecodeError::Trailing(trailing.len()));
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let bytes = encode(&("job", 7u32)).unwrap();
        assert_eq!(bytes[0], ENVELOPE_V1);
        let back: (String, u32) = decode(&bytes).unwrap();
        assert_eq!(back, ("job".to_owned(), 7));
        assert!(matches!(decode::<u32>(&[]), Err(DecodeError::Empty)));
        assert!(matches!(
            decode::<u32>(&[9, 1]),
            Err(DecodeError::Version(9))
        ));
        assert!(matches!(
            decode::<u8>(&[1, 1, 2]),
            Err(DecodeError::Trailing(1))
        ));
    }
}
