//! `rq` on PostgreSQL stores, against a real server (the root crate's harness,
//! `tests/pg/mod.rs`: its own private server, or `RQ_TEST_POSTGRES_URL`; without PostgreSQL
//! every test is reported ignored under a banner): commands on a live store that this
//! process keeps open, an export from sled imported into PostgreSQL and back compared item by
//! item, and an import killed with `kill -9` half way and run again, taking every item once.

mod common;
#[path = "../../tests/pg/mod.rs"]
mod pg;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    bulk_export, contents, export_lines, fails, fill, import_twice_at_once, json, ok, rq,
    rq_command, rq_within, s, stderr, with, write_lines,
};
use pg::{block_on, connect, PgServer};
use reliable_queue::Store;

/// A store on the test's own schema.
fn store(server: &PgServer, schema: &str) -> Store {
    server.store(schema)
}

fn pg_args<'a>(server: &'a PgServer, schema: &'a str) -> Vec<&'a str> {
    vec!["--postgres", server.url(), "--schema", schema]
}

/// stats, browse and dead letters on a store another process (this one) has open and uses.
fn commands_work_beside_a_live_store(server: &PgServer) {
    let schema = "cli_live";
    let live = store(server, schema);
    fill(&live);
    // A lease held by the live store while rq looks.
    let jobs = live.blocking_queue::<String>("jobs").unwrap();
    let lease = jobs.blocking_lease(Duration::from_secs(600)).unwrap();
    let base = pg_args(server, schema);
    let rows = json(&with(base.clone(), &["stats", "--json"]));
    let jobs_row = &rows.as_array().unwrap()[0];
    assert_eq!(jobs_row["queue"], "jobs");
    assert_eq!(
        (
            &jobs_row["ready"],
            &jobs_row["delayed"],
            &jobs_row["leased"],
            &jobs_row["dead"]
        ),
        (&2.into(), &1.into(), &1.into(), &2.into())
    );
    let leased = json(&with(
        base.clone(),
        &["browse", "jobs", "--state", "leased", "--json"],
    ));
    assert_eq!(leased[0]["text"], lease.item().as_str());
    let dead = json(&with(
        base.clone(),
        &["dead-letters", "list", "jobs", "--json"],
    ));
    assert_eq!(dead.as_array().unwrap().len(), 2);
    ok(&with(
        base.clone(),
        &["dead-letters", "replay", "jobs", "--first", "1", "--yes"],
    ));
    assert_eq!(
        jobs.blocking_stats().unwrap().dead,
        1,
        "the live store sees the replay"
    );
    // verify reads sled stores only.
    fails(&with(base, &["verify"]), None, "sled store");
    lease.blocking_complete().unwrap();
    live.blocking_close().unwrap();
}

/// sled → export → PostgreSQL → export → a fresh sled store: the same items, states,
/// attempts, times and dead letters at every step.
fn an_export_from_sled_imported_into_postgres_and_back_is_the_same(server: &PgServer) {
    let dir = tempfile::tempdir().unwrap();
    let sled_path = dir.path().join("sled");
    let sled = Store::open(&sled_path).unwrap();
    fill(&sled);
    let expected = contents(&sled);
    sled.blocking_close().unwrap();
    let first = dir.path().join("from-sled.jsonl");
    ok(&["--store", s(&sled_path), "export", s(&first)]);

    let schema = "cli_roundtrip";
    let base = pg_args(server, schema);
    let summary = json(&with(base.clone(), &["import", s(&first), "--json"]));
    assert_eq!(
        (&summary["items"], &summary["dead"]),
        (&9.into(), &2.into())
    );
    let on_pg = store(server, schema);
    assert_eq!(contents(&on_pg), expected, "sled -> PostgreSQL");
    on_pg.blocking_close().unwrap();

    let second = dir.path().join("from-pg.jsonl");
    ok(&with(base, &["export", s(&second)]));
    let back = dir.path().join("back");
    ok(&["--store", s(&back), "import", s(&second)]);
    let back = Store::open(&back).unwrap();
    assert_eq!(contents(&back), expected, "PostgreSQL -> sled");
    back.blocking_close().unwrap();
}

/// The items of queue `bulk` in `schema`, sorted.
fn bulk_items(server: &PgServer, schema: &str) -> Vec<u64> {
    let on_pg = store(server, schema);
    let bulk = on_pg.blocking_queue::<u64>("bulk").unwrap();
    let mut seen: Vec<u64> = bulk
        .blocking_browse(None, 100_000)
        .unwrap()
        .into_iter()
        .map(|b| b.item)
        .collect();
    on_pg.blocking_close().unwrap();
    seen.sort_unstable();
    seen
}

/// Two runs of the same import at once: whichever way they interleave, each batch starts
/// from the marker its own transaction took, so every item arrives once; a run that finds
/// the marker held stops with a clear error, and one more run afterwards takes nothing.
fn two_imports_of_one_export_at_once_take_every_item_once(server: &PgServer) {
    let dir = tempfile::tempdir().unwrap();
    let n = 5_000u64;
    let file = bulk_export(dir.path(), n);
    let schema = "cli_concurrent";
    import_twice_at_once(&pg_args(server, schema), &file, "the two imports");
    assert_eq!(bulk_items(server, schema), (0..n).collect::<Vec<_>>());
    let again = json(&with(
        pg_args(server, schema),
        &["import", s(&file), "--json"],
    ));
    assert_eq!(
        (&again["items"], &again["skipped"]),
        (&0.into(), &(n + 1).into())
    );
    assert_eq!(bulk_items(server, schema).len() as u64, n);
}

/// An import killed with `kill -9` after some of its transactions committed, run again:
/// every item arrives exactly once.
fn an_import_killed_half_way_and_run_again_takes_every_item_once(server: &PgServer) {
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000u64;
    let file = bulk_export(dir.path(), n);

    let schema = "cli_resume";
    let mut child = rq_command(&with(pg_args(server, schema), &["import", s(&file)]), &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait (bounded) until some transactions have committed, then kill it mid-run.
    let count = format!("SELECT count(*) FROM \"{schema}\".items i JOIN \"{schema}\".queues q ON q.id = i.queue WHERE q.name = 'bulk'");
    let give_up = Instant::now() + Duration::from_secs(60);
    let taken = loop {
        let taken: i64 = block_on(async {
            let client = connect(server.url()).await;
            match client.query_one(&count, &[]).await {
                Ok(row) => row.get(0),
                Err(_) => 0, // the schema is not made yet
            }
        });
        if taken > 0 || Instant::now() > give_up {
            break taken;
        }
        if child.try_wait().unwrap().is_some() {
            break taken;
        }
        std::thread::yield_now();
    };
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(taken > 0, "the import committed nothing within a minute");
    // 2,500 transactions: killed long before the last.
    assert_eq!(
        status.code(),
        None,
        "the import was killed by the signal: {status}"
    );
    assert!(taken < 20_000, "killed half way: {taken} items in");

    let again = json(&with(
        pg_args(server, schema),
        &["import", s(&file), "--json"],
    ));
    assert_eq!(
        bulk_items(server, schema),
        (0..n).collect::<Vec<_>>(),
        "every item exactly once"
    );
    assert_eq!(
        again["skipped"].as_u64().unwrap() + again["items"].as_u64().unwrap(),
        n + 1,
        "the second run resumed where the first stopped (the queue line counts): {again}"
    );
    assert!(again["skipped"].as_u64().unwrap() > 0, "{again}");
}

/// A NUL in a queue name or a dead letter's reason, which sled keeps and PostgreSQL's text
/// cannot: the import into PostgreSQL refuses the file before it writes anything, naming the
/// line, instead of failing at that line's batch with the batches before it committed.
fn an_import_with_a_nul_that_postgres_cannot_store_writes_nothing(server: &PgServer) {
    let dir = tempfile::tempdir().unwrap();
    let file = bulk_export(dir.path(), 300);
    let good = export_lines(&file);
    // Line 202 (the header is line 1, the queue line 2).
    assert_eq!(good[201]["kind"], "item");
    let schema = "cli_nul";
    type Damage = fn(&mut Vec<serde_json::Value>);
    let damages: [(&str, Damage); 2] = [
        ("a NUL in a queue name", |lines| {
            lines[201]["queue"] = "bulk\u{0}x".into();
        }),
        ("a NUL in a reason", |lines| {
            let item = lines[201].clone();
            lines[201] = serde_json::json!({
                "kind": "dead",
                "queue": "bulk",
                "bytes": item["bytes"],
                "reason": "bad\u{0}input",
                "attempts": 1,
                "enqueued_ms": null,
                "first_attempt_ms": null,
                "last_attempt_ms": null,
            });
            let end = lines.last_mut().unwrap();
            end["items"] = (end["items"].as_u64().unwrap() - 1).into();
            end["dead"] = (end["dead"].as_u64().unwrap() + 1).into();
        }),
    ];
    for (what, damage) in damages {
        let mut lines = good.clone();
        damage(&mut lines);
        let bad = dir.path().join("bad.jsonl");
        write_lines(&bad, &lines);
        let out = rq(&with(
            pg_args(server, schema),
            &["import", s(&bad), "--batch", "10"],
        ));
        assert_eq!(out.status.code(), Some(1), "{what}");
        let err = stderr(&out);
        assert!(
            err.contains("line 202") && err.contains("NUL") && err.contains("nothing was imported"),
            "{what}: {err}"
        );
        let on_pg = store(server, schema);
        assert_eq!(
            on_pg.blocking_list_queues().unwrap(),
            Vec::<String>::new(),
            "{what}: the import wrote to the store"
        );
        on_pg.blocking_close().unwrap();
    }
}

/// Reading commands against a schema that is not there (a typo) say so and create nothing;
/// an existing schema is read without a migration.
fn reading_commands_name_a_missing_schema_and_create_nothing(server: &PgServer) {
    for command in [
        &["stats"][..],
        &["browse", "jobs"],
        &["dead-letters", "list", "jobs"],
    ] {
        fails(
            &with(pg_args(server, "cli_typo"), command),
            None,
            "no reliable-queue schema \"cli_typo\"",
        );
    }
    let made = block_on(async {
        connect(server.url())
            .await
            .query_one(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'cli_typo'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    });
    assert_eq!(made, 0, "no schema was created");
    fill(&store(server, "cli_read"));
    let rows = json(&with(pg_args(server, "cli_read"), &["stats", "--json"]));
    assert!(!rows.as_array().unwrap().is_empty());
}

/// A URL whose port accepts connections and never answers as PostgreSQL (here a listener
/// that reads and says nothing): `rq` ends with an error naming the host once the URL's
/// `connect_timeout` has passed, instead of waiting for ever.
fn a_port_that_never_answers_is_an_error_naming_the_host(_: &PgServer) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(8).collect();
        drop(held);
    });
    let url = format!("postgresql://u:p@127.0.0.1:{port}/app?connect_timeout=1");
    // Bounded: a hang is a failure, not a stuck test.
    let out = rq_within(&["--postgres", &url, "stats"], Duration::from_secs(60));
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains(&format!("127.0.0.1:{port}")) && message.contains("no answer"),
        "{message}"
    );
}

fn main() -> std::process::ExitCode {
    pg::run_suite(vec![
        (
            "reading_commands_name_a_missing_schema_and_create_nothing",
            reading_commands_name_a_missing_schema_and_create_nothing,
        ),
        (
            "a_port_that_never_answers_is_an_error_naming_the_host",
            a_port_that_never_answers_is_an_error_naming_the_host,
        ),
        (
            "commands_work_beside_a_live_store",
            commands_work_beside_a_live_store,
        ),
        (
            "an_export_from_sled_imported_into_postgres_and_back_is_the_same",
            an_export_from_sled_imported_into_postgres_and_back_is_the_same,
        ),
        (
            "two_imports_of_one_export_at_once_take_every_item_once",
            two_imports_of_one_export_at_once_take_every_item_once,
        ),
        (
            "an_import_killed_half_way_and_run_again_takes_every_item_once",
            an_import_killed_half_way_and_run_again_takes_every_item_once,
        ),
        (
            "an_import_with_a_nul_that_postgres_cannot_store_writes_nothing",
            an_import_with_a_nul_that_postgres_cannot_store_writes_nothing,
        ),
    ])
}
