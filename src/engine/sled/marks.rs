//! The marks: how far the log is known to reach, kept in a file of the store's own, outside
//! sled, so that sled's recovery cannot silently drop it.
//!
//! sled checks its own log and treats everything after a damaged spot as never written; a
//! deleted, truncated or restored file comes back as an older, shorter log. The records'
//! checksums never see that damage: the records are simply not there. The mark says which
//! records must be:
//!
//! - `end`: one past the highest sequence number known durable. The committer publishes it
//!   after the flush that made those records durable; the [`Marker`] thread writes it within
//!   [`MARK_INTERVAL`]. So the mark never claims a record a crash can lose, and a durable
//!   commit waits for no extra device write: the mark trails the log by at most one interval
//!   plus one write of this file.
//! - `start`: records below it may be gone (compaction deleted them). Compaction asks for it to
//!   move and deletes a record only once a mark with a higher `start` is on disk in both of the
//!   file's copies (see below), so losing the oldest record is reported too.
//! - the queue catalog, each queue with the first sequence number that may name it: the
//!   queues a missing range may have touched, and a copy of the catalog should sled lose its
//!   own.
//!
//! At open every sequence number in `start .. end` must be in the log or in the quarantine
//! tree (set aside); the others are reported missing.
//!
//! The file holds two copies (slots) written in turn, each with a counter and a CRC-32; the
//! valid slot with the higher counter is the mark. A write cut short (crash, power loss)
//! damages at most the slot being written, and the other one is an older mark. An older mark
//! is still a safe one: its `end` is lower (it claims less), and its `start` is not above what
//! compaction relied on, because compaction only deletes below the `start` of the *previous*
//! write, which the other slot holds.
//!
//! ```text
//! slot (at offset 0 and at offset `slot size`; the file is two slots long)
//! 0..4      magic "RQMK"
//! 4..8      u32 LE  slot format version (1)
//! 8..12     u32 LE  slot size (a power of two, 4 KiB at least)
//! 12..20    u64 LE  counter (the higher valid one wins)
//! 20..24    u32 LE  body length
//! 24..      body: postcard of `Mark`
//! then      u32 LE  CRC-32 of everything before it; zeros to the slot's end
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::core::QueueId;
use crate::error::{Error, Result};
use crate::sync::process::{Condvar, Mutex};

/// The file's name in the store's directory.
pub(crate) const FILE: &str = "marks";
/// Where a file with bigger slots is written before it replaces the file.
const NEW_FILE: &str = "marks.new";

const MAGIC: &[u8; 4] = b"RQMK";
const SLOT_VERSION: u32 = 1;
const HEADER: usize = 24;
const MIN_SLOT: usize = 4 << 10;
const MAX_SLOT: usize = 64 << 20;

/// How often, at most, the marker writes the mark while it changes: the bound by which the
/// mark trails the durable log (plus the time of one write and `fdatasync` of the file).
pub(crate) const MARK_INTERVAL: Duration = Duration::from_millis(50);

/// A queue as the mark knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MarkedQueue {
    pub(crate) id: QueueId,
    pub(crate) name: String,
    /// No record below this sequence number names the queue (it did not exist yet).
    pub(crate) first_seq: u64,
}

/// How far the log reaches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mark {
    /// Records below this may have been deleted by compaction.
    pub(crate) start: u64,
    /// One past the highest record known durable; `start <= end`.
    pub(crate) end: u64,
    pub(crate) queues: Vec<MarkedQueue>,
}

impl Mark {
    /// The queues a record in `range` may name.
    pub(crate) fn queues_touched_by(
        &self,
        range: &std::ops::RangeInclusive<u64>,
    ) -> Vec<&MarkedQueue> {
        self.queues
            .iter()
            .filter(|q| q.first_seq <= *range.end())
            .collect()
    }
}

/// What the file holds.
#[derive(Debug)]
pub(crate) enum Found {
    /// No file: a new store, or one written before marks were kept.
    Absent,
    /// The newest valid slot.
    Mark { mark: Mark, counter: u64 },
    /// A file in which neither slot is valid.
    Unreadable { detail: String },
}

/// A storage error about the file or directory `path`.
fn io_at(e: std::io::Error, path: &Path) -> Error {
    Error::storage(e).at(path)
}

/// Reads the marks file of the store in `dir`.
pub(crate) fn read(dir: &Path) -> Result<Found> {
    // `prepare_dir` refused a symbolic link in its place.
    let path = dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Absent),
        Err(e) => return Err(io_at(e, &path)),
    };
    let first = decode_slot(&bytes, 0);
    let slot_size = match &first {
        Some((_, _, size)) => *size,
        None => bytes.len() / 2,
    };
    let second = if slot_size >= MIN_SLOT {
        decode_slot(&bytes, slot_size).filter(|(_, _, size)| *size == slot_size)
    } else {
        None
    };
    let best = match (first, second) {
        (Some(a), Some(b)) => Some(if b.1 > a.1 { b } else { a }),
        (a, b) => a.or(b),
    };
    Ok(match best {
        Some((mark, counter, _)) => Found::Mark { mark, counter },
        None => Found::Unreadable {
            detail: format!(
                "neither copy of the mark is valid ({} bytes; a copy fails its checksum, is cut \
                 short, or is not a mark)",
                bytes.len()
            ),
        },
    })
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The slot at `offset`, if it is a valid one: its mark, counter and slot size.
fn decode_slot(bytes: &[u8], offset: usize) -> Option<(Mark, u64, usize)> {
    let slot = bytes.get(offset..)?;
    if slot.get(..4)? != MAGIC || u32_at(slot, 4)? != SLOT_VERSION {
        return None;
    }
    let size = usize::try_from(u32_at(slot, 8)?).ok()?;
    if !(MIN_SLOT..=MAX_SLOT).contains(&size) || !size.is_power_of_two() {
        return None;
    }
    let counter = u64_at(slot, 12)?;
    let len = usize::try_from(u32_at(slot, 20)?).ok()?;
    let body_end = HEADER.checked_add(len)?;
    if body_end.checked_add(4)? > size {
        return None;
    }
    let crc = u32_at(slot, body_end)?;
    if crc32fast::hash(slot.get(..body_end)?) != crc {
        return None;
    }
    let mark: Mark = postcard::from_bytes(slot.get(HEADER..body_end)?).ok()?;
    (mark.start <= mark.end).then_some((mark, counter, size))
}

/// One slot's bytes, `slot_size` long, or `None` if the mark does not fit in it.
fn encode_slot(mark: &Mark, counter: u64, slot_size: usize) -> Result<Option<Vec<u8>>> {
    let body = postcard::to_allocvec(mark).map_err(Error::storage)?;
    let Some(needed) = HEADER
        .checked_add(body.len())
        .and_then(|n| n.checked_add(4))
    else {
        return Ok(None);
    };
    if needed > slot_size {
        return Ok(None);
    }
    let mut slot = Vec::with_capacity(slot_size);
    slot.extend_from_slice(MAGIC);
    slot.extend_from_slice(&SLOT_VERSION.to_le_bytes());
    let size = u32::try_from(slot_size).map_err(|_| Error::Bug {
        invariant: "a mark slot's size fits in 32 bits",
    })?;
    slot.extend_from_slice(&size.to_le_bytes());
    slot.extend_from_slice(&counter.to_le_bytes());
    let len = u32::try_from(body.len()).map_err(|_| Error::Bug {
        invariant: "a mark's body fits in 32 bits",
    })?;
    slot.extend_from_slice(&len.to_le_bytes());
    slot.extend_from_slice(&body);
    let crc = crc32fast::hash(&slot);
    slot.extend_from_slice(&crc.to_le_bytes());
    slot.resize(slot_size, 0);
    Ok(Some(slot))
}

/// The marks file, open for writing.
#[derive(Debug)]
pub(crate) struct MarksFile {
    file: File,
    dir: PathBuf,
    slot_size: usize,
    counter: u64,
    allow_shared: bool,
}

impl MarksFile {
    /// Writes a new marks file holding `mark` in both slots, replacing any file there:
    /// written beside it, synced, renamed over it, and the directory synced. Owner-only (0600)
    /// unless `allow_shared`.
    pub(crate) fn create(
        dir: &Path,
        mark: &Mark,
        counter: u64,
        allow_shared: bool,
    ) -> Result<Self> {
        let mut slot_size = MIN_SLOT;
        let slot = loop {
            if let Some(slot) = encode_slot(mark, counter, slot_size)? {
                break slot;
            }
            slot_size = slot_size.checked_mul(2).filter(|s| *s <= MAX_SLOT).ok_or(
                Error::InvalidConfig {
                    setting: "queues",
                    expected: "a catalog whose names take less than 64 MiB in all",
                },
            )?;
        };
        let path = dir.join(FILE);
        let new = dir.join(NEW_FILE);
        let at = |e: std::io::Error| io_at(e, &new);
        match std::fs::remove_file(&new) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(at(e)),
            _ => {}
        }
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true).create_new(true);
        #[cfg(unix)]
        if !allow_shared {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        }
        let mut file = options.open(&new).map_err(at)?;
        std::io::Write::write_all(&mut file, &slot).map_err(at)?;
        std::io::Write::write_all(&mut file, &slot).map_err(at)?;
        file.sync_all().map_err(at)?;
        // A rename replaces whatever is at `path`, a symbolic link included, without following it.
        std::fs::rename(&new, &path).map_err(at)?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_at(e, dir))?;
        Ok(MarksFile {
            file,
            dir: dir.to_path_buf(),
            slot_size,
            counter,
            allow_shared,
        })
    }

    /// Writes `mark` over the older slot and makes it durable.
    pub(crate) fn write(&mut self, mark: &Mark) -> Result<()> {
        let counter = self.counter.wrapping_add(1);
        let Some(slot) = encode_slot(mark, counter, self.slot_size)? else {
            // The catalog outgrew the slots: a new file with bigger ones.
            *self = MarksFile::create(&self.dir, mark, counter, self.allow_shared)?;
            return Ok(());
        };
        let offset = if counter.is_multiple_of(2) {
            0
        } else {
            self.slot_size
        };
        let offset = u64::try_from(offset).map_err(|_| Error::Bug {
            invariant: "a mark slot's offset fits in 64 bits",
        })?;
        let path = self.dir.join(FILE);
        write_at(&self.file, &slot, offset).map_err(|e| io_at(e, &path))?;
        self.file.sync_data().map_err(|e| io_at(e, &path))?;
        self.counter = counter;
        Ok(())
    }
}

#[cfg(unix)]
fn write_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

#[cfg(not(unix))]
fn write_at(mut file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(bytes)
}

/// What the committer and the marker thread share.
#[derive(Debug)]
struct State {
    /// The mark to write next.
    mark: Mark,
    /// `mark` differs from what was last written.
    changed: bool,
    /// Write at once, without waiting out the interval.
    urgent: bool,
    /// The `start` of the last two writes: compaction may delete below the lower one.
    written_starts: [u64; 2],
    /// Snapshots taken, and the last whose write completed.
    taken: u64,
    completed: u64,
    closing: bool,
    failed: Option<Error>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The marker waits here for work.
    wake: Condvar,
    /// Callers of [`Marker::write_now`] wait here.
    done: Condvar,
}

/// The marker thread: writes the mark when it changes, at most every [`MARK_INTERVAL`]
/// unless asked to write at once.
#[derive(Debug)]
pub(crate) struct Marker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Marker {
    /// Starts the thread, with `mark` already on disk in both slots of `file`.
    pub(crate) fn start(file: MarksFile, mark: Mark) -> Result<Marker> {
        let start = mark.start;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mark,
                changed: false,
                urgent: false,
                written_starts: [start, start],
                taken: 0,
                completed: 0,
                closing: false,
                failed: None,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("reliable-queue-marker".into())
            .spawn(move || run(&theirs, file))?;
        Ok(Marker {
            shared,
            thread: Some(thread),
        })
    }

    /// Records that every record below `end` is durable, and that compaction would like to
    /// delete the records below `want_start`. Returns the sequence number below which it may
    /// delete now, or the marker's failure.
    pub(crate) fn advance(&self, end: u64, want_start: u64) -> Result<u64> {
        let mut state = self.shared.state.lock();
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        let mut changed = false;
        if end > state.mark.end {
            state.mark.end = end;
            changed = true;
        }
        // Never past the last durable record: at least that one must be found at open. (An
        // empty log, `end` 0, keeps `start` at 0: saturating is meant.)
        let start = want_start.min(state.mark.end.saturating_sub(1));
        if start > state.mark.start {
            state.mark.start = start;
            changed = true;
        }
        debug_assert!(
            state.mark.start <= state.mark.end,
            "a mark's start is never past its end"
        );
        if changed && !state.changed {
            state.changed = true;
            self.shared.wake.notify_one();
        }
        Ok(state.written_starts[0].min(state.written_starts[1]))
    }

    /// Below which sequence number compaction may delete now.
    pub(crate) fn delete_below(&self) -> u64 {
        let state = self.shared.state.lock();
        state.written_starts[0].min(state.written_starts[1])
    }

    /// Adds a queue to the catalog the mark carries.
    pub(crate) fn add_queue(&self, queue: MarkedQueue) {
        let mut state = self.shared.state.lock();
        debug_assert!(
            !state
                .mark
                .queues
                .iter()
                .any(|q| q.id == queue.id || q.name == queue.name),
            "a queue is added to the mark once, under an id and a name no other queue has"
        );
        state.mark.queues.push(queue);
        if !state.changed {
            state.changed = true;
            self.shared.wake.notify_one();
        }
    }

    /// Writes the mark as it is now, and waits until it is durable. With `force`, writes it
    /// even if it did not change (so that both slots come to hold it).
    pub(crate) fn write_now(&self, force: bool) -> Result<()> {
        let mut state = self.shared.state.lock();
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        state.changed |= force;
        // The next snapshot if the mark changed since the last one, else the last one (which
        // may still be being written).
        let need = if state.changed {
            state.urgent = true;
            state.taken + 1
        } else {
            state.taken
        };
        self.shared.wake.notify_one();
        while state.completed < need {
            if let Some(e) = &state.failed {
                return Err(e.clone());
            }
            self.shared.done.wait(&mut state);
        }
        Ok(())
    }

    /// Writes the mark one last time if it changed, and stops the thread.
    pub(crate) fn close(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        {
            let mut state = self.shared.state.lock();
            state.closing = true;
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                return Err(Error::Bug {
                    invariant: "the marker thread does not panic",
                });
            }
        }
        match &self.shared.state.lock().failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.stop() {
                tracing::error!(error = %e, "the last write of the store's mark failed");
            }
        }
    }
}

/// The marker thread's loop.
fn run(shared: &Shared, mut file: MarksFile) {
    let mut last_write: Option<Instant> = None;
    loop {
        let (mark, index) = {
            let mut state = shared.state.lock();
            loop {
                if state.changed {
                    if state.urgent || state.closing {
                        break;
                    }
                    let due = last_write.and_then(|t| t.checked_add(MARK_INTERVAL));
                    match due {
                        Some(due) if Instant::now() < due => {
                            shared.wake.wait_until(&mut state, due);
                        }
                        _ => break,
                    }
                } else if state.closing {
                    return;
                } else {
                    shared.wake.wait(&mut state);
                }
            }
            state.changed = false;
            state.urgent = false;
            state.taken += 1;
            (state.mark.clone(), state.taken)
        };
        let written = file.write(&mark);
        last_write = Some(Instant::now());
        let mut state = shared.state.lock();
        match written {
            Ok(()) => {
                // Compaction deletes below the lower of the last two: a `start` going back
                // would let it delete what an older slot still says must be there.
                debug_assert!(
                    mark.start >= state.written_starts[1],
                    "a mark's start never goes back"
                );
                state.written_starts = [state.written_starts[1], mark.start];
                state.completed = index;
                shared.done.notify_all();
            }
            Err(e) => {
                tracing::error!(error = %e, "writing the store's mark failed; the store stops writing");
                state.failed = Some(e);
                shared.done.notify_all();
                return;
            }
        }
    }
}
