//! The rows the JSON API returns and the pages show: a queue's items and dead letters, read
//! through the store's `browse` and `dead_letters`, with payloads shown as the service's
//! [`Decoders`] show them. `rq --url` reads the same rows.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use reliable_queue::{
    BrowsedItem, DeadLetter, Decoders, ItemState, RawItem, ReliableConcurrentQueue,
};
use serde::{Deserialize, Serialize};

/// The largest page a request may ask for.
pub const MAX_PAGE: usize = 500;

/// The most items one request reads to find a page of items of one state, or a text.
pub const MAX_SCAN: usize = 10_000;

/// Items a filtered scan asks the store for at a time (BENCHMARKS.md §15 has the times of a
/// scan at 1,000,000 items with reads of 500, 1,000 and 10,000).
const SCAN_READ: usize = 1_000;

/// The most characters of a payload an item's page shows.
pub const MAX_SHOWN: usize = 65_536;

/// `d` for people: "850ms", "12s", "4m05s", "3h20m", "2d04h".
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// What a path segment or query value must escape: everything but `-._~` and alphanumerics.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` for a URL's path segment or query value.
pub fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// Milliseconds since the epoch (0 before it).
pub fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An item as the API and pages show it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ItemRow {
    /// Its id (a leased item's id is its lease's fencing token).
    pub id: u64,
    /// `ready`, `delayed` or `leased`.
    pub state: String,
    /// Leases granted so far.
    pub attempts: u32,
    /// When it falls due (delayed) or its lease ends (leased), ms since the epoch.
    pub until_ms: Option<u64>,
    /// When it was first enqueued, ms since the epoch.
    pub enqueued_ms: Option<u64>,
    /// The payload as the service's decoders show it.
    pub shown: String,
    /// The payload as UTF-8 text, when it is a string or bytes that are.
    pub text: Option<String>,
    /// The payload's encoded bytes, in hex.
    pub hex: String,
}

/// `state` as the API names it, and its time.
pub fn state_of(state: &ItemState) -> (&'static str, Option<SystemTime>) {
    match state {
        ItemState::Ready => ("ready", None),
        ItemState::Delayed { until } => ("delayed", Some(*until)),
        ItemState::Leased { until, .. } => ("leased", Some(*until)),
        _ => ("other", None),
    }
}

impl ItemRow {
    /// `item` of `queue`, shown by `decoders`.
    pub fn new(queue: &str, item: &BrowsedItem<RawItem>, decoders: &Decoders) -> ItemRow {
        let (state, until) = state_of(&item.state);
        ItemRow {
            id: item.id,
            state: state.to_owned(),
            attempts: item.attempts,
            until_ms: until.map(millis),
            enqueued_ms: item.enqueued_at.map(millis),
            shown: cut(decoders.show(queue, &item.item), MAX_SHOWN),
            text: item.item.text().map(|t| cut(t.to_owned(), MAX_SHOWN)),
            hex: item.item.hex(),
        }
    }
}

/// A dead letter as the API and pages show it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeadRow {
    /// Its dead-letter id.
    pub id: u64,
    /// Why it died: the last failure's reason, or "lease expired".
    pub reason: String,
    /// Leases it was granted.
    pub attempts: u32,
    /// When it was first enqueued, ms since the epoch.
    pub enqueued_ms: Option<u64>,
    /// When it was first leased, ms since the epoch.
    pub first_attempt_ms: Option<u64>,
    /// When it was last leased, ms since the epoch.
    pub last_attempt_ms: Option<u64>,
    /// The payload as the service's decoders show it.
    pub shown: String,
    /// The payload as UTF-8 text, when it is.
    pub text: Option<String>,
    /// The payload's encoded bytes, in hex.
    pub hex: String,
}

impl DeadRow {
    /// `letter` of `queue`, shown by `decoders`.
    pub fn new(queue: &str, letter: &DeadLetter<RawItem>, decoders: &Decoders) -> DeadRow {
        DeadRow {
            id: letter.id,
            reason: letter.reason.clone(),
            attempts: letter.attempts,
            enqueued_ms: letter.enqueued_at.map(millis),
            first_attempt_ms: letter.first_attempt.map(millis),
            last_attempt_ms: letter.last_attempt.map(millis),
            shown: cut(decoders.show(queue, &letter.item), MAX_SHOWN),
            text: letter.item.text().map(|t| cut(t.to_owned(), MAX_SHOWN)),
            hex: letter.item.hex(),
        }
    }
}

/// `text` in at most `width` characters, `...` marking a cut.
pub fn cut(text: String, width: usize) -> String {
    if text.chars().count() > width {
        let kept: String = text.chars().take(width.saturating_sub(3)).collect();
        format!("{kept}...")
    } else {
        text
    }
}

/// What a scan of a queue's items looks for.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// Only items in this state (`ready`, `delayed`, `leased`).
    pub state: Option<String>,
    /// Only items whose shown payload contains this text.
    pub find: Option<String>,
}

/// A page of items found by a scan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemPage {
    /// The items, in id order.
    pub items: Vec<ItemRow>,
    /// Where the next page starts (`after`), when the scan stopped before the queue's end.
    pub next_after: Option<u64>,
    /// How many items the scan read.
    pub scanned: usize,
}

/// Up to `limit` items of `q` after `after` that `filter` wants, reading at most
/// [`MAX_SCAN`] items.
pub async fn scan(
    q: &ReliableConcurrentQueue<RawItem>,
    queue: &str,
    after: Option<u64>,
    limit: usize,
    filter: &Filter,
    decoders: &Decoders,
) -> reliable_queue::Result<ItemPage> {
    let limit = limit.clamp(1, MAX_PAGE);
    let mut items = Vec::new();
    let mut after = after;
    let mut scanned = 0;
    let mut more = true;
    while items.len() < limit && scanned < MAX_SCAN {
        // Unfiltered: the page itself. Filtered: reads of `SCAN_READ` items (on the embedded
        // engines each read is a pass over the queue, so fewer is cheaper; on PostgreSQL a
        // read of thousands of rows is planned as a sort of the whole queue, so not too few).
        let want = if filter.state.is_none() && filter.find.is_none() {
            limit - items.len()
        } else {
            SCAN_READ.min(MAX_SCAN - scanned)
        };
        let page = q.browse(after, want).await?;
        if page.len() < want {
            more = false;
        }
        for item in &page {
            scanned += 1;
            after = Some(item.id);
            let row = ItemRow::new(queue, item, decoders);
            let state_ok = filter.state.as_deref().is_none_or(|s| s == row.state);
            let text_ok = filter.find.as_deref().is_none_or(|f| {
                row.shown.contains(f) || row.text.as_deref().is_some_and(|t| t.contains(f))
            });
            if state_ok && text_ok {
                items.push(row);
                if items.len() == limit {
                    break;
                }
            }
        }
        if !more {
            break;
        }
    }
    let stopped_early = items.len() == limit || scanned >= MAX_SCAN;
    Ok(ItemPage {
        items,
        next_after: if more || stopped_early { after } else { None },
        scanned,
    })
}

/// The item `id` of `q`, if it is there.
pub async fn item(
    q: &ReliableConcurrentQueue<RawItem>,
    queue: &str,
    id: u64,
    decoders: &Decoders,
) -> reliable_queue::Result<Option<ItemRow>> {
    let page = q.browse(id.checked_sub(1), 1).await?;
    Ok(page
        .first()
        .filter(|i| i.id == id)
        .map(|i| ItemRow::new(queue, i, decoders)))
}
