//! The store's directory: which directories this process has open, and the directory as
//! sled sees it: opening it (waiting out a lock that a store closed a moment ago still holds,
//! repairing what a crash can leave behind in sled's own files), syncing what sled does not,
//! and letting it go.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::trees::Trees;
use crate::config::Config;
use crate::error::{DirectoryProblem, Error, Result};
use crate::sync::process::Mutex;

/// Directories open in this process. sled's file lock catches other processes.
static OPEN_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// This process's claim on a store directory, released when dropped.
#[derive(Debug)]
pub(crate) struct DirLock(PathBuf);

impl DirLock {
    /// Claims `path` (canonical), unless a store of this process has it open.
    pub(crate) fn acquire(path: PathBuf) -> Result<Self> {
        let mut open = OPEN_DIRS.lock();
        if open.contains(&path) {
            return Err(Error::AlreadyOpen { path });
        }
        open.push(path.clone());
        Ok(DirLock(path))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        OPEN_DIRS.lock().retain(|p| p != &self.0);
    }
}

/// Creates the store's directory (and its parents) if missing, owner-only.
fn create_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path)
}

/// Makes sure the store's directory is safe to hand to sled, before sled opens anything in it:
/// creates it (owner-only) if missing, then refuses, with [`Error::UnsafeDirectory`]:
///
/// - a path that is not a directory, or whose last component is a symbolic link;
/// - sled's files in it (`db`, `conf`, `blobs`, `snap.*`) or the files in `blobs/` when one is
///   a symbolic link: sled opens them by name for writing, so a planted link would make it
///   write wherever the link points (a root process overwrote a root-only file that way);
/// - on Unix, unless `allow_shared` ([`Builder::allow_shared_directory`]): a directory owned
///   by another user than the process's effective user, or whose mode gives its group or
///   others any permission.
///
/// Earlier components of the path may be symbolic links (`/tmp` is one on some systems); only
/// the store's own directory and what is in it are checked. The checks are made once, at open,
/// by name: they keep a mistaken or planted directory out, not a user who can write to the
/// directory's parent while the store opens.
///
/// On platforms other than Unix only the not-a-directory and symbolic-link checks apply.
///
/// [`Builder::allow_shared_directory`]: crate::Builder::allow_shared_directory
pub(crate) fn prepare_dir(path: &Path, allow_shared: bool) -> Result<()> {
    let refused = |path: &Path, problem| Error::UnsafeDirectory {
        path: path.to_path_buf(),
        problem,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_dir(path)?;
            std::fs::symlink_metadata(path)?
        }
        other => other?,
    };
    if meta.file_type().is_symlink() {
        return Err(refused(path, DirectoryProblem::Symlink));
    }
    if !meta.is_dir() {
        return Err(refused(path, DirectoryProblem::NotADirectory));
    }
    #[cfg(unix)]
    if !allow_shared {
        use std::os::unix::fs::MetadataExt;
        if let Some(process) = effective_uid() {
            if meta.uid() != process {
                return Err(refused(
                    path,
                    DirectoryProblem::OwnedByOther {
                        owner: meta.uid(),
                        process,
                    },
                ));
            }
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refused(
                path,
                DirectoryProblem::OpenToOthers {
                    mode: meta.mode() & 0o7777,
                },
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = allow_shared;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        let sleds = name == "db" || name == "conf" || name == "blobs";
        if !sleds && !name.to_string_lossy().starts_with("snap.") {
            continue;
        }
        let file_type = entry.file_type()?;
        if file_type.is_symlink() {
            return Err(refused(&entry.path(), DirectoryProblem::Symlink));
        }
        if name == "blobs" && file_type.is_dir() {
            for blob in std::fs::read_dir(entry.path())? {
                let blob = blob?;
                if blob.file_type()?.is_symlink() {
                    return Err(refused(&blob.path(), DirectoryProblem::Symlink));
                }
            }
        }
    }
    Ok(())
}

/// The process's effective user id: the owner of `/proc/self` (Linux gives a process's
/// `/proc/<pid>` directory its effective uid and gid). `None` where there is no `/proc`
/// (Unix systems other than Linux): the owner check is then skipped, the mode and
/// symbolic-link checks still apply.
///
/// A process that made itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, or a set-user-id
/// program) sees `/proc/self` owned by root instead: such a process must open its store with
/// [`Builder::allow_shared_directory`](crate::Builder::allow_shared_directory) unless it runs
/// as root. (std has no safe `geteuid`, and this crate forbids `unsafe`.)
#[cfg(unix)]
fn effective_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Makes sled's blob directory owner-only, as the store's directory is: sled creates it with
/// the process's default permissions (0755 under the usual umask). Left alone in a directory
/// opened with [`Builder::allow_shared_directory`](crate::Builder::allow_shared_directory).
pub(crate) fn restrict_blobs(path: &Path, allow_shared: bool) -> Result<()> {
    #[cfg(unix)]
    if !allow_shared {
        use std::os::unix::fs::PermissionsExt;
        let blobs = path.join("blobs");
        let meta = match std::fs::symlink_metadata(&blobs) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if meta.file_type().is_symlink() {
            return Err(Error::UnsafeDirectory {
                path: blobs,
                problem: DirectoryProblem::Symlink,
            });
        }
        if meta.is_dir() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    #[cfg(not(unix))]
    let _ = (path, allow_shared);
    Ok(())
}

/// How long closing a store waits for sled after a storage failure.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// How long `open` waits for sled's lock on the directory when it is taken.
///
/// Dropping a `sled::Db` does not release its lock at once: sled's background threads (log
/// buffer writes, file truncation and its fsync) keep the file open until they finish. So a
/// store closed a moment ago, by this process or another, can look locked for a few
/// milliseconds, longer under I/O load. A directory that stays locked this long is in use.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Pause between two attempts to take sled's lock.
const LOCK_RETRY: Duration = Duration::from_millis(2);

/// Opens sled in `path`, waiting up to [`LOCK_PATIENCE`] for its lock.
pub(crate) fn open_sled(
    path: &Path,
    config: &Config,
    flush_every: Option<u64>,
) -> Result<sled::Db> {
    let give_up = Instant::now() + LOCK_PATIENCE;
    let mut snapshots_checked = false;
    loop {
        let opened = sled::Config::new()
            .path(path)
            .cache_capacity(config.cache_capacity)
            .flush_every_ms(flush_every)
            .open();
        match opened {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if Instant::now() >= give_up {
                    return Err(Error::AlreadyOpen {
                        path: path.to_path_buf(),
                    });
                }
                std::thread::sleep(LOCK_RETRY);
            }
            Err(sled::Error::Corruption { .. })
                if !snapshots_checked && discard_torn_sled_snapshots(path)? =>
            {
                snapshots_checked = true;
            }
            Err(other) => return Err(Error::from(other)),
        }
    }
}

/// Removes snapshot files sled did not finish writing; true if there were any.
///
/// sled's snapshot is an index of its log, rebuilt from the log at every open. sled 0.34
/// writes it to `snap.<position>.generating` and renames the file once it is complete, but
/// when it looks for the newest snapshot it does not skip `.generating` files: a write cut
/// short (a crash or an I/O error during an open) leaves one that sorts after every complete
/// snapshot, and sled then reports the directory corrupt at every open. Such a file holds
/// nothing the log does not; without it sled starts from the previous snapshot (or none) and
/// replays the log from there.
///
/// Called only after sled refused the directory as corrupt, so no process held it then. A
/// process opening the same directory in that instant could see its own snapshot removed:
/// its open then fails with an error and can be retried; nothing is lost.
fn discard_torn_sled_snapshots(path: &Path) -> Result<bool> {
    let mut removed = false;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(
                ?path,
                file = %name,
                "removing a snapshot file whose writing was cut short"
            );
            std::fs::remove_file(entry.path())?;
            removed = true;
        }
    }
    Ok(removed)
}

/// Finishes sled's `conf` file if a crash cut its first write short.
///
/// The first open of a directory writes sled's settings to `conf` in two writes, the text and
/// then its CRC-32, before sled creates its data file. A process killed between the two
/// leaves the text alone, and sled 0.34 then reads the end of the text as the checksum and
/// reports the directory corrupt at every later open. When `conf` holds exactly sled's three
/// settings lines and the data file is absent or empty (so nothing was ever stored), this
/// appends the missing checksum: the write sled did not get to make, and (on Unix, unless
/// `allow_shared`) makes the file owner-only (0600). Anything else is left to sled.
///
/// Called after [`prepare_dir`], which refused a `conf` that is a symbolic link.
pub(crate) fn complete_torn_sled_config(path: &Path, allow_shared: bool) -> Result<()> {
    let conf = path.join("conf");
    let text = match std::fs::read(&conf) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let keys: Option<Vec<&str>> = std::str::from_utf8(&text).ok().map(|t| {
        t.lines()
            .map(|line| line.split(": ").next().unwrap_or_default())
            .collect()
    });
    let settings_only = text.ends_with(b"\n")
        && keys.as_deref() == Some(&["segment_size", "use_compression", "version"][..]);
    let stored_nothing = match std::fs::metadata(path.join("db")) {
        Ok(meta) => meta.len() == 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e.into()),
    };
    if !settings_only || !stored_nothing {
        return Ok(());
    }
    tracing::warn!(
        ?path,
        "completing sled's configuration file, cut short by a crash"
    );
    let mut file = std::fs::OpenOptions::new().append(true).open(&conf)?;
    #[cfg(unix)]
    if !allow_shared {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = allow_shared;
    std::io::Write::write_all(&mut file, &crc32fast::hash(&text).to_le_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// Waits until no sled instance holds the directory's lock any more, up to
/// [`LOCK_PATIENCE`]; false if it is still held then.
///
/// sled's background threads keep its lock file open for a moment after the last handle is
/// dropped. Closing a store waits here, so that when the last handle is gone the directory can
/// be opened again at once. The lock is sled's: an advisory `flock` on the `db` file, which
/// std's file locks take too.
pub(crate) fn wait_until_released(path: &Path) -> bool {
    let Ok(file) = File::open(path.join("db")) else {
        return true;
    };
    let give_up = Instant::now() + LOCK_PATIENCE;
    loop {
        match file.try_lock() {
            Ok(()) => return file.unlock().is_ok(),
            Err(TryLockError::WouldBlock) if Instant::now() < give_up => {
                std::thread::sleep(LOCK_RETRY);
            }
            Err(_) => return false,
        }
    }
}

/// Drops sled's handles after a storage failure without risking a hang.
///
/// sled flushes when its last handle is dropped, and after some failures that flush never
/// returns. The handles are dropped on a thread of their own, waited for
/// [`CLOSE_PATIENCE`]; past that the thread is left to it and the directory stays locked
/// until the process exits.
pub(crate) fn close_after_failure(trees: Trees) {
    let (done, closed) = crossbeam_channel::bounded::<()>(1);
    let closer = std::thread::Builder::new()
        .name("reliable-queue-close".into())
        .spawn(move || {
            drop(trees);
            drop(done);
        });
    if let Err(e) = closer {
        tracing::error!(error = %e, "cannot start a thread to close the store; closing in place");
        return;
    }
    if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = closed.recv_timeout(CLOSE_PATIENCE) {
        tracing::error!(
            "the storage engine did not close within {CLOSE_PATIENCE:?} after a storage failure; \
             the directory stays locked until the process exits"
        );
    }
}

/// Records larger than this may be stored by sled as a file of their own in `blobs/` (sled's
/// threshold is a quarter of its 512 KiB segment, less headers; this stays below it).
pub(crate) const BLOB_CANDIDATE: usize = 96 << 10;

/// Makes what sled wrote durable past the disk's write cache.
///
/// sled 0.34's `Db::flush` writes its log with `pwrite` and `sync_file_range`: the pages reach
/// the device, but its write cache is not flushed and a grown file's new size is not committed,
/// so a power loss could still lose them. It never syncs the files in which it keeps large
/// values (`blobs/`) either. After sled's flush the committer calls [`DiskSync::sync_log`], which
/// adds the missing `fdatasync` of the log file; for groups with a large record the committer
/// also syncs every new blob file and the blob directory.
#[derive(Debug)]
pub(crate) struct DiskSync {
    db: File,
    blobs: std::path::PathBuf,
}

/// Names of the files in sled's blob directory before a large record was written.
pub(crate) type BlobFiles = std::collections::HashSet<std::ffi::OsString>;

impl DiskSync {
    /// Opens sled's log file of the store in `path`, and makes the directory's entries (the
    /// files sled created) durable.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let db = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path.join("db"))?;
        File::open(path)?.sync_all()?;
        Ok(DiskSync {
            db,
            blobs: path.join("blobs"),
        })
    }

    /// The blob files present now (call before writing a record of [`BLOB_CANDIDATE`] bytes
    /// or more).
    pub(crate) fn blob_files(&self) -> std::io::Result<BlobFiles> {
        match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries.map(|e| e.map(|e| e.file_name())).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BlobFiles::new()),
            Err(e) => Err(e),
        }
    }

    /// Syncs the blob files created since `before` was taken, and the blob directory.
    pub(crate) fn sync_new_blobs(&self, before: &BlobFiles) -> std::io::Result<()> {
        let mut new = false;
        for name in self.blob_files()? {
            if !before.contains(&name) {
                File::open(self.blobs.join(&name))?.sync_all()?;
                new = true;
            }
        }
        if new {
            File::open(&self.blobs)?.sync_all()?;
        }
        Ok(())
    }

    /// Syncs sled's log file: after `Db::flush`, this is what makes it durable.
    pub(crate) fn sync_log(&self) -> std::io::Result<()> {
        self.db.sync_data()
    }
}
