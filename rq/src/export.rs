//! `rq export` and `rq import`: a store's queues, items and dead letters as JSON lines.
//!
//! The file: a `header` line (format, version, a fresh source id, the engine, the time),
//! then per queue a `queue` line (its retry policy), its `item` lines and its `dead` lines,
//! and an `end` line with the counts. Items are their envelope bytes in base64, so the file
//! is independent of the items' types. An import refuses a file without its `end` line (an
//! export cut short).
//!
//! An import writes in transactions of at most `--batch` lines; each transaction also
//! replaces the one item of the queue `rq.import.<source>` with the number of lines taken so
//! far, so a second run (after a crash, or of a finished import) starts where the last
//! commit left off: no item is imported twice or lost.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use reliable_queue::{
    ImportedItem, ItemState, RawItem, ReliableConcurrentQueue, RetryPolicy, Store,
};
use serde::{Deserialize, Serialize};

use crate::{millis, progress, Res};

/// The `format` of a header line.
const FORMAT: &str = "reliable-queue-export";
/// The file format version this build writes and reads.
const VERSION: u32 = 1;
/// Bytes of items per import transaction, at most (roughly).
const BATCH_BYTES: usize = 8 << 20;
/// Queues whose names start so are import bookkeeping: not exported.
pub(crate) const MARKER_PREFIX: &str = "rq.import.";
/// Items per browse page.
const PAGE: usize = 1000;

/// One line of an export file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Line {
    Header {
        format: String,
        version: u32,
        source: String,
        engine: String,
        created_ms: u64,
    },
    Queue {
        name: String,
        policy: RetryPolicy,
    },
    Item {
        queue: String,
        state: String,
        /// The item's envelope, base64.
        bytes: String,
        attempts: u32,
        due_ms: Option<u64>,
        enqueued_ms: Option<u64>,
    },
    Dead {
        queue: String,
        bytes: String,
        reason: String,
        attempts: u32,
        enqueued_ms: Option<u64>,
        first_attempt_ms: Option<u64>,
        last_attempt_ms: Option<u64>,
    },
    End {
        source: String,
        queues: u64,
        items: u64,
        dead: u64,
    },
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Res<Vec<u8>> {
    Ok(base64::engine::general_purpose::STANDARD.decode(text)?)
}

fn time_of(ms: Option<u64>) -> Option<SystemTime> {
    ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// For the import: queues by name, opened once.
struct Queues<'a> {
    store: &'a Store,
    open: HashMap<String, ReliableConcurrentQueue<RawItem>>,
}

impl Queues<'_> {
    fn get(&mut self, name: &str) -> Res<&ReliableConcurrentQueue<RawItem>> {
        if !self.open.contains_key(name) {
            let q = self.store.blocking_queue::<RawItem>(name)?;
            self.open.insert(name.to_owned(), q);
        }
        Ok(&self.open[name])
    }
}

/// A writer that flushes, syncs and renames into place only when finished.
struct AtomicFile {
    tmp: PathBuf,
    dest: PathBuf,
    out: BufWriter<File>,
}

impl AtomicFile {
    fn create(dest: &Path) -> Res<AtomicFile> {
        let mut name = dest.file_name().unwrap_or_default().to_os_string();
        name.push(".partial");
        let tmp = dest.with_file_name(name);
        Ok(AtomicFile {
            out: BufWriter::new(File::create(&tmp)?),
            tmp,
            dest: dest.to_owned(),
        })
    }

    fn line(&mut self, line: &Line) -> Res<()> {
        serde_json::to_writer(&mut self.out, line)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    fn finish(self) -> Res<()> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&self.tmp, &self.dest)?;
        Ok(())
    }
}

/// Reads an export's lines; fails on a file that is not one, or was cut short.
fn read_lines(path: &Path) -> Res<Vec<Line>> {
    let file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = Vec::new();
    for (n, text) in BufReader::new(file).lines().enumerate() {
        let text = text?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text)
            .map_err(|e| format!("{} line {}: not an export line: {e}", path.display(), n + 1))?;
        lines.push(line);
    }
    Ok(lines)
}

/// What an export or import did.
#[derive(Serialize, Debug, Default)]
pub(crate) struct Summary {
    pub(crate) source: String,
    pub(crate) queues: u64,
    pub(crate) items: u64,
    pub(crate) dead: u64,
    /// Import only: lines an earlier run of the same import had taken already.
    pub(crate) skipped: u64,
}

impl Summary {
    pub(crate) fn print(&self, json: bool, done: &str, file: &Path) {
        if json {
            match serde_json::to_string(self) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("rq: {e}"),
            }
            return;
        }
        println!(
            "{done} {} queues, {} items and {} dead letters ({}, source {})",
            self.queues,
            self.items,
            self.dead,
            file.display(),
            self.source
        );
        if self.skipped > 0 {
            println!(
                "{} lines were taken by an earlier run of this import and skipped",
                self.skipped
            );
        }
    }
}

/// A fresh id for an export: time, process and a randomly keyed hash.
fn source_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    let a = h.finish();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

/// Writes every queue of `store` (but import bookkeeping), its items and its dead letters.
pub(crate) fn export(store: &Store, engine: &str, path: &Path) -> Res<Summary> {
    let source = source_id();
    let mut out = AtomicFile::create(path)?;
    out.line(&Line::Header {
        format: FORMAT.to_owned(),
        version: VERSION,
        source: source.clone(),
        engine: engine.to_owned(),
        created_ms: millis(SystemTime::now()),
    })?;
    let names: Vec<String> = store
        .blocking_list_queues()?
        .into_iter()
        .filter(|n| !n.starts_with(MARKER_PREFIX))
        .collect();
    let mut queues = Vec::new();
    let mut total = 0;
    for name in &names {
        let q = store.blocking_queue::<RawItem>(name)?;
        let s = q.blocking_stats()?;
        total += s.visible + s.delayed + s.leased + s.held + s.dead;
        queues.push(q);
    }
    let bar = progress(total, "exporting");
    let mut summary = Summary {
        source: source.clone(),
        ..Summary::default()
    };
    for q in &queues {
        out.line(&Line::Queue {
            name: q.name().to_owned(),
            policy: q.retry_policy(),
        })?;
        summary.queues += 1;
        let mut after = None;
        loop {
            let page = q.blocking_browse(after, PAGE)?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for item in page {
                let (state, due) = match item.state {
                    ItemState::Ready => ("ready", None),
                    ItemState::Delayed { until } => ("delayed", Some(millis(until))),
                    // Its lease ends then, and with it the holder's claim.
                    ItemState::Leased { until, .. } => ("leased", Some(millis(until))),
                    _ => ("ready", None),
                };
                out.line(&Line::Item {
                    queue: q.name().to_owned(),
                    state: state.to_owned(),
                    bytes: b64(item.item.envelope()),
                    attempts: item.attempts,
                    due_ms: due,
                    enqueued_ms: item.enqueued_at.map(millis),
                })?;
                summary.items += 1;
                bar.inc(1);
            }
        }
        let mut after = None;
        loop {
            let page = q.blocking_dead_letters(after, PAGE)?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for d in page {
                out.line(&Line::Dead {
                    queue: q.name().to_owned(),
                    bytes: b64(d.item.envelope()),
                    reason: d.reason,
                    attempts: d.attempts,
                    enqueued_ms: d.enqueued_at.map(millis),
                    first_attempt_ms: d.first_attempt.map(millis),
                    last_attempt_ms: d.last_attempt.map(millis),
                })?;
                summary.dead += 1;
                bar.inc(1);
            }
        }
    }
    out.line(&Line::End {
        source,
        queues: summary.queues,
        items: summary.items,
        dead: summary.dead,
    })?;
    out.finish()?;
    bar.finish_and_clear();
    Ok(summary)
}

/// An export read back and checked whole.
#[derive(Debug)]
pub(crate) struct Export {
    source: String,
    /// Every line between the header and the end line, in order.
    body: Vec<Line>,
}

/// Reads and checks an export: its header, every line, its end line and counts.
pub(crate) fn read(path: &Path) -> Res<Export> {
    let mut lines = read_lines(path)?;
    let source = match lines.first() {
        Some(Line::Header {
            format,
            version,
            source,
            ..
        }) if format == FORMAT => {
            if *version != VERSION {
                return Err(format!(
                    "{}: export format version {version}; this rq reads version {VERSION}",
                    path.display()
                )
                .into());
            }
            source.clone()
        }
        _ => return Err(format!("{}: not an rq export (no header line)", path.display()).into()),
    };
    let Some(Line::End {
        source: end_source,
        queues,
        items,
        dead,
    }) = lines.pop()
    else {
        return Err(format!(
            "{}: the export is incomplete (no end line): export again",
            path.display()
        )
        .into());
    };
    let body: Vec<Line> = lines.drain(1..).collect();
    let count = |f: fn(&Line) -> bool| body.iter().filter(|l| f(l)).count() as u64;
    let counted = (
        count(|l| matches!(l, Line::Queue { .. })),
        count(|l| matches!(l, Line::Item { .. })),
        count(|l| matches!(l, Line::Dead { .. })),
    );
    if end_source != source
        || counted != (queues, items, dead)
        || count(|l| matches!(l, Line::Header { .. } | Line::End { .. })) > 0
    {
        return Err(format!(
            "{}: the export's lines do not match its end line: the file is damaged",
            path.display()
        )
        .into());
    }
    Ok(Export { source, body })
}

/// Imports `export` into `store`, resuming after what an earlier run took.
///
/// The queue `rq.import.<source>` holds one marker: how many lines of the export are in the
/// store. Each transaction dequeues it, takes the lines after it and enqueues the new count,
/// so the count a batch starts from is always the one its own transaction holds: a run
/// started again, or two runs at once (the second finds the marker held and stops), never
/// take a line twice. The first marker is made once: on PostgreSQL under a transaction-level
/// advisory lock on the marker queue's name (two processes could otherwise both see no
/// marker and make one each); an embedded store is open in this process only.
pub(crate) fn import(
    store: &Store,
    export: &Export,
    batch: usize,
    on_postgres: bool,
) -> Res<Summary> {
    let marker_name = format!("{MARKER_PREFIX}{}", export.source);
    let marker = store.blocking_queue::<u64>(&marker_name)?;
    {
        let mut tx = store.begin();
        if on_postgres {
            tx.blocking_execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&marker_name],
            )?;
        }
        // Counted after the lock: a marker another run made under it is committed by now.
        let s = marker.blocking_stats()?;
        if s.visible + s.delayed + s.leased + s.held == 0 {
            marker.enqueue(&mut tx, 0)?;
            tx.blocking_commit()?;
        } else {
            tx.blocking_abort()?;
        }
    }
    let mut queues = Queues {
        store,
        open: HashMap::new(),
    };
    // Policies first (idempotent), so items imported later retry by them.
    for line in &export.body {
        if let Line::Queue { name, policy } = line {
            queues.get(name)?.blocking_set_retry_policy(*policy)?;
        }
    }
    let mut summary = Summary {
        source: export.source.clone(),
        ..Summary::default()
    };
    summary.queues = export
        .body
        .iter()
        .filter(|l| matches!(l, Line::Queue { .. }))
        .count() as u64;
    let bar = progress(export.body.len() as u64, "importing");
    let mut first = true;
    loop {
        let mut tx = store.begin();
        let Some(done) = marker.blocking_try_dequeue(&mut tx)? else {
            return Err(format!(
                "another import of this export is running (queue {marker_name:?} is held): \
                 run this one again once it stopped"
            )
            .into());
        };
        let mut at = usize::try_from(done).unwrap_or(usize::MAX);
        if first {
            summary.skipped = at.min(export.body.len()) as u64;
            bar.set_position(summary.skipped);
            first = false;
        }
        if at >= export.body.len() {
            // Finished (now or by an earlier run): nothing is written.
            tx.blocking_abort()?;
            break;
        }
        let mut bytes = 0;
        let start = at;
        while at < export.body.len() && at - start < batch && bytes < BATCH_BYTES {
            match &export.body[at] {
                Line::Item {
                    queue,
                    bytes: item,
                    attempts,
                    due_ms,
                    enqueued_ms,
                    ..
                } => {
                    let raw = RawItem::from_envelope(unb64(item)?)?;
                    bytes += raw.envelope().len();
                    let meta = ImportedItem {
                        attempts: *attempts,
                        due: time_of(*due_ms),
                        enqueued_at: time_of(*enqueued_ms),
                        ..ImportedItem::default()
                    };
                    queues.get(queue)?.import(&mut tx, raw, &meta)?;
                    summary.items += 1;
                }
                Line::Dead {
                    queue,
                    bytes: item,
                    reason,
                    attempts,
                    enqueued_ms,
                    first_attempt_ms,
                    last_attempt_ms,
                } => {
                    let raw = RawItem::from_envelope(unb64(item)?)?;
                    bytes += raw.envelope().len();
                    let meta = ImportedItem {
                        attempts: *attempts,
                        enqueued_at: time_of(*enqueued_ms),
                        first_attempt: time_of(*first_attempt_ms),
                        last_attempt: time_of(*last_attempt_ms),
                        ..ImportedItem::default()
                    };
                    queues
                        .get(queue)?
                        .import_dead_letter(&mut tx, raw, &meta, reason)?;
                    summary.dead += 1;
                }
                Line::Queue { .. } | Line::Header { .. } | Line::End { .. } => {}
            }
            at += 1;
        }
        marker.enqueue(&mut tx, at as u64)?;
        tx.blocking_commit()?;
        bar.set_position(at as u64);
    }
    bar.finish_and_clear();
    Ok(summary)
}
