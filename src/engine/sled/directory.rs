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
/// - sled's files in it (`db`, `conf`, `blobs`, `snap.*`), the store's `marks`, or the files
///   in `blobs/` when one is a symbolic link: they are opened by name for writing, so a planted link would make it
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
        let sleds = name == "db" || name == "conf" || name == "blobs" || name == super::marks::FILE;
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
/// as root. (std offers no `geteuid` of its own, and this crate calls no C functions.)
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
///
/// A failure names the file concerned where it can be told ([`explain_open_failure`]):
/// [`Error::Damaged`] for a `conf` whose checksum fails ([`check_sled_config`]) and for the
/// corruption sled reports (naming `db` and the offset, a snapshot or a large value's file);
/// [`Error::Storage`] with the path of the file sled could not open for an I/O error (a
/// permission problem, say), the directory's when no single file is to blame.
pub(crate) fn open_sled(
    path: &Path,
    config: &Config,
    flush_every: Option<u64>,
) -> Result<sled::Db> {
    check_sled_config(path)?;
    check_sled_log(path)?;
    // sled 0.34.7 takes a large value's file it may not read for a damaged record, and cuts
    // its log short there: a permission problem would become lost data. So what sled will
    // open is tried first (directories are not written to here: that only on failure).
    if let Some((file, e)) = inaccessible(path, false, |_| true) {
        return Err(Error::from(e).at(&file));
    }
    // sled creates a missing log file, so whether it was there must be seen before.
    let log_existed = std::fs::symlink_metadata(path.join("db")).is_ok();
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
                if !snapshots_checked
                    && discard_torn_sled_snapshots(path).map_err(|e| e.at(path))? =>
            {
                snapshots_checked = true;
            }
            Err(other) => return Err(explain_open_failure(path, other, log_existed)),
        }
    }
}

/// Refuses, as [`Error::Damaged`], a `conf` (sled's settings file) in `dir` whose checksum
/// does not match its text.
///
/// sled 0.34.7 computes the checksum but only logs a warning when it fails, then parses the
/// text; what a flipped bit gives then depends on where it fell: `Corruption` without a place
/// (most of the text), `Unsupported` saying the database "may have been created using a sled
/// version earlier than 0.29" (a byte that is no longer UTF-8), `Unsupported` asking to change
/// the segment size back or to upgrade from another "pagecache version" (a digit turned into
/// another), or a store that opens as if nothing happened (a bit of the checksum itself).
/// Checked here first, every one of them is reported as what it is.
///
/// A `conf` of 8 bytes or fewer sled takes for absent and writes anew; so is it left here.
fn check_sled_config(dir: &Path) -> Result<()> {
    let conf = dir.join("conf");
    let bytes = match std::fs::read(&conf) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::from(e).at(&conf)),
    };
    if bytes.len() <= 8 {
        return Ok(());
    }
    let (text, checksum) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(text).to_le_bytes()[..] == *checksum {
        return Ok(());
    }
    Err(Error::Damaged {
        path: conf,
        detail: "its checksum does not match its contents. It is the storage engine's (sled's) \
                 settings file, the same in every store made by the same version of \
                 reliable-queue: a copy of `conf` from such a store can replace it"
            .to_owned(),
    })
}

/// The name of the newest complete snapshot sled wrote in `dir`, if any. sled writes one
/// (never one at position 0) only once its log holds something, and renames it from
/// `.generating` once complete.
fn complete_snapshot(dir: &Path) -> std::io::Result<Option<String>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.starts_with("snap.")
                && !name.ends_with(".generating")
                && !name.ends_with(".in___motion")
                && !name
                    .trim_start_matches("snap.")
                    .trim_start_matches('0')
                    .is_empty()
        })
        .max())
}

/// Refuses, as [`Error::Damaged`], a store in `dir` whose log file `db` is missing or empty
/// while sled's snapshot of that log is there: the log was deleted, truncated or replaced.
///
/// Checked before sled opens the directory, because sled 0.34.7 does not refuse it: it
/// creates an empty `db`, reports corruption at an offset its snapshot points at, and on the
/// way deletes the large values in `blobs/` that the short log does not reach, so that
/// restoring `db` from a backup afterwards would no longer be enough.
fn check_sled_log(dir: &Path) -> Result<()> {
    let log = dir.join("db");
    let missing = match std::fs::metadata(&log) {
        Ok(meta) => meta.len() == 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(Error::from(e).at(&log)),
    };
    if !missing {
        return Ok(());
    }
    let snapshot = complete_snapshot(dir).map_err(|e| Error::from(e).at(dir))?;
    let Some(snapshot) = snapshot else {
        return Ok(());
    };
    let (what, how) = if std::fs::symlink_metadata(&log).is_ok() {
        ("empty", "truncated or replaced")
    } else {
        ("missing", "deleted or moved")
    };
    Err(Error::Damaged {
        path: log,
        detail: format!(
            "the storage engine's (sled's) log file is {what}, though its snapshot `{snapshot}` \
             says the log held data: the file was {how}. Nothing in the store was changed: \
             restore the file from a backup"
        ),
    })
}

/// What a failed `sled::Config::open` of the store in `dir` means, with the file concerned.
/// `log_existed`: whether sled's log file `db` was there before sled opened the directory.
fn explain_open_failure(dir: &Path, error: sled::Error, log_existed: bool) -> Error {
    match &error {
        sled::Error::Corruption { at, .. } => {
            // sled 0.34.7 reports some failures to read or write as corruption without a
            // place: a large value's file it may not read, a directory it may not write.
            if let Some((path, e)) = inaccessible(dir, true, |_| true) {
                return Error::from(e).at(&path);
            }
            if let Some(damage) = missing_log(dir, *at, log_existed) {
                return damage;
            }
            if at.is_some() {
                // `at` turns sled's own pointer into the file and offset.
                return Error::from(error).at(dir);
            }
            // sled does not say where: the checksums of its other files tell.
            damaged_snapshot_or_blob(dir).unwrap_or_else(|| Error::Damaged {
                path: dir.join("db"),
                detail: "the storage engine (sled) found its log file damaged, or shorter than \
                         its snapshot says (its other files check out: `conf`, the snapshot and \
                         the large values in `blobs/` match their checksums)"
                    .to_owned(),
            })
        }
        sled::Error::Io(io) => {
            let kind = io.kind();
            if matches!(
                kind,
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
            ) {
                if let Some(damage) = damaged_snapshot_or_blob(dir) {
                    return damage;
                }
            }
            let file = inaccessible(dir, true, |e| e.kind() == kind)
                .map_or_else(|| dir.to_path_buf(), |(path, _)| path);
            Error::from(error).at(&file)
        }
        // sled's complaints about the settings in `conf` (found intact by
        // `check_sled_config`): a store of another sled version or other settings.
        sled::Error::Unsupported(why)
            if why.contains("created using") || why.contains("across restarts") =>
        {
            Error::from(error).at(&dir.join("conf"))
        }
        _ => Error::from(error).at(dir),
    }
}

/// sled's log file `db` in `dir` gone or cut short, when sled reports corruption at `at`:
/// sled creates a missing `db` empty, then finds its snapshot pointing into nothing.
fn missing_log(dir: &Path, at: Option<sled::DiskPtr>, log_existed: bool) -> Option<Error> {
    let log = dir.join("db");
    let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let detail = if !log_existed {
        "the storage engine's (sled's) log file was missing, though its other files say it \
         held data (sled has put an empty file in its place): the file was deleted or moved"
            .to_owned()
    } else if len == 0 {
        "the storage engine's (sled's) log file is empty, though its other files say it held \
         data: the file was truncated or replaced"
            .to_owned()
    } else {
        match at {
            Some(sled::DiskPtr::Inline(offset)) if offset >= len => format!(
                "the storage engine's (sled's) log file is {len} byte{} long, but its index \
                 refers to offset {offset}: the file was truncated or replaced",
                if len == 1 { "" } else { "s" }
            ),
            _ => return None,
        }
    };
    Some(Error::Damaged { path: log, detail })
}

/// The first of sled's files in `dir` whose checksum fails: its newest snapshot (`snap.*`),
/// which sled reads at every open, then the large values it keeps in `blobs/`. Called on the
/// failure path only: it reads every blob file.
fn damaged_snapshot_or_blob(dir: &Path) -> Option<Error> {
    // The snapshot sled reads: the last `snap.*` by name.
    let newest = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("snap.") && !name.ends_with(".in___motion"))
        })
        .max();
    if let Some(snapshot) = newest {
        // The snapshot, then its length (8 bytes) and the CRC-32 of the snapshot (4 bytes).
        let intact = std::fs::read(&snapshot).ok().is_none_or(|bytes| {
            bytes.len() > 12 && {
                let (body, tail) = bytes.split_at(bytes.len() - 12);
                crc32fast::hash(body).to_le_bytes()[..] == tail[8..]
            }
        });
        if !intact {
            return Some(Error::Damaged {
                path: snapshot,
                detail: "its checksum does not match its contents. It is the storage engine's \
                         (sled's) snapshot, an index of its log that sled rebuilds from the log \
                         when no snapshot is present: moving this file out of the store's \
                         directory may let the store open"
                    .to_owned(),
            });
        }
    }
    let mut blobs: Vec<PathBuf> = std::fs::read_dir(dir.join("blobs"))
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    blobs.sort();
    blobs.into_iter().find_map(|blob| {
        // The CRC-32 of the rest (4 bytes), a kind byte, the value.
        let intact = std::fs::read(&blob).ok().is_none_or(|bytes| {
            bytes.len() > 4 && crc32fast::hash(&bytes[4..]).to_le_bytes()[..] == bytes[..4]
        });
        (!intact).then(|| Error::Damaged {
            path: blob,
            detail: "its checksum does not match its contents. It holds a large value of the \
                     storage engine's (sled's) log"
                .to_owned(),
        })
    })
}

/// The first of sled's files and directories in `dir` that cannot be used as sled uses them,
/// with the error that says why, among the errors `counts` accepts: the directory (listed,
/// and if `write`, written: a probe file is created and removed), `conf` (read), `db` (read
/// and write), the snapshots (read), `blobs/` (listed, written if `write`) and the files in
/// it (read). Files that are missing are sled's to create, not to blame. `None` when all of
/// them can be used.
fn inaccessible(
    dir: &Path,
    write: bool,
    counts: impl Fn(&std::io::Error) -> bool,
) -> Option<(PathBuf, std::io::Error)> {
    /// Opens the file `path` for reading, and for writing too if `write`.
    fn open(path: &Path, write: bool) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map(drop)
    }
    /// Lists the directory `path`, sorted.
    fn list(path: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut paths = std::fs::read_dir(path)?
            .map(|entry| entry.map(|entry| entry.path()))
            .collect::<std::io::Result<Vec<_>>>()?;
        paths.sort();
        Ok(paths)
    }
    /// Creates a file in the directory `path`, then removes it.
    fn write_into(path: &Path) -> std::io::Result<()> {
        let probe = path.join(format!(".reliable-queue-probe.{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)?;
        std::fs::remove_file(&probe)
    }
    let exists = |path: &Path| std::fs::symlink_metadata(path).is_ok();
    let mut checks: Vec<(PathBuf, std::io::Result<()>)> = Vec::new();
    let entries = list(dir);
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) => return counts(&e).then(|| (dir.to_path_buf(), e)),
    };
    if write {
        checks.push((dir.to_path_buf(), write_into(dir)));
    }
    for (name, for_writing) in [("conf", false), ("db", true)] {
        let path = dir.join(name);
        if exists(&path) {
            let opened = open(&path, for_writing);
            checks.push((path, opened));
        }
    }
    for path in entries {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        if name.is_some_and(|name| name.starts_with("snap.")) {
            let opened = open(&path, false);
            checks.push((path, opened));
        }
    }
    let blobs = dir.join("blobs");
    if exists(&blobs) {
        match list(&blobs) {
            Err(e) => checks.push((blobs, Err(e))),
            Ok(files) => {
                if write {
                    checks.push((blobs.clone(), write_into(&blobs)));
                }
                for file in files {
                    let opened = open(&file, false);
                    checks.push((file, opened));
                }
            }
        }
    }
    checks.into_iter().find_map(|(path, result)| match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound && counts(&e) => Some((path, e)),
        _ => None,
    })
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
    if !stored_nothing {
        return Ok(());
    }
    if !settings_only {
        // Nothing was ever stored: a `conf` that is not sled's settings with their checksum
        // is what a power cut during the first open leaves (sled never syncs the file; the
        // store syncs it once sled has opened). Removed, sled writes it again. With a
        // snapshot beside it the store did hold data, and the damage is reported instead.
        let checksum_ok = text.len() > 4 && {
            let (body, crc) = text.split_at(text.len() - 4);
            crc32fast::hash(body).to_le_bytes()[..] == *crc
        };
        if text.len() > 8 && !checksum_ok && complete_snapshot(path)?.is_none() {
            tracing::warn!(
                ?path,
                "removing sled's configuration file, cut short before anything was stored"
            );
            std::fs::remove_file(&conf)?;
        }
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

/// Makes what sled wrote durable past the disk's write cache.
///
/// sled 0.34's `Db::flush` writes its log with `pwrite` and `sync_file_range`: the pages reach
/// the device, but its write cache is not flushed and a grown file's new size is not committed,
/// so a power loss could still lose them. It never syncs the files in which it keeps large
/// values and large tree nodes (`blobs/`) either, although its log points at them: a power
/// cut after the log is durable and before a blob file is would leave the log pointing at an
/// empty file (found with LazyFS: sled then stops its recovery there). So after every sled
/// flush the committer calls [`DiskSync::sync_flushed`]: every blob file created since the
/// last call is synced, then the blob directory, and only then the log file (`fdatasync`), so
/// that the log never becomes durable before what it points at.
#[derive(Debug)]
pub(crate) struct DiskSync {
    db: File,
    blobs: std::path::PathBuf,
    /// The blob files known durable: those present at open (synced then) and those synced
    /// since.
    synced: crate::sync::process::Mutex<BlobFiles>,
}

/// Names of files in sled's blob directory.
type BlobFiles = std::collections::HashSet<std::ffi::OsString>;

impl DiskSync {
    /// Opens sled's log file of the store in `path`, syncs every blob file there (a process
    /// that crashed may have left some that never were), and makes the directory's entries
    /// (the files sled created) durable.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let db = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path.join("db"))?;
        let disk = DiskSync {
            db,
            blobs: path.join("blobs"),
            synced: crate::sync::process::Mutex::new(BlobFiles::new()),
        };
        disk.sync_new_blobs()?;
        // sled never syncs its settings file: once, here, so that a power cut cannot take it.
        match File::open(path.join("conf")) {
            Ok(conf) => conf.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        File::open(path)?.sync_all()?;
        Ok(disk)
    }

    /// The blob files present now.
    fn blob_files(&self) -> std::io::Result<BlobFiles> {
        match std::fs::read_dir(&self.blobs) {
            Ok(entries) => entries.map(|e| e.map(|e| e.file_name())).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BlobFiles::new()),
            Err(e) => Err(e),
        }
    }

    /// Syncs the blob files not synced yet, then the blob directory if there were any.
    /// Files sled removed are forgotten.
    fn sync_new_blobs(&self) -> std::io::Result<()> {
        let now = self.blob_files()?;
        let mut synced = self.synced.lock();
        let mut new = false;
        for name in &now {
            if !synced.contains(name) {
                match File::open(self.blobs.join(name)) {
                    Ok(file) => file.sync_all()?,
                    // Removed by sled between the listing and now: nothing to sync.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
        }
        if new {
            File::open(&self.blobs)?.sync_all()?;
        }
        *synced = now;
        Ok(())
    }

    /// After `Db::flush`: makes what it wrote durable, blob files first, then the log file.
    pub(crate) fn sync_flushed(&self) -> std::io::Result<()> {
        self.sync_new_blobs()?;
        self.db.sync_data()
    }
}
