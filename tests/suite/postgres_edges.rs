//! The PostgreSQL engine at its edges: a peer that accepts connections and never answers, a
//! connection cut at each point of a commit, waiting consumers woken by commits of their own
//! store, schema names at the length limit, roles that may not create (or only read),
//! the server's reasons in the errors, and settings the server would refuse.
//!
//! Waits that a lost wake-up would make endless run with a poll interval of an hour
//! (`Builder::postgres_poll_interval`), so that only a notification can end them, under a
//! generous bound that fails the test instead of hanging it. Nothing here asserts a speed.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use reliable_queue::{Error, Store};

    use super::pg::proxy::{Cut, CutProxy};
    use super::pg::{block_on, connect, PgServer};

    /// What a wait that only a notification can end gets before the test fails.
    const WAKE_BOUND: Duration = Duration::from_secs(60);
    /// The poll interval that leaves the notification as the only way to end a wait.
    const NO_POLL: Duration = Duration::from_secs(3600);

    /// Runs `f` on a thread and returns what it gave, or panics with `what` if it takes more
    /// than `bound` (a hang becomes a failure).
    fn within<T: Send + 'static>(
        bound: Duration,
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (done, result) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(f());
        });
        result
            .recv_timeout(bound)
            .unwrap_or_else(|_| panic!("{what}: no result within {bound:?}"))
    }

    /// Runs `sql` on a connection of its own; the first column of each row, as text.
    fn query(url: &str, sql: &str) -> Vec<String> {
        block_on(async {
            let client = connect(url).await;
            let rows = client.simple_query(sql).await.unwrap();
            rows.iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => {
                        Some(row.get(0).unwrap_or("").to_owned())
                    }
                    _ => None,
                })
                .collect()
        })
    }

    fn execute(url: &str, sql: &str) {
        block_on(async { connect(url).await.batch_execute(sql).await.unwrap() });
    }

    /// Rows of `schema`'s items table (every item, whatever its state).
    fn rows(server: &PgServer, schema: &str) -> usize {
        query(
            server.url(),
            &format!("SELECT count(*) FROM \"{schema}\".items"),
        )[0]
        .parse()
        .unwrap()
    }

    /// Rows of `schema`'s queue `queue`.
    fn rows_of(server: &PgServer, schema: &str, queue: &str) -> usize {
        query(
            server.url(),
            &format!(
                "SELECT count(*) FROM \"{schema}\".items i JOIN \"{schema}\".queues q \
                 ON q.id = i.queue WHERE q.name = '{queue}'"
            ),
        )[0]
        .parse()
        .unwrap()
    }

    fn store_with_poll(url: &str, schema: &str, poll: Duration) -> Store {
        Store::builder()
            .postgres(url)
            .postgres_schema(schema)
            .postgres_poll_interval(poll)
            .open()
            .expect("connect to the test server")
    }

    /// A port that accepts connections and never says a word (a hung server, or a service
    /// that waits for its own protocol's first line): `connect` ends with a typed error
    /// naming the host once the URL's `connect_timeout` has passed for each host, never
    /// hangs.
    pub(crate) fn a_connect_to_a_port_that_never_answers_fails_naming_the_host(_: &PgServer) {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            // Holds every connection open and silent until the test ends.
            let mut conns = Vec::new();
            for conn in silent.incoming().take(16) {
                conns.push(conn);
            }
        });
        for url in [
            format!("postgresql://u:p@127.0.0.1:{port}/app?connect_timeout=1"),
            format!(
                "host=127.0.0.1,127.0.0.1 port={port},{port} user=u dbname=app connect_timeout=1"
            ),
        ] {
            let opened = within(WAKE_BOUND, "connect to a silent port", move || {
                Store::builder().postgres(&url).open().map(drop)
            });
            let e = opened.expect_err("a silent port is no PostgreSQL server");
            assert!(
                matches!(
                    e,
                    Error::Postgres {
                        operation: "connect",
                        ..
                    }
                ),
                "{e:?}"
            );
            let message = e.to_string();
            assert!(
                message.contains(&format!("127.0.0.1:{port}")) && message.contains("no answer"),
                "the message names the host and says what happened: {message}"
            );
        }
        drop(held);
    }

    /// Which points of a commit a connection is cut at, and what the commit does.
    #[derive(Debug, Clone, Copy)]
    enum Shape {
        /// Enqueues only: one `INSERT`, no `BEGIN`.
        EnqueueOnly,
        /// A dequeue and enqueues: `BEGIN`, the dequeue, then `INSERT` and `COMMIT`.
        Move,
        /// A lease acked with enqueues (the processing layer's statements before `COMMIT`).
        AckAndEnqueue,
    }

    /// A connection cut at each point of a commit: wherever the server may have committed,
    /// the commit says `CommitOutcomeUnknown`; a commit that says it did not apply did not
    /// (nothing of it in the database); and the store carries on afterwards. Each cut is
    /// checked to have fired, so that no case passes without its cut.
    pub(crate) fn a_connection_cut_at_each_point_of_a_commit_never_reports_applied_work_as_not_applied(
        server: &PgServer,
    ) {
        let proxy = CutProxy::start(server);
        let url = format!("{} application_name='cut'", proxy.url());
        // The commit below enqueues two items, with the many-items `INSERT` (`unnest`): its
        // text goes to the server (`Parse`) with the commit, on any connection, since the
        // setup only ever enqueues one item at a time.
        let cases = [
            // (shape, the cut, the server surely committed before the cut)
            (Shape::EnqueueOnly, Cut::Reply("INSERT"), true),
            (Shape::EnqueueOnly, Cut::Request("unnest("), false),
            (Shape::Move, Cut::Request("unnest("), false),
            (Shape::Move, Cut::Reply("INSERT"), false),
            (Shape::Move, Cut::Request("COMMIT"), false),
            (Shape::Move, Cut::Reply("COMMIT"), true),
            (Shape::AckAndEnqueue, Cut::Request("unnest("), false),
            (Shape::AckAndEnqueue, Cut::Request("COMMIT"), false),
            (Shape::AckAndEnqueue, Cut::Reply("COMMIT"), true),
        ];
        let mut unknown = 0;
        for (n, (shape, cut, applied_surely)) in cases.into_iter().enumerate() {
            let schema = format!("cut_{n}");
            let store = Store::builder()
                .postgres(&url)
                .postgres_schema(&schema)
                .open()
                .unwrap();
            let (a, b) = (
                store.blocking_queue::<u64>("a").unwrap(),
                store.blocking_queue::<u64>("b").unwrap(),
            );
            // One item in `a` to move or lease.
            let mut tx = store.begin();
            a.enqueue(&mut tx, 1).unwrap();
            tx.blocking_commit().unwrap();
            let lease = matches!(shape, Shape::AckAndEnqueue)
                .then(|| a.blocking_lease(Duration::from_secs(600)).unwrap());
            let mut tx = store.begin();
            if matches!(shape, Shape::Move) {
                assert_eq!(a.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
            }
            if let Some(lease) = lease {
                lease.ack(&mut tx).unwrap();
            }
            b.enqueue(&mut tx, 20).unwrap();
            b.enqueue(&mut tx, 21).unwrap();
            proxy.arm(cut);
            let committed = tx.blocking_commit();
            assert_eq!(proxy.fired(), n + 1, "{shape:?} {cut:?}: the cut fired");
            // Once no session of the proxied store is inside a statement or a transaction
            // (the cut one has finished what it got, and ended), the table is final.
            let deadline = Instant::now() + WAKE_BOUND;
            while query(
                server.url(),
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cut' \
                 AND state <> 'idle'",
            )[0] != "0"
            {
                assert!(
                    Instant::now() < deadline,
                    "{shape:?} {cut:?}: the session ends"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let (rows, in_b) = (rows(server, &schema), rows_of(server, &schema, "b"));
            let applied = match shape {
                Shape::EnqueueOnly => rows == 3,
                Shape::Move | Shape::AckAndEnqueue => rows == 2,
            };
            let untouched = rows == 1 && in_b == 0;
            assert!(
                applied != untouched && (!applied || in_b == 2),
                "{shape:?} {cut:?}: all or nothing ({rows} rows, {in_b} in b)"
            );
            match committed {
                Ok(()) => panic!("{shape:?} {cut:?}: a commit whose connection was cut succeeded"),
                Err(Error::CommitOutcomeUnknown { .. }) => unknown += 1,
                Err(e) => assert!(
                    !applied,
                    "{shape:?} {cut:?}: the commit applied and was reported as not: {e}"
                ),
            }
            if applied_surely {
                assert!(applied, "{shape:?} {cut:?}: the server had committed");
            }
            // The store carries on: its next commit goes through a new connection.
            let mut tx = store.begin();
            b.enqueue(&mut tx, 3).unwrap();
            tx.blocking_commit().unwrap();
            store.blocking_close().unwrap();
        }
        assert!(
            unknown >= 3,
            "the cuts after the server committed were unknown"
        );
    }

    /// A producer that retries only `CommitOutcomeUnknown`, under a deduplication key, adds
    /// each item once: every first commit here is cut after the server committed it.
    pub(crate) fn a_producer_retrying_unknown_commits_under_a_key_adds_each_item_once(
        server: &PgServer,
    ) {
        let proxy = CutProxy::start(server);
        let store = Store::builder()
            .postgres(proxy.url())
            .postgres_schema("cut_keyed")
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("jobs").unwrap();
        let mut unknown = 0;
        for item in 0..5u64 {
            let key = format!("job-{item}");
            proxy.arm(Cut::Reply("COMMIT"));
            loop {
                let mut tx = store.begin();
                // On PostgreSQL the key is checked as the commit inserts (a retry's enqueue
                // is buffered, and its commit applies nothing).
                q.enqueue_unique(&mut tx, item, key.as_bytes(), Duration::ZERO)
                    .unwrap();
                match tx.blocking_commit() {
                    Ok(()) => break,
                    Err(Error::CommitOutcomeUnknown { .. }) => unknown += 1,
                    Err(e) => panic!("item {item}: {e}"),
                }
            }
        }
        assert_eq!(proxy.fired(), 5);
        assert_eq!(
            unknown, 5,
            "each first commit was cut after the server committed"
        );
        let checker = server.store("cut_keyed");
        let jobs = checker.blocking_queue::<u64>("jobs").unwrap();
        assert_eq!(jobs.blocking_count().unwrap(), 5, "each item once");
    }

    /// Waits until the consumer of `q` has looked for an item and found none (it is counted
    /// among the waiters then). A commit after this has to wake it (a wake before it waits
    /// is kept for it; one of another store before the listener's lock is seen by the look
    /// the consumer makes once the lock is held).
    fn looked(q: &reliable_queue::ReliableConcurrentQueue<u64>) {
        let deadline = Instant::now() + WAKE_BOUND;
        while q.waiters() == 0 {
            assert!(Instant::now() < deadline, "the consumer looks");
            std::thread::yield_now();
        }
    }

    /// A consumer waiting for an item of `q` (for an hour at most) on a thread of its own;
    /// what it took comes through the receiver.
    fn waiting_consumer(
        store: Store,
        q: reliable_queue::ReliableConcurrentQueue<u64>,
    ) -> mpsc::Receiver<u64> {
        let (took, taken) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = store.begin();
            if let Some(item) = q.blocking_dequeue_timeout(&mut tx, NO_POLL).unwrap() {
                tx.blocking_commit().unwrap();
                let _ = took.send(item);
            }
        });
        taken
    }

    /// What the consumer took, once a commit woke it: a failure past [`WAKE_BOUND`] (then
    /// nothing woke it; its thread is left waiting).
    fn woken(consumer: &mpsc::Receiver<u64>) -> u64 {
        consumer
            .recv_timeout(WAKE_BOUND)
            .expect("the commit wakes the waiting consumer")
    }

    /// Producer and consumer on one store: the commit wakes the waiting consumer at once.
    /// With an hour's poll interval nothing else would.
    pub(crate) fn a_waiting_consumer_is_woken_by_a_commit_of_its_own_store(server: &PgServer) {
        let store = store_with_poll(server.url(), "own_wake", NO_POLL);
        let q = store.blocking_queue::<u64>("q").unwrap();
        for round in 0..3u64 {
            let consumer = {
                let (store, q) = (store.clone(), q.clone());
                waiting_consumer(store, q)
            };
            looked(&q);
            let mut tx = store.begin();
            q.enqueue(&mut tx, round).unwrap();
            tx.blocking_commit().unwrap();
            assert_eq!(
                woken(&consumer),
                round,
                "round {round}: the commit woke the consumer of its own store"
            );
        }
    }

    /// P6 in one store: a delayed item committed while a consumer of the same store waits
    /// wakes it, and it takes the item once due (by the real clock).
    pub(crate) fn a_delayed_item_reaches_a_waiting_consumer_of_its_own_store(server: &PgServer) {
        let store = store_with_poll(server.url(), "own_delay", NO_POLL);
        let q = store.blocking_queue::<u64>("q").unwrap();
        let consumer = {
            let (store, q) = (store.clone(), q.clone());
            waiting_consumer(store, q)
        };
        looked(&q);
        let mut tx = store.begin();
        q.enqueue_after(&mut tx, 7, Duration::from_millis(200))
            .unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(woken(&consumer), 7);
    }

    /// A schema of 61 to 63 bytes: its channel would be longer than an identifier may be; the
    /// notification still reaches a consumer of another store.
    pub(crate) fn schemas_of_63_bytes_get_notifications(server: &PgServer) {
        let schema = format!("long_{}", "s".repeat(58));
        assert_eq!(schema.len(), 63);
        let consumer_store = store_with_poll(server.url(), &schema, NO_POLL);
        let producer_store = store_with_poll(server.url(), &schema, NO_POLL);
        let q = consumer_store.blocking_queue::<u64>("q").unwrap();
        let consumer = {
            let (store, q) = (consumer_store.clone(), q.clone());
            waiting_consumer(store, q)
        };
        looked(&q);
        let p = producer_store.blocking_queue::<u64>("q").unwrap();
        let mut tx = producer_store.begin();
        p.enqueue(&mut tx, 63).unwrap();
        tx.blocking_commit().unwrap();
        assert_eq!(woken(&consumer), 63);
    }

    /// A store told not to migrate changes nothing: a missing schema is
    /// `Error::SchemaMissing` and stays missing; an existing one at this version opens.
    pub(crate) fn a_store_told_not_to_migrate_creates_nothing(server: &PgServer) {
        let opened = Store::builder()
            .postgres(server.url())
            .postgres_schema("never_made")
            .postgres_migrate(false)
            .open();
        match opened {
            Err(Error::SchemaMissing { schema }) => assert_eq!(schema, "never_made"),
            other => panic!("expected SchemaMissing, got {:?}", other.map(drop)),
        }
        let found = query(
            server.url(),
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'never_made'",
        );
        assert_eq!(found, ["0"], "nothing was created");
        drop(server.store("made_once"));
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("made_once")
            .postgres_migrate(false)
            .open()
            .unwrap();
        assert!(store.blocking_list_queues().unwrap().is_empty());
    }

    /// Roles as production has them: a worker's role with no privilege to create in the
    /// database (only to use the store's tables) moves items through a schema a migrating
    /// role made; a role that may only read looks at it with `postgres_migrate(false)`.
    pub(crate) fn roles_that_may_not_create_use_a_current_schema(server: &PgServer) {
        if !server.started_here() {
            // Roles are made by this harness's superuser; an external server's may not.
            return;
        }
        let url = server.create_database("roles");
        drop(
            Store::builder()
                .postgres(&url)
                .postgres_schema("jobs")
                .open()
                .unwrap(),
        );
        execute(
            &url,
            "CREATE ROLE worker LOGIN; CREATE ROLE reader LOGIN; \
             REVOKE CREATE ON DATABASE roles FROM PUBLIC; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             GRANT USAGE ON SCHEMA jobs TO worker, reader; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA jobs TO worker; \
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA jobs TO worker; \
             GRANT SELECT ON ALL TABLES IN SCHEMA jobs TO reader;",
        );
        let worker = Store::builder()
            .postgres(&format!("{url} user='worker'"))
            .postgres_schema("jobs")
            .open()
            .expect("a worker's role connects to a current schema");
        let q = worker.blocking_queue::<u64>("q").unwrap();
        let mut tx = worker.begin();
        q.enqueue(&mut tx, 1).unwrap();
        q.enqueue(&mut tx, 2).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = worker.begin();
        assert_eq!(q.blocking_try_dequeue(&mut tx).unwrap(), Some(1));
        tx.blocking_commit().unwrap();
        let reader = Store::builder()
            .postgres(&format!("{url} user='reader'"))
            .postgres_schema("jobs")
            .postgres_migrate(false)
            .open()
            .expect("a reader's role connects");
        assert_eq!(reader.blocking_list_queues().unwrap(), ["q"]);
        let seen = reader.blocking_queue::<u64>("q").unwrap();
        assert_eq!(seen.blocking_count().unwrap(), 1);
    }

    /// The server's reason and SQLSTATE are in the message a person reads.
    pub(crate) fn errors_carry_the_servers_reason_and_sqlstate(server: &PgServer) {
        if !server.started_here() {
            return;
        }
        let e = Store::builder()
            .postgres(&format!("{} dbname='no_such_db'", server.url()))
            .open()
            .map(drop)
            .expect_err("no such database");
        let message = e.to_string();
        assert!(
            message.contains("database \"no_such_db\" does not exist") && message.contains("3D000"),
            "{message}"
        );
        let store = server.store("reasons");
        let mut tx = store.begin();
        let e = tx
            .blocking_execute("SELECT 1 / (SELECT 0)", &[])
            .expect_err("division by zero");
        let message = e.to_string();
        assert!(
            message.contains("division by zero") && message.contains("22012"),
            "{message}"
        );
    }

    /// Opens a store of one engine with a given transaction timeout.
    type Opener<'a> = dyn Fn(Duration) -> reliable_queue::Result<Store> + 'a;

    /// Timeouts the server would refuse (over 2^31 - 1 ms) are `InvalidConfig` at open, on
    /// every engine, before any connection is tried.
    pub(crate) fn timeouts_the_server_refuses_are_invalid_config(server: &PgServer) {
        let too_long = Duration::from_millis(1 << 31);
        let fits = Duration::from_millis((1 << 31) - 1);
        let dir = tempfile::tempdir().unwrap();
        let openers: [(&str, Box<Opener<'_>>); 3] = [
            (
                "memory",
                Box::new(|t| Store::builder().transaction_timeout(t).open()),
            ),
            (
                "sled",
                Box::new(|t| {
                    Store::builder()
                        .path(dir.path().join("s"))
                        .transaction_timeout(t)
                        .open()
                }),
            ),
            (
                "postgres",
                Box::new(|t| {
                    Store::builder()
                        .postgres(server.url())
                        .postgres_schema("timeouts")
                        .transaction_timeout(t)
                        .open()
                }),
            ),
        ];
        for (engine, open) in &openers {
            match open(too_long) {
                Err(Error::InvalidConfig {
                    setting: "transaction_timeout",
                    ..
                }) => {}
                other => panic!(
                    "{engine}: expected InvalidConfig, got {:?}",
                    other.map(drop)
                ),
            }
            open(fits)
                .unwrap_or_else(|e| panic!("{engine}: {e}"))
                .blocking_close()
                .unwrap();
        }
        match Store::builder()
            .postgres(server.url())
            .postgres_idle_transaction_timeout(too_long)
            .open()
        {
            Err(Error::InvalidConfig {
                setting: "postgres_idle_transaction_timeout",
                ..
            }) => {}
            other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
        }
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
#[cfg(feature = "postgres")]
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    use cases::*;
    crate::common::engines::postgres_suite(vec![
        (
            "a_connect_to_a_port_that_never_answers_fails_naming_the_host",
            a_connect_to_a_port_that_never_answers_fails_naming_the_host,
        ),
        (
            "a_connection_cut_at_each_point_of_a_commit_never_reports_applied_work_as_not_applied",
            a_connection_cut_at_each_point_of_a_commit_never_reports_applied_work_as_not_applied,
        ),
        (
            "a_producer_retrying_unknown_commits_under_a_key_adds_each_item_once",
            a_producer_retrying_unknown_commits_under_a_key_adds_each_item_once,
        ),
        (
            "a_waiting_consumer_is_woken_by_a_commit_of_its_own_store",
            a_waiting_consumer_is_woken_by_a_commit_of_its_own_store,
        ),
        (
            "a_delayed_item_reaches_a_waiting_consumer_of_its_own_store",
            a_delayed_item_reaches_a_waiting_consumer_of_its_own_store,
        ),
        (
            "schemas_of_63_bytes_get_notifications",
            schemas_of_63_bytes_get_notifications,
        ),
        (
            "a_store_told_not_to_migrate_creates_nothing",
            a_store_told_not_to_migrate_creates_nothing,
        ),
        (
            "roles_that_may_not_create_use_a_current_schema",
            roles_that_may_not_create_use_a_current_schema,
        ),
        (
            "errors_carry_the_servers_reason_and_sqlstate",
            errors_carry_the_servers_reason_and_sqlstate,
        ),
        (
            "timeouts_the_server_refuses_are_invalid_config",
            timeouts_the_server_refuses_are_invalid_config,
        ),
    ])
}
