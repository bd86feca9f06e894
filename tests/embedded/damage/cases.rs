//! The damage cases: what is done to a copy of the pristine store.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::Rng;

/// One kind of damage, applied to one copy of the pristine store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Damage {
    /// Nothing: the control case, which must open intact.
    None,
    /// The file (path relative to the store directory) is deleted.
    Delete(PathBuf),
    /// The directory is deleted with everything in it.
    DeleteDir(PathBuf),
    /// The file is cut to `at` bytes (of `len`).
    Truncate { file: PathBuf, at: u64, len: u64 },
    /// Bit `bit` of byte `offset` of the file is flipped.
    Flip { file: PathBuf, offset: u64, bit: u8 },
    /// The files of a class (see [`file_class`]; [`SLED_FILES`]: all of sled's files) are
    /// replaced by their versions of the older store (as the first session left it): a backup
    /// restored over part of the store.
    Rollback(String),
}

/// The class of a rollback of every file of sled (`db`, `conf`, `snap.*`, `blobs/*`), the
/// store's own files kept.
pub(crate) const SLED_FILES: &str = "sled's files";

/// Whether `path` is one of sled's files rather than one of the store's own.
fn is_sled_file(path: &Path) -> bool {
    let class = file_class(path);
    ["db", "conf", "snap.*", "blobs/*"].contains(&class.as_str())
}

/// Whether the file at `path` belongs to rollback class `class`.
fn in_class(path: &Path, class: &str) -> bool {
    if class == SLED_FILES {
        is_sled_file(path)
    } else {
        file_class(path) == class
    }
}

/// The kinds of damage, as the tables break them down.
pub(crate) const KINDS: [&str; 4] = ["delete", "truncate", "flip", "rollback"];

impl Damage {
    /// `delete`, `truncate`, `flip` (or `none`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Damage::None => "none",
            Damage::Delete(_) | Damage::DeleteDir(_) => "delete",
            Damage::Truncate { .. } => "truncate",
            Damage::Flip { .. } => "flip",
            Damage::Rollback(_) => "rollback",
        }
    }

    /// The file or directory damaged.
    pub(crate) fn target(&self) -> Option<&Path> {
        match self {
            Damage::None => None,
            Damage::Delete(file) | Damage::DeleteDir(file) => Some(file),
            Damage::Truncate { file, .. } | Damage::Flip { file, .. } => Some(file),
            Damage::Rollback(class) => Some(Path::new(class)),
        }
    }

    /// A one-line description.
    pub(crate) fn label(&self) -> String {
        match self {
            Damage::None => "no damage".to_owned(),
            Damage::Delete(file) => format!("delete {}", file.display()),
            Damage::DeleteDir(dir) => format!("delete directory {}/", dir.display()),
            Damage::Truncate { file, at, len } => {
                format!("truncate {} at {at} of {len} bytes", file.display())
            }
            Damage::Flip { file, offset, bit } => {
                format!("flip bit {bit} of byte {offset} of {}", file.display())
            }
            Damage::Rollback(class) => {
                format!("roll back {class} to the first session's version")
            }
        }
    }

    /// Applies the damage to the store copy at `store`; `older`: the store as the first
    /// session left it.
    pub(crate) fn apply(&self, store: &Path, older: &Path) -> std::io::Result<()> {
        match self {
            Damage::Rollback(class) => {
                for f in list_files(store)? {
                    if in_class(&f.path, class) {
                        std::fs::remove_file(store.join(&f.path))?;
                    }
                }
                for f in list_files(older)? {
                    if in_class(&f.path, class) {
                        let target = store.join(&f.path);
                        let parent = target.parent().expect("a file in the store");
                        if !parent.exists() {
                            make_private_dir(parent)?;
                        }
                        std::fs::copy(older.join(&f.path), target)?;
                    }
                }
                Ok(())
            }
            Damage::None => Ok(()),
            Damage::Delete(file) => std::fs::remove_file(store.join(file)),
            Damage::DeleteDir(dir) => std::fs::remove_dir_all(store.join(dir)),
            Damage::Truncate { file, at, .. } => std::fs::OpenOptions::new()
                .write(true)
                .open(store.join(file))?
                .set_len(*at),
            Damage::Flip { file, offset, bit } => {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(store.join(file))?;
                let mut byte = [0u8];
                f.seek(SeekFrom::Start(*offset))?;
                f.read_exact(&mut byte)?;
                byte[0] ^= 1 << bit;
                f.seek(SeekFrom::Start(*offset))?;
                f.write_all(&byte)
            }
        }
    }
}

/// A file of the store: its path relative to the store directory and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreFile {
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    /// Its length without its trailing zero bytes (sled's `db` is a preallocated segment,
    /// mostly zeros).
    pub(crate) extent: u64,
}

impl StoreFile {
    /// Its class: `blobs/*` together, `snap.*` together, other files by name.
    pub(crate) fn class(&self) -> String {
        file_class(&self.path)
    }
}

/// The class of a file of the store: `blobs/*` together, `snap.*` together, other files by
/// their path.
pub(crate) fn file_class(path: &Path) -> String {
    let text = path.display().to_string();
    if text.starts_with("blobs/") {
        "blobs/*".to_owned()
    } else if text.starts_with("snap.") {
        "snap.*".to_owned()
    } else {
        text
    }
}

/// Every file under `root`, recursively, sorted by path.
pub(crate) fn list_files(root: &Path) -> std::io::Result<Vec<StoreFile>> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<StoreFile>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(root.join(rel))? {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            let meta = entry.metadata()?;
            if meta.is_dir() {
                walk(root, &path, out)?;
            } else {
                let bytes = std::fs::read(entry.path())?;
                let extent = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                out.push(StoreFile {
                    path,
                    len: meta.len(),
                    extent: extent as u64,
                });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Every directory under `root` (not `root` itself), sorted.
pub(crate) fn list_dirs(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = list_files(root)?
        .iter()
        .filter_map(|f| f.path.parent().map(Path::to_path_buf))
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    Ok(dirs)
}

/// The points a file of `len` bytes is cut at: 0, 1, `len - 1` and `cuts - 3` interior points
/// (the quarters first, then random ones), each below `len`, without repeats.
fn cut_points(len: u64, cuts: usize, rng: &mut StdRng) -> Vec<u64> {
    let mut points = vec![0, 1, len.saturating_sub(1)];
    for i in 0..cuts.saturating_sub(3) {
        let point = if i < 3 {
            len * (i as u64 + 1) / 4
        } else if len > 2 {
            rng.gen_range(1..len - 1)
        } else {
            0
        };
        points.push(point);
    }
    points.truncate(cuts);
    points.retain(|&p| p < len);
    points.sort_unstable();
    points.dedup();
    points
}

/// The campaign's cases for the pristine store at `root`, which holds `files` (`older`: the
/// files of the store as the first session left it): the control case; each class of files
/// rolled back to its older version, and all of sled's files together; every file deleted; every directory deleted; every file cut at `cuts` points; `flips`
/// single-bit flips. Half the flips go to a class of files chosen uniformly (`db`, `conf`,
/// `snap.*`, `blobs/*`, the store's own files), then to one of its files by size, before its
/// trailing zeros, and half of those to a byte that is not zero: so that the small files get
/// their share and the flips land where something was written. The other half go anywhere in
/// all the bytes, zeros included.
pub(crate) fn enumerate(
    root: &Path,
    files: &[StoreFile],
    older: &[StoreFile],
    dirs: &[PathBuf],
    cuts: usize,
    flips: usize,
    rng: &mut StdRng,
) -> std::io::Result<Vec<Damage>> {
    let mut cases = vec![Damage::None];
    let mut classes: Vec<String> = files.iter().chain(older).map(StoreFile::class).collect();
    classes.sort();
    classes.dedup();
    cases.extend(classes.into_iter().map(Damage::Rollback));
    cases.push(Damage::Rollback(SLED_FILES.to_owned()));
    cases.extend(files.iter().map(|f| Damage::Delete(f.path.clone())));
    cases.extend(dirs.iter().cloned().map(Damage::DeleteDir));
    for f in files {
        for at in cut_points(f.len, cuts, rng) {
            cases.push(Damage::Truncate {
                file: f.path.clone(),
                at,
                len: f.len,
            });
        }
    }
    let written: Vec<&StoreFile> = files.iter().filter(|f| f.extent > 0).collect();
    let mut classes: Vec<String> = written.iter().map(|f| f.class()).collect();
    classes.sort();
    classes.dedup();
    let all: Vec<&StoreFile> = files.iter().filter(|f| f.len > 0).collect();
    if all.is_empty() {
        return Ok(cases);
    }
    for i in 0..flips {
        let (file, offset) = if i % 2 == 0 && !classes.is_empty() {
            let class = &classes[rng.gen_range(0..classes.len())];
            let members: Vec<&StoreFile> = written
                .iter()
                .copied()
                .filter(|f| &f.class() == class)
                .collect();
            let file = by_size(&members, |f| f.extent, rng);
            let offset = if i % 4 == 0 {
                // A byte that is not zero, chosen uniformly among them.
                let bytes = std::fs::read(root.join(&file.path))?;
                let nonzero = bytes.iter().filter(|&&b| b != 0).count();
                let nth = rng.gen_range(0..nonzero);
                bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b != 0)
                    .nth(nth)
                    .map_or(0, |(at, _)| at as u64)
            } else {
                rng.gen_range(0..file.extent)
            };
            (file, offset)
        } else {
            let file = by_size(&all, |f| f.len, rng);
            (file, rng.gen_range(0..file.len))
        };
        cases.push(Damage::Flip {
            file: file.path.clone(),
            offset,
            bit: rng.gen_range(0..8),
        });
    }
    Ok(cases)
}

/// One of `files` (not empty, every size above 0), chosen with a chance proportional to its
/// `size`.
fn by_size<'a>(
    files: &[&'a StoreFile],
    size: impl Fn(&StoreFile) -> u64,
    rng: &mut StdRng,
) -> &'a StoreFile {
    let total: u64 = files.iter().map(|f| size(f)).sum();
    let mut at = rng.gen_range(0..total);
    for f in files {
        if at < size(f) {
            return f;
        }
        at -= size(f);
    }
    files[files.len() - 1]
}

/// Makes a directory readable by its owner only, as the store requires.
pub(crate) fn make_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path)?;
    #[cfg(unix)]
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    Ok(())
}

/// Copies the store directory `from` to `to` (which must not exist), directories 0700.
pub(crate) fn copy_store(from: &Path, to: &Path) -> std::io::Result<()> {
    make_private_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_store(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
