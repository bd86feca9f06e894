//! The item envelope: one version byte, then the item in postcard.
//!
//! Items are encoded once, at `enqueue`, so a serialization error surfaces there and the
//! bytes are what the log, the core and an aborting transaction carry around. They are decoded
//! once, when a transaction dequeues them.
//!
//! Byte-like items (`Vec<u8>`, `Box<[u8]>`, `bytes::Bytes`, `bytes::BytesMut`, `String`,
//! `Box<str>`) skip serde: postcard writes each of them as a varint length then the raw bytes
//! (through `serialize_seq` of `u8`s, `serialize_bytes` or `serialize_str` alike), and reads a
//! `Vec<u8>` one element at a time. [`encode`] and [`decode`] recognize these types by
//! `TypeId` and copy the bytes in one go instead, writing exactly what postcard writes and
//! accepting and rejecting exactly what postcard accepts and rejects, with the same errors
//! (the tests check both against postcard). The envelope is unchanged.
//!
//! postcard's errors carry no message: an item whose `Serialize` fails with
//! `serde::ser::Error::custom("...")` gives `SerdeSerCustom`. On that error path only,
//! [`encode`] serializes the item once more into a serializer that writes nothing and keeps the
//! message ([`MessageProbe`]), so that the user sees their own text.

use std::any::{Any, TypeId};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Envelope version written in front of every item.
const ENVELOPE_V1: u8 = 1;

/// An item as its encoded bytes: the envelope the store keeps (a version byte, then the item
/// in postcard), whatever the item's type.
///
/// A queue opened as `ReliableConcurrentQueue<RawItem>` moves these bytes as they are, with
/// no decoding or encoding: browsing, dead letters, exporting and importing (with
/// [`import`](crate::ReliableConcurrentQueue::import)) all work on a queue whose item type
/// the caller does not know. Enqueueing a `RawItem` into a queue whose consumers expect
/// another type gives them [`Error::Deserialize`](crate::Error::Deserialize) if the bytes are
/// not one of theirs: nothing checks the type here.
///
/// postcard's encoding does not say what type it holds, so [`RawItem::display`] can only
/// guess: a string or byte string (a length, then that many bytes) is shown as text when it
/// is UTF-8, anything else as hex.
///
/// # Examples
///
/// ```
/// use reliable_queue::RawItem;
/// let store = reliable_queue::Store::in_memory()?;
/// let typed = store.blocking_queue::<String>("mail")?;
/// let mut tx = store.begin();
/// typed.enqueue(&mut tx, "welcome user 42".to_owned())?;
/// tx.blocking_commit()?;
///
/// let raw = store.blocking_queue::<RawItem>("mail")?;
/// let browsed = raw.blocking_browse(None, 10)?;
/// assert_eq!(browsed[0].item.display(), "welcome user 42");
/// assert_eq!(browsed[0].item.decode::<String>()?, "welcome user 42");
/// # Ok::<(), reliable_queue::Error>(())
/// ```
// The type is here, below `admin.rs` (its other methods, its `Debug` and serde), because the
// codec moves its envelope as it is.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawItem(
    /// Always an envelope: made by the codec, or by `admin.rs` after checking.
    pub(crate) Box<[u8]>,
);

impl RawItem {
    /// Bytes the codec has checked are an envelope.
    pub(crate) fn from_checked(bytes: &[u8]) -> RawItem {
        RawItem(bytes.into())
    }

    /// The envelope bytes: what the store keeps of the item.
    pub fn envelope(&self) -> &[u8] {
        &self.0
    }
}

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

/// Why an item could not be encoded.
#[derive(Debug)]
pub(crate) enum EncodeError {
    /// `T`'s serialization failed.
    Postcard(SerializeError),
    /// The envelope would be longer than the limit. Encoding stopped at the first write that
    /// would have crossed it, so `size` (the length the envelope would have reached with that
    /// write) is over the limit and at most the item's whole encoded size; for byte-like items
    /// it is exactly that size.
    TooLarge {
        /// At least this many bytes.
        size: usize,
    },
}

/// Why `T`'s serialization failed.
#[derive(Debug)]
pub(crate) enum SerializeError {
    /// The item's `Serialize` implementation (or serde's derived code) failed with
    /// `serde::ser::Error::custom`, and said this.
    Custom(CustomMessage),
    /// What postcard reported: any other failure, or a custom one whose message could not be
    /// recovered.
    Postcard(postcard::Error),
}

/// The message a `Serialize` implementation gave to `serde::ser::Error::custom`.
///
/// postcard keeps no message in its errors (`custom` gives `SerdeSerCustom`, which displays
/// as "Serde Serialization Error"), so when postcard reports one, [`encode`] serializes the
/// item once more into [`MessageProbe`], which writes nothing and keeps the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CustomMessage(String);

impl std::fmt::Display for CustomMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CustomMessage {}

impl serde::ser::Error for CustomMessage {
    fn custom<M: std::fmt::Display>(message: M) -> Self {
        // Not `to_string`, which panics if the message's `Display` fails: keep what it wrote.
        let mut text = String::new();
        let _ = std::fmt::Write::write_fmt(&mut text, format_args!("{message}"));
        CustomMessage(text)
    }
}

/// Turns postcard's error for `item` into a [`SerializeError`], with the item's own message
/// when postcard's error is a custom one (postcard drops the message). Only called on the
/// error path: encoding an item that serializes pays nothing for it.
#[cold]
fn serialize_error<T: Serialize + ?Sized>(item: &T, e: postcard::Error) -> SerializeError {
    if e != postcard::Error::SerdeSerCustom {
        return SerializeError::Postcard(e);
    }
    match item.serialize(MessageProbe) {
        Err(message) => SerializeError::Custom(message),
        // The second run went through (a `Serialize` impl that fails only now and then):
        // postcard's error is all there is.
        Ok(()) => SerializeError::Postcard(e),
    }
}

/// A serde serializer that writes nothing and stops at the first error, keeping its message:
/// run over an item that postcard failed to serialize with a custom error, it fails at the
/// same place with the message postcard dropped.
///
/// Our own, not a crate: the serializers that keep messages (serde_json and the like) each
/// refuse shapes of their own (map keys that are not strings, say) before the item's error
/// could be reached, and write output we would throw away; this one accepts every shape,
/// writes nothing, and is a few lines of forwarding. It says `is_human_readable() == false`
/// as postcard does, so items that serialize differently for readable formats take the same
/// path as they did under postcard.
struct MessageProbe;

/// A `fmt::Write` that discards what it is given, for [`MessageProbe::collect_str`].
struct Discard;

impl std::fmt::Write for Discard {
    fn write_str(&mut self, _: &str) -> std::fmt::Result {
        Ok(())
    }
}

/// Serializers for the probe's methods that take no value: every one accepts it.
macro_rules! probe_accepts {
    ($($method:ident($($ty:ty),*);)*) => {
        $(
            fn $method(self, $(_: $ty),*) -> Result<(), CustomMessage> {
                Ok(())
            }
        )*
    };
}

impl serde::Serializer for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;
    type SerializeSeq = MessageProbe;
    type SerializeTuple = MessageProbe;
    type SerializeTupleStruct = MessageProbe;
    type SerializeTupleVariant = MessageProbe;
    type SerializeMap = MessageProbe;
    type SerializeStruct = MessageProbe;
    type SerializeStructVariant = MessageProbe;

    probe_accepts! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_i128(i128);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_u128(u128);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_some<V: Serialize + ?Sized>(self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn serialize_newtype_struct<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &V,
    ) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &V,
    ) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_tuple(self, _: usize) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<MessageProbe, CustomMessage> {
        Ok(MessageProbe)
    }

    /// Formats `value` into nothing: serde's default would build a `String` with
    /// `to_string`, which panics when the `Display` impl fails.
    fn collect_str<V: std::fmt::Display + ?Sized>(self, value: &V) -> Result<(), CustomMessage> {
        std::fmt::Write::write_fmt(&mut Discard, format_args!("{value}")).map_err(|_| {
            CustomMessage("the item's Display implementation (collect_str) failed".to_owned())
        })
    }

    fn is_human_readable(&self) -> bool {
        false
    }
}

impl serde::ser::SerializeSeq for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_element<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeTuple for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_element<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeTupleStruct for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_field<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeTupleVariant for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_field<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeMap for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_key<K: Serialize + ?Sized>(&mut self, key: &K) -> Result<(), CustomMessage> {
        key.serialize(MessageProbe)
    }

    fn serialize_value<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeStruct for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_field<V: Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        value: &V,
    ) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

impl serde::ser::SerializeStructVariant for MessageProbe {
    type Ok = ();
    type Error = CustomMessage;

    fn serialize_field<V: Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        value: &V,
    ) -> Result<(), CustomMessage> {
        value.serialize(MessageProbe)
    }

    fn end(self) -> Result<(), CustomMessage> {
        Ok(())
    }
}

/// A postcard output that appends to a caller's buffer, up to a total length: the write that
/// would cross it is refused (and every later one), so an item over the limit costs no more
/// memory than the limit.
struct Bounded<'a> {
    buf: &'a mut Vec<u8>,
    limit: usize,
    /// The length the buffer would have reached with the first refused write (the caller's,
    /// as postcard keeps the flavor when it fails).
    over: &'a mut Option<usize>,
}

impl Bounded<'_> {
    /// Refuses a write of `n` bytes that would take the buffer past the limit.
    #[inline]
    fn room_for(&mut self, n: usize) -> postcard::Result<()> {
        // Saturating is meant: a size past `usize::MAX` is over any limit, as `usize::MAX` is.
        let size = self.buf.len().saturating_add(n);
        if size > self.limit || self.over.is_some() {
            self.over.get_or_insert(size);
            return Err(postcard::Error::SerializeBufferFull);
        }
        Ok(())
    }
}

impl postcard::ser_flavors::Flavor for Bounded<'_> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.room_for(data.len())?;
        self.buf.extend_from_slice(data);
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.room_for(1)?;
        self.buf.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// A postcard output that appends to a caller's buffer.
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    #[inline]
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

/// Encodes `item` in the envelope, of at most `limit` bytes. The result has no spare
/// capacity. An item over the limit is refused as soon as that is known: before any copy for
/// a byte-like item, at the write that crosses the limit otherwise, so refusing it costs at
/// most `limit` bytes of memory, not the item's encoded size.
#[inline]
pub(crate) fn encode<T: Serialize + 'static>(
    item: &T,
    limit: usize,
) -> Result<Box<[u8]>, EncodeError> {
    if TypeId::of::<T>() == TypeId::of::<RawItem>() {
        let item: &dyn Any = item;
        if let Some(raw) = item.downcast_ref::<RawItem>() {
            return encode_envelope(raw.envelope(), limit);
        }
    }
    match raw_bytes(item) {
        Some(raw) => encode_raw(raw, limit),
        None => encode_serde(item, limit),
    }
}

/// A [`RawItem`]'s envelope, copied as it is (it was checked when the `RawItem` was made).
fn encode_envelope(envelope: &[u8], limit: usize) -> Result<Box<[u8]>, EncodeError> {
    if envelope.len() > limit {
        return Err(EncodeError::TooLarge {
            size: envelope.len(),
        });
    }
    Ok(Box::from(envelope))
}

/// Are `bytes` an envelope this build reads (its version byte first)?
pub(crate) fn is_envelope(bytes: &[u8]) -> bool {
    open_envelope(bytes).is_ok()
}

/// The text of an enveloped string or byte string of UTF-8 (a varint length, then exactly
/// that many bytes), if `bytes` are one.
pub(crate) fn as_text(bytes: &[u8]) -> Option<&str> {
    let rest = open_envelope(bytes).ok()?;
    let (len, body) = take_varint_usize(rest).ok()?;
    if len != body.len() {
        return None;
    }
    std::str::from_utf8(body).ok()
}

/// Encodes `item` in the envelope through serde and postcard, within `limit` bytes.
#[inline]
fn encode_serde<T: Serialize>(item: &T, limit: usize) -> Result<Box<[u8]>, EncodeError> {
    #[inline]
    fn into_exact(
        buf: &mut Vec<u8>,
        item: &impl Serialize,
        limit: usize,
    ) -> Result<Box<[u8]>, EncodeError> {
        buf.clear();
        let encoded = if limit == 0 {
            Err(EncodeError::TooLarge { size: 1 })
        } else {
            buf.push(ENVELOPE_V1);
            let mut over = None;
            let out = Bounded {
                buf: &mut *buf,
                limit,
                over: &mut over,
            };
            let written = postcard::serialize_with_flavor(item, out);
            // Checked first: a `Serialize` impl that swallowed the refusal must not pass off
            // a cut encoding as the item.
            match (over, written) {
                (Some(size), _) => Err(EncodeError::TooLarge { size }),
                (None, Ok(())) => Ok(Box::from(&buf[..])),
                (None, Err(e)) => Err(EncodeError::Postcard(SerializeError::Postcard(e))),
            }
        };
        if buf.capacity() > SCRATCH_KEEP {
            *buf = Vec::new();
        }
        encoded
    }
    let encoded = SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => into_exact(&mut buf, item, limit),
        // Re-entered from inside a `Serialize` impl: use a buffer of its own.
        Err(_) => into_exact(&mut Vec::new(), item, limit),
    });
    match encoded {
        // Outside the scratch buffer's borrow: the probe runs the item's `Serialize` again.
        Err(EncodeError::Postcard(SerializeError::Postcard(e))) => {
            Err(EncodeError::Postcard(serialize_error(item, e)))
        }
        other => other,
    }
}

/// Decodes an enveloped item.
#[inline]
pub(crate) fn decode<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<T, DecodeError> {
    let rest = open_envelope(bytes)?;
    if TypeId::of::<T>() == TypeId::of::<RawItem>() {
        // Checked just above: the bytes are an envelope.
        if let Some(item) = cast(RawItem::from_checked(bytes)) {
            return Ok(item);
        }
    }
    if let Some(kind) = RawKind::of::<T>() {
        if let Some(item) = decode_raw(kind, rest) {
            return item;
        }
    }
    decode_serde(rest)
}

/// The item's bytes after the envelope's version byte.
fn open_envelope(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    let (&version, rest) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if version != ENVELOPE_V1 {
        return Err(DecodeError::Version(version));
    }
    Ok(rest)
}

/// Decodes an item (without its envelope) through serde and postcard.
#[inline]
fn decode_serde<T: DeserializeOwned>(rest: &[u8]) -> Result<T, DecodeError> {
    let (item, trailing) = postcard::take_from_bytes(rest)?;
    if !trailing.is_empty() {
        return Err(DecodeError::Trailing(trailing.len()));
    }
    Ok(item)
}

/// The raw bytes of `item` if it is of a byte-like type, whose postcard encoding is a varint
/// length followed by these bytes.
#[inline]
fn raw_bytes<T: 'static>(item: &T) -> Option<&[u8]> {
    // `RawKind::of` compares constant type ids and folds away for every other `T`, so they
    // pay nothing here; only a byte-like `T` goes through `Any`.
    let kind = RawKind::of::<T>()?;
    let item: &dyn Any = item;
    match kind {
        RawKind::Vec => item.downcast_ref::<Vec<u8>>().map(Vec::as_slice),
        RawKind::String => item.downcast_ref::<String>().map(String::as_bytes),
        RawKind::Bytes => item.downcast_ref::<bytes::Bytes>().map(|b| &b[..]),
        RawKind::BoxSlice => item.downcast_ref::<Box<[u8]>>().map(|b| &b[..]),
        RawKind::BytesMut => item.downcast_ref::<bytes::BytesMut>().map(|b| &b[..]),
        RawKind::BoxStr => item.downcast_ref::<Box<str>>().map(|s| s.as_bytes()),
    }
}

/// Encodes raw bytes in the envelope as postcard does: version, varint length, bytes. One
/// allocation of the exact size, one copy; none when the exact size is over `limit`.
#[inline]
fn encode_raw(raw: &[u8], limit: usize) -> Result<Box<[u8]>, EncodeError> {
    let mut prefix = [0u8; VARINT_MAX];
    let prefix = put_varint_usize(raw.len(), &mut prefix);
    // Saturating is meant: a size past `usize::MAX` is over any limit, as `usize::MAX` is.
    let size = (1 + prefix.len()).saturating_add(raw.len());
    if size > limit {
        return Err(EncodeError::TooLarge { size });
    }
    let mut out = Vec::with_capacity(size);
    out.push(ENVELOPE_V1);
    out.extend_from_slice(prefix);
    out.extend_from_slice(raw);
    Ok(out.into_boxed_slice())
}

/// The byte-like item types decoded without serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RawKind {
    Vec,
    BoxSlice,
    Bytes,
    BytesMut,
    String,
    BoxStr,
}

impl RawKind {
    /// Which byte-like type `T` is, if any (the comparisons fold away at compile time).
    fn of<T: 'static>() -> Option<RawKind> {
        let t = TypeId::of::<T>();
        if t == TypeId::of::<Vec<u8>>() {
            Some(RawKind::Vec)
        } else if t == TypeId::of::<String>() {
            Some(RawKind::String)
        } else if t == TypeId::of::<bytes::Bytes>() {
            Some(RawKind::Bytes)
        } else if t == TypeId::of::<Box<[u8]>>() {
            Some(RawKind::BoxSlice)
        } else if t == TypeId::of::<bytes::BytesMut>() {
            Some(RawKind::BytesMut)
        } else if t == TypeId::of::<Box<str>>() {
            Some(RawKind::BoxStr)
        } else {
            None
        }
    }
}

/// Decodes an item of byte-like type `T` (`kind`, from [`RawKind::of::<T>`]) from `rest` (the
/// bytes after the envelope's version byte), with the checks and errors of the serde path, in
/// its order: the varint, the length against what is left, UTF-8 for strings, then trailing
/// bytes. `None` only if `kind` does not name `T`, which `RawKind::of` rules out.
fn decode_raw<T: 'static>(kind: RawKind, rest: &[u8]) -> Option<Result<T, DecodeError>> {
    let (len, after) = match take_varint_usize(rest) {
        Ok(taken) => taken,
        Err(e) => return Some(Err(e.into())),
    };
    if len > after.len() {
        return Some(Err(postcard::Error::DeserializeUnexpectedEnd.into()));
    }
    let (body, trailing) = after.split_at(len);
    let text = match kind {
        RawKind::String | RawKind::BoxStr => match std::str::from_utf8(body) {
            Ok(text) => Some(text),
            Err(_) => return Some(Err(postcard::Error::DeserializeBadUtf8.into())),
        },
        _ => None,
    };
    if !trailing.is_empty() {
        return Some(Err(DecodeError::Trailing(trailing.len())));
    }
    let item = match (kind, text) {
        (RawKind::String, Some(text)) => cast(text.to_owned()),
        (RawKind::BoxStr, Some(text)) => cast(Box::<str>::from(text)),
        (RawKind::Vec, _) => cast(body.to_vec()),
        (RawKind::BoxSlice, _) => cast(Box::<[u8]>::from(body)),
        (RawKind::Bytes, _) => cast(bytes::Bytes::copy_from_slice(body)),
        (RawKind::BytesMut, _) => cast(bytes::BytesMut::from(body)),
        _ => None,
    };
    item.map(Ok)
}

/// Moves `value` out as a `T` when `U` is `T`; `None` (dropping `value`) otherwise.
fn cast<U: 'static, T: 'static>(value: U) -> Option<T> {
    (&mut Some(value) as &mut dyn Any)
        .downcast_mut::<Option<T>>()
        .and_then(Option::take)
}

/// Most bytes in the varint of a `usize`, as postcard counts them.
const VARINT_MAX: usize = (usize::BITS as usize).div_ceil(7);

/// Largest value of the last byte of a `usize` varint of `VARINT_MAX` bytes (the bits left
/// over), as postcard checks it.
const VARINT_LAST_MAX: u8 = (1 << (usize::BITS % 7)) - 1;

/// Writes `n` as postcard writes a length: LEB128, 7 bits a byte, least significant first.
fn put_varint_usize(mut n: usize, out: &mut [u8; VARINT_MAX]) -> &[u8] {
    let mut used = 0;
    for byte in out.iter_mut() {
        used += 1;
        // The low seven bits, which always fit a byte.
        let low = u8::try_from(n & 0x7f).unwrap_or(0);
        if n < 0x80 {
            *byte = low;
            break;
        }
        *byte = low | 0x80;
        n >>= 7;
    }
    &out[..used]
}

/// Reads a length as postcard reads it: at most `VARINT_MAX` bytes, the last one without
/// bits beyond a `usize`; redundant zero groups are accepted, as postcard does. Errors:
/// `DeserializeUnexpectedEnd` if `input` ends first, `DeserializeBadVarint` otherwise.
fn take_varint_usize(input: &[u8]) -> Result<(usize, &[u8]), postcard::Error> {
    let mut out: usize = 0;
    for (i, &byte) in input.iter().take(VARINT_MAX).enumerate() {
        out |= usize::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            if i == VARINT_MAX - 1 && byte > VARINT_LAST_MAX {
                return Err(postcard::Error::DeserializeBadVarint);
            }
            return Ok((out, &input[i + 1..]));
        }
    }
    if input.len() < VARINT_MAX {
        Err(postcard::Error::DeserializeUnexpectedEnd)
    } else {
        Err(postcard::Error::DeserializeBadVarint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt::Debug;

    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;

    /// [`super::encode`] without a size limit.
    fn encode<T: Serialize + 'static>(item: &T) -> Result<Box<[u8]>, EncodeError> {
        super::encode(item, usize::MAX)
    }

    fn too_large<T: Serialize + 'static>(item: &T, limit: usize) -> usize {
        match super::encode(item, limit) {
            Err(EncodeError::TooLarge { size }) => size,
            other => panic!("expected TooLarge under {limit}, got {other:?}"),
        }
    }

    #[test]
    fn the_limit_is_exact_on_both_paths() {
        for len in [0, 1, 126, 127, 128, 300, 16_384, 70_000] {
            let raw = pattern(len);
            let whole = old_encode(&raw).len();
            assert_eq!(
                &super::encode(&raw, whole).unwrap()[..],
                &old_encode(&raw)[..]
            );
            assert_eq!(too_large(&raw, whole - 1), whole, "{len}");
            // The serde path: the same bytes in a one-field tuple, which has no fast path.
            let item = (raw.clone(),);
            let whole = old_encode(&item).len();
            assert_eq!(
                &super::encode(&item, whole).unwrap()[..],
                &old_encode(&item)[..]
            );
            let size = too_large(&item, whole - 1);
            assert!(
                size > whole - 1 && size <= whole,
                "{len}: {size} of {whole}"
            );
        }
        assert_eq!(too_large(&(), 0), 1);
        assert_eq!(too_large(&Vec::<u8>::new(), 0), 2);
        assert_eq!(&super::encode(&(), 1).unwrap()[..], &[ENVELOPE_V1]);
    }

    #[test]
    fn encoding_stops_at_the_limit() {
        // 64 strings of 1 KiB under a 4 KiB limit: refused within the fifth string's write.
        let item: Vec<String> = (0..64).map(|_| "x".repeat(1024)).collect();
        let size = too_large(&item, 4096);
        assert!(size > 4096 && size <= 4096 + 1024 + 2, "{size}");
        // The scratch buffer kept no more than the limit.
        SCRATCH.with(|s| assert!(s.borrow().len() <= 4096));
    }

    #[test]
    fn a_serialize_impl_that_swallows_the_refusal_is_still_refused() {
        struct Stubborn;
        impl Serialize for Stubborn {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let mut t = s.serialize_tuple(3)?;
                t.serialize_element(&7u8)?;
                let _ignored = t.serialize_element(&"y".repeat(100));
                t.serialize_element(&8u8)?;
                t.end()
            }
        }
        let size = too_large(&Stubborn, 50);
        assert!(size > 50, "{size}");
    }

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

    /// Lengths around every varint boundary, and a large one.
    const LENGTHS: &[usize] = &[
        0,
        1,
        2,
        100,
        126,
        127,
        128,
        129,
        255,
        256,
        300,
        16_382,
        16_383,
        16_384,
        16_385,
        65_536,
        2_097_151,
        2_097_152,
        2_097_153,
        (4 << 20) + 3,
    ];

    fn pattern(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(31) ^ (i >> 8)).to_le_bytes()[0])
            .collect()
    }

    fn text(len: usize) -> String {
        // ASCII with a two-byte character wherever it fits, so the byte length is `len`.
        let mut s = String::with_capacity(len);
        while s.len() < len {
            if len - s.len() >= 2 && s.len() % 7 == 3 {
                s.push('é');
            } else {
                s.push(char::from(b'a' + (s.len() % 26).to_le_bytes()[0]));
            }
        }
        assert_eq!(s.len(), len);
        s
    }

    /// What the code before the fast path wrote: the envelope byte, then plain postcard.
    fn old_encode<T: Serialize + ?Sized>(item: &T) -> Vec<u8> {
        let mut out = vec![ENVELOPE_V1];
        out.extend(postcard::to_stdvec(item).unwrap());
        out
    }

    /// What the code before the fast path read: the envelope, then plain postcard.
    fn old_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
        decode_serde(open_envelope(bytes)?)
    }

    /// Decoding `input` as a `T` gives the same value or the same error with the fast path
    /// as through serde and postcard.
    fn same_decode<T: DeserializeOwned + PartialEq + Debug + 'static>(input: &[u8]) {
        assert!(RawKind::of::<T>().is_some());
        let what = || {
            format!(
                "{} from {:?} ({} bytes)",
                std::any::type_name::<T>(),
                &input[..input.len().min(24)],
                input.len()
            )
        };
        match (decode::<T>(input), old_decode::<T>(input)) {
            (Ok(fast), Ok(old)) => assert!(fast == old, "{}: values differ", what()),
            (Err(fast), Err(old)) => {
                assert_eq!(format!("{fast:?}"), format!("{old:?}"), "{}", what());
            }
            (fast, old) => panic!(
                "{}: fast path {:?}, serde path {:?}",
                what(),
                fast.map(|_| "Ok"),
                old.map(|_| "Ok")
            ),
        }
    }

    fn same_decode_all(input: &[u8]) {
        same_decode::<Vec<u8>>(input);
        same_decode::<Box<[u8]>>(input);
        same_decode::<Bytes>(input);
        same_decode::<BytesMut>(input);
        same_decode::<String>(input);
        same_decode::<Box<str>>(input);
    }

    /// The fast path's bytes are postcard's, and both paths read them back.
    fn check_item<T>(item: T)
    where
        T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
    {
        let fast = encode(&item).unwrap();
        let old = old_encode(&item);
        assert!(
            fast[..] == old[..],
            "{} of {} bytes: fast path differs from postcard",
            std::any::type_name::<T>(),
            old.len()
        );
        assert_eq!(fast.len(), old.len());
        assert_eq!(decode::<T>(&fast).unwrap(), item);
        assert_eq!(old_decode::<T>(&fast).unwrap(), item);
        assert_eq!(decode::<T>(&old).unwrap(), item);
        // The same bytes read as every other byte-like type.
        same_decode_all(&fast);
    }

    #[test]
    fn fast_path_covers_the_byte_like_types_only() {
        assert_eq!(RawKind::of::<Vec<u8>>(), Some(RawKind::Vec));
        assert_eq!(RawKind::of::<Box<[u8]>>(), Some(RawKind::BoxSlice));
        assert_eq!(RawKind::of::<Bytes>(), Some(RawKind::Bytes));
        assert_eq!(RawKind::of::<BytesMut>(), Some(RawKind::BytesMut));
        assert_eq!(RawKind::of::<String>(), Some(RawKind::String));
        assert_eq!(RawKind::of::<Box<str>>(), Some(RawKind::BoxStr));
        assert_eq!(RawKind::of::<Vec<i8>>(), None);
        assert_eq!(RawKind::of::<Vec<u16>>(), None);
        assert_eq!(RawKind::of::<[u8; 4]>(), None);
        assert_eq!(RawKind::of::<(Vec<u8>,)>(), None);
        assert_eq!(RawKind::of::<Option<Vec<u8>>>(), None);
        assert!(raw_bytes(&vec![1u8]).is_some());
        assert!(raw_bytes(&vec![1u16]).is_none());
        assert!(raw_bytes(&Some(vec![1u8])).is_none());
        assert!(cast::<u8, u16>(1).is_none());
        assert_eq!(cast::<u8, u8>(1), Some(1));
    }

    #[test]
    fn postcard_writes_seq_bytes_and_str_alike() {
        for &len in LENGTHS {
            let raw = pattern(len);
            let seq = postcard::to_stdvec(&raw).unwrap(); // serialize_seq of u8s
            let bytes = postcard::to_stdvec(&Bytes::from(raw.clone())).unwrap(); // serialize_bytes
            assert_eq!(seq, bytes, "len {len}");
            let mut prefix = [0u8; VARINT_MAX];
            let prefix = put_varint_usize(len, &mut prefix);
            assert_eq!(&seq[..prefix.len()], prefix, "len {len}");
            assert_eq!(&seq[prefix.len()..], &raw[..], "len {len}");

            let s = text(len);
            let by_str = postcard::to_stdvec(&s).unwrap(); // serialize_str
            let by_seq = postcard::to_stdvec(&s.as_bytes().to_vec()).unwrap();
            assert_eq!(by_str, by_seq, "len {len}");
        }
    }

    #[test]
    fn varints_match_postcard() {
        let mut values: Vec<usize> = vec![usize::MAX, usize::MAX - 1, usize::MAX >> 1];
        for shift in 0..usize::BITS {
            let p = 1usize << shift;
            values.extend([p - 1, p, p + 1]);
        }
        for n in values {
            let mut buf = [0u8; VARINT_MAX];
            let ours = put_varint_usize(n, &mut buf).to_vec();
            assert_eq!(ours, postcard::to_stdvec(&n).unwrap(), "{n}");
            let mut input = ours.clone();
            input.push(0xEE);
            assert_eq!(take_varint_usize(&input), Ok((n, &[0xEE][..])), "{n}");
        }
    }

    #[test]
    fn byte_like_items_are_written_as_postcard_writes_them() {
        for &len in LENGTHS {
            let raw = pattern(len);
            check_item(raw.clone());
            check_item(raw.clone().into_boxed_slice());
            check_item(Bytes::from(raw.clone()));
            check_item(BytesMut::from(&raw[..]));
            check_item(text(len));
            check_item(text(len).into_boxed_str());
        }
        check_item("ünïcödé ✓ \u{1F980}".to_owned());
        check_item(Bytes::from_static(b"static"));
        // A `Bytes` that is a slice of a larger buffer encodes its own bytes only.
        check_item(Bytes::from(pattern(1000)).slice(10..300));
    }

    #[test]
    fn other_types_still_go_through_postcard() {
        fn same<T: Serialize + DeserializeOwned + PartialEq + Debug + 'static>(item: T) {
            let bytes = encode(&item).unwrap();
            assert_eq!(&bytes[..], &old_encode(&item)[..]);
            assert_eq!(decode::<T>(&bytes).unwrap(), item);
        }
        same(vec![1u16, 300, 65535]);
        same(vec![1i8, -1]);
        same((vec![1u8, 2], "x".to_owned()));
        same(Some(vec![7u8; 3]));
        same([1u8, 2, 3, 4]);
        same(vec![vec![1u8], vec![]]);
        same(42u64);
    }

    #[test]
    fn reads_bytes_written_by_the_old_code() {
        // Written out by hand: version 1, varint length, bytes.
        assert_eq!(decode::<Vec<u8>>(&[1, 0]).unwrap(), Vec::<u8>::new());
        assert_eq!(decode::<Vec<u8>>(&[1, 3, 7, 8, 9]).unwrap(), vec![7, 8, 9]);
        assert_eq!(decode::<String>(&[1, 3, b'a', b'b', b'c']).unwrap(), "abc");
        assert_eq!(decode::<String>(&[1, 0]).unwrap(), "");
        assert_eq!(&decode::<Bytes>(&[1, 2, 0, 255]).unwrap()[..], &[0, 255]);
        assert_eq!(&*decode::<Box<[u8]>>(&[1, 1, 5]).unwrap(), &[5]);
        let mut long = vec![1, 0x80, 0x01]; // length 128
        long.extend(pattern(128));
        assert_eq!(decode::<Vec<u8>>(&long).unwrap(), pattern(128));
        // A redundant zero group in the varint: postcard accepts it, so do we.
        assert_eq!(decode::<Vec<u8>>(&[1, 0x81, 0x00, 9]).unwrap(), vec![9]);
        same_decode_all(&[1, 0x81, 0x00, 9]);

        // Written by the old encoder (plain postcard, `serialize_seq` for `Vec<u8>`).
        for &len in LENGTHS {
            let raw = pattern(len);
            let s = text(len);
            assert_eq!(decode::<Vec<u8>>(&old_encode(&raw)).unwrap(), raw);
            assert_eq!(&decode::<Bytes>(&old_encode(&raw)).unwrap()[..], &raw[..]);
            assert_eq!(decode::<String>(&old_encode(&s)).unwrap(), s);
            // A string written as bytes, and bytes written as a string, read back.
            assert_eq!(decode::<Vec<u8>>(&old_encode(&s)).unwrap(), s.as_bytes());
            assert_eq!(decode::<String>(&old_encode(s.as_bytes())).unwrap(), s);
        }
    }

    fn postcard_error<T: Debug>(result: Result<T, DecodeError>) -> postcard::Error {
        match result {
            Err(DecodeError::Postcard(e)) => e,
            other => panic!("expected a postcard error, got {other:?}"),
        }
    }

    #[test]
    fn damaged_inputs_fail_as_before() {
        use postcard::Error::{DeserializeBadUtf8, DeserializeBadVarint, DeserializeUnexpectedEnd};

        // Envelope.
        assert!(matches!(decode::<Vec<u8>>(&[]), Err(DecodeError::Empty)));
        assert!(matches!(decode::<String>(&[]), Err(DecodeError::Empty)));
        assert!(matches!(
            decode::<Vec<u8>>(&[0, 0]),
            Err(DecodeError::Version(0))
        ));
        assert!(matches!(
            decode::<Bytes>(&[2, 1, 1]),
            Err(DecodeError::Version(2))
        ));
        assert!(matches!(
            decode::<String>(&[255]),
            Err(DecodeError::Version(255))
        ));

        // Varint: missing, truncated, too long, too large.
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&[1])),
            DeserializeUnexpectedEnd
        );
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&[1, 0x80])),
            DeserializeUnexpectedEnd
        );
        assert_eq!(
            postcard_error(decode::<String>(&[1, 0xFF, 0xFF])),
            DeserializeUnexpectedEnd
        );
        let mut nine = vec![1];
        nine.extend([0xFF; VARINT_MAX - 1]);
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&nine)),
            DeserializeUnexpectedEnd
        );
        let mut ten = vec![1];
        ten.extend([0x80; VARINT_MAX]);
        assert_eq!(postcard_error(decode::<String>(&ten)), DeserializeBadVarint);
        let mut eleven = vec![1];
        eleven.extend([0x80; 10]);
        eleven.push(0);
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&eleven)),
            DeserializeBadVarint
        );
        let mut too_big = vec![1];
        too_big.extend([0xFF; VARINT_MAX - 1]);
        too_big.push(VARINT_LAST_MAX + 1);
        assert_eq!(
            postcard_error(decode::<Bytes>(&too_big)),
            DeserializeBadVarint
        );
        // The largest length: well formed, and longer than anything that follows.
        let mut largest = vec![1];
        largest.extend([0xFF; VARINT_MAX - 1]);
        largest.push(VARINT_LAST_MAX);
        largest.extend([0; 16]);
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&largest)),
            DeserializeUnexpectedEnd
        );

        // Length longer than the rest, shorter than the rest.
        assert_eq!(
            postcard_error(decode::<Vec<u8>>(&[1, 3, 1, 2])),
            DeserializeUnexpectedEnd
        );
        assert_eq!(
            postcard_error(decode::<String>(&[1, 1])),
            DeserializeUnexpectedEnd
        );
        assert!(matches!(
            decode::<Vec<u8>>(&[1, 1, 1, 2]),
            Err(DecodeError::Trailing(1))
        ));
        assert!(matches!(
            decode::<String>(&[1, 0, 0, 0, 0]),
            Err(DecodeError::Trailing(3))
        ));
        assert!(matches!(
            decode::<Box<[u8]>>(&[1, 0, 9]),
            Err(DecodeError::Trailing(1))
        ));

        // UTF-8, checked before trailing bytes.
        assert_eq!(
            postcard_error(decode::<String>(&[1, 2, 0xC3, 0x28])),
            DeserializeBadUtf8
        );
        assert_eq!(
            postcard_error(decode::<Box<str>>(&[1, 1, 0xFF])),
            DeserializeBadUtf8
        );
        assert_eq!(
            postcard_error(decode::<String>(&[1, 1, 0x80, 0])),
            DeserializeBadUtf8
        );
        // Cut in the middle of a character.
        let crab = "\u{1F980}".as_bytes();
        assert_eq!(
            postcard_error(decode::<String>(&[&[1, 3][..], &crab[..3]].concat())),
            DeserializeBadUtf8
        );
        // Surrogates are not UTF-8.
        assert_eq!(
            postcard_error(decode::<String>(&[1, 3, 0xED, 0xA0, 0x80])),
            DeserializeBadUtf8
        );
        // The same bytes are fine as bytes.
        assert_eq!(
            decode::<Vec<u8>>(&[1, 2, 0xC3, 0x28]).unwrap(),
            vec![0xC3, 0x28]
        );

        for input in [
            &[][..],
            &[0, 0],
            &[1],
            &[1, 0x80],
            &[1, 0xFF, 0xFF],
            &nine,
            &ten,
            &eleven,
            &too_big,
            &largest,
            &[1, 3, 1, 2],
            &[1, 1, 1, 2],
            &[1, 0, 0, 0, 0],
            &[1, 2, 0xC3, 0x28],
            &[1, 1, 0x80, 0],
            &[1, 3, 0xED, 0xA0, 0x80],
        ] {
            same_decode_all(input);
        }
    }

    #[test]
    fn every_short_input_decodes_as_before() {
        // Every input of up to three bytes after the version byte, over values that matter
        // to a varint, a length and UTF-8.
        let interesting = [
            0x00, 0x01, 0x02, 0x03, 0x41, 0x7F, 0x80, 0x81, 0xC3, 0xED, 0xFF,
        ];
        same_decode_all(&[1]);
        for &a in &interesting {
            same_decode_all(&[1, a]);
            for &b in &interesting {
                same_decode_all(&[1, a, b]);
                for &c in &interesting {
                    same_decode_all(&[1, a, b, c]);
                }
            }
        }
    }

    /// Always fails, with `message` (through `serde::ser::Error::custom`).
    struct Refuses {
        message: &'static str,
    }

    impl Serialize for Refuses {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom(self.message))
        }
    }

    fn message_of<T: Serialize + 'static>(item: &T) -> Result<String, String> {
        match super::encode(item, usize::MAX) {
            Err(EncodeError::Postcard(SerializeError::Custom(message))) => Ok(message.0),
            Err(EncodeError::Postcard(SerializeError::Postcard(e))) => Err(format!("{e:?}")),
            other => panic!("expected a serialization failure, got {other:?}"),
        }
    }

    #[test]
    fn a_custom_message_is_kept_wherever_it_is_raised() {
        use std::collections::BTreeMap;

        #[derive(Serialize)]
        struct Deep {
            id: u32,
            tags: Vec<String>,
            inner: Option<(u8, Vec<Refuses>)>,
        }
        #[derive(Serialize)]
        enum Shape {
            Unit,
            Tuple(u8, Refuses),
            Struct { first: i128, second: Refuses },
            Newtype(Refuses),
        }
        #[derive(Serialize)]
        struct Wrapper(Refuses);

        let no = |message| Refuses { message };
        assert_eq!(message_of(&no("top")), Ok("top".into()));
        assert_eq!(message_of(&vec![no("in a seq")]), Ok("in a seq".into()));
        assert_eq!(
            message_of(&(1u8, 2u128, no("in a tuple"))),
            Ok("in a tuple".into())
        );
        assert_eq!(
            message_of(&Some(no("in an option"))),
            Ok("in an option".into())
        );
        assert_eq!(
            message_of(&Wrapper(no("in a newtype"))),
            Ok("in a newtype".into())
        );
        let deep = Deep {
            id: 7,
            tags: vec!["a".into(), "b".into()],
            inner: Some((1, vec![no("deep down")])),
        };
        assert_eq!(message_of(&deep), Ok("deep down".into()));
        assert_eq!(
            message_of(&vec![Shape::Unit, Shape::Tuple(1, no("tuple variant"))]),
            Ok("tuple variant".into())
        );
        assert_eq!(
            message_of(&Shape::Struct {
                first: -1,
                second: no("struct variant")
            }),
            Ok("struct variant".into())
        );
        assert_eq!(
            message_of(&Shape::Newtype(no("newtype variant"))),
            Ok("newtype variant".into())
        );
        let mut values = BTreeMap::new();
        values.insert("k", no("a map value"));
        assert_eq!(message_of(&values), Ok("a map value".into()));
        // The first failure is the one reported.
        assert_eq!(message_of(&(no("first"), no("second"))), Ok("first".into()));
    }

    #[test]
    fn a_custom_message_from_serde_itself_is_kept() {
        // serde's derived code for an internally tagged enum refuses a newtype variant of an
        // integer, with `custom`.
        #[derive(Serialize)]
        #[serde(tag = "kind")]
        enum Tagged {
            Number(u32),
        }
        let message = message_of(&Tagged::Number(3)).expect("serde's message");
        assert!(message.contains("Tagged::Number"), "{message}");
    }

    #[test]
    fn a_message_whose_display_fails_does_not_panic() {
        /// Writes a little, then fails.
        struct Halting;
        impl std::fmt::Display for Halting {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("half")?;
                Err(std::fmt::Error)
            }
        }
        struct Refusing;
        impl Serialize for Refusing {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom(Halting))
            }
        }
        assert_eq!(message_of(&Refusing), Ok("half".into()));
    }

    #[test]
    fn the_probe_sees_the_item_as_postcard_does() {
        /// Fails only when the format is human readable (postcard's is not).
        struct Readable;
        impl Serialize for Readable {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str("readable")
                } else {
                    Err(serde::ser::Error::custom("compact"))
                }
            }
        }
        assert_eq!(message_of(&Readable), Ok("compact".into()));
    }

    #[test]
    fn failures_that_are_not_custom_stay_postcards() {
        /// A sequence of unknown length, which postcard refuses on its own.
        struct Unsized;
        impl Serialize for Unsized {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq;
                let mut seq = s.serialize_seq(None)?;
                seq.serialize_element(&Refuses {
                    message: "never reached",
                })?;
                seq.end()
            }
        }
        assert_eq!(
            message_of(&Unsized),
            Err(format!("{:?}", postcard::Error::SerializeSeqLengthUnknown))
        );

        /// A `Display` that fails, for `collect_str`.
        struct BadDisplay;
        impl std::fmt::Display for BadDisplay {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                Err(std::fmt::Error)
            }
        }
        struct Collects;
        impl Serialize for Collects {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&BadDisplay)
            }
        }
        assert_eq!(
            message_of(&Collects),
            Err(format!("{:?}", postcard::Error::CollectStrError))
        );
        // The probe's own `collect_str` does not panic on it either.
        assert!(Collects.serialize(MessageProbe).is_err());
    }

    #[test]
    fn an_item_that_fails_only_once_keeps_postcards_error() {
        /// Fails with `custom` the first time only.
        struct Once(std::cell::Cell<bool>);
        impl Serialize for Once {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if self.0.replace(true) {
                    s.serialize_u8(1)
                } else {
                    Err(serde::ser::Error::custom("once"))
                }
            }
        }
        assert_eq!(
            message_of(&Once(std::cell::Cell::new(false))),
            Err(format!("{:?}", postcard::Error::SerdeSerCustom))
        );
    }

    #[test]
    fn the_probe_accepts_every_shape() {
        use std::collections::HashMap;

        #[derive(Serialize)]
        enum Every {
            Unit,
            Newtype(f32),
            Tuple(char, bool),
            Struct { a: i8, b: i16 },
        }
        #[derive(Serialize)]
        struct UnitStruct;
        let mut map = HashMap::new();
        map.insert((1u8, vec![2u16]), [Every::Unit, Every::Newtype(1.5)]);
        let item = (
            map,
            Every::Tuple('x', true),
            Every::Struct { a: -1, b: -2 },
            UnitStruct,
            (i32::MIN, i64::MIN, u64::MAX, f64::MAX, u128::MAX, i128::MIN),
            Bytes::from_static(b"bytes"),
            None::<u8>,
            (),
        );
        assert_eq!(item.serialize(MessageProbe), Ok(()));
        assert!(super::encode(&item, usize::MAX).is_ok());
    }

    proptest! {
        #[test]
        fn any_input_decodes_as_before(tail in proptest::collection::vec(any::<u8>(), 0..40)) {
            same_decode_all(&[&[1][..], &tail].concat());
        }

        #[test]
        fn any_length_prefix_decodes_as_before(
            len in 0usize..64,
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut input = old_encode(&len);
            input.extend(&body);
            same_decode_all(&input);
        }

        #[test]
        fn any_bytes_round_trip(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            check_item(raw);
        }

        #[test]
        fn any_string_round_trips(s in ".{0,200}") {
            check_item(s);
        }
    }
}
