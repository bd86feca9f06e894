//! Errors a person can act on: each message says what happened and where (the path and the
//! cause), for a store path that is a regular file, a permission problem, a missing file,
//! damaged files of the storage engine, and an item whose `Serialize` refuses with a message of
//! its own.

use crate::common;
use crate::{engine_case, once_case};

use std::error::Error as _;
use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::process::Command;

use common::engines::Engine;
use common::temp_dir;
use reliable_queue::{Error, Store};
use serde::ser::{Error as _, Serializer};
use serde::{Deserialize, Serialize};

/// Makes a store in `path` holding a few items, large ones included (which sled keeps in
/// files of their own in `blobs/`), closes it, then opens and closes it once more, so that
/// sled has written its snapshot of the log too.
fn make_store(path: &Path) {
    for round in 0..2u8 {
        let store = Store::open(path).expect("open the store");
        let queue = store.blocking_queue::<Vec<u8>>("q").expect("queue");
        let mut tx = store.begin();
        queue.enqueue(&mut tx, vec![round; 10]).expect("enqueue");
        queue
            .enqueue(&mut tx, vec![round; 300_000])
            .expect("enqueue");
        tx.blocking_commit().expect("commit");
        store.blocking_close().expect("close");
    }
}

/// The error of opening the store in `path`, which must fail.
fn open_error(path: &Path) -> Error {
    match Store::open(path) {
        Ok(_) => panic!("{path:?}: the store opened"),
        Err(e) => e,
    }
}

/// `e`'s message and the messages of its sources, one per line.
fn chain(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push('\n');
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Checks that `e`'s message names `path` and says `cause`.
fn assert_names(e: &Error, path: &Path, cause: &str) {
    let message = e.to_string();
    println!("{message}");
    let path = path.display().to_string();
    assert!(
        message.contains(&path),
        "the message does not name {path}: {message:?} ({e:?})"
    );
    assert!(
        message.contains(cause),
        "the message does not say {cause:?}: {message:?} ({e:?})"
    );
}

fn a_store_path_that_is_a_regular_file_is_named() {
    let (_guard, path) = temp_dir();
    std::fs::write(&path, b"a file").unwrap();
    let e = open_error(&path);
    assert!(matches!(e, Error::UnsafeDirectory { .. }), "{e:?}");
    assert_names(&e, &path, "is not a directory");
    assert_eq!(std::fs::read(&path).unwrap(), b"a file");
}

/// Set in the child process that runs the permission case as an unprivileged user: the
/// directory (owned by that user) in which it makes its store.
#[cfg(unix)]
const CHILD_DIR: &str = "RQ_MESSAGES_PERMISSION_DIR";

/// What the child prints before its error's message, on a line of its own.
#[cfg(unix)]
const MESSAGE_LINE: &str = "permission-case message: ";

/// The unprivileged user (and group) the child runs as: `nobody` on most systems.
#[cfg(unix)]
const NOBODY: u32 = 65534;

/// The process's effective user id (the owner of `/proc/self`, as the crate itself finds it).
#[cfg(unix)]
fn effective_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// A store in which, one at a time, a file or directory the storage engine opens at startup
/// is made inaccessible: opening it fails with a storage error that names that file (or
/// directory) and says "Permission denied", and opens again once the permission is back.
/// Returns each path and the message that named it.
#[cfg(unix)]
fn permission_case(dir: &Path) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("store");
    make_store(&path);
    let store = path.canonicalize().unwrap();
    let newest = |dir: &Path, prefix: &str| {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .max()
            .unwrap_or_else(|| panic!("no {prefix}* in {dir:?}"))
    };
    let mut messages = Vec::new();
    // What sled opens: its log for writing, its snapshot and its large values for reading,
    // the directory to write a new snapshot in. Each found when its turn comes: a reopen may
    // write a new snapshot.
    let cases: [(&str, &dyn Fn() -> PathBuf, u32, u32); 4] = [
        ("the log", &|| store.join("db"), 0o400, 0o600),
        ("the snapshot", &|| newest(&store, "snap."), 0o000, 0o600),
        (
            "a large value",
            &|| newest(&store.join("blobs"), ""),
            0o000,
            0o600,
        ),
        ("the directory", &|| store.clone(), 0o500, 0o700),
    ];
    for (what, target, mode, back) in cases {
        let target = target();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = open_error(&path);
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(back)).unwrap();
        let named = match &e {
            Error::Storage { path: Some(p), .. } => p.clone(),
            other => panic!("{what}: expected a storage error with a path, got {other:?}"),
        };
        // The directory: named itself, or the file that could not be created in it.
        let dir_case = target == store && named.parent() == Some(&*store);
        assert!(named == target || dir_case, "{what}: {e:?}");
        assert_names(&e, &named, "Permission denied");
        // The store opens again once the permission is back.
        Store::open(&path)
            .unwrap_or_else(|e| panic!("{what}: open after the fix: {e:?}"))
            .blocking_close()
            .expect("close");
        messages.push((named, e.to_string()));
    }
    messages
}

/// root passes every permission check, and the tests run as root in CI: as root, the case runs
/// in a child process of this test binary under an unprivileged uid (`setpriv`), in a
/// directory that user owns. When that cannot be arranged the test says "skipped" and why.
#[cfg(unix)]
fn a_permission_problem_names_the_file_and_the_cause() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        // The child: the case itself, as the unprivileged user.
        assert_ne!(effective_uid(), Some(0), "the child must not run as root");
        for (path, message) in permission_case(Path::new(&dir)) {
            println!("\n{MESSAGE_LINE}{}\t{message}", path.display());
        }
        return;
    }
    match effective_uid() {
        Some(0) => {}
        Some(_) => {
            // Not root: permissions apply to this process.
            permission_case(tempfile::tempdir().unwrap().path());
            return;
        }
        None => {
            println!("skipped: no /proc to tell this process's user id");
            return;
        }
    }
    let has_setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_setpriv {
        println!("skipped: running as root and `setpriv` is not available to drop to uid {NOBODY}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(&exe)
        .args([
            "--exact",
            "messages::a_permission_problem_names_the_file_and_the_cause",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .output()
        .expect("run setpriv");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stdout.contains("running 1 test") {
        // The test binary did not start as that user (it cannot reach the binary, say).
        println!(
            "skipped: cannot run {} as uid {NOBODY}: {}\n{stderr}",
            exe.display(),
            output.status
        );
        return;
    }
    assert!(
        output.status.success(),
        "the permission case failed as uid {NOBODY}:\n{stdout}\n{stderr}"
    );
    // The parent checks the messages too: a child that printed none, or other ones, fails.
    let messages: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix(MESSAGE_LINE)?.split_once('\t'))
        .collect();
    assert_eq!(messages.len(), 4, "{stdout}\n{stderr}");
    let store = dir.path().canonicalize().unwrap().join("store");
    for (path, message) in messages {
        assert!(path.starts_with(&*store.to_string_lossy()), "{path}");
        assert!(
            message.starts_with(&format!("storage failure in {path}: "))
                && message.contains("Permission denied"),
            "{message:?}"
        );
        println!("as uid {NOBODY}: {message}");
    }
    assert!(stdout.contains(&format!("{}\t", store.join("db").display())));
}

/// sled's log file deleted: refused before sled touches anything, so putting the file back
/// is enough.
fn a_missing_log_file_is_named() {
    let (_guard, path) = temp_dir();
    make_store(&path);
    let db = path.canonicalize().unwrap().join("db");
    let moved = path.parent().unwrap().join("db.moved");
    std::fs::rename(&db, &moved).unwrap();
    for _ in 0..2 {
        let e = open_error(&path);
        assert!(
            matches!(&e, Error::Damaged { path, .. } if *path == db),
            "{e:?}"
        );
        assert_names(&e, &db, "log file is missing");
        assert!(!db.exists(), "nothing was created in its place");
    }
    std::fs::rename(&moved, &db).unwrap();
    let store = Store::open(&path).expect("open with the file back");
    let queue = store.blocking_queue::<Vec<u8>>("q").unwrap();
    assert_eq!(queue.blocking_count().unwrap(), 4);
    store.blocking_close().unwrap();
}

/// sled's log file cut short: empty, shorter than an offset sled's index points at, or cut
/// inside its first records (where sled reports corruption without a place).
fn a_log_file_cut_short_is_named() {
    let (_guard, path) = temp_dir();
    make_store(&path);
    let db = path.canonicalize().unwrap().join("db");
    let whole = std::fs::read(&db).unwrap();
    for (len, cause) in [
        (0, "log file is empty, though its snapshot `snap."),
        (
            1,
            "log file is 1 byte long, but its index refers to offset ",
        ),
        (100, "found its log file damaged"),
    ] {
        std::fs::write(&db, &whole[..len]).unwrap();
        let e = open_error(&path);
        assert!(
            matches!(&e, Error::Damaged { path, .. } if *path == db),
            "{len}: {e:?}"
        );
        assert_names(&e, &db, cause);
    }
    std::fs::write(&db, &whole).unwrap();
}

/// Flips bit `bit` of byte `at` of `file`.
fn flip(file: &Path, at: usize, bit: u8) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[at] ^= 1 << bit;
    std::fs::write(file, bytes).unwrap();
}

/// Every single bit flipped in sled's settings file, the text or its checksum, is reported as
/// damage of that file. (sled itself would report most of them as corruption without a place,
/// some as a database "created using a sled version earlier than 0.29" or as settings changed
/// across restarts, and would open the store as if nothing happened for a flip in the
/// checksum.)
fn a_flipped_bit_in_the_storage_engines_settings_is_damage_of_conf() {
    let (_guard, path) = temp_dir();
    make_store(&path);
    let conf = path.canonicalize().unwrap().join("conf");
    let len = std::fs::metadata(&conf).unwrap().len();
    let len = usize::try_from(len).unwrap();
    for at in 0..len {
        for bit in 0..8 {
            flip(&conf, at, bit);
            let e = open_error(&path);
            assert!(
                matches!(&e, Error::Damaged { path, .. } if *path == conf),
                "byte {at} bit {bit}: {e:?}"
            );
            assert_names(&e, &conf, "checksum does not match its contents");
            flip(&conf, at, bit);
        }
    }
    let store = Store::open(&path).expect("open once conf is back");
    let queue = store.blocking_queue::<Vec<u8>>("q").unwrap();
    assert_eq!(queue.blocking_count().unwrap(), 4);
    store.blocking_close().unwrap();
}

/// A flipped bit in sled's snapshot of its log names the snapshot file.
fn a_flipped_bit_in_the_storage_engines_snapshot_names_it() {
    let (_guard, path) = temp_dir();
    make_store(&path);
    let dir = path.canonicalize().unwrap();
    let snapshot: PathBuf = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
        })
        .max()
        .expect("sled wrote a snapshot");
    flip(&snapshot, 3, 0);
    let e = open_error(&path);
    assert!(
        matches!(&e, Error::Damaged { path, .. } if *path == snapshot),
        "{e:?}"
    );
    assert_names(&e, &snapshot, "checksum does not match its contents");
}

/// An item whose `Serialize` refuses with a message of its own.
#[derive(Deserialize)]
struct Widget;

impl Serialize for Widget {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(S::Error::custom("no widgets on Tuesdays"))
    }
}

/// On every engine of the conformance suite (`tests/common/engines.rs`).
fn the_items_own_serialization_message_reaches_the_user(engine: &'static Engine) {
    {
        let at = engine.store();
        let store = &at.store;
        let queue = store.blocking_queue::<Widget>("widgets").unwrap();
        let nested = store
            .blocking_queue::<Vec<Option<Widget>>>("nested")
            .unwrap();
        let mut tx = store.begin();
        let e = queue.enqueue(&mut tx, Widget).unwrap_err();
        assert!(matches!(e, Error::Serialize { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "item for queue \"widgets\" could not be serialized: no widgets on Tuesdays"
        );
        assert_eq!(
            e.source().map(ToString::to_string).as_deref(),
            Some("no widgets on Tuesdays")
        );
        let e = nested
            .enqueue(&mut tx, vec![None, Some(Widget)])
            .unwrap_err();
        assert!(chain(&e).contains("no widgets on Tuesdays"), "{e:?}");
        assert!(e.to_string().contains("\"nested\""), "{e}");
        assert_eq!(tx.enqueued(), 0);
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![
        engine_case!(the_items_own_serialization_message_reaches_the_user),
        once_case!(a_store_path_that_is_a_regular_file_is_named),
        #[cfg(unix)]
        once_case!(a_permission_problem_names_the_file_and_the_cause),
        once_case!(a_missing_log_file_is_named),
        once_case!(a_log_file_cut_short_is_named),
        once_case!(a_flipped_bit_in_the_storage_engines_settings_is_damage_of_conf),
        once_case!(a_flipped_bit_in_the_storage_engines_snapshot_names_it),
    ]
}
