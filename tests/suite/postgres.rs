//! The PostgreSQL engine against a real server: the transaction semantics (S1-S5 and
//! durability across connections), bad input and faults. The server is the harness's own
//! (`tests/pg/mod.rs`: `initdb` and `pg_ctl` in a temporary directory, Unix socket only), or
//! the one `RQ_TEST_POSTGRES_URL` names. Without PostgreSQL installed every test is reported
//! ignored, with a banner that says why.
//!
//! Each test works in a schema of its own, so tests can run side by side on one database.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Barrier};

    use reliable_queue::{Error, ReliableConcurrentQueue, Store};
    use tokio_postgres::types::ToSql;

    use super::pg::PgServer;
    use crate::common::scenarios::{caller_runtime, fill, move_among_aborts_then_wake_a_waiter};

    /// A store on the test's own schema.
    fn store(server: &PgServer, schema: &str) -> Store {
        server.store(schema)
    }

    /// Runs `sql` with `params` on a connection of its own: the first column of its first
    /// row, when it returns a count.
    fn run_sql(url: &str, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Option<i64> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                let driver = tokio::spawn(connection);
                let rows = client.query(sql, params).await.unwrap();
                drop(client);
                driver.await.unwrap().unwrap();
                rows.first().and_then(|row| row.try_get(0).ok())
            })
    }

    fn execute(url: &str, sql: &str) {
        run_sql(url, sql, &[]);
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
    pub(crate) fn s1_an_enqueue_is_invisible_until_commit(server: &PgServer) {
        let store = store(server, "s1");
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 1).unwrap();
        assert_eq!(
            q.blocking_try_dequeue(&mut tx).unwrap(),
            None,
            "not even to itself"
        );
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
    pub(crate) fn s2_s5_a_dequeue_hides_the_item_at_once_and_count_skips_it(server: &PgServer) {
        let store = store(server, "s2");
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2, 3]);
        assert_eq!(q.blocking_count().unwrap(), 3);
        let mut a = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut a).unwrap(), Some(1));
        assert_eq!(a.dequeued(), 1);
        assert_eq!(
            q.blocking_count().unwrap(),
            2,
            "held by an open transaction"
        );
        let mut b = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut b).unwrap(), Some(2));
        assert_eq!(q.blocking_count().unwrap(), 1);
        b.blocking_commit().unwrap();
        a.blocking_commit().unwrap();
        assert_eq!(drain(&store, &q), [3]);
    }

    /// S3: a commit applies its enqueues and dequeues on several queues at once.
    pub(crate) fn s3_a_commit_is_atomic_across_queues(server: &PgServer) {
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
            (
                done.blocking_count().unwrap(),
                audit.blocking_count().unwrap()
            ),
            (0, 0)
        );
        tx.blocking_commit().unwrap();
        assert_eq!(inbox.blocking_count().unwrap(), 0);
        assert_eq!(drain(&store, &done), [70]);
        assert_eq!(drain(&store, &audit), [7]);
    }

    /// S4: an abort, or a dropped transaction, puts its items back at the head, and drops its
    /// enqueues.
    pub(crate) fn s4_abort_and_drop_put_items_back_at_the_head(server: &PgServer) {
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
        assert_eq!(
            drain(&store, &q),
            [1, 2, 3],
            "back at the head, the enqueue gone"
        );
    }

    /// A dequeue whose future is dropped while the database works on it aborts its
    /// transaction: the commit says so, and the item it may have taken is back. (A pool of
    /// one connection, held by another transaction, keeps the dequeue waiting for certain
    /// when its future is dropped.)
    pub(crate) fn a_dequeue_cancelled_mid_flight_aborts_its_transaction(server: &PgServer) {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("cancelled")
            .postgres_pool_size(1)
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2, 3]);
        let mut holder = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut holder).unwrap(), Some(1));
        let mut tx = store.begin();
        q.enqueue(&mut tx, 40).unwrap();
        {
            let mut dequeue = std::pin::pin!(q.try_dequeue(&mut tx));
            let polled = dequeue
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()));
            assert!(matches!(polled, Poll::Pending), "waits for the connection");
        }
        holder.blocking_abort().unwrap();
        assert!(matches!(
            tx.blocking_commit(),
            Err(Error::TransactionAborted { .. })
        ));
        assert_eq!(
            drain(&store, &q),
            [1, 2, 3],
            "nothing taken, the enqueue not applied"
        );
    }

    /// A waiting dequeue: the consumer registers (its store's listener takes the queue's
    /// advisory lock, which makes committers notify), and a commit by another store wakes it
    /// with the item. A timeout with nothing committed ends the wait with `None`.
    pub(crate) fn a_waiting_consumer_is_woken_by_a_commit(server: &PgServer) {
        let consumer_store = store(server, "waiting");
        let producer_store = store(server, "waiting");
        let q = consumer_store.blocking_queue::<u64>("q").unwrap();
        let mut tx = consumer_store.begin();
        assert_eq!(
            q.blocking_dequeue_timeout(&mut tx, std::time::Duration::from_millis(50))
                .unwrap(),
            None
        );
        drop(tx);
        let consumer = {
            let (store, q) = (consumer_store.clone(), q.clone());
            std::thread::spawn(move || {
                let mut tx = store.begin();
                let item = q.blocking_dequeue(&mut tx).unwrap();
                tx.blocking_commit().unwrap();
                item
            })
        };
        // Wait (bounded) until the consumer is registered, so the commit below is the one
        // that wakes it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while super::pg::watched_queues(server.url(), "waiting") == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the consumer registers"
            );
            std::thread::yield_now();
        }
        let p = producer_store.blocking_queue::<u64>("q").unwrap();
        fill(&producer_store, &p, [42]);
        assert_eq!(consumer.join().unwrap(), 42);
        assert_eq!(q.blocking_count().unwrap(), 0);
    }

    /// Many consumers waiting in one store, fed by commits of several items from another:
    /// every item is taken exactly once, and every consumer ends.
    pub(crate) fn waiting_consumers_share_the_commits_exactly_once(server: &PgServer) {
        let consumer_store = store(server, "waitmany");
        let producer_store = store(server, "waitmany");
        let q = consumer_store.blocking_queue::<u64>("q").unwrap();
        let consumers = 6;
        let per_consumer = 40;
        let threads: Vec<_> = (0..consumers)
            .map(|_| {
                let (store, q) = (consumer_store.clone(), q.clone());
                std::thread::spawn(move || {
                    (0..per_consumer)
                        .map(|_| {
                            let mut tx = store.begin();
                            let item = q.blocking_dequeue(&mut tx).unwrap();
                            tx.blocking_commit().unwrap();
                            item
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let p = producer_store.blocking_queue::<u64>("q").unwrap();
        let total = (consumers * per_consumer) as u64;
        for start in (0..total).step_by(8) {
            fill(&producer_store, &p, start..start + 8);
        }
        let mut all: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..total).collect::<Vec<_>>());
    }

    /// A batch dequeue takes up to n items at the head, in order, in one call; what is held
    /// stays out of the next batch and of `count`.
    pub(crate) fn a_batch_dequeue_takes_the_head_in_order(server: &PgServer) {
        let store = store(server, "batch");
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, 0..100);
        let mut a = store.begin();
        assert_eq!(
            q.blocking_try_dequeue_many(&mut a, 64).unwrap(),
            (0..64).collect::<Vec<_>>()
        );
        assert_eq!(a.dequeued(), 64);
        assert_eq!(q.blocking_count().unwrap(), 36);
        let mut b = store.begin();
        assert_eq!(
            q.blocking_try_dequeue_many(&mut b, 64).unwrap(),
            (64..100).collect::<Vec<_>>()
        );
        assert!(q.blocking_try_dequeue_many(&mut b, 64).unwrap().is_empty());
        a.blocking_abort().unwrap();
        b.blocking_commit().unwrap();
        assert_eq!(drain(&store, &q), (0..64).collect::<Vec<_>>());
    }

    /// A connection killed in the middle of a transaction (the server's
    /// `pg_terminate_backend`, as a network cut or a server restart would) is a typed error:
    /// the commit fails, nothing of the transaction applies, the items it held are back, and
    /// the store goes on with new connections.
    pub(crate) fn a_connection_lost_mid_transaction_fails_the_commit_and_the_store_recovers(
        server: &PgServer,
    ) {
        let url = format!("{} application_name=rq-lost", server.url());
        let store = Store::builder()
            .postgres(&url)
            .postgres_schema("lost")
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1, 2]);
        let mut tx = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        q.enqueue(&mut tx, 3).unwrap();
        let killed = run_sql(
            server.url(),
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'rq-lost' AND state = 'idle in transaction'",
            &[],
        );
        assert_eq!(killed, Some(1), "the transaction's backend");
        match tx.blocking_commit() {
            Err(Error::Postgres { .. } | Error::CommitOutcomeUnknown { .. }) => {}
            other => panic!("expected a PostgreSQL error, got {other:?}"),
        }
        assert_eq!(
            drain(&store, &q),
            [1, 2],
            "rolled back: 1 is back, 3 never came"
        );
        fill(&store, &q, [4]);
        assert_eq!(drain(&store, &q), [4], "the store goes on");
    }

    /// The service's own SQL in the transaction commits and rolls back with its queue
    /// operations; a failing statement aborts the transaction and nothing of it applies; the
    /// embedded engines refuse it.
    pub(crate) fn the_services_own_sql_commits_with_the_queue_operations(server: &PgServer) {
        let store = store(server, "business");
        execute(
            server.url(),
            "CREATE TABLE business.orders (id int8 PRIMARY KEY)",
        );
        let jobs = store.blocking_queue::<u64>("jobs").unwrap();
        let orders = |store: &Store| -> i64 {
            let mut tx = store.begin();
            let rows = tx
                .blocking_query("SELECT count(*) FROM business.orders", &[])
                .unwrap();
            rows[0].get(0)
        };

        let mut tx = store.begin();
        assert_eq!(
            tx.blocking_execute("INSERT INTO business.orders VALUES ($1)", &[&1i64])
                .unwrap(),
            1
        );
        jobs.enqueue(&mut tx, 1).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!((orders(&store), jobs.blocking_count().unwrap()), (1, 1));

        // Completing the job and recording its result, then changing one's mind: neither.
        let mut tx = store.begin();
        assert_eq!(jobs.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        tx.blocking_execute("INSERT INTO business.orders VALUES ($1)", &[&2i64])
            .unwrap();
        tx.blocking_abort().unwrap();
        assert_eq!((orders(&store), jobs.blocking_count().unwrap()), (1, 1));

        // A failing statement (a duplicate key) aborts the whole transaction; the job is
        // back as soon as the commit has said so (S4), every time (a rollback left to run
        // after the commit returned would lose some of these races).
        for round in 0..30 {
            let mut tx = store.begin();
            assert_eq!(jobs.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
            jobs.enqueue(&mut tx, 2).unwrap();
            assert!(matches!(
                tx.blocking_execute("INSERT INTO business.orders VALUES ($1)", &[&1i64]),
                Err(Error::Postgres { .. })
            ));
            assert!(matches!(
                tx.blocking_commit(),
                Err(Error::TransactionAborted { .. })
            ));
            let mut tx = store.begin();
            assert_eq!(
                jobs.blocking_try_dequeue(&mut tx).unwrap(),
                Some(1),
                "round {round}: the job is back at once"
            );
            tx.blocking_abort().unwrap();
        }
        assert_eq!(
            drain(&store, &jobs),
            [1],
            "the job is back, the enqueue never applied"
        );

        let memory = Store::in_memory().unwrap();
        assert!(matches!(
            memory.begin().blocking_execute("SELECT 1", &[]),
            Err(Error::Unsupported { .. })
        ));
    }

    /// A transaction left idle past the store's idle-transaction timeout is ended by the
    /// server: its items are visible again at once, and its commit fails with a typed
    /// error. (The wait is for the server's timer, bounded, not a sleep for synchronisation:
    /// the test watches the session end.)
    pub(crate) fn an_idle_transaction_past_its_timeout_is_ended_by_the_server(server: &PgServer) {
        let url = format!("{} application_name=rq-idle", server.url());
        let store = Store::builder()
            .postgres_idle_transaction_timeout(std::time::Duration::from_millis(200))
            .postgres(&url)
            .postgres_schema("idle")
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        fill(&store, &q, [1]);
        let mut tx = store.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        assert_eq!(q.blocking_count().unwrap(), 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while run_sql(
            server.url(),
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'rq-idle' AND state = 'idle in transaction'",
            &[],
        ) != Some(0)
        {
            assert!(std::time::Instant::now() < deadline, "the server ends it");
            std::thread::yield_now();
        }
        assert_eq!(q.blocking_count().unwrap(), 1, "visible again");
        assert!(matches!(
            tx.blocking_commit(),
            Err(Error::Postgres { .. } | Error::CommitOutcomeUnknown { .. })
        ));
        assert_eq!(drain(&store, &q), [1]);
    }

    /// Committed items are in the database: a second store (as another process would) sees
    /// them, in commit order.
    pub(crate) fn committed_items_are_seen_by_another_connection_in_order(server: &PgServer) {
        let first = store(server, "durable");
        let q = first.blocking_queue::<u64>("q").unwrap();
        fill(&first, &q, 0..50);
        fill(&first, &q, 50..100);
        first.blocking_close().unwrap();
        let second = store(server, "durable");
        let q = second.blocking_queue::<u64>("q").unwrap();
        assert_eq!(drain(&second, &q), (0..100).collect::<Vec<_>>());
    }

    /// Stores opening the same new queues at the same moment (workers starting together on a
    /// fresh schema) each get the queue, the same one: never an error because another store
    /// created its row while this one was asking.
    pub(crate) fn stores_opening_one_new_queue_at_once_share_it(server: &PgServer) {
        let stores: Vec<Store> = (0..4).map(|_| store(server, "opened_at_once")).collect();
        let names: Vec<String> = (0..50).map(|i| format!("q{i}")).collect();
        let start = Arc::new(Barrier::new(stores.len()));
        let threads: Vec<_> = stores
            .iter()
            .map(|store| {
                let (store, names, start) = (store.clone(), names.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut failed = Vec::new();
                    for name in &names {
                        // All four ask for each name at the same moment.
                        start.wait();
                        if let Err(e) = store.blocking_queue::<u64>(name) {
                            failed.push(format!("opening {name}: {e}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Vec::<String>::new());
        }
        // One row per name, and an item enqueued through one store is taken through another.
        for (i, name) in names.iter().enumerate() {
            let (from, to) = (&stores[i % stores.len()], &stores[(i + 1) % stores.len()]);
            fill(from, &from.blocking_queue::<u64>(name).unwrap(), [i as u64]);
            assert_eq!(
                drain(to, &to.blocking_queue::<u64>(name).unwrap()),
                [i as u64]
            );
        }
        let rows = run_sql(
            server.url(),
            "SELECT count(*) FROM opened_at_once.queues",
            &[],
        );
        assert_eq!(rows, Some(names.len() as i64));
    }

    /// Many consumers at once, each in its own transaction: every item is taken exactly once
    /// (SKIP LOCKED never hands a held row to a second transaction).
    pub(crate) fn concurrent_consumers_take_each_item_once(server: &PgServer) {
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
    pub(crate) fn the_async_forms_work_under_tokio(server: &PgServer) {
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

    /// On the service's own runtime (`Builder::postgres_runtime`): tasks moving items with
    /// aborts and drops lose and duplicate nothing, a waiting consumer is woken by a commit,
    /// the blocking forms work from a thread outside the runtime, and `close` ends the
    /// store's sessions while the runtime runs on. A current-thread runtime is refused.
    pub(crate) fn a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_sessions(
        server: &PgServer,
    ) {
        const APP: &str = "rq-caller-runtime";
        const ITEMS: u64 = 200;
        const TASKS: u64 = 8;
        let url = format!("{} application_name={APP}", server.url());
        let rt = caller_runtime("postgres_runtime", |single| {
            Store::builder()
                .postgres(&url)
                .postgres_runtime(single)
                .open()
        });
        let store = rt.block_on(async {
            Store::builder()
                .postgres(&url)
                .postgres_schema("callerruntime")
                .postgres_pool_size(TASKS as usize + 2)
                .postgres_runtime(tokio::runtime::Handle::current())
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
        let mut moved = drain(&store, &b);
        moved.sort_unstable();
        assert_eq!(
            moved,
            (0..ITEMS).collect::<Vec<_>>(),
            "none lost, none twice"
        );

        assert!(sessions(server.url(), APP) > 0);
        store.blocking_close().unwrap();
        // The pool's connections and the listener's end with the store, not the runtime.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while sessions(server.url(), APP) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the store's sessions outlive its close"
            );
            std::thread::yield_now();
        }
        drop(rt);
    }

    /// Bad settings and an unreachable server are typed errors, never a panic.
    pub(crate) fn bad_urls_schemas_and_unreachable_servers_are_typed_errors(server: &PgServer) {
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
    pub(crate) fn a_schema_of_another_version_is_refused(server: &PgServer) {
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
            }) => assert_eq!((found, supported), (99, 4)),
            other => panic!("expected SchemaVersion, got {other:?}"),
        }
    }

    /// The environment variable that makes this binary a worker process of
    /// [`processes_moving_items_under_kill_9_lose_and_duplicate_nothing`]: the store's URL.
    pub(crate) const WORKER_VAR: &str = "RQ_PG_WORKER_URL";
    const WORKER_SEED_VAR: &str = "RQ_PG_WORKER_SEED";
    const MOVED: u64 = 2000;

    /// A worker process: moves items between queues `a` and `b` of schema `multiproc`, a few
    /// at a time, in transactions it commits, aborts or drops at random, and reports each
    /// commit on stdout, until it is killed.
    pub(crate) fn worker(url: &str) {
        let store = Store::builder()
            .postgres(url)
            .postgres_schema("multiproc")
            .postgres_pool_size(2)
            .open()
            .expect("worker: connect");
        let queues = [
            store.blocking_queue::<u64>("a").unwrap(),
            store.blocking_queue::<u64>("b").unwrap(),
        ];
        let seed = crate::common::movers::seed(WORKER_SEED_VAR);
        crate::common::movers::move_forever(
            &store,
            &queues,
            seed,
            crate::common::movers::OnFailure::Panic,
        )
    }

    /// Several worker processes (this binary, re-executed) move items between two queues of
    /// one database; the parent kills one with SIGKILL at random moments (after a random
    /// number of their commits) and starts another. Each move is one transaction, so at the
    /// end, once every worker is dead and the server has rolled back what they held, the two
    /// queues hold exactly the items put in at the start: none lost, none twice.
    pub(crate) fn processes_moving_items_under_kill_9_lose_and_duplicate_nothing(
        server: &PgServer,
    ) {
        use rand::{Rng, SeedableRng};

        let store = store(server, "multiproc");
        let a = store.blocking_queue::<u64>("a").unwrap();
        let b = store.blocking_queue::<u64>("b").unwrap();
        fill(&store, &a, 0..MOVED);
        let url = format!("{} application_name=rq-worker", server.url());
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut workers =
            crate::common::movers::Workers::start(4, WORKER_VAR, &url, WORKER_SEED_VAR);
        let kills = 20;
        let mut seen = 0;
        for round in 0..kills {
            // Kill after a random number of commits by any worker: the kill lands anywhere
            // in some worker's transaction.
            let commits: u32 = rng.gen_range(20..150);
            workers.wait_commits(commits);
            seen += commits;
            let victim = rng.gen_range(0..workers.len());
            workers.kill(victim);
            workers.replace(victim, 100 + round);
        }
        workers.kill_all();
        // The server rolls back a dead client's transaction when it sees its socket close;
        // wait (bounded) until no worker session is left, so nothing is still held.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while sessions(server.url(), "rq-worker") > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "worker sessions outlive their processes"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            a.blocking_count().unwrap() + b.blocking_count().unwrap(),
            MOVED
        );
        let mut all = drain(&store, &a);
        let in_a = all.len();
        all.extend(drain(&store, &b));
        all.sort_unstable();
        assert_eq!(all, (0..MOVED).collect::<Vec<_>>(), "none lost, none twice");
        eprintln!(
            "    {kills} workers killed with SIGKILL after {seen} commits seen; \
             {in_a} items in a, {} in b, none lost or twice",
            MOVED as usize - in_a
        );
    }

    /// Sessions of `application` on the server.
    fn sessions(url: &str, application: &str) -> i64 {
        run_sql(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&application],
        )
        .unwrap_or(0)
    }
}

/// This module's worker process: started by one of its tests with the variable set to the
/// server's URL (see `tests/suite/main.rs`), not as a test run.
#[cfg(feature = "postgres")]
pub(crate) const WORKER: (&str, fn(&str)) = (cases::WORKER_VAR, cases::worker);

/// The cases of this module of the suite (`tests/suite/main.rs`).
#[cfg(feature = "postgres")]
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    use cases::*;
    crate::common::engines::postgres_suite(vec![
        (
            "stores_opening_one_new_queue_at_once_share_it",
            stores_opening_one_new_queue_at_once_share_it,
        ),
        (
            "processes_moving_items_under_kill_9_lose_and_duplicate_nothing",
            processes_moving_items_under_kill_9_lose_and_duplicate_nothing,
        ),
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
            "a_dequeue_cancelled_mid_flight_aborts_its_transaction",
            a_dequeue_cancelled_mid_flight_aborts_its_transaction,
        ),
        (
            "a_waiting_consumer_is_woken_by_a_commit",
            a_waiting_consumer_is_woken_by_a_commit,
        ),
        (
            "waiting_consumers_share_the_commits_exactly_once",
            waiting_consumers_share_the_commits_exactly_once,
        ),
        (
            "a_batch_dequeue_takes_the_head_in_order",
            a_batch_dequeue_takes_the_head_in_order,
        ),
        (
            "a_connection_lost_mid_transaction_fails_the_commit_and_the_store_recovers",
            a_connection_lost_mid_transaction_fails_the_commit_and_the_store_recovers,
        ),
        (
            "the_services_own_sql_commits_with_the_queue_operations",
            the_services_own_sql_commits_with_the_queue_operations,
        ),
        (
            "an_idle_transaction_past_its_timeout_is_ended_by_the_server",
            an_idle_transaction_past_its_timeout_is_ended_by_the_server,
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
            "a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_sessions",
            a_store_on_the_callers_runtime_keeps_every_item_and_ends_its_sessions,
        ),
        (
            "bad_urls_schemas_and_unreachable_servers_are_typed_errors",
            bad_urls_schemas_and_unreachable_servers_are_typed_errors,
        ),
        (
            "a_schema_of_another_version_is_refused",
            a_schema_of_another_version_is_refused,
        ),
    ])
}
