//! What operators' tools need beyond a service's own calls: items as their encoded bytes,
//! whatever their type ([`RawItem`]), and a way to show them ([`Decoders`]).
//!
//! The `rq` command-line tool is built on these, and a service can build an admin view of
//! its own on them that shows its item types decoded.

use std::collections::HashMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::codec::{self, RawItem};
use crate::error::{Error, Result};

impl RawItem {
    /// An item from its envelope bytes, as [`envelope`](Self::envelope) gave them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the bytes are empty or do not start with the envelope's
    /// version byte.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::RawItem;
    /// let item = RawItem::encode(&7u32)?;
    /// let again = RawItem::from_envelope(item.envelope().to_vec())?;
    /// assert_eq!(again.decode::<u32>()?, 7);
    /// assert!(RawItem::from_envelope(vec![0xff, 1]).is_err());
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn from_envelope(bytes: impl Into<Box<[u8]>>) -> Result<RawItem> {
        let bytes = bytes.into();
        if !codec::is_envelope(&bytes) {
            return Err(Error::InvalidArgument {
                argument: "bytes",
                expected: "an item envelope (version byte 1, then the item)",
            });
        }
        Ok(RawItem(bytes))
    }

    /// The item encoded as a queue of `T` would keep it.
    ///
    /// # Errors
    ///
    /// [`Error::Serialize`] if `T`'s serialization fails (the error's queue is empty).
    ///
    /// # Examples
    ///
    /// ```
    /// let item = reliable_queue::RawItem::encode(&("order", 12u64))?;
    /// assert_eq!(item.decode::<(String, u64)>()?, ("order".to_owned(), 12));
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn encode<T: Serialize + 'static>(item: &T) -> Result<RawItem> {
        codec::encode(item, usize::MAX)
            .map(RawItem)
            .map_err(|e| match e {
                codec::EncodeError::Postcard(e) => Error::serialize("", e),
                codec::EncodeError::TooLarge { size } => Error::ItemTooLarge {
                    queue: String::new(),
                    size,
                    limit: usize::MAX,
                },
            })
    }

    /// The item as a `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Deserialize`] if the bytes are not a `T` (the error's queue is empty and its
    /// item id 0).
    ///
    /// # Examples
    ///
    /// ```
    /// let item = reliable_queue::RawItem::encode(&"text".to_owned())?;
    /// assert!(item.decode::<u64>().is_err());
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn decode<T: DeserializeOwned + 'static>(&self) -> Result<T> {
        codec::decode(&self.0).map_err(|e| Error::Deserialize {
            queue: String::new(),
            item_id: 0,
            source: std::sync::Arc::new(e),
        })
    }

    /// The item's text when it looks like a string or byte string of UTF-8 text (a length,
    /// then exactly that many bytes, none of them a control character but tab, line feed and
    /// carriage return), else `None`.
    ///
    /// A guess: other types can encode to the same bytes (a struct of two small integers
    /// `{ 1, 4 }` is a one-byte string `"\u{4}"` by shape, which the control-character rule
    /// turns away; `{ 1, 65 }` would still read as `"A"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::RawItem;
    /// assert_eq!(RawItem::encode(&"hello".to_owned())?.text(), Some("hello"));
    /// assert_eq!(RawItem::encode(&b"bytes too".to_vec())?.text(), Some("bytes too"));
    /// assert_eq!(RawItem::encode(&(1u32, 4u64))?.text(), None);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn text(&self) -> Option<&str> {
        codec::as_text(&self.0).filter(|text| {
            !text
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        })
    }

    /// The item's bytes after the envelope's version byte, in lowercase hex.
    pub fn hex(&self) -> String {
        let body = self.0.get(1..).unwrap_or_default();
        let mut out = String::with_capacity(body.len() * 2);
        for b in body {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        out
    }

    /// [`text`](Self::text) if the item looks like text, else [`hex`](Self::hex) with a
    /// `0x` prefix.
    pub fn display(&self) -> String {
        match self.text() {
            Some(text) => text.to_owned(),
            None => format!("0x{}", self.hex()),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for RawItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawItem").field(&self.display()).finish()
    }
}

// The queue's bound asks for serde; the codec never calls these for a `RawItem` (it copies
// the envelope), but a `RawItem` nested in another type goes through them as bytes.
impl Serialize for RawItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for RawItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let bytes = <Vec<u8>>::deserialize(deserializer)?;
        RawItem::from_envelope(bytes).map_err(serde::de::Error::custom)
    }
}

/// How to show one queue's items.
type Show = Box<dyn Fn(&RawItem) -> Option<String> + Send + Sync>;

/// Shows raw items decoded as their queues' types, for an admin view built into a service.
///
/// The store does not know its items' types; the service does. Register each queue's type
/// with [`with`](Self::with) and [`show`](Self::show) prints items of that queue with their
/// `Debug` form; other queues' items, and items that do not decode, fall back to
/// [`RawItem::display`].
///
/// # Examples
///
/// ```
/// use reliable_queue::{Decoders, RawItem};
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// struct Order { id: u64, sku: String }
///
/// let decoders = Decoders::new().with::<Order>("orders");
/// let raw = RawItem::encode(&Order { id: 7, sku: "A-1".into() })?;
/// assert_eq!(decoders.show("orders", &raw), r#"Order { id: 7, sku: "A-1" }"#);
/// let text = RawItem::encode(&"hello".to_owned())?;
/// assert_eq!(decoders.show("mail", &text), "hello");
/// # Ok::<(), reliable_queue::Error>(())
/// ```
#[derive(Default)]
pub struct Decoders {
    by_queue: HashMap<String, Show>,
}

impl Decoders {
    /// No queue registered: every item shown by [`RawItem::display`].
    pub fn new() -> Self {
        Decoders::default()
    }

    /// Shows the items of `queue` as `T`s.
    pub fn with<T: DeserializeOwned + fmt::Debug + 'static>(mut self, queue: &str) -> Self {
        self.by_queue.insert(
            queue.to_owned(),
            Box::new(|raw: &RawItem| raw.decode::<T>().ok().map(|item| format!("{item:?}"))),
        );
        self
    }

    /// Shows the items of `queue` with `show` (`None`: not one of its items).
    pub fn with_fn(
        mut self,
        queue: &str,
        show: impl Fn(&RawItem) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.by_queue.insert(queue.to_owned(), Box::new(show));
        self
    }

    /// `item` of `queue` as text.
    pub fn show(&self, queue: &str, item: &RawItem) -> String {
        self.by_queue
            .get(queue)
            .and_then(|show| show(item))
            .unwrap_or_else(|| item.display())
    }
}

impl fmt::Debug for Decoders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut queues: Vec<&String> = self.by_queue.keys().collect();
        queues.sort();
        f.debug_struct("Decoders").field("queues", &queues).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_hex_guesses() {
        let text = RawItem::encode(&"héllo".to_owned()).unwrap();
        assert_eq!(text.text(), Some("héllo"));
        let bytes = RawItem::encode(&vec![0xffu8, 0]).unwrap();
        assert_eq!(bytes.text(), None);
        assert_eq!(bytes.display(), "0x02ff00");
        let number = RawItem::encode(&300u32).unwrap();
        assert_eq!(number.display(), "0xac02");
        let empty = RawItem::encode(&String::new()).unwrap();
        assert_eq!(empty.text(), Some(""));
        // A struct { producer: 1, seq: 4 } has the shape of a one-byte string "\u{4}".
        let pair = RawItem::encode(&(1u32, 4u64)).unwrap();
        assert_eq!((pair.text(), pair.display().as_str()), (None, "0x0104"));
        let lines = RawItem::encode(&"a\tb\r\nc".to_owned()).unwrap();
        assert_eq!(lines.text(), Some("a\tb\r\nc"));
        let bell = RawItem::encode(&"ding\u{7}".to_owned()).unwrap();
        assert_eq!(bell.text(), None);
    }

    #[test]
    fn bad_envelopes_are_refused_not_panicked_on() {
        for bytes in [vec![], vec![0u8], vec![2u8, 1, 2]] {
            assert!(matches!(
                RawItem::from_envelope(bytes),
                Err(Error::InvalidArgument { .. })
            ));
        }
        let odd = RawItem::from_envelope(vec![1u8, 0x80]).unwrap();
        assert_eq!(odd.text(), None);
        assert!(odd.decode::<String>().is_err());
    }

    #[test]
    fn an_envelope_over_the_item_limit_is_a_typed_error_and_stays_with_the_caller() {
        let store = crate::Store::builder().max_item_size(16).open().unwrap();
        let raw = store.blocking_queue::<RawItem>("q").unwrap();
        let big = RawItem::encode(&"x".repeat(100)).unwrap();
        let mut tx = store.begin();
        match raw.enqueue(&mut tx, &big) {
            Err(Error::ItemTooLarge { size, limit, .. }) => {
                assert_eq!((size, limit), (big.envelope().len(), 16));
            }
            other => panic!("expected ItemTooLarge, got {other:?}"),
        }
        let small = RawItem::encode(&"ok".to_owned()).unwrap();
        raw.enqueue(&mut tx, &small).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        let back = raw.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        assert_eq!(back.envelope(), small.envelope(), "moved verbatim");
    }

    #[test]
    fn a_raw_item_inside_another_type_goes_through_serde_as_bytes() {
        let inner = RawItem::encode(&"inner".to_owned()).unwrap();
        let outer = RawItem::encode(&("label".to_owned(), inner.clone())).unwrap();
        let (label, back) = outer.decode::<(String, RawItem)>().unwrap();
        assert_eq!((label.as_str(), back), ("label", inner));
        // Bytes that are not an envelope inside: a decode error, not a panic.
        let bad = RawItem::encode(&("label".to_owned(), vec![9u8, 9])).unwrap();
        assert!(matches!(
            bad.decode::<(String, RawItem)>(),
            Err(Error::Deserialize { .. })
        ));
    }

    #[test]
    fn decoders_fall_back_to_the_guess_when_an_item_is_not_the_registered_type() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)] // read through Debug only
        struct Pair(u8, u8);
        let decoders = Decoders::new()
            .with::<Pair>("pairs")
            .with_fn("custom", |raw| {
                Some(format!("{} bytes", raw.envelope().len()))
            });
        let pair = RawItem::encode(&(1u8, 2u8)).unwrap();
        assert_eq!(decoders.show("pairs", &pair), "Pair(1, 2)");
        let text = RawItem::encode(&"free text".to_owned()).unwrap();
        // Not a Pair (trailing bytes are not checked by postcard, so pick one that fails).
        let short = RawItem::from_envelope(vec![1u8, 7]).unwrap();
        assert_eq!(decoders.show("pairs", &short), "0x07");
        assert_eq!(decoders.show("custom", &text), "11 bytes");
        assert_eq!(decoders.show("other", &text), "free text");
        assert_eq!(
            format!("{decoders:?}"),
            r#"Decoders { queues: ["custom", "pairs"] }"#
        );
    }

    #[test]
    fn a_raw_queue_moves_envelopes_unchanged_between_typed_queues() {
        let store = crate::Store::in_memory().unwrap();
        let typed = store.blocking_queue::<(u8, String)>("t").unwrap();
        let raw = store.blocking_queue::<RawItem>("t").unwrap();
        let copy = store.blocking_queue::<RawItem>("copy").unwrap();
        let mut tx = store.begin();
        typed.enqueue(&mut tx, (1, "one".to_owned())).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        let item = raw.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        copy.enqueue(&mut tx, &item).unwrap();
        tx.blocking_commit().unwrap();
        let typed_copy = store.blocking_queue::<(u8, String)>("copy").unwrap();
        let mut tx = store.begin();
        assert_eq!(
            typed_copy.blocking_try_dequeue(&mut tx).unwrap(),
            Some((1, "one".to_owned()))
        );
    }
}
