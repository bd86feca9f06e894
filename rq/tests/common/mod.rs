//! What the `rq` tests share: running the binary, building stores with known contents, and
//! reading a store back item by item.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reliable_queue::{ItemState, RawItem, RetryPolicy, Store};

#[path = "../../../tests/common/raw_sled.rs"]
mod raw_sled;
pub use raw_sled::open_raw_sled;

/// `rq` with `args` and these environment variables set, stdin closed (no terminal), to run
/// or spawn. The store variables of the caller's environment are not passed on.
pub fn rq_command(args: &[&str], vars: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rq"));
    command
        .args(args)
        .env_remove("RQ_STORE")
        .env_remove("RQ_POSTGRES_URL")
        .env_remove("RQ_REDIS_URL")
        .env_remove("RQ_URL")
        .env_remove("RQ_ADMIN_TOKEN")
        .envs(vars.iter().copied())
        .stdin(Stdio::null());
    command
}

/// Runs `rq` with `args`, stdin closed (no terminal), and returns its output. The store
/// variables of the caller's environment are not passed on.
pub fn rq(args: &[&str]) -> Output {
    rq_with(args, &[])
}

/// [`rq`] with these environment variables set.
pub fn rq_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    rq_command(args, vars).output().expect("run rq")
}

/// [`rq`], given at most `limit`: one still running then is killed (SIGKILL) and the test
/// fails, so that a hang fails clearly instead of stalling the test.
pub fn rq_within(args: &[&str], limit: Duration) -> Output {
    let child = rq_command(args, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rq");
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(out) = finished.recv_timeout(limit) else {
        let _ = Command::new("kill").args(["-9", &pid]).status();
        panic!("rq {args:?} still runs after {limit:?}");
    };
    out.expect("run rq")
}

/// `base` (a store's options) followed by `more` (a command and its arguments).
pub fn with<'a>(mut base: Vec<&'a str>, more: &[&'a str]) -> Vec<&'a str> {
    base.extend_from_slice(more);
    base
}

/// A path as an argument.
pub fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `rq` with `args`, checks that it failed (with exit code `code` when given) and that
/// its standard error says `says`; returns its output.
pub fn fails(args: &[&str], code: Option<i32>, says: &str) -> Output {
    let out = rq(args);
    match code {
        Some(code) => assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stdout(&out)),
        None => assert!(
            !out.status.success(),
            "{args:?} succeeded: {}",
            stdout(&out)
        ),
    }
    assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    out
}

/// Runs `rq` and expects success; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = rq(args);
    assert!(
        out.status.success(),
        "rq {args:?} failed: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
    stdout(&out)
}

/// Runs `rq`, expects exit code `code` and JSON on stdout.
pub fn json_exit(args: &[&str], code: i32) -> serde_json::Value {
    let out = rq(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "rq {args:?}: {}",
        stderr(&out)
    );
    let text = stdout(&out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("rq {args:?} printed {text:?}: {e}"))
}

pub fn json(args: &[&str]) -> serde_json::Value {
    let text = ok(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("rq {args:?} printed {text:?}: {e}"))
}

/// A store with known contents: queue `jobs` with 3 ready text items (the first with 2
/// attempts behind it), one delayed an hour, and 2 dead letters (a byte item and a text);
/// queue `numbers` with 5 `u64`s (shown as hex) and a policy of 7 attempts.
pub fn fill(store: &Store) {
    let jobs = store.blocking_queue::<String>("jobs").unwrap();
    let numbers = store.blocking_queue::<u64>("numbers").unwrap();
    let bytes = store.blocking_queue::<Vec<u8>>("jobs").unwrap();
    numbers
        .blocking_set_retry_policy(RetryPolicy::default().max_attempts(7))
        .unwrap();
    jobs.blocking_set_retry_policy(RetryPolicy::default().max_attempts(1))
        .unwrap();
    let mut tx = store.begin();
    bytes.enqueue(&mut tx, vec![0xffu8, 0x00, 0x7f]).unwrap();
    tx.blocking_commit().unwrap();
    let mut tx = store.begin();
    for text in ["poison", "first", "second", "third"] {
        jobs.enqueue(&mut tx, text.to_owned()).unwrap();
    }
    jobs.enqueue_after(&mut tx, "later".to_owned(), Duration::from_secs(3600))
        .unwrap();
    for n in 0..5u64 {
        numbers.enqueue(&mut tx, 1000 + n).unwrap();
    }
    tx.blocking_commit().unwrap();
    let lease = bytes.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(lease.item(), &vec![0xffu8, 0x00, 0x7f]);
    lease.blocking_fail("bad bytes").unwrap();
    let lease = jobs.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(lease.item(), "poison");
    lease.blocking_fail("cannot parse").unwrap();
    for attempt in 1..=2 {
        let lease = jobs.blocking_lease(Duration::from_secs(60)).unwrap();
        assert_eq!((lease.item().as_str(), lease.attempt()), ("first", attempt));
        lease.blocking_release(Duration::ZERO).unwrap();
    }
}

/// One item of a store as a comparison sees it (ids differ between stores; order, bytes,
/// states, attempts and times must not).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub queue: String,
    pub kind: &'static str,
    pub bytes: Vec<u8>,
    pub attempts: u32,
    /// Delayed items: when due (ms); dead letters: their reason's length is not here.
    pub due_ms: Option<u64>,
    pub enqueued_ms: Option<u64>,
    pub reason: Option<String>,
}

/// `t` in ms since the epoch, as exports and `--json` rows give times.
pub fn ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Every item and dead letter of every queue of `store` (but import bookkeeping), sorted.
pub fn contents(store: &Store) -> Vec<Seen> {
    let mut all = Vec::new();
    for name in store.blocking_list_queues().unwrap() {
        if name.starts_with("rq.import.") {
            continue;
        }
        let q = store.blocking_queue::<RawItem>(&name).unwrap();
        for item in q.blocking_browse(None, 100_000).unwrap() {
            let (kind, due_ms) = match item.state {
                ItemState::Ready => ("ready", None),
                ItemState::Delayed { until } => ("delayed", Some(ms(until))),
                ItemState::Leased { until, .. } => ("delayed", Some(ms(until))),
                _ => ("other", None),
            };
            all.push(Seen {
                queue: name.clone(),
                kind,
                bytes: item.item.envelope().to_vec(),
                attempts: item.attempts,
                due_ms,
                enqueued_ms: item.enqueued_at.map(ms),
                reason: None,
            });
        }
        for d in q.blocking_dead_letters(None, 100_000).unwrap() {
            all.push(Seen {
                queue: name.clone(),
                kind: "dead",
                bytes: d.item.envelope().to_vec(),
                attempts: d.attempts,
                due_ms: None,
                enqueued_ms: d.enqueued_at.map(ms),
                reason: Some(d.reason),
            });
        }
    }
    all.sort();
    all
}

/// An export of queue `bulk` holding the `u64`s `0..n`, made from a sled store in `dir`.
pub fn bulk_export(dir: &Path, n: u64) -> std::path::PathBuf {
    let sled_path = dir.join("big");
    let sled = Store::open(&sled_path).unwrap();
    let q = sled.blocking_queue::<u64>("bulk").unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut tx = sled.begin();
        for i in chunk {
            q.enqueue(&mut tx, *i).unwrap();
        }
        tx.blocking_commit().unwrap();
    }
    sled.blocking_close().unwrap();
    let file = dir.join("bulk.jsonl");
    ok(&["--store", s(&sled_path), "export", s(&file)]);
    file
}

/// The lines of an export file as JSON values.
pub fn export_lines(file: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Writes `lines` as an export file.
pub fn write_lines(file: &Path, lines: &[serde_json::Value]) {
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(file, text.join("\n") + "\n").unwrap();
}

/// Every file under `dir` with its bytes, for checking that a command wrote nothing.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                files.push((
                    path.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&path).unwrap(),
                ));
            }
        }
    }
    files.sort();
    files
}

/// The fixed part of a log record's header (see `src/engine/sled/record.rs`).
const RECORD_FIXED: usize = 24;

/// What to do to the one log record that holds a marker.
pub enum RecordDamage {
    /// Flip bits in its body: its checksum fails, the open sets it aside.
    FlipBody,
    /// Delete it from the log: the marks say it was durable, so it is missing.
    Remove,
}

/// Damages the one record of the closed store at `path` whose bytes contain `marker`;
/// returns its sequence number.
pub fn damage_record(path: &Path, marker: &[u8], damage: RecordDamage) -> u64 {
    let db = open_raw_sled(path);
    let log = db.open_tree("log").unwrap();
    let mut found: Vec<(u64, Vec<u8>)> = log
        .iter()
        .map(|kv| kv.unwrap())
        .filter(|(_, v)| v.windows(marker.len()).any(|w| w == marker))
        .map(|(k, v)| {
            (
                u64::from_be_bytes(k.as_ref().try_into().unwrap()),
                v.to_vec(),
            )
        })
        .collect();
    assert_eq!(found.len(), 1, "exactly one record holds the marker");
    let (seq, mut bytes) = found.pop().unwrap();
    match damage {
        RecordDamage::FlipBody => {
            let header_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
            bytes[RECORD_FIXED + header_len + 7] ^= 0x5a;
            log.insert(seq.to_be_bytes(), bytes).unwrap();
        }
        RecordDamage::Remove => {
            log.remove(seq.to_be_bytes()).unwrap();
        }
    }
    db.flush().unwrap();
    seq
}

/// Two `rq import FILE --batch 20` runs started at once on the store `store` names (its
/// arguments): at least one finishes, and one that does not stopped because the other held
/// the import's mark. `what` names the run in the messages.
pub fn import_twice_at_once(store: &[&str], file: &Path, what: &str) {
    let spawn = || {
        rq_command(
            &with(store.to_vec(), &["import", s(file), "--batch", "20"]),
            &[],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    assert!(
        outs.iter().any(|o| o.status.success()),
        "{what}: neither import finished: {:?}",
        outs.iter().map(stderr).collect::<Vec<_>>()
    );
    for out in outs.iter().filter(|o| !o.status.success()) {
        assert!(
            stderr(out).contains("another import of this export is running"),
            "{what}: {}",
            stderr(out)
        );
    }
}
