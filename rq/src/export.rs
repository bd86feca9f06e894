//! `rq export` and `rq import`: a store's queues, items and dead letters as JSON lines.
//!
//! The file: a `header` line (format, version, a fresh source id, the engine, the time),
//! then per queue a `queue` line (its retry policy), its `item` lines and its `dead` lines,
//! and an `end` line with the counts. Items are their envelope bytes in base64, so the file
//! is independent of the items' types.
//!
//! An import checks the whole file before it writes anything: every line must parse, every
//! item's bytes must be base64 of an item envelope, every queue name and item must be one the
//! store takes (checked on an in-memory store with the same limits), and the end line must be
//! there (an export cut short is refused) with the right counts. A refusal names each bad line
//! by its number and what is wrong with it.
//!
//! It then writes in transactions of at most `--batch` lines; each transaction also replaces
//! the one item of the queue `rq.import.<source>` with the number of lines taken so far and
//! the SHA-256 of those lines, so a second run (after a crash, or of a finished import) starts
//! where the last commit left off: no item is imported twice or lost. A file with the same
//! source id whose first lines are not the ones taken is refused (see [`import`]).
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use reliable_queue::{
    Enqueued, Error, ImportedItem, ItemState, RawItem, ReliableConcurrentQueue, RetryPolicy, Store,
    Transaction,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::common::{millis, printable, progress, Res, ITEM_LIMIT};

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
/// The deduplication key of every mark of an import into a Redis store (see [`import`]).
const MARK_KEY: &[u8] = b"rq.import.mark";

/// The engine of the store an import writes to, which decides how its first mark is made
/// only once (see [`import`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// An embedded store: open in this process only.
    Sled,
    /// PostgreSQL: the first mark is made under an advisory lock.
    Postgres,
    /// Redis: every mark is enqueued with the deduplication key [`MARK_KEY`].
    Redis,
}

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

fn time_of(ms: Option<u64>) -> Option<SystemTime> {
    ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// For the import: queues by name, opened once.
struct Queues<'a> {
    store: &'a Store,
    open: HashMap<String, ReliableConcurrentQueue<RawItem>>,
}

impl Queues<'_> {
    fn get(&mut self, name: &str) -> reliable_queue::Result<&ReliableConcurrentQueue<RawItem>> {
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
            printable(&self.source)
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

/// Why an import stopped. Each says what was written: nothing, or the lines before a point.
#[derive(Debug)]
pub(crate) enum ImportError {
    /// The file cannot be read.
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not a whole, well-formed export; nothing was imported. `problems`: the
    /// first few bad lines (a line number, or none for the file as a whole) and what is wrong
    /// with each; `more` bad lines were not listed.
    BadFile {
        path: PathBuf,
        problems: Vec<(Option<usize>, String)>,
        more: usize,
    },
    /// The store's record of this source id is of another file: its first `taken` lines
    /// were not this file's.
    OtherFile {
        path: PathBuf,
        marker: String,
        taken: u64,
    },
    /// The store's record of this source id is not one this rq reads.
    UnreadableRecord { marker: String, error: Box<Error> },
    /// Another run of this import holds the record.
    Busy { marker: String },
    /// A line checked before the import began does not parse now (rq's own fault); the
    /// lines before `from` are in the store.
    Line {
        path: PathBuf,
        from: usize,
        line: usize,
        problem: String,
    },
    /// The store refused a write or a commit; the lines before `from` are in the store
    /// (`None`: before the import knew how far an earlier run got).
    Store {
        path: PathBuf,
        /// The first line (of the file) not yet in the store.
        from: Option<usize>,
        /// The line being written when it failed, if the failure was one line's.
        line: Option<usize>,
        error: Box<Error>,
    },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::Read { path, error } => {
                write!(f, "cannot read {}: {error}", path.display())
            }
            ImportError::BadFile {
                path,
                problems,
                more,
            } => {
                write!(f, "{}: nothing was imported:", path.display())?;
                for (line, problem) in problems {
                    match line {
                        Some(n) => write!(f, "\n  line {n}: {problem}")?,
                        None => write!(f, "\n  {problem}")?,
                    }
                }
                if *more > 0 {
                    write!(f, "\n  and {more} more bad lines")?;
                }
                Ok(())
            }
            ImportError::OtherFile {
                path,
                marker,
                taken,
            } => write!(
                f,
                "{}: this store has taken {taken} lines of a different file with the same \
                 source id (its record is queue {marker:?}): the first {taken} lines of this \
                 file are not those; nothing was imported. To finish that import, run it with \
                 the file it began with; to import this file as well, give it a source id of \
                 its own (export it again, or change `source` in its header and end lines)",
                path.display()
            ),
            ImportError::UnreadableRecord { marker, error } => write!(
                f,
                "queue {marker:?} holds an import record this rq cannot read (an earlier rq \
                 wrote it without a digest of the file, or it is damaged): {error}; nothing \
                 was imported. Finish that import with the rq that began it, or give this file \
                 a source id of its own (export it again, or change `source` in its header and \
                 end lines)"
            ),
            ImportError::Busy { marker } => write!(
                f,
                "another import of this export is running (queue {marker:?} is held): run \
                 this one again once it stopped"
            ),
            ImportError::Line {
                path,
                from,
                line,
                problem,
            } => write!(
                f,
                "{} line {line}: {problem}; the lines before line {from} are in the store",
                path.display()
            ),
            ImportError::Store {
                path,
                from,
                line,
                error,
            } => {
                write!(f, "{}", path.display())?;
                if let Some(n) = line {
                    write!(f, " line {n}")?;
                }
                match from {
                    Some(from) => write!(
                        f,
                        ": {error}; the lines before line {from} are in the store: run the \
                         import again to take the rest"
                    ),
                    None => write!(
                        f,
                        ": {error}; run the import again: it starts where the last commit left \
                         off"
                    ),
                }
            }
        }
    }
}

impl std::error::Error for ImportError {}

/// Bad lines listed in an [`ImportError::BadFile`], at most.
const LISTED: usize = 10;

/// One non-blank line of an export's body.
#[derive(Debug)]
struct BodyLine {
    /// Its line number in the file, from 1.
    number: usize,
    /// The line as rq writes it: parsed and written back compactly, its fields in a fixed
    /// order (what the digest of a resume point is taken over, so a file re-formatted but
    /// not changed still resumes).
    text: String,
}

/// An export read back and checked whole: every line of it is one the import can write.
#[derive(Debug)]
pub(crate) struct Export {
    path: PathBuf,
    source: String,
    /// Every line between the header and the end line, in order.
    body: Vec<BodyLine>,
    queues: u64,
}

/// A body line parsed and decoded: what the import writes for it.
enum Entry {
    Queue {
        name: String,
        policy: RetryPolicy,
    },
    Item {
        queue: String,
        raw: RawItem,
        meta: ImportedItem,
    },
    Dead {
        queue: String,
        raw: RawItem,
        meta: ImportedItem,
        reason: String,
    },
}

/// An item's bytes: base64 of an item envelope.
fn envelope(queue: &str, what: &str, bytes: &str) -> Result<RawItem, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(bytes)
        .map_err(|e| format!("{what} of queue {queue:?}: its bytes are not base64 ({e})"))?;
    RawItem::from_envelope(bytes)
        .map_err(|e| format!("{what} of queue {queue:?}: its bytes are not an item envelope ({e})"))
}

/// A queue name the file may use: not one of the import's own, and (on PostgreSQL, whose
/// text cannot hold it) without NUL. The store's own rules are checked by [`Checker`].
fn name_allowed(name: &str, on_postgres: bool) -> Result<(), String> {
    if name.starts_with(MARKER_PREFIX) {
        return Err(format!(
            "queue name {name:?} is reserved for import bookkeeping ({MARKER_PREFIX}*)"
        ));
    }
    if on_postgres && name.contains('\0') {
        return Err(format!(
            "queue name {name:?} holds a NUL character, which PostgreSQL cannot store"
        ));
    }
    Ok(())
}

/// Parses one line of the file.
fn parse(text: &str) -> Result<Line, String> {
    serde_json::from_str(text).map_err(|e| format!("not an export line: {e}"))
}

/// Decodes one body line (checking what can be checked without a store).
fn entry(line: Line, on_postgres: bool) -> Result<Entry, String> {
    let entry = match line {
        Line::Header { .. } => return Err("a second header line".to_owned()),
        Line::End { .. } => return Err("an end line before the last line".to_owned()),
        Line::Queue { name, policy } => {
            name_allowed(&name, on_postgres)?;
            Entry::Queue { name, policy }
        }
        Line::Item {
            queue,
            state,
            bytes,
            attempts,
            due_ms,
            enqueued_ms,
        } => {
            name_allowed(&queue, on_postgres)?;
            if !matches!(state.as_str(), "ready" | "delayed" | "leased") {
                return Err(format!(
                    "item of queue {queue:?}: state {state:?} is none of ready, delayed, leased"
                ));
            }
            Entry::Item {
                raw: envelope(&queue, "item", &bytes)?,
                meta: ImportedItem {
                    attempts,
                    due: time_of(due_ms),
                    enqueued_at: time_of(enqueued_ms),
                    ..ImportedItem::default()
                },
                queue,
            }
        }
        Line::Dead {
            queue,
            bytes,
            reason,
            attempts,
            enqueued_ms,
            first_attempt_ms,
            last_attempt_ms,
        } => {
            name_allowed(&queue, on_postgres)?;
            if on_postgres && reason.contains('\0') {
                return Err(format!(
                    "dead letter of queue {queue:?}: its reason holds a NUL character, which \
                     PostgreSQL cannot store"
                ));
            }
            Entry::Dead {
                raw: envelope(&queue, "dead letter", &bytes)?,
                meta: ImportedItem {
                    attempts,
                    enqueued_at: time_of(enqueued_ms),
                    first_attempt: time_of(first_attempt_ms),
                    last_attempt: time_of(last_attempt_ms),
                    ..ImportedItem::default()
                },
                queue,
                reason,
            }
        }
    };
    Ok(entry)
}

/// Checks entries against the store's own rules (queue names, item sizes, times) by
/// writing them to an in-memory store with the limits rq opens stores with, and never
/// committing.
struct Checker {
    store: Store,
    queues: HashMap<String, ReliableConcurrentQueue<RawItem>>,
}

impl Checker {
    fn new() -> Res<Checker> {
        Ok(Checker {
            store: Store::builder().max_item_size(ITEM_LIMIT).open()?,
            queues: HashMap::new(),
        })
    }

    fn check(&mut self, entry: &Entry) -> Result<(), String> {
        let name = match entry {
            Entry::Queue { name, .. } | Entry::Item { queue: name, .. } => name,
            Entry::Dead { queue, .. } => queue,
        };
        if !self.queues.contains_key(name) {
            let q = self
                .store
                .blocking_queue::<RawItem>(name)
                .map_err(|e| e.to_string())?;
            self.queues.insert(name.clone(), q);
        }
        let q = &self.queues[name];
        let mut tx = self.store.begin();
        let checked = match entry {
            Entry::Queue { .. } => Ok(()),
            Entry::Item { raw, meta, .. } => q.import(&mut tx, raw, meta),
            Entry::Dead {
                raw, meta, reason, ..
            } => q.import_dead_letter(&mut tx, raw, meta, reason),
        };
        drop(tx);
        checked.map_err(|e| e.to_string())
    }
}

/// Reads and checks an export whole, before anything is written: its header, every line
/// (as the import will write it), its end line and counts. `on_postgres`: the import is
/// into a PostgreSQL store, which cannot hold NUL in text.
pub(crate) fn read(path: &Path, on_postgres: bool) -> Result<Export, ImportError> {
    let read_error = |error| ImportError::Read {
        path: path.to_owned(),
        error,
    };
    let file = File::open(path).map_err(read_error)?;
    let mut lines = Vec::new();
    for (n, text) in BufReader::new(file).lines().enumerate() {
        let text = text.map_err(read_error)?;
        if !text.trim().is_empty() {
            lines.push(BodyLine {
                number: n + 1,
                text,
            });
        }
    }
    let bad = |problems: Vec<(Option<usize>, String)>, more| ImportError::BadFile {
        path: path.to_owned(),
        problems,
        more,
    };
    let whole = |problem: String| bad(vec![(None, problem)], 0);
    let mut lines = lines.into_iter();
    let Some(first) = lines.next() else {
        return Err(whole("an empty file, not an rq export".to_owned()));
    };
    let source = match serde_json::from_str::<Line>(&first.text) {
        Ok(Line::Header {
            format,
            version,
            source,
            ..
        }) if format == FORMAT => {
            if version != VERSION {
                return Err(whole(format!(
                    "export format version {version}; this rq reads version {VERSION}"
                )));
            }
            source
        }
        _ => return Err(whole("not an rq export (no header line)".to_owned())),
    };
    let marker = format!("{MARKER_PREFIX}{source}");
    let mut body: Vec<BodyLine> = lines.collect();
    let end = body
        .pop()
        .map(|last| (serde_json::from_str::<Line>(&last.text), last));
    let (end_source, counts) = match end {
        Some((
            Ok(Line::End {
                source,
                queues,
                items,
                dead,
            }),
            _,
        )) => (source, (queues, items, dead)),
        _ => {
            return Err(whole(
                "the export is incomplete (no end line): export again".to_owned(),
            ))
        }
    };
    let mut problems = Vec::new();
    let mut more = 0;
    let mut note = |line: Option<usize>, problem: String| {
        if problems.len() < LISTED {
            problems.push((line, problem));
        } else {
            more += 1;
        }
    };
    if end_source != source {
        note(
            None,
            "the end line's source id is not the header's: the file is damaged".to_owned(),
        );
    }
    let mut checker = Checker::new().map_err(|e| whole(format!("cannot check the file: {e}")))?;
    if let Err(e) = checker.check(&Entry::Queue {
        name: marker,
        policy: RetryPolicy::default(),
    }) {
        note(
            Some(first.number),
            format!("the source id cannot name a queue: {e}"),
        );
    } else if on_postgres && source.contains('\0') {
        note(
            Some(first.number),
            "the source id holds a NUL character, which PostgreSQL cannot store".to_owned(),
        );
    }
    let bar = progress(body.len() as u64, "checking");
    let mut counted = (0, 0, 0);
    let mut bad_lines = 0;
    for line in &mut body {
        let checked = parse(&line.text).and_then(|parsed| {
            let canonical = serde_json::to_string(&parsed).map_err(|e| e.to_string())?;
            Ok((canonical, entry(parsed, on_postgres)?))
        });
        match checked {
            Ok((canonical, e)) => {
                line.text = canonical;
                match e {
                    Entry::Queue { .. } => counted.0 += 1,
                    Entry::Item { .. } => counted.1 += 1,
                    Entry::Dead { .. } => counted.2 += 1,
                }
                if let Err(problem) = checker.check(&e) {
                    bad_lines += 1;
                    note(Some(line.number), problem);
                }
            }
            Err(problem) => {
                bad_lines += 1;
                note(Some(line.number), problem);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Counted only over a file whose lines are all good: otherwise the bad lines say more.
    if bad_lines == 0 && counted != counts {
        note(
            None,
            format!(
                "the end line counts {} queues, {} items and {} dead letters, the file has \
                 {}, {} and {}: the file is damaged",
                counts.0, counts.1, counts.2, counted.0, counted.1, counted.2
            ),
        );
    }
    if !problems.is_empty() {
        return Err(bad(problems, more));
    }
    Ok(Export {
        path: path.to_owned(),
        source,
        body,
        queues: counted.0,
    })
}

/// The record of how far an import got, the one item of its marker queue: how many lines
/// of the body are in the store, and the SHA-256 of those lines (each as rq writes it, see
/// [`BodyLine::text`], and a newline), which binds the count to the content it counts.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    lines: u64,
    sha256: [u8; 32],
}

/// SHA-256 of the first lines of a body, computed forward as the import goes.
struct Prefix<'a> {
    body: &'a [BodyLine],
    at: usize,
    hash: Sha256,
}

impl<'a> Prefix<'a> {
    fn new(body: &'a [BodyLine]) -> Self {
        Prefix {
            body,
            at: 0,
            hash: Sha256::new(),
        }
    }

    /// The digest of the first `n` lines; `None` when the body is shorter.
    fn digest(&mut self, n: usize) -> Option<[u8; 32]> {
        if n > self.body.len() {
            return None;
        }
        if n < self.at {
            *self = Prefix::new(self.body);
        }
        for line in &self.body[self.at..n] {
            self.hash.update(line.text.as_bytes());
            self.hash.update(b"\n");
        }
        self.at = n;
        Some(self.hash.clone().finalize().into())
    }
}

/// Imports `export` into `store`, resuming after what an earlier run took.
///
/// The queue `rq.import.<source>` holds one [`Mark`]: how many lines of the export are in
/// the store, and their digest. Each transaction dequeues it, checks that those lines are
/// this file's first lines, takes the lines after them and enqueues the new mark, so the
/// count a batch starts from is always the one its own transaction holds: a run started
/// again, or two runs at once (the second finds the mark held and stops), never take a line
/// twice; and a different file that carries the same source id (edited, or made by hand) is
/// refused instead of having its first lines skipped.
///
/// That holds while the queue has one mark, so the first mark, made when the queue has
/// none, is made once even when two processes both count none:
///
/// - PostgreSQL: under a transaction-level advisory lock on the marker queue's name, so the
///   second counts the first's mark, committed by then.
/// - Redis, which runs no lock or command of ours inside a transaction: every mark, the
///   first and each batch's, is enqueued with one deduplication key, [`MARK_KEY`]. The
///   server keeps a key while its item is in the queue, held by a transaction included, and
///   frees it only when a commit consumes the item; and a commit consumes what it holds
///   before it writes its enqueues, in one script. So a batch's commit hands the key from the
///   old mark to the new one at once, the key is taken from the first mark on, and a second
///   first mark commits as a no-op. (A mark an earlier rq wrote without the key is counted,
///   so none is made beside it; the first batch replaces it with a keyed one.)
/// - sled: the store is open in this process only. Keyed marks would be wrong there: an
///   embedded store keeps the key of an item a transaction holds reserved until that
///   dequeue commits, so the next mark's keyed enqueue in the same transaction would be a
///   no-op, and the batch would commit without a mark.
///
/// PostgreSQL keeps the lock: keyed marks would hold there too (a dequeue deletes the row
/// inside its transaction, and another process's keyed insert waits for that transaction),
/// but the lock needs no key on marks that earlier runs wrote, and costs no such waits.
pub(crate) fn import(
    store: &Store,
    export: &Export,
    batch: usize,
    target: Target,
) -> Result<Summary, ImportError> {
    let on_postgres = target == Target::Postgres;
    let marker_name = format!("{MARKER_PREFIX}{}", export.source);
    let mut prefix = Prefix::new(&export.body);
    let failed = |from: Option<usize>, line: Option<usize>| {
        move |error: Error| ImportError::Store {
            path: export.path.clone(),
            from,
            line,
            error: Box::new(error),
        }
    };
    let marker = store
        .blocking_queue::<Mark>(&marker_name)
        .map_err(failed(None, None))?;
    {
        let mut tx = store.begin();
        if on_postgres {
            tx.blocking_execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&marker_name],
            )
            .map_err(failed(None, None))?;
        }
        // Counted after the lock: a mark another run made under it is committed by now.
        let s = marker.blocking_stats().map_err(failed(None, None))?;
        if s.visible + s.delayed + s.leased + s.held == 0 {
            let empty = Mark {
                lines: 0,
                sha256: prefix.digest(0).unwrap_or_default(),
            };
            // On Redis a key taken already (by another run's first mark, committed or not)
            // makes this a no-op: at the latest at the commit.
            put_mark(&marker, &mut tx, empty, target).map_err(failed(None, None))?;
            tx.blocking_commit().map_err(failed(None, None))?;
        } else {
            tx.blocking_abort().map_err(failed(None, None))?;
        }
    }
    // The mark, looked at (taken and given back): a file that is not the one it counts is
    // refused before anything is written.
    let (taken, tx) = take_mark(store, &marker, &marker_name, export, &mut prefix)?;
    tx.blocking_abort().map_err(failed(None, None))?;
    let mut queues = Queues {
        store,
        open: HashMap::new(),
    };
    // Policies of the queues still to come first (idempotent), so items imported later retry
    // by them; those of lines taken were set by the run that took them.
    let resume_at = export.body.get(taken).map(|l| l.number);
    for line in &export.body[taken..] {
        if let Ok(Entry::Queue { name, policy }) =
            parse(&line.text).and_then(|l| entry(l, on_postgres))
        {
            let on_line = failed(resume_at, Some(line.number));
            queues
                .get(&name)
                .and_then(|q| q.blocking_set_retry_policy(policy))
                .map_err(on_line)?;
        }
    }
    let mut summary = Summary {
        source: export.source.clone(),
        queues: export.queues,
        skipped: taken as u64,
        ..Summary::default()
    };
    let bar = progress(export.body.len() as u64, "importing");
    bar.set_position(taken as u64);
    loop {
        // Taken again in each batch's own transaction: another run may have moved it.
        let (taken, mut tx) = take_mark(store, &marker, &marker_name, export, &mut prefix)?;
        if taken == export.body.len() {
            // Finished (now or by an earlier run): nothing is written.
            tx.blocking_abort().map_err(failed(None, None))?;
            break;
        }
        let from = export.body[taken].number;
        let mut at = taken;
        let mut bytes = 0;
        while at < export.body.len() && at - taken < batch && bytes < BATCH_BYTES {
            let line = &export.body[at];
            let on_line = failed(Some(from), Some(line.number));
            // Checked by `read`: a line that fails now fails as it did there.
            let parsed = parse(&line.text).and_then(|l| entry(l, on_postgres));
            let e = parsed.map_err(|problem| ImportError::Line {
                path: export.path.clone(),
                from,
                line: line.number,
                problem,
            })?;
            match e {
                Entry::Queue { .. } => {}
                Entry::Item { queue, raw, meta } => {
                    bytes += raw.envelope().len();
                    queues
                        .get(&queue)
                        .and_then(|q| q.import(&mut tx, raw, &meta))
                        .map_err(on_line)?;
                    summary.items += 1;
                }
                Entry::Dead {
                    queue,
                    raw,
                    meta,
                    reason,
                } => {
                    bytes += raw.envelope().len();
                    queues
                        .get(&queue)
                        .and_then(|q| q.import_dead_letter(&mut tx, raw, &meta, &reason))
                        .map_err(on_line)?;
                    summary.dead += 1;
                }
            }
            at += 1;
        }
        let next = Mark {
            lines: at as u64,
            sha256: prefix.digest(at).unwrap_or_default(),
        };
        let put = put_mark(&marker, &mut tx, next, target).map_err(failed(Some(from), None))?;
        if !put {
            // The key is reserved by another open transaction of this process: never in rq,
            // which opens one at a time. Committed, this batch would leave no mark.
            let _ = tx.blocking_abort();
            return Err(ImportError::Busy {
                marker: marker_name,
            });
        }
        tx.blocking_commit().map_err(failed(Some(from), None))?;
        bar.set_position(at as u64);
    }
    bar.finish_and_clear();
    Ok(summary)
}

/// Buffers `mark` in `tx`: on Redis with the key [`MARK_KEY`] (see [`import`]). False when
/// nothing was buffered because another open transaction of this process reserved the key.
fn put_mark(
    marker: &ReliableConcurrentQueue<Mark>,
    tx: &mut Transaction,
    mark: Mark,
    target: Target,
) -> Result<bool, Error> {
    if target != Target::Redis {
        marker.enqueue(tx, mark)?;
        return Ok(true);
    }
    let put = marker.enqueue_unique(tx, mark, MARK_KEY, Duration::ZERO)?;
    Ok(put == Enqueued::Enqueued)
}

/// Takes the mark of `marker` into a new transaction and checks it against the file:
/// how many lines are taken, and the transaction holding the mark (abort it to give the mark
/// back, or commit it with the next mark).
fn take_mark(
    store: &Store,
    marker: &ReliableConcurrentQueue<Mark>,
    marker_name: &str,
    export: &Export,
    prefix: &mut Prefix<'_>,
) -> Result<(usize, Transaction), ImportError> {
    let mut tx = store.begin();
    let mark = match marker.blocking_try_dequeue(&mut tx) {
        Ok(Some(mark)) => mark,
        Ok(None) => {
            return Err(ImportError::Busy {
                marker: marker_name.to_owned(),
            })
        }
        Err(error @ Error::Deserialize { .. }) => {
            return Err(ImportError::UnreadableRecord {
                marker: marker_name.to_owned(),
                error: Box::new(error),
            })
        }
        Err(error) => {
            return Err(ImportError::Store {
                path: export.path.clone(),
                from: None,
                line: None,
                error: Box::new(error),
            })
        }
    };
    // A count read from the store: one past `usize` is more lines than any file read into
    // memory holds, so it is another file's, as a count past the body's end is.
    let taken = usize::try_from(mark.lines).ok();
    let Some(taken) = taken.filter(|&n| prefix.digest(n) == Some(mark.sha256)) else {
        // The refusal is what to report: the mark goes back, by the abort or at the latest
        // when the store closes.
        let _ = tx.blocking_abort();
        return Err(ImportError::OtherFile {
            path: export.path.clone(),
            marker: marker_name.to_owned(),
            taken: mark.lines,
        });
    };
    Ok((taken, tx))
}
