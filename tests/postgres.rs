//! The PostgreSQL engine against a real server: the transaction semantics (S1-S5 and
//! durability across connections), bad input and faults. The server is the harness's own
//! (`tests/pg/mod.rs`: `initdb` and `pg_ctl` in a temporary directory, Unix socket only), or
//! the one `RQ_TEST_POSTGRES_URL` names. Without PostgreSQL installed every test is reported
//! ignored, with a banner that says why.
//!
//! Each test works in a schema of its own, so tests can run side by side on one database.

#[cfg(feature = "postgres")]
mod pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Barrier};

    use reliable_queue::{Error, ReliableConcurrentQueue, Store};

    use super::pg::PgServer;

    /// A store on the test's own schema.
    fn store(server: &PgServer, schema: &str) -> Store {
        Store::builder()
            .postgres(server.url())
            .postgres_schema(schema)
            .open()
            .expect("connect to the test server")
    }

    /// Runs `sql` on its own connection.
    fn execute(url: &str, sql: &str) {
        let sql = sql.to_owned();
        let url = url.to_owned();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                let driver = tokio::spawn(connection);
                client.batch_execute(&sql).await.unwrap();
                drop(client);
                driver.await.unwrap().unwrap();
            });
    }

    fn fill(store: &Store, q: &ReliableConcurrentQueue<u64>, items: impl IntoIterator<Item = u64>) {
        let mut tx = store.begin();
        for i in items {
            q.enqueue(&mut tx, i).unwrap();
        }
        tx.blocking_commit().unwrap();
    }

    /// Dequeues everything visible, one transaction, committed.
    fn drain(store: &Store, q: &ReliableConcurrentQueue<u64>) -> Vec<u64> {
        let mut tx = store.begin();
        let mut out = Vec::new();
        while let Some(i) = q.blocking_try_dequeue(&mut tx).unwrap() {
            out.push(i);
        }
        tx.blocking_commit().unwrap();
        out
    }

    /// S1: an enqueue is invisible until its commit, to every transaction including its own.
    pub fn s1_an_enqueue_is_invisible_until_commit(server: &PgServer) {
        let store = store(server, "s1");
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 1).unwrap();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), None, "not even to itself");
        let mut other = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut other).unwrap(), None);
        assert_eq!(q.blocking_count().unwrap(), 0);
        tx.blocking_commit().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 1);
        assert_eq!(q.blocking_try_dequeue(&mut other).unwrap(), Some(1));
        other.blocking_commit().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 0);
    }

    /// S2 and S5: a dequeued item is hidden from every other transaction at once, without
    /// waiting, and `count` does not count it; the next dequeue gets the next item.
    pub fn s2_s5_a_dequeue_hides_the_item_at_once_and_count_skips_it(server: &PgServer) {
        let store = store(server, "s2");
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2, 3]);
        assert_eq!(q.blocking_count().unwrap(), 3);
        let mut a = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut a).unwrap(), Some(1));
        assert_eq!(a.dequeued(), 1);
        assert_eq!(q.blocking_count().unwrap(), 2, "held by an open transaction");
        let mut b = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut b).unwrap(), Some(2));
        assert_eq!(q.blocking_count().unwrap(), 1);
        b.blocking_commit().unwrap();
        a.blocking_commit().unwrap();
        assert_eq!(drain(&store, &q), [3]);
    }

    /// S3: a commit applies its enqueues and dequeues on several queues at once.
    pub fn s3_a_commit_is_atomic_across_queues(server: &PgServer) {
        let store = store(server, "s3");
        let inbox = store.blocking_queue::<u64>("inbox").unwrap();
        let done = store.blocking_queue::<u64>("done").unwrap();
        let audit = store.blocking_queue::<u64>("audit").unwrap();
        fill(&store, &inbox, [7]);
        let mut tx = store.begin();
        let item = inbox.blocking_try_dequeue(&mut tx).unwrap().unwrap();
        done.enqueue(&mut tx, item * 10).unwrap();
        audit.enqueue(&mut tx, item).unwrap();
        assert_eq!(
            (done.blocking_count().unwrap(), audit.blocking_count().unwrap()),
            (0, 0)
        );
        tx.blocking_commit().unwrap();
        assert_eq!(inbox.blocking_count().unwrap(), 0);
        assert_eq!(drain(&store, &done), [70]);
        assert_eq!(drain(&store, &audit), [7]);
    }

    /// S4: an abort, or a dropped transaction, puts its items back at the head, and drops its
    /// enqueues.
    pub fn s4_abort_and_drop_put_items_back_at_the_head(server: &PgServer) {
        // One connection: whatever comes after a drop waits for its rollback to finish and
        // the connection to come back, so the test needs no waiting of its own.
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("s4")
            .postgres_pool_size(1)
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2, 3]);
        let mut tx = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(2));
        q.enqueue(&mut tx, 99).unwrap();
        tx.blocking_abort().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 3);

        let mut tx = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        q.enqueue(&mut tx, 98).unwrap();
        drop(tx);
        assert_eq!(drain(&store, &q), [1, 2, 3], "back at the head, the enqueue gone");
    }

    /// Committed items are in the database: a second store (as another process would) sees
    /// them, in commit order.
    pub fn committed_items_are_seen_by_another_connection_in_order(server: &PgServer) {
        let first = store(server, "durable");
        let q = first.blocking_queue::<u64>("q").unwrap();
        fill(&first, &q, 0..50);
        fill(&first, &q, 50..100);
        first.blocking_close().unwrap();
        let second = store(server, "durable");
        let q = second.blocking_queue::<u64>("q").unwrap();
        assert_eq!(drain(&second, &q), (0..100).collect::<Vec<_>>());
    }

    /// Many consumers at once, each in its own transaction: every item is taken exactly once
    /// (SKIP LOCKED never hands a held row to a second transaction).
    pub fn concurrent_consumers_take_each_item_once(server: &PgServer) {
        let store = store(server, "concurrent");
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, 0..400);
        let consumers = 8;
        let start = Arc::new(Barrier::new(consumers));
        let threads: Vec<_> = (0..consumers)
            .map(|_| {
                let (store, q, start) = (store.clone(), q.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut got = Vec::new();
                    loop {
                        let mut tx = store.begin();
                        let mut batch = Vec::new();
                        while batch.len() < 5 {
                            match q.blocking_try_dequeue(&mut tx).unwrap() {
                                Some(i) => batch.push(i),
                                None => break,
                            }
                        }
                        tx.blocking_commit().unwrap();
                        if batch.is_empty() {
                            return got;
                        }
                        got.extend(batch);
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in threads {
            all.extend(t.join().unwrap());
        }
        let distinct: BTreeSet<u64> = all.iter().copied().collect();
        assert_eq!(all.len(), 400, "no item taken twice");
        assert_eq!(distinct, (0..400).collect());
        assert_eq!(q.blocking_count().unwrap(), 0);
    }

    /// The async forms, on a tokio runtime of the test's own.
    pub fn the_async_forms_work_under_tokio(server: &PgServer) {
        let url = server.url().to_owned();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let store = Store::builder()
                    .postgres(&url)
                    .postgres_schema("asyncforms")
                    .connect()
                    .await
                    .unwrap();
                let q = store.queue::<String>("q").await.unwrap();
                let mut tx = store.begin();
                q.enqueue(&mut tx, "a".to_owned()).unwrap();
                tx.commit().await.unwrap();
                assert_eq!(q.count().await.unwrap(), 1);
                let mut tx = store.begin();
                assert_eq!(q.try_dequeue(&mut tx).await.unwrap().as_deref(), Some("a"));
                tx.abort().await.unwrap();
                assert_eq!(q.count().await.unwrap(), 1);
                store.close().await.unwrap();
            });
    }

    /// Bad settings and an unreachable server are typed errors, never a panic.
    pub fn bad_urls_schemas_and_unreachable_servers_are_typed_errors(server: &PgServer) {
        assert!(matches!(
            Store::blocking_connect("postgresql://[::1"),
            Err(Error::InvalidConfig { .. })
        ));
        assert!(matches!(
            Store::builder()
                .postgres(server.url())
                .postgres_schema("Bad-Name")
                .open(),
            Err(Error::InvalidConfig { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let nowhere = format!(
            "host={} port=1 user=rq dbname=postgres connect_timeout=5",
            dir.path().display()
        );
        match Store::blocking_connect(&nowhere) {
            Err(Error::Postgres { operation, .. }) => assert_eq!(operation, "connect"),
            other => panic!("expected Error::Postgres, got {other:?}"),
        }
    }

    /// A schema written by another version of the crate is refused, and left as it is.
    pub fn a_schema_of_another_version_is_refused(server: &PgServer) {
        let store = store(server, "versioned");
        store.blocking_close().unwrap();
        execute(
            server.url(),
            "UPDATE versioned.meta SET value = '99' WHERE key = 'schema_version'",
        );
        match Store::builder()
            .postgres(server.url())
            .postgres_schema("versioned")
            .open()
        {
            Err(Error::SchemaVersion {
                found, supported, ..
            }) => assert_eq!((found, supported), (99, 1)),
            other => panic!("expected SchemaVersion, got {other:?}"),
        }
    }

    /// What is not built on this engine yet says so with a typed error, and loses nothing.
    pub fn the_processing_layer_is_refused_for_now(server: &PgServer) {
        let store = store(server, "unsupported");
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1]);
        assert!(matches!(
            q.blocking_try_lease(std::time::Duration::from_secs(5)),
            Err(Error::Unsupported { .. })
        ));
        let mut tx = store.begin();
        assert!(matches!(
            q.blocking_dequeue(&mut tx),
            Err(Error::Unsupported { .. })
        ));
        drop(tx);
        assert_eq!(drain(&store, &q), [1], "nothing lost");
    }
}

#[cfg(feature = "postgres")]
fn main() -> std::process::ExitCode {
    use cases::*;
    pg::run_suite(vec![
        (
            "s1_an_enqueue_is_invisible_until_commit",
            s1_an_enqueue_is_invisible_until_commit,
        ),
        (
            "s2_s5_a_dequeue_hides_the_item_at_once_and_count_skips_it",
            s2_s5_a_dequeue_hides_the_item_at_once_and_count_skips_it,
        ),
        (
            "s3_a_commit_is_atomic_across_queues",
            s3_a_commit_is_atomic_across_queues,
        ),
        (
            "s4_abort_and_drop_put_items_back_at_the_head",
            s4_abort_and_drop_put_items_back_at_the_head,
        ),
        (
            "committed_items_are_seen_by_another_connection_in_order",
            committed_items_are_seen_by_another_connection_in_order,
        ),
        (
            "concurrent_consumers_take_each_item_once",
            concurrent_consumers_take_each_item_once,
        ),
        (
            "the_async_forms_work_under_tokio",
            the_async_forms_work_under_tokio,
        ),
        (
            "bad_urls_schemas_and_unreachable_servers_are_typed_errors",
            bad_urls_schemas_and_unreachable_servers_are_typed_errors,
        ),
        (
            "a_schema_of_another_version_is_refused",
            a_schema_of_another_version_is_refused,
        ),
        (
            "the_processing_layer_is_refused_for_now",
            the_processing_layer_is_refused_for_now,
        ),
    ])
}

/// Built without the `postgres` feature: says how to run these tests.
#[cfg(not(feature = "postgres"))]
fn main() {
    eprintln!(
        "==> PostgreSQL engine tests not built: run them with `cargo test --features postgres`"
    );
}
