//! The Redis engine's own tests, each on a server of its own (`tests/redis/mod.rs`): the
//! hold on a dequeued item that ends without its client, functions loaded again, a server
//! killed with SIGKILL and restarted from its append-only file, keys of the store tampered
//! with, URLs that are not Redis, a server that is down or wants a password, and one that
//! does not fsync every write; TLS with a private authority; worker processes and the server
//! killed with SIGKILL. The behaviour tests run on Redis through the conformance suite
//! (`tests/common/engines.rs`).

use std::time::{Duration, Instant};

use reliable_queue::{Builder, Error, ManualClock, Store};

use crate::common::engines::Case;
use crate::common::movers::{self, OnFailure, Workers};
use crate::common::redis::{RedisServer, Reply};
use crate::common::scenarios::{caller_runtime, fill, move_among_aborts_then_wake_a_waiter};

pub(crate) fn cases() -> Vec<Case> {
    vec![
        Case::redis(
            "a_hold_ends_without_its_client_and_its_commit_then_applies_nothing",
            a_hold_ends_without_its_client_and_its_commit_then_applies_nothing,
        ),
        Case::redis(
            "functions_are_loaded_again_when_the_server_forgets_them",
            functions_are_loaded_again_when_the_server_forgets_them,
        ),
        Case::redis(
            "acknowledged_commits_survive_kill_9_of_the_server_and_the_store_reconnects",
            acknowledged_commits_survive_kill_9_of_the_server_and_the_store_reconnects,
        ),
        Case::redis(
            "concurrent_calls_go_to_the_server_in_groups_and_each_fails_alone",
            concurrent_calls_go_to_the_server_in_groups_and_each_fails_alone,
        ),
        Case::redis(
            "tampered_keys_give_a_typed_error_and_lose_nothing",
            tampered_keys_give_a_typed_error_and_lose_nothing,
        ),
        Case::redis(
            "bad_urls_a_server_that_is_down_and_one_that_wants_a_password",
            bad_urls_a_server_that_is_down_and_one_that_wants_a_password,
        ),
        Case::redis(
            "a_server_that_does_not_fsync_every_write_is_refused_when_asked",
            a_server_that_does_not_fsync_every_write_is_refused_when_asked,
        ),
        Case::redis(
            "tls_connections_verify_the_server",
            tls_connections_verify_the_server,
        ),
        Case::redis(
            "a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_connections",
            a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_connections,
        ),
        Case::redis(
            "processes_and_the_server_killed_with_sigkill_lose_and_duplicate_nothing",
            processes_and_the_server_killed_with_sigkill_lose_and_duplicate_nothing,
        ),
    ]
}

fn builder(server: &RedisServer) -> Builder {
    Store::builder().url(server.url()).namespace("t")
}

/// `Builder::redis_runtime`: a current-thread runtime is refused; on a multi-thread one the
/// blocking forms work from a thread outside it, tasks move items with aborts and drops
/// among the commits and lose or repeat none, a waiting consumer is woken by a commit, and
/// the store's connections end with it, not with the runtime.
fn a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_connections(server: &RedisServer) {
    const ITEMS: u64 = 200;
    const TASKS: u64 = 8;
    let rt = caller_runtime("redis_runtime", |single| {
        builder(server).redis_runtime(single).open()
    });
    let before = server.connected_clients();
    let store = rt.block_on(async {
        builder(server)
            .redis_runtime(tokio::runtime::Handle::current())
            .connect()
            .await
            .unwrap()
    });
    // The blocking forms, from this thread.
    let a = store.blocking_queue::<u64>("a").unwrap();
    let b = store.blocking_queue::<u64>("b").unwrap();
    fill(&store, &a, 0..ITEMS);
    rt.block_on(move_among_aborts_then_wake_a_waiter(
        &store, &a, &b, ITEMS, TASKS,
    ));
    assert_eq!(a.blocking_count().unwrap(), 0);
    let mut moved = crate::common::drain(&store, &b);
    moved.sort_unstable();
    assert_eq!(
        moved,
        (0..ITEMS).collect::<Vec<_>>(),
        "none lost, none twice"
    );
    assert!(
        server.connected_clients() > before,
        "the store's connections"
    );
    store.blocking_close().unwrap();
    // The subscription ends with the close, the connection with the store's last handle; not
    // with the runtime, which runs on.
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.connected_clients() > before {
        assert!(
            Instant::now() < deadline,
            "the store's connections outlive it"
        );
        std::thread::yield_now();
    }
    drop(rt);
}

/// Retries `f` until it succeeds (the store reconnecting after a restart), at most 30 s.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, Error>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                assert!(
                    matches!(e, Error::Redis { .. } | Error::CommitOutcomeUnknown { .. }),
                    "{what}: {e:?}"
                );
                std::thread::yield_now();
            }
            Err(e) => panic!("{what}: still failing after 30 s: {e}"),
        }
    }
}

/// A client that dequeued an item and then stopped (its transaction leaked: nothing gives the
/// item back) holds it until its hold ends (`Builder::transaction_timeout`, or the default);
/// then any store's next look at the queue takes it back. The commit that comes later fails
/// with `TransactionExpired` and applies nothing.
fn a_hold_ends_without_its_client_and_its_commit_then_applies_nothing(server: &RedisServer) {
    let clock = ManualClock::new(std::time::SystemTime::now()).unwrap();
    let a = builder(server).clock(clock.clone()).open().unwrap();
    let b = builder(server).clock(clock.clone()).open().unwrap();
    let (qa, qb) = (
        a.blocking_queue::<u32>("q").unwrap(),
        b.blocking_queue::<u32>("q").unwrap(),
    );
    let out = a.blocking_queue::<u32>("out").unwrap();
    let mut tx = a.begin();
    qa.enqueue(&mut tx, 1).unwrap();
    tx.blocking_commit().unwrap();

    let mut tx = a.begin();
    assert_eq!(qa.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
    out.enqueue(&mut tx, 2).unwrap();
    assert_eq!(
        qb.blocking_count().unwrap(),
        0,
        "held: hidden from everyone"
    );
    assert_eq!(qb.blocking_stats().unwrap().held, 1);
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        qb.blocking_count().unwrap(),
        0,
        "still held before its hold ends"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(qb.blocking_count().unwrap(), 1, "back once the hold ended");
    assert!(matches!(
        tx.blocking_commit(),
        Err(Error::TransactionExpired)
    ));
    assert_eq!(
        out.blocking_count().unwrap(),
        0,
        "nothing of the commit applied"
    );
    let mut again = b.begin();
    assert_eq!(qb.blocking_try_dequeue(&mut again).unwrap(), Some(1));
    again.blocking_commit().unwrap();
    assert_eq!(qa.blocking_count().unwrap(), 0);
}

/// `FUNCTION FLUSH` (a server without the store's functions: a new one, or one whose
/// functions were dropped) answers that the function is missing: the store loads its library
/// again, and the call succeeds.
fn functions_are_loaded_again_when_the_server_forgets_them(server: &RedisServer) {
    let store = builder(server).open().unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();
    let libraries = |server: &RedisServer| match server.command(&[b"FUNCTION", b"LIST"]) {
        Reply::Array(libs) => libs.len(),
        other => panic!("FUNCTION LIST answered {other:?}"),
    };
    for round in 0..3 {
        assert_eq!(
            server.command(&[b"FUNCTION", b"FLUSH"]),
            Reply::Status("OK".into())
        );
        assert_eq!(libraries(server), 0);
        let mut tx = store.begin();
        q.enqueue(&mut tx, round).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(libraries(server), 1);
        server.command(&[b"FUNCTION", b"FLUSH"]);
        let mut tx = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(round));
        tx.blocking_commit().unwrap();
    }
}

/// With `appendfsync always`, every commit acknowledged before the server is killed with
/// SIGKILL is there when it comes back from its append-only file; a commit unacknowledged
/// then (failed or unknown) is all there or not at all; the store that was connected goes on
/// after it reconnects.
fn acknowledged_commits_survive_kill_9_of_the_server_and_the_store_reconnects(
    server: &RedisServer,
) {
    let store = builder(server).require_fsync(true).open().unwrap();
    let q = store.blocking_queue::<u64>("q").unwrap();
    let done = store.blocking_queue::<u64>("done").unwrap();
    let mut acknowledged = Vec::new();
    for cycle in 0..3u64 {
        for i in 0..200u64 {
            let mut tx = store.begin();
            let item = cycle * 1000 + i;
            q.enqueue(&mut tx, item).unwrap();
            tx.blocking_commit().unwrap();
            acknowledged.push(item);
        }
        // Half of them moved to `done` in transactions of their own.
        for _ in 0..100 {
            let mut tx = store.begin();
            let item = q.blocking_try_dequeue(&mut tx).unwrap().expect("an item");
            done.enqueue(&mut tx, item).unwrap();
            tx.blocking_commit().unwrap();
        }
        server.kill_9();
        let mut tx = store.begin();
        q.enqueue(&mut tx, u64::MAX).unwrap();
        assert!(
            matches!(
                tx.blocking_commit(),
                Err(Error::Redis { .. } | Error::CommitOutcomeUnknown { .. })
            ),
            "a commit to a server that is down fails"
        );
        server.restart();
        let after = builder(server).open().unwrap();
        let (q2, done2) = (
            after.blocking_queue::<u64>("q").unwrap(),
            after.blocking_queue::<u64>("done").unwrap(),
        );
        let mut all: Vec<u64> = eventually("peek q", || {
            let mut tx = after.begin();
            let mut seen = Vec::new();
            while let Some(x) = q2.blocking_try_dequeue(&mut tx)? {
                seen.push(x);
            }
            tx.blocking_abort()?;
            Ok(seen)
        });
        let mut tx = after.begin();
        while let Some(x) = done2.blocking_try_dequeue(&mut tx).unwrap() {
            all.push(x);
        }
        tx.blocking_abort().unwrap();
        // The commit that failed with the server down applied nothing.
        all.retain(|&x| x != u64::MAX);
        all.sort_unstable();
        let mut expected = acknowledged.clone();
        expected.sort_unstable();
        assert_eq!(
            all, expected,
            "cycle {cycle}: every acknowledged item, once"
        );
        after.blocking_close().unwrap();
        // The first store reconnects by itself.
        eventually("count after the restart", || q.blocking_count());
    }
}

/// Keys of the store changed by hand: a wrong type, a missing or malformed record. Each
/// call that meets one fails with `Error::Redis` (no panic), and the items that were not
/// damaged stay where they were.
fn tampered_keys_give_a_typed_error_and_lose_nothing(server: &RedisServer) {
    let store = builder(server).open().unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    for i in 1..=3 {
        q.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    // Queue "q" is number 1; items 1..=3.
    let items = b"rq:{t}:q:1:items";
    // A missing record: the dequeue that meets it fails, its id is set aside, the rest stay.
    assert_eq!(server.command(&[b"HDEL", items, b"1"]), Reply::Int(1));
    let mut tx = store.begin();
    match q.blocking_try_dequeue(&mut tx) {
        Err(Error::Redis { operation, .. }) => assert_eq!(operation, "dequeue"),
        other => panic!("a missing record: {other:?}"),
    }
    tx.blocking_abort().unwrap();
    assert_eq!(
        server.command(&[b"LRANGE", b"rq:{t}:q:1:damaged", b"0", b"-1"]),
        Reply::Array(vec![Reply::Bulk(Some(b"1".to_vec()))])
    );
    assert_eq!(q.blocking_count().unwrap(), 2);
    // A malformed record: refused when read; the item is held by the transaction, and given
    // back with it.
    server.command(&[b"HSET", items, b"2", b"not a record"]);
    let mut tx = store.begin();
    assert!(matches!(
        q.blocking_try_dequeue(&mut tx),
        Err(Error::Redis { .. })
    ));
    tx.blocking_abort().unwrap();
    assert_eq!(q.blocking_count().unwrap(), 2, "given back with the abort");
    assert!(matches!(
        q.blocking_browse(None, 10),
        Err(Error::Redis { .. })
    ));
    // A key of the wrong type.
    server.command(&[b"DEL", b"rq:{t}:q:1:ready"]);
    server.command(&[b"SET", b"rq:{t}:q:1:ready", b"x"]);
    let mut tx = store.begin();
    assert!(matches!(
        q.blocking_try_dequeue(&mut tx),
        Err(Error::Redis { .. })
    ));
    drop(tx);
    assert!(matches!(q.blocking_count(), Err(Error::Redis { .. })));
    assert!(matches!(q.blocking_stats(), Err(Error::Redis { .. })));
    let mut tx = store.begin();
    q.enqueue(&mut tx, 9).unwrap();
    assert!(matches!(tx.blocking_commit(), Err(Error::Redis { .. })));
    // Another queue of the store is not touched by any of it.
    let other = store.blocking_queue::<u32>("other").unwrap();
    let mut tx = store.begin();
    other.enqueue(&mut tx, 5).unwrap();
    tx.blocking_commit().unwrap();
    assert_eq!(other.blocking_count().unwrap(), 1);
    // The layout's version of another build is refused at connect.
    server.command(&[b"SET", b"rq:{t}:version", b"99"]);
    assert!(matches!(
        builder(server).open(),
        Err(Error::SchemaVersion {
            found: 99,
            supported: 2,
            ..
        })
    ));
}

/// The takes and commits of many transactions at once go to the server in groups (fewer
/// function calls than calls), and every item moves once. In a group, each call has its own
/// answer: a take from a queue whose list was tampered with fails alone, and the takes
/// around it hold their items, counted once each.
fn concurrent_calls_go_to_the_server_in_groups_and_each_fails_alone(server: &RedisServer) {
    const THREADS: u32 = 32;
    const MOVES: u32 = 20;
    let store = builder(server).open().unwrap();
    let a = store.blocking_queue::<u32>("a").unwrap();
    let b = store.blocking_queue::<u32>("b").unwrap();
    let mut tx = store.begin();
    for i in 0..THREADS * MOVES {
        a.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    let fcalls = |server: &RedisServer| {
        let (calls, _) = server
            .fcall_stats()
            .expect("FCALL's count in INFO commandstats");
        calls
    };
    let before = fcalls(server);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..MOVES {
                    let mut tx = store.begin();
                    let item = a.blocking_try_dequeue(&mut tx).unwrap().expect("an item");
                    b.enqueue(&mut tx, item).unwrap();
                    tx.blocking_commit().unwrap();
                }
            });
        }
    });
    let calls = fcalls(server) - before;
    let ops = u64::from(2 * THREADS * MOVES);
    eprintln!("{ops} takes and commits of {THREADS} threads: {calls} function calls");
    assert!(
        calls < ops,
        "{calls} function calls for {ops} takes and commits"
    );
    assert_eq!(a.blocking_count().unwrap(), 0);
    let mut moved = crate::common::drain(&store, &b);
    moved.sort_unstable();
    assert_eq!(moved, (0..THREADS * MOVES).collect::<Vec<_>>());

    // One group by hand: takes from queue "c" (number 3) around a take from "d" (4), whose
    // ready list is a string.
    let c = store.blocking_queue::<u32>("c").unwrap();
    store.blocking_queue::<u32>("d").unwrap();
    let mut tx = store.begin();
    for i in [7, 8, 9] {
        c.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    server.command(&[b"SET", b"rq:{t}:q:4:ready", b"x"]);
    fn find_batch(reply: &Reply) -> Option<Vec<u8>> {
        match reply {
            Reply::Bulk(Some(name)) if name.ends_with(b"_batch") => Some(name.clone()),
            Reply::Array(parts) => parts.iter().find_map(find_batch),
            _ => None,
        }
    }
    let batch = find_batch(&server.command(&[b"FUNCTION", b"LIST"])).expect("the batch function");
    let take = |q: &'static [u8], token: &'static [u8]| -> [&'static [u8]; 8] {
        [b"take", b"6", q, b"1", token, b"60000", b"0", b"0"]
    };
    let mut args: Vec<&[u8]> = vec![b"FCALL", &batch, b"1", b"rq:{t}:queues", b"rq:{t}:", b"0"];
    args.extend([b"test".as_slice(), b"3"]);
    args.extend(take(b"3", b"aaaa"));
    args.extend(take(b"4", b"bbbb"));
    args.extend(take(b"3", b"cccc"));
    let Reply::Array(answers) = server.command(&args) else {
        panic!("the batch function answered no list");
    };
    let taken = |answer: &Reply| match answer {
        Reply::Array(parts) => match parts.as_slice() {
            [Reply::Int(_), Reply::Bulk(Some(ok)), Reply::Bulk(Some(id)), Reply::Bulk(Some(_))]
                if ok == b"ok" =>
            {
                id.clone()
            }
            other => panic!("a take answered {other:?}"),
        },
        other => panic!("a take answered {other:?}"),
    };
    assert_eq!(answers.len(), 3);
    let (first, second) = (taken(&answers[0]), taken(&answers[2]));
    assert_ne!(first, second);
    assert!(
        matches!(&answers[1], Reply::Error(e) if e.contains("WRONGTYPE")),
        "the take from the tampered queue: {:?}",
        answers[1]
    );
    let entry = |id: &[u8]| [b"3:".as_slice(), id].concat();
    for (token, id) in [(b"rq:{t}:tx:aaaa", &first), (b"rq:{t}:tx:cccc", &second)] {
        assert_eq!(
            server.command(&[b"LRANGE", token, b"0", b"-1"]),
            Reply::Array(vec![Reply::Bulk(Some(entry(id)))])
        );
    }
    assert_eq!(
        server.command(&[b"HGET", b"rq:{t}:held", b"3"]),
        Reply::Bulk(Some(b"2".to_vec()))
    );
    assert_eq!(server.command(&[b"ZCARD", b"rq:{t}:holds"]), Reply::Int(2));
    assert_eq!(c.blocking_stats().unwrap().held, 2);
    assert_eq!(c.blocking_count().unwrap(), 1);
}

/// A URL no engine serves, a socket nobody listens on, a server that wants a password.
fn bad_urls_a_server_that_is_down_and_one_that_wants_a_password(server: &RedisServer) {
    for url in ["ftp://host/q", "http://localhost:6379", "nothing"] {
        assert!(
            matches!(
                Store::builder().url(url).open(),
                Err(Error::InvalidConfig { setting: "url", .. })
            ),
            "{url}"
        );
    }
    let nobody = server.data_dir().unwrap().join("nobody.sock");
    match Store::builder()
        .url(&format!("redis+unix://{}", nobody.display()))
        .open()
    {
        Err(e @ Error::Redis { operation, .. }) => {
            assert_eq!(operation, "connect");
            let said = e.to_string();
            assert!(
                said.contains(&nobody.display().to_string()),
                "the error names the server: {said}"
            );
        }
        other => panic!("a server that is down: {other:?}"),
    }
    assert!(matches!(
        Store::builder().url(server.url()).namespace("a{b}").open(),
        Err(Error::InvalidConfig {
            setting: "namespace",
            ..
        })
    ));
    server.command(&[b"CONFIG", b"SET", b"requirepass", b"s3cret"]);
    assert!(matches!(
        builder(server).open(),
        Err(Error::Redis {
            operation: "connect",
            ..
        })
    ));
    let with_password = format!("{}?pass=s3cret", server.url());
    let wrong_password = format!("{}?pass=wrong-s3cret", server.url());
    match Store::builder().url(&wrong_password).namespace("t").open() {
        Err(e @ Error::Redis { .. }) => {
            let said = e.to_string();
            assert!(
                said.contains("cannot connect to the Redis server at") && !said.contains("wrong"),
                "the server named, the password not: {said}"
            );
        }
        other => panic!("a wrong password: {other:?}"),
    }
    let store = Store::builder()
        .url(&with_password)
        .namespace("t")
        .open()
        .expect("the password in the URL");
    let q = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    q.enqueue(&mut tx, 1).unwrap();
    tx.blocking_commit().unwrap();
    assert_eq!(q.blocking_count().unwrap(), 1);
}

/// `appendfsync everysec` loses up to a second of acknowledged writes in a crash: a store
/// built with `require_fsync(true)` refuses such a server; without it the store connects.
fn a_server_that_does_not_fsync_every_write_is_refused_when_asked(server: &RedisServer) {
    builder(server)
        .require_fsync(true)
        .open()
        .expect("appendfsync always");
    server.command(&[b"CONFIG", b"SET", b"appendfsync", b"everysec"]);
    assert!(matches!(
        builder(server).require_fsync(true).open(),
        Err(Error::Redis {
            operation: "connect",
            ..
        })
    ));
    builder(server).open().expect("connects with a warning");
}

/// The environment variable that makes this binary a worker process of
/// [`processes_and_the_server_killed_with_sigkill_lose_and_duplicate_nothing`]: the server's
/// URL.
pub(crate) const WORKER_VAR: &str = "RQ_REDIS_WORKER_URL";
const WORKER_SEED_VAR: &str = "RQ_REDIS_WORKER_SEED";
const MOVED: u64 = 2000;
/// The workers' hold: a killed worker's items come back this long after its dequeue.
const WORKER_HOLD: Duration = Duration::from_secs(1);

/// This module's worker process: started by one of its tests with the variable set (see
/// `tests/suite/main.rs`), not as a test run.
pub(crate) const WORKER: (&str, fn(&str)) = (WORKER_VAR, worker);

/// A worker process: moves items between queues `a` and `b`, a few at a time, in
/// transactions it commits, aborts or drops at random, and reports each acknowledged commit
/// on stdout, until it is killed. A call that fails (the server is down, or restarting) is
/// left behind with its transaction, and the worker goes on.
fn worker(url: &str) {
    let store = eventually("worker: connect", || {
        Store::builder()
            .url(url)
            .namespace("multiproc")
            .transaction_timeout(WORKER_HOLD)
            .open()
    });
    let queues = [
        eventually("worker: queue a", || store.blocking_queue::<u64>("a")),
        eventually("worker: queue b", || store.blocking_queue::<u64>("b")),
    ];
    movers::move_forever(
        &store,
        &queues,
        movers::seed(WORKER_SEED_VAR),
        OnFailure::GoOn,
    )
}

/// TLS (rustls) with a private authority: the server, given a certificate signed by a test
/// authority (`tests/common/certs.rs`), listens for TLS on a port of localhost; a store
/// given that authority connects with `rediss://` and works; one without it (the system's
/// roots) is refused at connect with a typed error, as is a plain `redis://` to the TLS port.
fn tls_connections_verify_the_server(server: &RedisServer) {
    if !crate::common::certs::available() {
        assert!(
            std::env::var_os(crate::common::redis::REQUIRE_VAR).is_none(),
            "the TLS test needs the openssl command"
        );
        eprintln!("skipped: no `openssl` command to make the certificates");
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    crate::common::certs::make(dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let file = |name: &str| dir.join(name).to_str().unwrap().as_bytes().to_vec();
    assert_eq!(
        server.command(&[
            b"CONFIG",
            b"SET",
            b"tls-cert-file",
            &file("server.pem"),
            b"tls-key-file",
            &file("server.key"),
            b"tls-ca-cert-file",
            &file("ca.pem"),
            b"tls-auth-clients",
            b"no",
            b"tls-port",
            port.as_bytes(),
        ]),
        Reply::Status("OK".into())
    );
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let tls_url = format!("rediss://localhost:{port}");

    // With the authority: TLS, verified, and the queues work over it.
    let store = Store::builder()
        .url(&tls_url)
        .namespace("t")
        .tls_root_certificates(ca.clone())
        .open()
        .unwrap();
    let q = store.blocking_queue::<u32>("q").unwrap();
    let mut tx = store.begin();
    q.enqueue(&mut tx, 7).unwrap();
    tx.blocking_commit().unwrap();
    assert_eq!(crate::common::drain(&store, &q), vec![7]);
    store.blocking_close().unwrap();

    let refused_at_connect = |builder: Builder| {
        let refused = builder.namespace("t").open();
        assert!(
            matches!(
                refused,
                Err(Error::Redis {
                    operation: "connect",
                    ..
                })
            ),
            "{refused:?}"
        );
    };
    // Without it the server's certificate is not trusted.
    refused_at_connect(Store::builder().url(&tls_url));
    // In the clear to the TLS port: refused too, not a hang.
    refused_at_connect(
        Store::builder()
            .url(&format!("redis://localhost:{port}"))
            .tls_root_certificates(ca),
    );
}

/// Four worker processes (this binary, re-executed) move items between two queues; the
/// parent kills one with SIGKILL at random moments (after a random number of their commits)
/// and starts another, and every fourth time kills the server too and restarts it from its
/// append-only file. Each move is one transaction, so once every worker is dead and their
/// holds have ended, the two queues hold exactly the items put in at the start: none lost,
/// none twice.
fn processes_and_the_server_killed_with_sigkill_lose_and_duplicate_nothing(server: &RedisServer) {
    use rand::{Rng, SeedableRng};

    let store = builder(server).namespace("multiproc").open().unwrap();
    let a = store.blocking_queue::<u64>("a").unwrap();
    let mut tx = store.begin();
    for i in 0..MOVED {
        a.enqueue(&mut tx, i).unwrap();
    }
    tx.blocking_commit().unwrap();
    store.blocking_close().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut workers = Workers::start(4, WORKER_VAR, server.url(), WORKER_SEED_VAR);
    let (kills, mut server_kills, mut seen) = (20, 0, 0);
    for round in 0..kills {
        let commits: u32 = rng.gen_range(20..150);
        workers.wait_commits(commits);
        seen += commits;
        let victim = rng.gen_range(0..workers.len());
        workers.kill(victim);
        if round % 4 == 3 {
            server.kill_9();
            server.restart();
            server_kills += 1;
        }
        workers.replace(victim, 100 + round);
    }
    workers.kill_all();
    // The dead workers' holds end WORKER_HOLD after their last dequeues; a count takes
    // back what has ended. Bounded.
    let store = builder(server).namespace("multiproc").open().unwrap();
    let a = store.blocking_queue::<u64>("a").unwrap();
    let b = store.blocking_queue::<u64>("b").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.blocking_count().unwrap() + b.blocking_count().unwrap() < MOVED {
        assert!(
            Instant::now() < deadline,
            "the killed workers' items are still held a minute later: a {:?}, b {:?}; \
             damaged {:?} {:?}",
            a.blocking_stats().unwrap(),
            b.blocking_stats().unwrap(),
            server.command(&[b"LRANGE", b"rq:{multiproc}:q:1:damaged", b"0", b"-1"]),
            server.command(&[b"LRANGE", b"rq:{multiproc}:q:2:damaged", b"0", b"-1"]),
        );
        std::thread::yield_now();
    }
    let mut all = Vec::new();
    let mut tx = store.begin();
    for q in [&a, &b] {
        while let Some(x) = q.blocking_try_dequeue(&mut tx).unwrap() {
            all.push(x);
        }
    }
    let in_queues = all.len();
    tx.blocking_abort().unwrap();
    all.sort_unstable();
    assert_eq!(all, (0..MOVED).collect::<Vec<_>>(), "none lost, none twice");
    eprintln!(
        "    {kills} workers and {server_kills} servers killed with SIGKILL after {seen} \
         acknowledged commits; {in_queues} items in the queues, none lost or twice"
    );
}
