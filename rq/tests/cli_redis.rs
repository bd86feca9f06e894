//! `rq` on Redis stores, against a real server (the root crate's harness,
//! `tests/redis/mod.rs`: its own private `redis-server`, or `RQ_TEST_REDIS_URL`; without Redis
//! every test is reported ignored under a banner, and with `RQ_TEST_REQUIRE_REDIS=1` that is a
//! failure): commands on a live store that this process keeps open, one store moved by
//! export and import through every engine (sled, Redis, PostgreSQL where `tests/pg/mod.rs`
//! finds one) and compared line by line at every step, two imports of one export at once,
//! and a server nobody listens on.

mod common;
#[path = "../../tests/pg/mod.rs"]
mod pg;
#[path = "../../tests/redis/mod.rs"]
mod redis;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use common::{
    bulk_export, export_lines, fails, fill, import_twice_at_once, json, ms, ok, rq_with, rq_within,
    s, stderr, stdout, with,
};
use pg::{block_on, connect, PgServer};
use redis::{RedisServer, Reply};
use reliable_queue::{RawItem, RetryPolicy, Store};

/// `name` as a namespace of its own on `server`: on a server of the caller's
/// (`RQ_TEST_REDIS_URL`), the keys an earlier run left there are deleted first.
fn namespace(server: &RedisServer, name: &str) -> String {
    if !server.started_here() {
        let pattern = format!("rq:{{{name}}}:*");
        if let Reply::Array(keys) = server.command(&[b"KEYS", pattern.as_bytes()]) {
            for key in keys {
                if let Reply::Bulk(Some(key)) = key {
                    server.command(&[b"DEL", &key]);
                }
            }
        }
    }
    name.to_owned()
}

/// The store in `namespace` on `server`.
fn store(server: &RedisServer, namespace: &str) -> Store {
    Store::builder()
        .url(server.url())
        .namespace(namespace)
        .open()
        .unwrap()
}

fn redis_args<'a>(server: &'a RedisServer, namespace: &'a str) -> Vec<&'a str> {
    vec!["--redis", server.url(), "--schema", namespace]
}

/// The texts of a listing's rows (`browse`, `dead-letters list`), `null` for a payload that
/// is not text.
fn texts(rows: &serde_json::Value) -> Vec<&serde_json::Value> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| &r["text"])
        .collect()
}

/// A `stats --json` row's figures: the queue and its ready, delayed, leased, held and dead
/// items (the front's age moves between two looks).
fn figures(rows: &serde_json::Value) -> Vec<(String, [u64; 5])> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (
                r["queue"].as_str().unwrap().to_owned(),
                [n("ready"), n("delayed"), n("leased"), n("held"), n("dead")],
            )
        })
        .collect()
}

/// stats, browse and dead letters (list, replay, purge) on a store another process (this
/// one) has open and uses, with a lease running.
fn commands_work_beside_a_live_store(server: &RedisServer) {
    let ns = namespace(server, "cli_live");
    let live = store(server, &ns);
    fill(&live);
    // A lease held by the live store while rq looks.
    let jobs = live.blocking_queue::<String>("jobs").unwrap();
    let lease = jobs.blocking_lease(Duration::from_secs(600)).unwrap();
    assert_eq!((lease.item().as_str(), lease.attempt()), ("first", 3));
    let base = redis_args(server, &ns);

    let stats = json(&with(base.clone(), &["stats", "--json"]));
    assert_eq!(
        figures(&stats),
        [
            ("jobs".to_owned(), [2, 1, 1, 0, 2]),
            ("numbers".to_owned(), [5, 0, 0, 0, 0]),
        ]
    );
    // The URL from the environment instead of the command line: the same store.
    let from_env = rq_with(
        &["--schema", &ns, "stats", "--json"],
        &[("RQ_REDIS_URL", server.url())],
    );
    assert!(from_env.status.success(), "{}", stderr(&from_env));
    let from_env: serde_json::Value = serde_json::from_str(&stdout(&from_env)).unwrap();
    assert_eq!(figures(&from_env), figures(&stats));

    let leased = json(&with(
        base.clone(),
        &["browse", "jobs", "--state", "leased", "--json"],
    ));
    assert_eq!(leased.as_array().unwrap().len(), 1, "{leased}");
    assert_eq!(leased[0]["text"], lease.item().as_str());
    assert_eq!(leased[0]["attempts"], 3);
    assert_eq!(leased[0]["until_ms"], ms(lease.deadline()));
    let ready = json(&with(
        base.clone(),
        &["browse", "jobs", "--state", "ready", "--json"],
    ));
    assert_eq!(texts(&ready), ["second", "third"]);
    let delayed = json(&with(
        base.clone(),
        &["browse", "jobs", "--state", "delayed", "--json"],
    ));
    assert_eq!(texts(&delayed), ["later"]);
    let all = json(&with(base.clone(), &["browse", "jobs", "--json"]));
    assert_eq!(all.as_array().unwrap().len(), 4, "{all}");

    // The oldest first: the byte item (not text), then "poison".
    let dead = json(&with(
        base.clone(),
        &["dead-letters", "list", "jobs", "--json"],
    ));
    assert_eq!(texts(&dead), [&serde_json::Value::Null, &"poison".into()]);
    assert_eq!(
        (&dead[0]["reason"], &dead[1]["reason"]),
        (&"bad bytes".into(), &"cannot parse".into())
    );
    assert_eq!(
        (&dead[0]["attempts"], &dead[1]["attempts"]),
        (&1.into(), &1.into())
    );
    let poison = dead[1]["id"].as_u64().unwrap().to_string();
    let replayed = ok(&with(
        base.clone(),
        &["dead-letters", "replay", "jobs", "--ids", &poison, "--yes"],
    ));
    assert!(replayed.contains("replayed 1 dead letter"), "{replayed}");
    let stats = jobs.blocking_stats().unwrap();
    assert_eq!(
        (stats.visible, stats.leased, stats.dead),
        (3, 1, 1),
        "the live store sees the replay"
    );
    let ready = json(&with(
        base.clone(),
        &["browse", "jobs", "--state", "ready", "--json"],
    ));
    assert_eq!(texts(&ready), ["second", "third", "poison"], "at the tail");
    let purged = ok(&with(
        base.clone(),
        &["dead-letters", "purge", "jobs", "--all", "--yes"],
    ));
    assert!(purged.contains("purged 1 dead letter"), "{purged}");
    assert_eq!(
        jobs.blocking_stats().unwrap().dead,
        0,
        "the live store sees the purge"
    );
    let dead = json(&with(
        base.clone(),
        &["dead-letters", "list", "jobs", "--json"],
    ));
    assert_eq!(dead, serde_json::json!([]));

    // verify reads sled stores only.
    fails(&with(base, &["verify"]), None, "sled store");
    // The lease rq looked at is still the live store's to settle.
    lease.blocking_complete().unwrap();
    let stats = jobs.blocking_stats().unwrap();
    assert_eq!((stats.visible, stats.leased), (3, 0));
    live.blocking_close().unwrap();
}

/// A sled store with [`fill`]'s contents and more: 1,200 byte items holding NULs (more than
/// an export's page and an import's batch), and a queue with a policy of its own holding an
/// item waiting out a retry's backoff, two delayed items and a dead letter with three
/// attempts and a reason that is not ASCII.
fn sled_store_to_move(path: &Path) {
    let sled = Store::open(path).unwrap();
    fill(&sled);
    let bulk = sled.blocking_queue::<Vec<u8>>("bulk").unwrap();
    let mut tx = sled.begin();
    for i in 0..1_200u32 {
        let mut bytes = i.to_be_bytes().to_vec();
        bytes.push(0);
        bulk.enqueue(&mut tx, bytes).unwrap();
    }
    tx.blocking_commit().unwrap();
    let retried = sled.blocking_queue::<String>("retried").unwrap();
    retried
        .blocking_set_retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .initial_backoff(Duration::from_secs(3600))
                .jitter(0.0),
        )
        .unwrap();
    let mut tx = sled.begin();
    retried.enqueue(&mut tx, "flaky".to_owned()).unwrap();
    retried.enqueue(&mut tx, "steady".to_owned()).unwrap();
    retried
        .enqueue_after(&mut tx, "soon".to_owned(), Duration::from_secs(600))
        .unwrap();
    retried
        .enqueue_after(&mut tx, "tomorrow".to_owned(), Duration::from_secs(86_400))
        .unwrap();
    tx.blocking_commit().unwrap();
    for attempt in 1..=2 {
        let lease = retried.blocking_lease(Duration::from_secs(60)).unwrap();
        assert_eq!((lease.item().as_str(), lease.attempt()), ("flaky", attempt));
        lease.blocking_release(Duration::ZERO).unwrap();
    }
    let lease = retried.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!((lease.item().as_str(), lease.attempt()), ("flaky", 3));
    assert_eq!(
        lease.blocking_fail("gave up: échec ✗").unwrap(),
        reliable_queue::Failed::Dead
    );
    let lease = retried.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(lease.item(), "steady");
    assert!(matches!(
        lease.blocking_fail("try again in an hour").unwrap(),
        reliable_queue::Failed::Retry { .. }
    ));
    sled.blocking_close().unwrap();
}

/// What an export says of its store: the engine its header names, and its lines but the
/// header, with the end line's counts but not its source id (each export draws a fresh one).
fn rows(file: &Path) -> (String, Vec<serde_json::Value>) {
    let mut lines = export_lines(file);
    let header = lines.remove(0);
    assert_eq!(header["kind"], "header", "{header}");
    assert_eq!(header["format"], "reliable-queue-export", "{header}");
    let end = lines.last_mut().unwrap();
    assert_eq!(end["kind"], "end", "{end}");
    assert_eq!(end["source"], header["source"]);
    end.as_object_mut().unwrap().remove("source");
    (header["engine"].as_str().unwrap().to_owned(), lines)
}

/// Imports `from` into the store `target` names (a new one), exports that store to `to`,
/// and checks that the export is `engine`'s and has `expected`'s rows, line for line.
fn hop(target: Vec<&str>, from: &Path, to: &Path, engine: &str, expected: &[serde_json::Value]) {
    let summary = json(&with(target.clone(), &["import", s(from), "--json"]));
    let end = expected.last().unwrap();
    assert_eq!(
        (
            &summary["queues"],
            &summary["items"],
            &summary["dead"],
            &summary["skipped"]
        ),
        (&end["queues"], &end["items"], &end["dead"], &0.into()),
        "import into {engine}"
    );
    ok(&with(target, &["export", s(to)]));
    let (made_by, lines) = rows(to);
    assert_eq!(made_by, engine);
    assert_eq!(lines.len(), expected.len(), "-> {engine}");
    for (n, (got, want)) in lines.iter().zip(expected).enumerate() {
        // Line 1 is the header.
        assert_eq!(got, want, "-> {engine}: line {}", n + 2);
    }
}

/// One store moved through every engine by `rq export` and `rq import`: sled -> Redis ->
/// PostgreSQL -> a new sled store, each export the same rows as the first (queues and their
/// policies, items with their states, attempts, due and enqueue times, dead letters with
/// their reasons and attempt times, in order). Without PostgreSQL that step is skipped with
/// a banner, and the store goes from Redis straight to the new sled store.
fn one_store_moved_through_every_engine_is_the_same_at_every_step(server: &RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let sled_path = dir.path().join("sled");
    sled_store_to_move(&sled_path);
    let first = dir.path().join("from-sled.jsonl");
    ok(&["--store", s(&sled_path), "export", s(&first)]);
    let (engine, expected) = rows(&first);
    assert_eq!(engine, "sled");
    let end = expected.last().unwrap();
    assert_eq!(
        (&end["queues"], &end["items"], &end["dead"]),
        (&4.into(), &1_212.into(), &3.into()),
        "the store to move"
    );

    let ns = namespace(server, "cli_hop");
    let from_redis = dir.path().join("from-redis.jsonl");
    hop(
        redis_args(server, &ns),
        &first,
        &from_redis,
        "redis",
        &expected,
    );

    let last = match PgServer::start() {
        Ok(pg) => {
            let schema = "cli_redis_hop";
            if !pg.started_here() {
                block_on(async {
                    connect(pg.url())
                        .await
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .await
                        .unwrap();
                });
            }
            let from_pg = dir.path().join("from-postgres.jsonl");
            hop(
                vec!["--postgres", pg.url(), "--schema", schema],
                &from_redis,
                &from_pg,
                "postgres",
                &expected,
            );
            from_pg
        }
        Err(skip) => {
            eprintln!("\n==> the PostgreSQL step SKIPPED (sled -> Redis -> sled only): {skip}\n");
            from_redis
        }
    };

    let back = dir.path().join("back");
    hop(
        vec!["--store", s(&back)],
        &last,
        &dir.path().join("back.jsonl"),
        "sled",
        &expected,
    );
}

/// Two runs of one import started at once against one new store, for several rounds: each
/// round the store ends with every item exactly once and one import record, and each run
/// either finished or stopped because the other held the record. Both runs may count no
/// record and make a first one each; every record has one deduplication key on Redis, so
/// the second is a no-op (see `import` in `rq/src/export.rs`).
fn two_imports_of_one_export_at_once_take_every_item_once(server: &RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let n = 3_000u64;
    let file = bulk_export(dir.path(), n);
    let source = export_lines(&file)[0]["source"]
        .as_str()
        .unwrap()
        .to_owned();
    let marker = format!("rq.import.{source}");
    for round in 0..5 {
        let ns = namespace(server, &format!("cli_concurrent_{round}"));
        import_twice_at_once(&redis_args(server, &ns), &file, &format!("round {round}"));

        let on_redis = store(server, &ns);
        let bulk = on_redis.blocking_queue::<u64>("bulk").unwrap();
        let browsed = bulk.blocking_browse(None, 100_000).unwrap();
        assert_eq!(browsed.len() as u64, n, "round {round}: items in the store");
        let mut seen: Vec<u64> = browsed.into_iter().map(|b| b.item).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..n).collect::<Vec<_>>(),
            "round {round}: every item exactly once"
        );
        let marks = on_redis.blocking_queue::<RawItem>(&marker).unwrap();
        let stats = marks.blocking_stats().unwrap();
        assert_eq!(
            (
                stats.visible,
                stats.delayed,
                stats.leased,
                stats.held,
                stats.dead
            ),
            (1, 0, 0, 0, 0),
            "round {round}: one import record"
        );
        on_redis.blocking_close().unwrap();

        // The record says the import finished: one more run takes nothing.
        let again = json(&with(
            redis_args(server, &ns),
            &["import", s(&file), "--json"],
        ));
        assert_eq!(
            (&again["items"], &again["skipped"]),
            (&0.into(), &(n + 1).into()),
            "round {round}"
        );
    }
}

/// Reading commands against a namespace that holds no store (a typo) say so and write
/// nothing on the server; the commands that write items may start a store.
fn reading_commands_name_a_missing_namespace_and_write_nothing(server: &RedisServer) {
    let typo = namespace(server, "cli_typo");
    for command in [
        &["stats"][..],
        &["browse", "jobs"],
        &["dead-letters", "list", "jobs"],
    ] {
        fails(
            &with(redis_args(server, &typo), command),
            None,
            "no reliable-queue schema \"cli_typo\"",
        );
    }
    let pattern = format!("rq:{{{typo}}}:*");
    match server.command(&[b"KEYS", pattern.as_bytes()]) {
        Reply::Array(keys) => assert!(keys.is_empty(), "keys written: {keys:?}"),
        other => panic!("KEYS: {other:?}"),
    }
}

/// Reading commands on a Redis URL nobody listens on (a Unix socket that is not there, a
/// TCP port nobody holds): an error naming the failed connect, exit code 1, no panic, and
/// no file written by the export.
fn a_server_nobody_listens_on_is_a_connect_error(_: &RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let socket = format!("redis+unix://{}", dir.path().join("nobody.sock").display());
    // Bound and let go: nobody listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp = format!("redis://127.0.0.1:{port}/0");
    let export = dir.path().join("out.jsonl");
    // What the connect met, as the operating system says it.
    for (url, cause) in [
        (&socket, "No such file or directory"),
        (&tcp, "Connection refused"),
    ] {
        for command in [
            &["stats"][..],
            &["browse", "jobs", "--state", "ready"],
            &["dead-letters", "list", "jobs"],
            &["export", s(&export)],
        ] {
            let args = with(vec!["--redis", url], command);
            // Bounded: a hang is a failure, not a stuck test.
            let out = rq_within(&args, Duration::from_secs(60));
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.starts_with("rq: Redis failed during connect: ")
                    && err.contains(cause)
                    && !err.contains("panicked"),
                "{args:?}: {err}"
            );
            assert_eq!(stdout(&out), "", "{args:?}");
        }
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the export wrote a file"
    );
}

/// The tests, run by `pg::run_server_suite` against one Redis server: the harness's own, or
/// `RQ_TEST_REDIS_URL`'s; without one every test is reported ignored under a banner
/// (`RQ_TEST_REQUIRE_REDIS=1` makes that a failure).
fn main() -> ExitCode {
    pg::run_server_suite(
        "Redis",
        RedisServer::start,
        vec![
            (
                "a_server_nobody_listens_on_is_a_connect_error",
                a_server_nobody_listens_on_is_a_connect_error,
            ),
            (
                "commands_work_beside_a_live_store",
                commands_work_beside_a_live_store,
            ),
            (
                "reading_commands_name_a_missing_namespace_and_write_nothing",
                reading_commands_name_a_missing_namespace_and_write_nothing,
            ),
            (
                "one_store_moved_through_every_engine_is_the_same_at_every_step",
                one_store_moved_through_every_engine_is_the_same_at_every_step,
            ),
            (
                "two_imports_of_one_export_at_once_take_every_item_once",
                two_imports_of_one_export_at_once_take_every_item_once,
            ),
        ],
    )
}
