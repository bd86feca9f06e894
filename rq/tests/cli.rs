//! `rq` on embedded (sled) stores the tests build: each command's output checked against
//! the store's known contents, a store open in another process refused, a damaged store found
//! by `verify` (which never writes to the store it checks), and an export imported into a
//! fresh store compared item by item, twice (a second import takes nothing), and `--url`
//! through the dashboard of a store this process keeps open.

mod common;

use std::path::{Path, PathBuf};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    contents, damage_record, export_lines, fails, fill, json, json_exit, ok, rq, rq_with, snapshot,
    stderr, stdout, write_lines, RecordDamage,
};
use reliable_queue::Store;

/// A closed store with [`fill`]'s contents, in a temporary directory.
fn filled() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::open(&path).unwrap();
    fill(&store);
    store.blocking_close().unwrap();
    (dir, path)
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_store_on_the_command_line_wins_over_the_other_engines_variable() {
    let (_dir, path) = filled();
    // An unreachable URL: were it used, the command would fail.
    let elsewhere = [("RQ_POSTGRES_URL", "host=/nonexistent dbname=none")];
    let out = rq_with(&["--store", s(&path), "stats", "--json"], &elsewhere);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()[0]["queue"],
        "jobs"
    );
    // The directory from the environment is used when nothing else names a store.
    let out = rq_with(&["stats", "--json"], &[("RQ_STORE", s(&path))]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Two stores named the same way is a usage error.
    let both = rq(&[
        "--store",
        s(&path),
        "--postgres",
        "host=/nonexistent",
        "stats",
    ]);
    assert_eq!(both.status.code(), Some(2));
    assert!(stderr(&both).contains("give one"), "{}", stderr(&both));
    let both = rq_with(
        &["stats"],
        &[
            ("RQ_STORE", s(&path)),
            ("RQ_POSTGRES_URL", "host=/nonexistent"),
        ],
    );
    assert_eq!(both.status.code(), Some(2));
    assert!(stderr(&both).contains("both set"), "{}", stderr(&both));
}

#[test]
fn stats_counts_every_state_of_every_queue() {
    let (_dir, path) = filled();
    let rows = json(&["--store", s(&path), "stats", "--json"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let jobs = &rows[0];
    assert_eq!(jobs["queue"], "jobs");
    assert_eq!(
        (
            &jobs["ready"],
            &jobs["delayed"],
            &jobs["leased"],
            &jobs["held"],
            &jobs["dead"]
        ),
        (&3.into(), &1.into(), &0.into(), &0.into(), &2.into())
    );
    assert!(jobs["oldest_ms"].as_u64().is_some());
    assert_eq!(
        (&rows[1]["queue"], &rows[1]["ready"]),
        (&"numbers".into(), &5.into())
    );

    let table = ok(&["--store", s(&path), "stats"]);
    let line = table.lines().find(|l| l.starts_with("jobs")).unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..6], ["jobs", "3", "1", "0", "0", "2"], "{table}");

    let watched = ok(&[
        "--store",
        s(&path),
        "stats",
        "--watch",
        "--interval",
        "0.1",
        "--count",
        "2",
    ]);
    assert_eq!(watched.matches("numbers").count(), 2, "{watched}");
}

#[test]
fn browse_shows_text_and_hex_and_filters_by_state() {
    let (_dir, path) = filled();
    let items = json(&["--store", s(&path), "browse", "jobs", "--json"]);
    let items = items.as_array().unwrap();
    let texts: Vec<&str> = items.iter().map(|i| i["text"].as_str().unwrap()).collect();
    // In id order: "first" was released twice, each time under a new id.
    assert_eq!(texts, ["second", "third", "later", "first"]);
    assert_eq!(items[3]["attempts"], 2);
    assert_eq!(items[2]["state"], "delayed");

    let delayed = json(&[
        "--store",
        s(&path),
        "browse",
        "jobs",
        "--state",
        "delayed",
        "--json",
    ]);
    assert_eq!(delayed.as_array().unwrap().len(), 1);
    let two = json(&[
        "--store",
        s(&path),
        "browse",
        "jobs",
        "--limit",
        "2",
        "--json",
    ]);
    assert_eq!(two.as_array().unwrap().len(), 2);

    let numbers = ok(&["--store", s(&path), "browse", "numbers"]);
    // 1000 as a postcard varint: e8 07.
    assert!(numbers.contains("0xe807"), "{numbers}");
    fails(
        &["--store", s(&path), "browse", "nope"],
        None,
        "no queue \"nope\"",
    );
}

#[test]
fn dead_letters_list_replay_and_purge_ask_first() {
    let (_dir, path) = filled();
    let dead = json(&[
        "--store",
        s(&path),
        "dead-letters",
        "list",
        "jobs",
        "--json",
    ]);
    let dead = dead.as_array().unwrap();
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0]["reason"], "bad bytes");
    assert_eq!(dead[0]["hex"], "03ff007f");
    assert_eq!(dead[1]["text"], "poison");
    let listed = ok(&["--store", s(&path), "dead-letters", "list", "jobs"]);
    assert!(
        listed.contains("cannot parse") && listed.contains("0x03ff007f"),
        "{listed}"
    );

    // No terminal to ask on, no --yes: refused, nothing changed.
    let refused = rq(&[
        "--store",
        s(&path),
        "dead-letters",
        "replay",
        "jobs",
        "--all",
    ]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    let purge = rq(&[
        "--store",
        s(&path),
        "dead-letters",
        "purge",
        "jobs",
        "--all",
    ]);
    assert!(!purge.status.success());
    let stats = json(&["--store", s(&path), "stats", "--json"]);
    assert_eq!(stats[0]["dead"], 2);

    let id = dead[1]["id"].as_u64().unwrap().to_string();
    let replayed = ok(&[
        "--store",
        s(&path),
        "dead-letters",
        "replay",
        "jobs",
        "--ids",
        &id,
        "--reset-attempts",
        "--yes",
    ]);
    assert!(replayed.contains("replayed 1"), "{replayed}");
    let items = json(&[
        "--store",
        s(&path),
        "browse",
        "jobs",
        "--state",
        "ready",
        "--json",
    ]);
    let last = items.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&last["text"], &last["attempts"]),
        (&"poison".into(), &0.into())
    );
    let purged = ok(&[
        "--store",
        s(&path),
        "dead-letters",
        "purge",
        "jobs",
        "--first",
        "5",
        "--yes",
    ]);
    assert!(purged.contains("purged 1"), "{purged}");
    let stats = json(&["--store", s(&path), "stats", "--json"]);
    assert_eq!(
        (&stats[0]["dead"], &stats[0]["ready"]),
        (&0.into(), &4.into())
    );
    // Nothing left: nothing to ask about, even without a terminal or --yes.
    for command in ["replay", "purge"] {
        let nothing = ok(&[
            "--store",
            s(&path),
            "dead-letters",
            command,
            "jobs",
            "--all",
        ]);
        assert!(nothing.contains("no dead letters"), "{nothing}");
    }
}

#[test]
fn a_store_open_in_another_process_is_refused_clearly() {
    let (_dir, path) = filled();
    // This process holds the store open; rq is another process.
    let store = Store::open(&path).unwrap();
    for args in [vec!["stats"], vec!["verify"]] {
        let mut all = vec!["--store", s(&path)];
        all.extend(args);
        let out = rq(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}");
        assert!(
            stderr(&out).contains("open in another process"),
            "{all:?}: {}",
            stderr(&out)
        );
    }
    store.blocking_close().unwrap();
    let missing = rq(&["--store", "/nonexistent/rq-store", "stats"]);
    assert!(
        stderr(&missing).contains("no store at"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn verify_passes_a_healthy_store_and_fails_a_damaged_one_without_writing_to_either() {
    let (_dir, path) = filled();
    let before = snapshot(&path);
    let out = rq(&["--store", s(&path), "verify"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("healthy"), "{}", stdout(&out));
    let report = json(&["--store", s(&path), "verify", "--json"]);
    assert_eq!(
        (&report["queues"], &report["items"], &report["dead_letters"]),
        (&2.into(), &9.into(), &2.into())
    );
    assert_eq!(snapshot(&path), before, "verify wrote to the store");

    // Damage: the log file cut in half.
    let db = path.join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    file.set_len(len / 2).unwrap();
    drop(file);
    let damaged = snapshot(&path);
    let out = rq(&["--store", s(&path), "verify"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("DAMAGED"), "{}", stdout(&out));
    assert_eq!(
        snapshot(&path),
        damaged,
        "verify wrote to the damaged store"
    );
}

#[test]
fn an_export_imported_into_a_fresh_store_is_the_same_item_for_item_and_twice_is_once() {
    let (dir, path) = filled();
    let file = dir.path().join("export.jsonl");
    let summary = json(&["--store", s(&path), "export", s(&file), "--json"]);
    assert_eq!(
        (&summary["queues"], &summary["items"], &summary["dead"]),
        (&2.into(), &9.into(), &2.into())
    );

    let copy = dir.path().join("copy");
    let first = json(&["--store", s(&copy), "import", s(&file), "--json"]);
    assert_eq!(
        (&first["items"], &first["dead"], &first["skipped"]),
        (&9.into(), &2.into(), &0.into())
    );
    let again = json(&["--store", s(&copy), "import", s(&file), "--json"]);
    assert_eq!(
        (&again["items"], &again["dead"]),
        (&0.into(), &0.into()),
        "a finished import takes nothing"
    );

    let original = Store::open(&path).unwrap();
    let imported = Store::open(&copy).unwrap();
    assert_eq!(contents(&imported), contents(&original));
    let numbers = imported.blocking_queue::<u64>("numbers").unwrap();
    assert_eq!(
        numbers.retry_policy().attempts_allowed(),
        7,
        "policy carried over"
    );
    let jobs = imported.blocking_queue::<String>("jobs").unwrap();
    let browsed = jobs.blocking_browse(None, 10).unwrap();
    let first = browsed.iter().find(|b| b.item == "first").unwrap();
    assert_eq!(first.attempts, 2, "attempts carried over");
    original.blocking_close().unwrap();
    imported.blocking_close().unwrap();

    // A file cut short (no end line) is refused before anything is written.
    let text = std::fs::read_to_string(&file).unwrap();
    let cut: Vec<&str> = text.lines().collect();
    let short = dir.path().join("short.jsonl");
    std::fs::write(&short, cut[..cut.len() - 1].join("\n")).unwrap();
    let out = rq(&["--store", s(&dir.path().join("other")), "import", s(&short)]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("incomplete"), "{}", stderr(&out));
}

#[test]
fn help_explains_every_command_with_an_example() {
    let top = ok(&["--help"]);
    for command in [
        "stats",
        "browse",
        "dead-letters",
        "verify",
        "export",
        "import",
        "serve",
    ] {
        assert!(top.contains(command), "{top}");
        let help = ok(&[command, "--help"]);
        assert!(help.contains("Example"), "rq {command} --help: {help}");
    }
    for sub in ["list", "replay", "purge"] {
        let help = ok(&["dead-letters", sub, "--help"]);
        assert!(
            help.contains("Example"),
            "rq dead-letters {sub} --help: {help}"
        );
    }
}

/// A closed store: queues `good` (10 items) and `victim` (one item in a record of its own,
/// then the item "victim-damaged" in another), and queue `later` (3 items) created after
/// both.
fn with_victim() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::open(&path).unwrap();
    let good = store.blocking_queue::<String>("good").unwrap();
    let victim = store.blocking_queue::<String>("victim").unwrap();
    let commit = |queue: &reliable_queue::ReliableConcurrentQueue<String>, items: &[&str]| {
        let mut tx = store.begin();
        for item in items {
            queue.enqueue(&mut tx, (*item).to_owned()).unwrap();
        }
        tx.blocking_commit().unwrap();
    };
    commit(&good, &["g0", "g1", "g2", "g3", "g4"]);
    commit(&victim, &["victim-kept"]);
    commit(&victim, &["victim-damaged"]);
    commit(&good, &["g5", "g6", "g7", "g8", "g9"]);
    let later = store.blocking_queue::<String>("later").unwrap();
    commit(&later, &["l0", "l1", "l2"]);
    store.blocking_close().unwrap();
    (dir, path)
}

#[test]
fn verify_reports_a_record_that_fails_its_checksum_and_the_queue_it_fences() {
    let (_dir, path) = with_victim();
    let seq = damage_record(&path, b"victim-damaged", RecordDamage::FlipBody);
    let damaged = snapshot(&path);

    let out = rq(&["--store", s(&path), "verify"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("DAMAGED: record {seq} set aside (victim)")),
        "{text}"
    );
    assert!(text.contains("queues fenced"), "{text}");

    let report = json_exit(&["--store", s(&path), "verify", "--json"], 2);
    assert_eq!(report["healthy"], false);
    assert_eq!(report["set_aside"][0]["record"], seq);
    assert_eq!(
        report["set_aside"][0]["queues"],
        serde_json::json!(["victim"])
    );
    assert_eq!(report["fenced"], serde_json::json!(["victim"]));
    assert_eq!(report["missing_records"], serde_json::json!([]));
    // The unfenced queues were read whole.
    assert_eq!(
        (&report["queues"], &report["items"]),
        (&3.into(), &13.into())
    );
    assert_eq!(
        snapshot(&path),
        damaged,
        "verify set the record aside in the store itself"
    );
}

#[test]
fn verify_reports_missing_records_and_checks_the_rest() {
    let (_dir, path) = with_victim();
    let seq = damage_record(&path, b"victim-damaged", RecordDamage::Remove);
    let damaged = snapshot(&path);

    let out = rq(&["--store", s(&path), "verify"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&format!("DAMAGED: records {seq}..={seq} missing")),
        "{}",
        stdout(&out)
    );
    let report = json_exit(&["--store", s(&path), "verify", "--json"], 2);
    assert_eq!(report["healthy"], false);
    assert_eq!(report["refused"], serde_json::Value::Null);
    assert_eq!(report["missing_records"], serde_json::json!([[seq, seq]]));
    // Every queue that existed before the missing record is fenced; `later` is read.
    assert_eq!(report["fenced"], serde_json::json!(["good", "victim"]));
    assert_eq!(report["items"], 3);
    assert_eq!(snapshot(&path), damaged, "verify salvaged the store itself");
    // The store itself still refuses a plain open.
    assert!(matches!(
        Store::open(&path),
        Err(reliable_queue::Error::MissingRecords { .. })
    ));
}

/// Sends SIGINT (Ctrl-C) to `child` (`what`) and checks it exits with 0 within 30 s.
fn interrupt(child: &mut std::process::Child, what: &str) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            child.kill().unwrap();
            panic!("{what} did not stop at SIGINT");
        }
        std::thread::yield_now();
    };
    assert_eq!(
        status.code(),
        Some(0),
        "{what}: stopped by the signal, not killed"
    );
}

#[test]
fn stats_watch_stops_at_ctrl_c_and_closes_the_store() {
    let (_dir, path) = filled();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rq"))
        .args([
            "--store",
            s(&path),
            "stats",
            "--watch",
            "--interval",
            "3600",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first table is drawn after the signal handlers are in place.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let drawn = lines
        .by_ref()
        .map(|l| l.unwrap())
        .any(|l| l.starts_with("numbers"));
    assert!(drawn, "no table drawn");
    // Bounded: an hour's interval that the signal did not end would fail here.
    interrupt(&mut child, "rq stats --watch");
    // Closed: the store opens again at once, as it was.
    let store = Store::open(&path).unwrap();
    assert_eq!(store.blocking_list_queues().unwrap().len(), 2);
    store.blocking_close().unwrap();
}

/// A closed store holding queue `name` with one text item.
fn with_queue_named(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<String>(name).unwrap();
    let mut tx = store.begin();
    q.enqueue(&mut tx, "x".to_owned()).unwrap();
    tx.blocking_commit().unwrap();
    store.blocking_close().unwrap();
    (dir, path)
}

#[test]
fn stats_escapes_control_characters_in_queue_names_but_not_in_json() {
    // Control characters a name may hold (NUL is refused in names on every engine).
    let name = "evil\u{1b}[2J\u{7}name\u{202e}";
    let (_dir, path) = with_queue_named(name);
    let table = ok(&["--store", s(&path), "stats"]);
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{7}') && !table.contains('\u{202e}'),
        "control characters reached the terminal: {table:?}"
    );
    let line = table.lines().find(|l| l.starts_with("evil")).unwrap();
    assert!(
        line.starts_with(r"evil\u{1b}[2J\u{7}name\u{202e}  "),
        "{table}"
    );
    // The columns still line up: READY under READY.
    let header = table.lines().next().unwrap();
    assert_eq!(
        header.find("READY").map(|at| at + "READY".len()),
        line.find(" 1 ").map(|at| at + 2),
        "{table}"
    );
    let rows = json(&["--store", s(&path), "stats", "--json"]);
    assert_eq!(rows[0]["queue"], name, "JSON keeps the name exactly");
}

#[test]
fn stats_refuses_an_interval_under_100_ms_or_over_a_day() {
    let (_dir, path) = filled();
    for interval in ["1e-300", "0.05", "0", "-1", "NaN", "inf", "86401", "soon"] {
        let given = format!("--interval={interval}");
        let out = rq(&[
            "--store",
            s(&path),
            "stats",
            "--watch",
            &given,
            "--count",
            "2",
        ]);
        assert_eq!(out.status.code(), Some(2), "--interval {interval}");
        assert!(
            stderr(&out).contains("between 0.1 and 86400 seconds"),
            "--interval {interval}: {}",
            stderr(&out)
        );
        assert_eq!(stdout(&out), "", "--interval {interval} drew a table");
    }
    let watched = ok(&[
        "--store",
        s(&path),
        "stats",
        "--watch",
        "--interval",
        "0.1",
        "--count",
        "1",
    ]);
    assert!(watched.contains("every 100ms"), "{watched}");
}

#[test]
fn stats_refuses_a_count_of_zero_and_a_count_without_watch() {
    let (_dir, path) = filled();
    let zero = fails(
        &["--store", s(&path), "stats", "--watch", "--count", "0"],
        Some(2),
        "at least 1",
    );
    assert_eq!(stdout(&zero), "", "a count of 0 drew a table");
    fails(
        &["--store", s(&path), "stats", "--count", "3"],
        Some(2),
        "--watch",
    );
}

#[test]
fn browse_and_dead_letters_refuse_a_limit_of_zero() {
    let (_dir, path) = filled();
    for args in [
        vec!["browse", "jobs", "--limit", "0"],
        vec!["dead-letters", "list", "jobs", "--limit", "0"],
        vec!["dead-letters", "replay", "jobs", "--first", "0", "--yes"],
        vec!["dead-letters", "purge", "jobs", "--first", "0", "--yes"],
    ] {
        let mut all = vec!["--store", s(&path)];
        all.extend(&args);
        fails(&all, Some(2), "at least 1");
    }
    // Nothing was replayed or purged.
    let stats = json(&["--store", s(&path), "stats", "--json"]);
    assert_eq!(
        (&stats[0]["ready"], &stats[0]["dead"]),
        (&3.into(), &2.into())
    );
}

/// An export (in `dir`, named `name`) of a store holding queue `jobs` with the text items
/// `items`.
fn export_of(dir: &Path, name: &str, items: &[String]) -> PathBuf {
    let path = dir.join(format!("{name}-store"));
    let store = Store::open(&path).unwrap();
    let q = store.blocking_queue::<String>("jobs").unwrap();
    let mut tx = store.begin();
    for item in items {
        q.enqueue(&mut tx, item.clone()).unwrap();
    }
    tx.blocking_commit().unwrap();
    store.blocking_close().unwrap();
    let file = dir.join(format!("{name}.jsonl"));
    ok(&["--store", s(&path), "export", s(&file)]);
    file
}

/// The texts of queue `jobs` in the store at `path`, sorted.
fn jobs_texts(path: &Path) -> Vec<String> {
    let store = Store::open(path).unwrap();
    let q = store.blocking_queue::<String>("jobs").unwrap();
    let mut texts: Vec<String> = q
        .blocking_browse(None, 1000)
        .unwrap()
        .into_iter()
        .map(|b| b.item)
        .collect();
    store.blocking_close().unwrap();
    texts.sort();
    texts
}

fn texts(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn an_import_refuses_a_different_file_with_the_same_source_id() {
    let dir = tempfile::tempdir().unwrap();
    let first = export_of(dir.path(), "first", &texts("a", 3));
    let other = export_of(dir.path(), "other", &texts("b", 8));
    let target = dir.path().join("target");
    ok(&["--store", s(&target), "import", s(&first)]);

    // Another export given the first one's source id, in its header and end line.
    let mut lines = export_lines(&other);
    let source = export_lines(&first)[0]["source"].clone();
    let last = lines.len() - 1;
    lines[0]["source"] = source.clone();
    lines[last]["source"] = source.clone();
    let forged = dir.path().join("forged.jsonl");
    write_lines(&forged, &lines);
    let out = rq(&["--store", s(&target), "import", s(&forged)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("a different file") && err.contains("source id of its own"),
        "{err}"
    );
    assert_eq!(jobs_texts(&target), texts("a", 3), "nothing was taken");

    // The same file with more lines after what was taken resumes after them: a file is
    // matched by its content, not refused for being longer.
    let mut longer = export_lines(&first);
    let end = longer.pop().unwrap();
    let more: Vec<serde_json::Value> = lines[2..4].to_vec();
    longer.extend(more);
    let mut end = end;
    end["items"] = (end["items"].as_u64().unwrap() + 2).into();
    longer.push(end);
    let extended = dir.path().join("extended.jsonl");
    write_lines(&extended, &longer);
    let summary = json(&["--store", s(&target), "import", s(&extended), "--json"]);
    assert_eq!(
        (&summary["items"], &summary["skipped"]),
        (&2.into(), &4.into()),
        "{summary}"
    );
    let mut expected = texts("a", 3);
    expected.extend(["b0".to_owned(), "b1".to_owned()]);
    expected.sort();
    assert_eq!(jobs_texts(&target), expected);
}

#[test]
fn an_import_with_a_bad_line_writes_nothing_and_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = export_of(dir.path(), "bulk", &texts("item", 300));
    let good = export_lines(&file);
    // Line 202 (the header is line 1, the queue line 2): item 199.
    assert_eq!(good[201]["kind"], "item");
    let (_target_dir, target) = filled();
    let before = {
        let store = Store::open(&target).unwrap();
        let seen = (store.blocking_list_queues().unwrap(), contents(&store));
        store.blocking_close().unwrap();
        seen
    };
    type Damage = fn(&mut serde_json::Value);
    let damages: [(&str, Damage, &str); 5] = [
        ("bad base64", |l| l["bytes"] = "!!!".into(), "base64"),
        // 0xff 0x01: not an envelope (its first byte is the version, 1).
        ("bad envelope", |l| l["bytes"] = "/wE=".into(), "envelope"),
        ("empty queue name", |l| l["queue"] = "".into(), "queue name"),
        (
            "queue name of the import's bookkeeping",
            |l| l["queue"] = "rq.import.mine".into(),
            "reserved",
        ),
        ("unknown state", |l| l["state"] = "lost".into(), "state"),
    ];
    for (what, damage, said) in damages {
        let mut lines = good.clone();
        damage(&mut lines[201]);
        let bad = dir.path().join("bad.jsonl");
        write_lines(&bad, &lines);
        let out = rq(&["--store", s(&target), "import", s(&bad), "--batch", "10"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains("line 202") && err.contains(said),
            "{what}: {err}"
        );
        assert!(err.contains("nothing was imported"), "{what}: {err}");
        let store = Store::open(&target).unwrap();
        let after = (store.blocking_list_queues().unwrap(), contents(&store));
        store.blocking_close().unwrap();
        assert_eq!(after, before, "{what}: the import wrote to the store");
    }
    // A line that is not JSON at all.
    let mut text: Vec<String> = good.iter().map(|l| l.to_string()).collect();
    text[201] = "{\"kind\":\"item\",".to_owned();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, text.join("\n")).unwrap();
    let out = rq(&["--store", s(&target), "import", s(&bad)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("line 202"), "{}", stderr(&out));
    // A store that did not exist is not made.
    let fresh = dir.path().join("fresh");
    let out = rq(&["--store", s(&fresh), "import", s(&bad)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!fresh.exists(), "a refused import made a store");
}

#[test]
fn stats_leaves_out_import_bookkeeping_queues() {
    let (dir, path) = filled();
    let file = dir.path().join("export.jsonl");
    ok(&["--store", s(&path), "export", s(&file)]);
    let copy = dir.path().join("copy");
    ok(&["--store", s(&copy), "import", s(&file)]);
    let source = export_lines(&file)[0]["source"]
        .as_str()
        .unwrap()
        .to_owned();
    let marker = format!("rq.import.{source}");

    let rows = json(&["--store", s(&copy), "stats", "--json"]);
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["jobs", "numbers"]);
    let table = ok(&["--store", s(&copy), "stats"]);
    assert!(!table.contains(&marker), "{table}");
    assert!(
        table.contains("--all"),
        "the table says what it left out: {table}"
    );

    let rows = json(&["--store", s(&copy), "stats", "--all", "--json"]);
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|r| r["queue"] == marker.as_str()),
        "{rows}"
    );
    let table = ok(&["--store", s(&copy), "stats", "--all"]);
    assert!(table.contains(&marker), "{table}");
}

#[test]
fn an_import_refuses_a_mark_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = export_of(dir.path(), "file", &texts("a", 3));
    let source = export_lines(&file)[0]["source"]
        .as_str()
        .unwrap()
        .to_owned();
    // A mark as an earlier rq wrote it: a bare count of lines, with no digest of them.
    let target = dir.path().join("target");
    let store = Store::open(&target).unwrap();
    let marker = store
        .blocking_queue::<u64>(&format!("rq.import.{source}"))
        .unwrap();
    let mut tx = store.begin();
    marker.enqueue(&mut tx, 2).unwrap();
    tx.blocking_commit().unwrap();
    store.blocking_close().unwrap();

    let out = rq(&["--store", s(&target), "import", s(&file)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("cannot read") && err.contains("source id of its own"),
        "{err}"
    );
    assert_eq!(
        jobs_texts(&target),
        Vec::<String>::new(),
        "nothing was taken"
    );
}

/// `--url`: stats, browse and dead letters of a live store, through the dashboard a service
/// (this test process) mounts; replay needs the admin token.
#[test]
fn url_reads_and_acts_through_a_running_services_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    fill(&store);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = runtime.block_on(async {
        let dashboard = reliable_queue_web::Dashboard::new(store.clone())
            .admin_token(Some("t0ken".to_owned()))
            .router()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().nest("/ops", dashboard);
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/ops")
    });
    // `api/stats` answers once the dashboard has read the store.
    let rows = json(&["--url", &url, "stats", "--json"]);
    let jobs = store.blocking_queue::<String>("jobs").unwrap();
    let stats = jobs.blocking_stats().unwrap();
    assert_eq!(rows[0]["queue"], "jobs");
    assert_eq!(
        (&rows[0]["ready"], &rows[0]["delayed"], &rows[0]["dead"]),
        (
            &stats.visible.into(),
            &stats.delayed.into(),
            &stats.dead.into()
        )
    );
    let delayed = json(&[
        "--url", &url, "browse", "jobs", "--state", "delayed", "--json",
    ]);
    assert_eq!(delayed[0]["text"], "later");
    let dead = json(&["--url", &url, "dead-letters", "list", "jobs", "--json"]);
    assert_eq!(dead.as_array().unwrap().len(), 2);
    let first = dead[0]["id"].as_u64().unwrap().to_string();
    let replay = [
        "--url",
        url.as_str(),
        "dead-letters",
        "replay",
        "jobs",
        "--ids",
        &first,
        "--yes",
    ];
    let refused = rq(&replay);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("RQ_ADMIN_TOKEN"),
        "{}",
        stderr(&refused)
    );
    let wrong = rq_with(&replay, &[("RQ_ADMIN_TOKEN", "nope")]);
    assert!(stderr(&wrong).contains("401"), "{}", stderr(&wrong));
    assert_eq!(
        jobs.blocking_stats().unwrap().dead,
        2,
        "refused: nothing moved"
    );
    let done = rq_with(&replay, &[("RQ_ADMIN_TOKEN", "t0ken")]);
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(
        stdout(&done).contains("replayed 1 dead letter"),
        "{}",
        stdout(&done)
    );
    assert_eq!(jobs.blocking_stats().unwrap().dead, 1);
    fails(
        &["--url", &url, "verify"],
        Some(1),
        "--url works with stats, browse and dead-letters",
    );
    drop(runtime);
    store.blocking_close().unwrap();
}

/// `rq serve`: the dashboard of a sled store, read-only without a token, on the address it
/// prints; Ctrl-C stops it and closes the store.
#[test]
fn serve_shows_the_store_and_stops_at_ctrl_c() {
    let (_dir, path) = filled();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rq"))
        .args(["--store", s(&path), "serve", "--listen", "127.0.0.1:0"])
        .env_remove("RQ_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // rq prints where it listens once it does.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let said = lines.next().expect("a line").unwrap();
    assert!(said.contains("read-only"), "{said}");
    let addr = said
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("an address")
        .to_owned();
    let get = |path: &str| {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(
            &mut stream,
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
        answer
    };
    // `api/stats` answers once the dashboard has read the store.
    assert!(get("/api/stats").contains("\"numbers\""));
    assert!(get("/").contains("data-queue=\"jobs\""));
    let refused = {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(
            &mut stream,
            format!(
                "POST /api/queues/jobs/dead-letters/purge HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nContent-Length: 12\r\n\
                 Connection: close\r\n\r\n{{\"all\":true}}"
            )
            .as_bytes(),
        )
        .unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
        answer
    };
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    interrupt(&mut child, "rq serve");
    let store = Store::open(&path).unwrap();
    let jobs = store.blocking_queue::<String>("jobs").unwrap();
    assert_eq!(
        jobs.blocking_stats().unwrap().dead,
        2,
        "the refused purge changed nothing"
    );
    store.blocking_close().unwrap();
}
