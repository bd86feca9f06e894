//! The store's files are private: the directories it creates or accepts are owner-only, an
//! existing directory that others own or can enter is refused unless the builder allows it,
//! and no symbolic link in or to the store's directory is followed at open.
#![cfg(unix)]

use std::fs::Permissions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use reliable_queue::{DirectoryProblem, Error, Store};

use crate::common;

use common::mode;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, Permissions::from_mode(mode)).expect("chmod");
}

/// A temporary directory and a path for a store in it (not created).
fn temp_store() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("store");
    (dir, path)
}

fn open_shared(path: &Path) -> reliable_queue::Result<Store> {
    Store::builder()
        .path(path)
        .allow_shared_directory(true)
        .open()
}

/// The process's effective uid, as the crate finds it.
fn euid() -> u32 {
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

/// Puts one item (large enough to be kept as a blob file) in queue "q" and checks it is
/// there after a reopen.
fn check_usable(open: impl Fn() -> reliable_queue::Result<Store>) {
    let store = open().expect("open");
    let q = store.blocking_queue::<String>("q").expect("queue");
    let before = q.blocking_count().expect("count");
    let mut tx = store.begin();
    q.enqueue(&mut tx, "x".repeat(200 << 10)).expect("enqueue");
    tx.blocking_commit().expect("commit");
    drop(q);
    store.blocking_close().expect("close");
    let store = open().expect("reopen");
    let q = store.blocking_queue::<String>("q").expect("queue");
    assert_eq!(q.blocking_count().expect("count"), before + 1);
}

#[test]
fn a_new_store_and_its_blobs_are_owner_only() {
    let (_guard, path) = temp_store();
    check_usable(|| Store::open(&path));
    assert_eq!(mode(&path), 0o700);
    assert_eq!(mode(&path.join("blobs")), 0o700);
    // The item above is large enough for sled to keep it as a blob file: it is in there.
    assert!(std::fs::read_dir(path.join("blobs")).unwrap().count() > 0);
}

#[test]
fn an_existing_0755_directory_is_refused_and_named() {
    let (_guard, path) = temp_store();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o755);
    let err = Store::open(&path).expect_err("a 0755 directory must be refused");
    match &err {
        Error::UnsafeDirectory {
            path: reported,
            problem: DirectoryProblem::OpenToOthers { mode },
        } => {
            assert_eq!(reported, &path);
            assert_eq!(*mode, 0o755);
        }
        other => panic!("expected UnsafeDirectory(OpenToOthers), got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("0755"), "{text}");
    assert!(text.contains("allow_shared_directory"), "{text}");
    // Nothing was created in it, and it was not changed.
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
    assert_eq!(mode(&path), 0o755);
}

#[test]
fn group_or_other_bits_alone_are_refused() {
    for bits in [0o701, 0o710, 0o740, 0o770, 0o707] {
        let (_guard, path) = temp_store();
        std::fs::create_dir(&path).unwrap();
        chmod(&path, bits);
        match Store::open(&path) {
            Err(Error::UnsafeDirectory {
                problem: DirectoryProblem::OpenToOthers { mode },
                ..
            }) => assert_eq!(mode, bits),
            other => panic!("mode {bits:o}: expected OpenToOthers, got {other:?}"),
        }
    }
}

#[test]
fn a_shared_directory_opens_when_allowed_and_is_left_as_it_is() {
    let (_guard, path) = temp_store();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o755);
    check_usable(|| open_shared(&path));
    assert_eq!(mode(&path), 0o755);
}

#[test]
fn an_existing_0700_directory_opens() {
    let (_guard, path) = temp_store();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o700);
    check_usable(|| Store::open(&path));
}

#[test]
fn a_wide_blob_directory_is_made_owner_only() {
    let (_guard, path) = temp_store();
    check_usable(|| Store::open(&path));
    // As a copy made with the default umask would leave it.
    chmod(&path.join("blobs"), 0o755);
    check_usable(|| Store::open(&path));
    assert_eq!(mode(&path.join("blobs")), 0o700);
}

/// sled's settings file written without its checksum (a kill in the first open): the repair
/// this crate makes leaves it owner-only.
#[test]
fn the_repaired_settings_file_is_owner_only() {
    let (_guard, path) = temp_store();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o700);
    let conf = path.join("conf");
    std::fs::write(
        &conf,
        "segment_size: 524288\nuse_compression: false\nversion: 0.34\n",
    )
    .unwrap();
    chmod(&conf, 0o644);
    check_usable(|| Store::open(&path));
    assert_eq!(mode(&conf), 0o600);
}

/// A file outside the store, with its content and modification time.
struct Victim {
    path: PathBuf,
    content: Vec<u8>,
    mtime: std::time::SystemTime,
}

impl Victim {
    fn new(dir: &Path) -> Victim {
        let path = dir.join("victim");
        let content = b"root-only secrets\n".to_vec();
        std::fs::write(&path, &content).unwrap();
        chmod(&path, 0o600);
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        Victim {
            path,
            content,
            mtime,
        }
    }

    fn assert_unchanged(&self) {
        assert_eq!(std::fs::read(&self.path).unwrap(), self.content);
        let meta = std::fs::metadata(&self.path).unwrap();
        assert_eq!(meta.modified().unwrap(), self.mtime);
        assert_eq!(meta.len(), self.content.len() as u64);
    }
}

fn expect_symlink(result: reliable_queue::Result<Store>, link: &Path) {
    match result {
        Err(
            ref err @ Error::UnsafeDirectory {
                ref path,
                problem: DirectoryProblem::Symlink,
            },
        ) => {
            assert_eq!(path, link);
            let text = err.to_string();
            assert!(text.contains(&link.display().to_string()), "{text}");
            assert!(text.contains("symbolic link"), "{text}");
        }
        other => panic!("{link:?}: expected UnsafeDirectory(Symlink), got {other:?}"),
    }
}

#[test]
fn a_planted_db_symlink_is_refused_and_its_target_untouched() {
    let (guard, path) = temp_store();
    let victim = Victim::new(guard.path());
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o700);
    let link = path.join("db");
    std::os::unix::fs::symlink(&victim.path, &link).unwrap();
    expect_symlink(Store::open(&path), &link);
    expect_symlink(open_shared(&path), &link);
    victim.assert_unchanged();
    // Nothing was created next to the link.
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 1);
}

#[test]
fn every_sled_file_planted_as_a_symlink_is_refused() {
    for name in [
        "db",
        "conf",
        "snap.0000000000000000",
        "snap.00000000000001F0.generating",
    ] {
        let (guard, path) = temp_store();
        let victim = Victim::new(guard.path());
        std::fs::create_dir(&path).unwrap();
        chmod(&path, 0o700);
        let link = path.join(name);
        std::os::unix::fs::symlink(&victim.path, &link).unwrap();
        expect_symlink(Store::open(&path), &link);
        victim.assert_unchanged();
    }
    // `blobs` itself pointing at a directory elsewhere.
    let (guard, path) = temp_store();
    let elsewhere = guard.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o700);
    let link = path.join("blobs");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    expect_symlink(Store::open(&path), &link);
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn a_symlink_among_the_blob_files_is_refused() {
    let (guard, path) = temp_store();
    check_usable(|| Store::open(&path));
    let victim = Victim::new(guard.path());
    let link = path.join("blobs").join("999999");
    std::os::unix::fs::symlink(&victim.path, &link).unwrap();
    expect_symlink(Store::open(&path), &link);
    victim.assert_unchanged();
}

#[test]
fn a_store_path_that_is_a_symlink_is_refused() {
    let (guard, path) = temp_store();
    let real = guard.path().join("real");
    std::fs::create_dir(&real).unwrap();
    chmod(&real, 0o700);
    std::os::unix::fs::symlink(&real, &path).unwrap();
    expect_symlink(Store::open(&path), &path);
    expect_symlink(open_shared(&path), &path);
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
    // A dangling link is refused too, and nothing is created where it points.
    let dangling = guard.path().join("dangling");
    std::os::unix::fs::symlink(guard.path().join("nowhere"), &dangling).unwrap();
    expect_symlink(Store::open(&dangling), &dangling);
    assert!(!guard.path().join("nowhere").exists());
    // The real path opens.
    check_usable(|| Store::open(&real));
}

#[test]
fn a_symlink_earlier_in_the_path_is_followed() {
    let (guard, _) = temp_store();
    let real = guard.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = guard.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    check_usable(|| Store::open(link.join("store")));
    assert_eq!(mode(&real.join("store")), 0o700);
}

#[test]
fn a_store_path_that_is_a_file_is_a_typed_error() {
    let (_guard, path) = temp_store();
    std::fs::write(&path, b"not a store").unwrap();
    chmod(&path, 0o600);
    for open in [Store::open(&path), open_shared(&path)] {
        match open {
            Err(
                ref err @ Error::UnsafeDirectory {
                    path: ref reported,
                    problem: DirectoryProblem::NotADirectory,
                },
            ) => {
                assert_eq!(reported, &path);
                assert!(err.to_string().contains(&path.display().to_string()));
            }
            other => panic!("expected UnsafeDirectory(NotADirectory), got {other:?}"),
        }
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"not a store");
}

#[test]
fn a_directory_owned_by_another_user_is_refused() {
    if euid() != 0 {
        println!("a_directory_owned_by_another_user_is_refused NOT RUN: needs root");
        return;
    }
    let (_guard, path) = temp_store();
    std::fs::create_dir(&path).unwrap();
    chmod(&path, 0o700);
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let err = Store::open(&path).expect_err("another user's directory must be refused");
    match &err {
        Error::UnsafeDirectory {
            path: reported,
            problem: DirectoryProblem::OwnedByOther { owner, process },
        } => {
            assert_eq!(reported, &path);
            assert_eq!((*owner, *process), (65534, 0));
        }
        other => panic!("expected UnsafeDirectory(OwnedByOther), got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("uid 65534"), "{text}");
    assert!(text.contains("(uid 0)"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
    // Allowed, root opens it, and leaves its owner alone.
    check_usable(|| open_shared(&path));
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
}

#[test]
fn the_error_stays_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Error>();
    check::<DirectoryProblem>();
}
