//! The PostgreSQL engine in operation: a schema of the previous version migrated with its
//! items, dead-letter retention, the transaction deadline's server-side guard, and a worker
//! process stopped (SIGSTOP) past its lease: the lease ends by the database's clock, another
//! worker completes the item, and the stopped one, resumed, cannot. Against a real server
//! (`tests/pg/mod.rs`); without PostgreSQL every test is reported ignored with a banner.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use reliable_queue::{Error, Failed, ManualClock, RetryPolicy, Store};

    use super::pg::{block_on, connect, PgServer};

    pub(crate) const WORKER_VAR: &str = "RQ_PG_OPS_WORKER_URL";

    /// A store on the test's own schema.
    fn store(server: &PgServer, schema: &str) -> Store {
        server.store(schema)
    }

    fn sql(url: &str, statements: &str) {
        block_on(async {
            let client = connect(url).await;
            client.batch_execute(statements).await.unwrap();
        });
    }

    fn one_i64(url: &str, query: &str) -> i64 {
        block_on(async {
            let client = connect(url).await;
            client.query_one(query, &[]).await.unwrap().get(0)
        })
    }

    /// Foreign keys in `schema`.
    fn foreign_keys(server: &PgServer, schema: &str) -> i64 {
        one_i64(
            server.url(),
            &format!(
                "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace \
                 WHERE n.nspname = '{schema}' AND c.contype = 'f'"
            ),
        )
    }

    /// Version 3's shape made from the current one: version 4's counts, their triggers and
    /// functions, and its table settings gone.
    fn to_v3_shape(schema: &str) -> String {
        format!(
            "DROP TABLE {schema}.counts; \
             DROP FUNCTION {schema}.count_items_in, {schema}.count_items_out, \
               {schema}.count_items_moved, {schema}.count_dead_in, {schema}.count_dead_out \
               CASCADE; \
             ALTER TABLE {schema}.items RESET (fillfactor, autovacuum_vacuum_scale_factor, \
               autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, \
               autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay); \
             ALTER TABLE {schema}.dead_letters RESET (autovacuum_vacuum_scale_factor); \
             UPDATE {schema}.meta SET value = '3' WHERE key = 'schema_version';"
        )
    }

    /// `schema` records the current version (4) and has its shape: no foreign keys, the
    /// counts and their triggers.
    fn assert_current(server: &PgServer, schema: &str) {
        let version = one_i64(
            server.url(),
            &format!("SELECT value::int8 FROM {schema}.meta WHERE key = 'schema_version'"),
        );
        assert_eq!(version, 4, "{schema}'s recorded version");
        let triggers = one_i64(
            server.url(),
            &format!(
                "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal \
                 AND tgrelid IN ('{schema}.items'::regclass, '{schema}.dead_letters'::regclass)"
            ),
        );
        assert_eq!(triggers, 5, "{schema}'s counting triggers");
        assert_eq!(foreign_keys(server, schema), 0, "{schema}'s foreign keys");
    }

    /// A schema of version 2 (version 3 with foreign keys from the items and the dead
    /// letters to the queues) is migrated to the current version when a store connects.
    pub(crate) fn a_schema_of_version_2_is_migrated_with_its_items(server: &PgServer) {
        migrated_with_its_items(server, "migrate_v2", 2);
    }

    /// A schema of version 3 (no counts) is migrated to the current version when a store
    /// connects.
    pub(crate) fn a_schema_of_version_3_is_migrated_with_its_items(server: &PgServer) {
        migrated_with_its_items(server, "migrate_v3", 3);
    }

    /// A schema of `version` (2 or 3) is migrated when a store connects: version 2's keys
    /// are dropped, the counts are made from the rows there (`stats()` and `count()` agree
    /// with them), its items and dead letters stay, and a store connecting again changes
    /// nothing.
    fn migrated_with_its_items(server: &PgServer, schema: &str, version: u32) {
        let store = store(server, schema);
        let q = store.blocking_queue::<String>("q").unwrap();
        q.blocking_set_retry_policy(RetryPolicy::default().max_attempts(1))
            .unwrap();
        let mut tx = store.begin();
        for item in ["poison", "first", "second", "leased"] {
            q.enqueue(&mut tx, item.to_owned()).unwrap();
        }
        q.enqueue_after(&mut tx, "later".to_owned(), Duration::from_secs(3600))
            .unwrap();
        tx.blocking_commit().unwrap();
        let lease = q.blocking_lease(Duration::from_secs(30)).unwrap();
        assert_eq!(lease.item().as_str(), "poison");
        assert!(matches!(lease.blocking_fail("bad").unwrap(), Failed::Dead));
        drop(q);
        store.blocking_close().unwrap();
        let mut older = to_v3_shape(schema);
        if version == 2 {
            older = format!(
                "{older} ALTER TABLE {schema}.items ADD CONSTRAINT items_queue_fkey \
                   FOREIGN KEY (queue) REFERENCES {schema}.queues (id); \
                 ALTER TABLE {schema}.dead_letters ADD CONSTRAINT dead_letters_queue_fkey \
                   FOREIGN KEY (queue) REFERENCES {schema}.queues (id); \
                 UPDATE {schema}.meta SET value = '2' WHERE key = 'schema_version';"
            );
        }
        sql(server.url(), &older);
        assert_eq!(
            foreign_keys(server, schema),
            if version == 2 { 2 } else { 0 }
        );

        for round in 0..2 {
            let store = self::store(server, schema);
            assert_current(server, schema);
            assert_eq!(foreign_keys(server, schema), 0);
            let q = store.blocking_queue::<String>("q").unwrap();
            let dead = q.blocking_dead_letters(None, 10).unwrap();
            assert_eq!(dead.len(), 1);
            assert_eq!(
                (dead[0].item.as_str(), dead[0].reason.as_str()),
                ("poison", "bad")
            );
            let browsed: Vec<String> = q
                .blocking_browse(None, 10)
                .unwrap()
                .into_iter()
                .map(|b| b.item)
                .collect();
            if round == 0 {
                assert_eq!(browsed, ["first", "second", "leased", "later"]);
                let stats = q.blocking_stats().unwrap();
                assert_eq!(
                    (stats.visible, stats.delayed, stats.leased, stats.dead),
                    (3, 1, 0, 1)
                );
                // The counts go on from those the migration made.
                let lease = q.blocking_lease(Duration::from_secs(30)).unwrap();
                assert_eq!(lease.item().as_str(), "first");
                lease.blocking_complete().unwrap();
                let lease = q.blocking_lease(Duration::from_secs(30)).unwrap();
                assert_eq!(lease.item().as_str(), "second");
                std::mem::forget(lease);
            } else {
                assert_eq!(browsed, ["second", "leased", "later"]);
            }
            let stats = q.blocking_stats().unwrap();
            assert_eq!(
                (stats.visible, stats.delayed, stats.leased, stats.dead),
                (1, 1, 1, 1)
            );
            assert_eq!(q.blocking_count().unwrap(), 1);
            drop(q);
            store.blocking_close().unwrap();
        }
    }

    /// A schema left by the first release of the engine (version 1: no processing layer)
    /// is migrated to the current version when a store connects: its items stay, in order,
    /// and the processing layer works on them.
    pub(crate) fn a_schema_of_version_1_is_migrated_with_its_items(server: &PgServer) {
        let s = "\"migrate_v1\"";
        // Version 1's tables, as that release created them, with two queued items whose
        // payloads are postcard envelopes written by this crate (taken from a store below).
        let probe = store(server, "migrate_probe");
        let q = probe.blocking_queue::<String>("q").unwrap();
        let mut tx = probe.begin();
        q.enqueue(&mut tx, "first".to_owned()).unwrap();
        q.enqueue(&mut tx, "second".to_owned()).unwrap();
        tx.blocking_commit().unwrap();
        sql(
            server.url(),
            &format!(
                "CREATE SCHEMA {s}; \
                 CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL); \
                 CREATE TABLE {s}.queues (id serial PRIMARY KEY, name text NOT NULL UNIQUE, \
                   retry_policy jsonb); \
                 CREATE TABLE {s}.items (id bigserial PRIMARY KEY, \
                   queue int4 NOT NULL REFERENCES {s}.queues (id), payload bytea NOT NULL, \
                   enqueued_at timestamptz NOT NULL DEFAULT now(), \
                   attempts int4 NOT NULL DEFAULT 0, not_before timestamptz, \
                   leased_until timestamptz, lease_token int8, first_attempt timestamptz, \
                   last_attempt timestamptz, dedup_key bytea); \
                 CREATE INDEX items_queue_id ON {s}.items (queue, id); \
                 INSERT INTO {s}.meta VALUES ('schema_version', '1'); \
                 INSERT INTO {s}.queues (name) VALUES ('q'); \
                 INSERT INTO {s}.items (queue, payload) \
                   SELECT 1, payload FROM \"migrate_probe\".items ORDER BY id;"
            ),
        );
        drop(q);
        probe.blocking_close().unwrap();

        let store = store(server, "migrate_v1");
        assert_current(server, "migrate_v1");
        let q = store.blocking_queue::<String>("q").unwrap();
        assert_eq!(q.blocking_count().unwrap(), 2);
        let lease = q.blocking_lease(Duration::from_secs(30)).unwrap();
        assert_eq!((lease.item().as_str(), lease.attempt()), ("first", 1));
        lease.blocking_complete().unwrap();
        let mut tx = store.begin();
        assert_eq!(
            q.blocking_try_dequeue(&mut tx).unwrap().as_deref(),
            Some("second")
        );
        tx.blocking_commit().unwrap();
        assert_eq!(q.blocking_count().unwrap(), 0);
        // Connecting again finds version 4 and changes nothing.
        drop(q);
        store.blocking_close().unwrap();
        let again = self::store(server, "migrate_v1");
        assert_eq!(
            again
                .blocking_queue::<String>("q")
                .unwrap()
                .blocking_count()
                .unwrap(),
            0
        );
    }

    /// Dead letters older than `postgres_dead_letter_retention` are deleted (by the next
    /// dead-letter call, and by the maintenance pass); younger ones stay. `stats()`, which
    /// writes nothing, leaves them out as soon as they are past it.
    pub(crate) fn dead_letters_past_the_retention_are_deleted(server: &PgServer) {
        let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000)).unwrap();
        let store = Store::builder()
            .clock(clock.clone())
            .postgres(server.url())
            .postgres_schema("retention")
            .postgres_dead_letter_retention(Duration::from_secs(3600))
            .open()
            .unwrap();
        let q = store.blocking_queue::<u32>("q").unwrap();
        q.blocking_set_retry_policy(RetryPolicy::default().max_attempts(1))
            .unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 1).unwrap();
        q.enqueue(&mut tx, 2).unwrap();
        tx.blocking_commit().unwrap();
        let first = q.blocking_lease(Duration::from_secs(10)).unwrap();
        assert_eq!(first.blocking_fail("old").unwrap(), Failed::Dead);
        clock.advance(Duration::from_secs(1800));
        let second = q.blocking_lease(Duration::from_secs(10)).unwrap();
        assert_eq!(second.blocking_fail("young").unwrap(), Failed::Dead);
        assert_eq!(q.blocking_stats().unwrap().dead, 2);
        clock.advance(Duration::from_secs(1801));
        assert_eq!(q.blocking_stats().unwrap().dead, 1, "past the retention");
        let left = q.blocking_dead_letters(None, 10).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].item, left[0].reason.as_str()), (2, "young"));
        assert_eq!(q.blocking_stats().unwrap().dead, 1);
    }

    /// `Builder::transaction_timeout` on PostgreSQL also has the server end a transaction
    /// idle that long (the guard for a worker that cannot run its own timer).
    pub(crate) fn the_store_transaction_timeout_is_the_servers_idle_timeout(server: &PgServer) {
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("txtimeout")
            .transaction_timeout(Duration::from_millis(45_000))
            .open()
            .unwrap();
        let mut tx = store.begin();
        let rows = block_on(tx.query("SHOW idle_in_transaction_session_timeout", &[])).unwrap();
        let shown: String = rows[0].get(0);
        assert_eq!(shown, "45s");
        tx.blocking_abort().unwrap();
        // An explicit setting wins.
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("txtimeout")
            .transaction_timeout(Duration::from_secs(45))
            .postgres_idle_transaction_timeout(Duration::from_secs(90))
            .open()
            .unwrap();
        let mut tx = store.begin();
        let rows = block_on(tx.query("SHOW idle_in_transaction_session_timeout", &[])).unwrap();
        let shown: String = rows[0].get(0);
        assert_eq!(shown, "90s");
        tx.blocking_abort().unwrap();
    }

    /// The worker process of the SIGSTOP test: leases one item for 1 s, says so, waits for
    /// a line on its input, then tries to complete it with a follow-up enqueue, and says how
    /// that went.
    pub(crate) fn worker(url: &str) {
        let store = Store::builder()
            .postgres(url)
            .postgres_schema("sigstop")
            .postgres_pool_size(2)
            .open()
            .expect("worker: connect");
        let jobs = store.blocking_queue::<u64>("jobs").unwrap();
        let done = store.blocking_queue::<String>("done").unwrap();
        let lease = jobs.blocking_lease(Duration::from_secs(1)).unwrap();
        let mut out = std::io::stdout();
        writeln!(out, "leased {} {}", lease.item(), lease.token()).unwrap();
        out.flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let mut tx = store.begin();
        done.enqueue(&mut tx, format!("stopped worker did {}", lease.item()))
            .unwrap();
        lease.ack(&mut tx).unwrap();
        let outcome = match tx.blocking_commit() {
            Ok(()) => "committed".to_owned(),
            Err(Error::LeaseExpired { .. }) => "expired".to_owned(),
            Err(e) => format!("error {e}"),
        };
        writeln!(out, "{outcome}").unwrap();
        out.flush().unwrap();
    }

    /// A worker stopped with SIGSTOP while it holds a lease cannot keep the item: the lease
    /// ends at its deadline by the database's clock (nobody needs to notice the worker), the
    /// item is leased again (attempt 2) and completed by another worker, and the stopped
    /// worker, resumed, fails to complete it (fencing): its completion and its follow-up
    /// enqueue are not applied. The item is done exactly once.
    pub(crate) fn a_worker_stopped_past_its_lease_cannot_complete_the_item(server: &PgServer) {
        let store = store(server, "sigstop");
        let jobs = store.blocking_queue::<u64>("jobs").unwrap();
        let done = store.blocking_queue::<String>("done").unwrap();
        let mut tx = store.begin();
        jobs.enqueue(&mut tx, 42).unwrap();
        tx.blocking_commit().unwrap();

        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(WORKER_VAR, server.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the worker");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let leased = lines.next().unwrap().unwrap();
        assert!(leased.starts_with("leased 42 "), "{leased}");
        let stopped = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());

        // The lease runs out by the database's clock while the worker is stopped: poll
        // (bounded) until the item can be leased again.
        let deadline = Instant::now() + Duration::from_secs(30);
        let lease = loop {
            if let Some(lease) = jobs.blocking_try_lease(Duration::from_secs(60)).unwrap() {
                break lease;
            }
            assert!(
                Instant::now() < deadline,
                "the stopped worker's lease never ended"
            );
            std::thread::yield_now();
        };
        assert_eq!((*lease.item(), lease.attempt()), (42, 2));
        let mut tx = store.begin();
        done.enqueue(&mut tx, "second worker did 42".to_owned())
            .unwrap();
        lease.ack(&mut tx).unwrap();
        tx.blocking_commit().unwrap();

        let resumed = Command::new("kill")
            .args(["-CONT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(resumed.success());
        writeln!(child.stdin.take().unwrap(), "go").unwrap();
        let outcome = lines.next().unwrap().unwrap();
        assert_eq!(outcome, "expired");
        assert!(child.wait().unwrap().success());

        let mut tx = store.begin();
        let mut finished = Vec::new();
        while let Some(line) = done.blocking_try_dequeue(&mut tx).unwrap() {
            finished.push(line);
        }
        tx.blocking_commit().unwrap();
        assert_eq!(finished, ["second worker did 42"]);
        let stats = jobs.blocking_stats().unwrap();
        assert_eq!((stats.visible, stats.leased, stats.dead), (0, 0, 0));
    }

    /// A waiting consumer whose own transaction holds the pool's last connection still gives
    /// up at its timeout (it looks for the next due item only with a connection to spare).
    pub(crate) fn a_waiting_consumer_holding_the_last_connection_times_out(server: &PgServer) {
        let store = Store::builder()
            .postgres(server.url())
            .postgres_schema("lastconn")
            .postgres_pool_size(1)
            .open()
            .unwrap();
        let q = store.blocking_queue::<u64>("q").unwrap();
        let mut tx = store.begin();
        let started = Instant::now();
        assert_eq!(
            q.blocking_dequeue_timeout(&mut tx, Duration::from_millis(200))
                .unwrap(),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        tx.blocking_abort().unwrap();
    }

    /// The processing layer's calls are not refused on PostgreSQL any more, and a lease's
    /// deadline comes from the database's clock when no clock is injected: a fresh lease
    /// ends about its ttl from now by this machine's clock (same machine as the server).
    pub(crate) fn a_lease_deadline_comes_from_the_databases_clock(server: &PgServer) {
        let store = store(server, "dbclock");
        let q = store.blocking_queue::<u8>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, 1).unwrap();
        tx.blocking_commit().unwrap();
        let before = std::time::SystemTime::now();
        let lease = q.blocking_lease(Duration::from_secs(300)).unwrap();
        let after = std::time::SystemTime::now();
        let slack = Duration::from_secs(5);
        assert!(lease.deadline() >= before + Duration::from_secs(300) - slack);
        assert!(lease.deadline() <= after + Duration::from_secs(300) + slack);
        lease.blocking_release(Duration::ZERO).unwrap();
        assert_eq!(q.blocking_count().unwrap(), 1);
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
            "a_schema_of_version_1_is_migrated_with_its_items",
            a_schema_of_version_1_is_migrated_with_its_items,
        ),
        (
            "a_schema_of_version_2_is_migrated_with_its_items",
            a_schema_of_version_2_is_migrated_with_its_items,
        ),
        (
            "a_schema_of_version_3_is_migrated_with_its_items",
            a_schema_of_version_3_is_migrated_with_its_items,
        ),
        (
            "dead_letters_past_the_retention_are_deleted",
            dead_letters_past_the_retention_are_deleted,
        ),
        (
            "the_store_transaction_timeout_is_the_servers_idle_timeout",
            the_store_transaction_timeout_is_the_servers_idle_timeout,
        ),
        (
            "a_worker_stopped_past_its_lease_cannot_complete_the_item",
            a_worker_stopped_past_its_lease_cannot_complete_the_item,
        ),
        (
            "a_waiting_consumer_holding_the_last_connection_times_out",
            a_waiting_consumer_holding_the_last_connection_times_out,
        ),
        (
            "a_lease_deadline_comes_from_the_databases_clock",
            a_lease_deadline_comes_from_the_databases_clock,
        ),
    ])
}
