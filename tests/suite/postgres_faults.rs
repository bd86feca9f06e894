//! Faults of the PostgreSQL engine against a real server, under load: worker threads move
//! items between two queues while the server is killed with `SIGKILL` and restarted, or while
//! their connections are ended mid-transaction with `pg_terminate_backend`. The workers treat
//! every error as transient and carry on; the store must recover by itself (its pool
//! reconnects), and at the end every item must be exactly once in one of the two queues. A
//! third test kills the server under consumers waiting in `blocking_dequeue_timeout`: they
//! must get the items committed after the restart (the listeners reconnect too).
//!
//! Which server each test gets (`tests/pg/mod.rs`, [`crate::common::engines::Case::postgres`]):
//!
//! - The kill tests kill the server, which would break every other test running against it
//!   at the same time (the trials run on several threads). So they run with
//!   [`pg::Needs::OwnCluster`]: the harness `initdb`s and starts a cluster for each alone and
//!   stops it after it, and the test kills and restarts that one (`PgServer::kill_9`, which
//!   SIGKILLs the postmaster read from `postmaster.pid`, and `PgServer::restart`, which runs
//!   `pg_ctl start` again on the same data directory). With `RQ_TEST_POSTGRES_URL` set they
//!   are reported as ignored, with the reason: a server the harness did not start is not
//!   theirs to kill. A cluster costs about a second of `initdb`; `--test-threads=1` is not
//!   needed, the tests run side by side.
//! - The `pg_terminate_backend` test only ends its own sessions (picked by their
//!   `application_name`), so it shares the binary's server, in a schema of its own.
//!
//! How the outcome is checked: every item carries a unique id and a hop count, the number of
//! moves it went through; an item at hop `h` belongs in queue `a` when `h` is even, `b` when
//! odd, and a move takes it from hop `h` to `h + 1`. Each worker writes down every move it
//! tried and what the store said of it: committed, not committed (an abort, a drop, or a
//! commit that failed with an error other than `CommitOutcomeUnknown`), or in doubt
//! (`Error::CommitOutcomeUnknown`). The final contents of both queues then resolve the
//! moves in doubt (an item at hop `h` went through exactly one committed move from each hop
//! below `h`) and the checker counts, all of which must be zero:
//!
//! - lost: an id in neither queue;
//! - duplicated: an id more than once, or one hop of an id moved by two known commits;
//! - torn: half a move applied: an id at hops `h` and `h + 1` at once (the enqueue without
//!   the dequeue), or an item in the queue its hop does not put it in;
//! - resurrected: an id found at a hop below one a known commit moved it past (a committed
//!   dequeue undone, S7);
//! - phantom: an id at a hop that no move committed or in doubt could have taken it to (a
//!   move applied although the store reported it not committed).
//!
//! PostgreSQL runs with `fsync = off` in the harness, which loses nothing here: killing the
//! server's processes (not the machine) leaves what they wrote in the kernel's page cache,
//! and crash recovery replays it, so every committed move must survive.
//!
//! The only waits are bounded polls of a condition (commits counted, processes gone,
//! sessions ended) with a deadline; the workers sleep a few milliseconds between attempts
//! after an error, as a backoff.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::collections::{BTreeMap, HashMap};
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use reliable_queue::{Error, ReliableConcurrentQueue, Store};
    use serde::{Deserialize, Serialize};

    use super::pg::{self, PgServer};

    /// An item: its unique id and how many moves it has been through (even: it belongs in
    /// `a`, odd: in `b`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    struct Item {
        id: u32,
        hop: u32,
    }

    /// The two queues, by index: an item at hop `h` belongs in `QUEUES[h % 2]`.
    const QUEUES: [&str; 2] = ["a", "b"];

    /// Worker threads: `STORES` stores (as many processes would have) of `THREADS` each.
    const STORES: usize = 2;
    const THREADS: usize = 2;
    const WORKERS: usize = STORES * THREADS;
    /// Connections per store.
    const POOL: usize = 3;
    /// Items moved about.
    const ITEMS: u32 = 300;
    /// Commits that tell the store is working again after a fault.
    const RECOVERED_AFTER: u64 = 50;
    /// The longest any bounded wait of these tests may take.
    const DEADLINE: Duration = Duration::from_secs(60);

    /// What the store said of one move a worker tried.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        /// `commit` returned `Ok`.
        Committed,
        /// `commit` returned `Error::CommitOutcomeUnknown`.
        InDoubt,
        /// Aborted, dropped, or a commit that failed with another error.
        NotCommitted,
    }

    /// One move tried: the item `id` from hop `from` to `from + 1`.
    #[derive(Debug, Clone, Copy)]
    struct Attempt {
        id: u32,
        from: u32,
        outcome: Outcome,
    }

    /// What the workers share with the test: progress counters and the stop flag.
    #[derive(Debug, Default)]
    struct Progress {
        commits: AtomicU64,
        errors: AtomicU64,
        stop: AtomicBool,
    }

    impl Progress {
        fn commits(&self) -> u64 {
            self.commits.load(Ordering::SeqCst)
        }

        fn errors(&self) -> u64 {
            self.errors.load(Ordering::SeqCst)
        }
    }

    /// Stops the workers when dropped: also when the test fails half way.
    struct StopOnDrop(Arc<Progress>);

    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.stop.store(true, Ordering::SeqCst);
        }
    }

    /// A worker's record of its run.
    #[derive(Debug, Default)]
    struct WorkerLog {
        attempts: Vec<Attempt>,
        /// Items dequeued from a queue their hop does not put them in (the queue's index).
        misplaced: Vec<(Item, usize)>,
        /// The errors seen, by kind.
        errors: BTreeMap<String, u64>,
        /// Errors of a kind a fault of the server or the connection should never cause.
        unexpected: Vec<String>,
    }

    impl WorkerLog {
        /// Counts `e`; an error no connection fault explains goes to `unexpected`.
        fn error(&mut self, progress: &Progress, during: &str, e: &Error) {
            progress.errors.fetch_add(1, Ordering::SeqCst);
            let kind = match e {
                Error::Postgres { operation, .. } => format!("Postgres({operation})"),
                Error::CommitOutcomeUnknown { .. } => "CommitOutcomeUnknown".to_owned(),
                Error::TransactionAborted { .. } => "TransactionAborted".to_owned(),
                other => {
                    self.unexpected.push(format!("{during}: {other:?}"));
                    format!("unexpected during {during}")
                }
            };
            *self.errors.entry(format!("{during}: {kind}")).or_default() += 1;
        }
    }

    /// A few milliseconds between attempts after an error.
    fn backoff(rng: &mut StdRng) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(2..15)));
    }

    /// Moves one item at a time from a random queue to the other, in one transaction each,
    /// committed (18 in 20), aborted or dropped; every error is transient. Until told to stop.
    fn worker(
        store: Store,
        queues: [ReliableConcurrentQueue<Item>; 2],
        progress: Arc<Progress>,
        seed: u64,
    ) -> WorkerLog {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut log = WorkerLog::default();
        while !progress.stop.load(Ordering::SeqCst) {
            let from = rng.gen_range(0..2usize);
            let mut tx = store.begin();
            let item = match queues[from].blocking_try_dequeue(&mut tx) {
                Ok(Some(item)) => item,
                Ok(None) => {
                    if let Err(e) = tx.blocking_abort() {
                        log.error(&progress, "abort", &e);
                        backoff(&mut rng);
                    }
                    continue;
                }
                Err(e) => {
                    log.error(&progress, "dequeue", &e);
                    drop(tx);
                    backoff(&mut rng);
                    continue;
                }
            };
            if item.hop as usize % 2 != from {
                // Checked again at the end; not moved, so that the record stays readable.
                log.misplaced.push((item, from));
                drop(tx);
                continue;
            }
            let moved = Item {
                id: item.id,
                hop: item.hop + 1,
            };
            let mut failed = false;
            let outcome = if let Err(e) = queues[1 - from].enqueue(&mut tx, moved) {
                log.error(&progress, "enqueue", &e);
                failed = true;
                Outcome::NotCommitted
            } else {
                match rng.gen_range(0..20) {
                    0 => {
                        if let Err(e) = tx.blocking_abort() {
                            log.error(&progress, "abort", &e);
                            failed = true;
                        }
                        Outcome::NotCommitted
                    }
                    1 => {
                        drop(tx);
                        Outcome::NotCommitted
                    }
                    _ => match tx.blocking_commit() {
                        Ok(()) => {
                            progress.commits.fetch_add(1, Ordering::SeqCst);
                            Outcome::Committed
                        }
                        Err(e) => {
                            log.error(&progress, "commit", &e);
                            failed = true;
                            if matches!(e, Error::CommitOutcomeUnknown { .. }) {
                                Outcome::InDoubt
                            } else {
                                Outcome::NotCommitted
                            }
                        }
                    },
                }
            };
            log.attempts.push(Attempt {
                id: item.id,
                from: item.hop,
                outcome,
            });
            if failed {
                backoff(&mut rng);
            }
        }
        log
    }

    /// The worker stores and threads of a test.
    struct Workers {
        stores: Vec<Store>,
        threads: Vec<JoinHandle<WorkerLog>>,
        progress: Arc<Progress>,
        _stop: StopOnDrop,
    }

    impl Workers {
        /// [`STORES`] stores on `url` and `schema`, [`THREADS`] worker threads on each.
        fn start(url: &str, schema: &str, seed: u64) -> Workers {
            let progress = Arc::new(Progress::default());
            let mut stores = Vec::new();
            let mut threads = Vec::new();
            for s in 0..STORES {
                let store = Store::builder()
                    .postgres(url)
                    .postgres_schema(schema)
                    .postgres_pool_size(POOL)
                    .open()
                    .expect("a worker store connects");
                let queues = QUEUES.map(|name| store.blocking_queue::<Item>(name).unwrap());
                for t in 0..THREADS {
                    let (store, queues, progress) =
                        (store.clone(), queues.clone(), Arc::clone(&progress));
                    let seed = seed * 1000 + (s * THREADS + t) as u64;
                    threads.push(
                        std::thread::Builder::new()
                            .name(format!("mover-{s}-{t}"))
                            .spawn(move || worker(store, queues, progress, seed))
                            .unwrap(),
                    );
                }
                stores.push(store);
            }
            Workers {
                stores,
                threads,
                _stop: StopOnDrop(Arc::clone(&progress)),
                progress,
            }
        }

        /// Stops the workers, closes their stores and returns their logs. A worker that
        /// panicked (a panic in the library) fails the test here.
        fn finish(self) -> Vec<WorkerLog> {
            self.progress.stop.store(true, Ordering::SeqCst);
            let logs = self
                .threads
                .into_iter()
                .map(|t| {
                    let name = t.thread().name().unwrap_or("?").to_owned();
                    t.join()
                        .unwrap_or_else(|_| panic!("worker {name} panicked (see above)"))
                })
                .collect();
            for store in self.stores {
                store
                    .blocking_close()
                    .expect("a worker store closes once the server is back");
            }
            logs
        }
    }

    /// Polls `done` until it holds: how long it took, or `Err` after `timeout`.
    fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> Result<Duration, ()> {
        let start = Instant::now();
        while !done() {
            if start.elapsed() >= timeout {
                return Err(());
            }
            // A polling interval, bounded by the deadline.
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(start.elapsed())
    }

    /// Polls `done` until it holds, failing the test after `timeout`; returns how long it took.
    fn wait_until(what: &str, timeout: Duration, done: impl FnMut() -> bool) -> Duration {
        poll_until(timeout, done).unwrap_or_else(|()| panic!("{what}: not within {timeout:?}"))
    }

    /// [`wait_until`] on the workers' progress, which the failure reports.
    fn wait_for(
        progress: &Progress,
        what: &str,
        mut done: impl FnMut(&Progress) -> bool,
    ) -> Duration {
        poll_until(DEADLINE, || done(progress)).unwrap_or_else(|()| {
            panic!(
                "{what}: not within {DEADLINE:?} (the workers are at {} commits, {} errors)",
                progress.commits(),
                progress.errors()
            )
        })
    }

    /// The first column of the first row of `sql` (a count), on a connection of its own.
    fn query_count(url: &str, sql: &str, param: &str) -> i64 {
        pg::block_on(async {
            let client = pg::connect(url).await;
            let row = client
                .query_one(sql, &[&param])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            row.get(0)
        })
    }

    /// Drops `schema` if it is there.
    fn drop_schema(url: &str, schema: &str) {
        pg::block_on(async {
            pg::connect(url)
                .await
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await
                .unwrap_or_else(|e| panic!("dropping the schema {schema}: {e:?}"));
        });
    }

    /// Sessions of `application` on the server.
    fn sessions(url: &str, application: &str) -> i64 {
        query_count(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            application,
        )
    }

    /// Puts ids `0..ITEMS`, at hop 0, in queue `a` of `schema`, made afresh (an existing
    /// server may have it from an earlier run).
    fn fill(url: &str, schema: &str) {
        drop_schema(url, schema);
        let store = Store::builder()
            .postgres(url)
            .postgres_schema(schema)
            .open()
            .unwrap();
        let a = store.blocking_queue::<Item>(QUEUES[0]).unwrap();
        store.blocking_queue::<Item>(QUEUES[1]).unwrap();
        let mut tx = store.begin();
        for id in 0..ITEMS {
            a.enqueue(&mut tx, Item { id, hop: 0 }).unwrap();
        }
        tx.blocking_commit().unwrap();
        store.blocking_close().unwrap();
    }

    /// Everything in both queues of `schema` (read in one transaction, then aborted: left as
    /// it is), as `(queue index, item)`; checked against `count` and the rows of the schema's
    /// tables. Call when nothing else works on the schema.
    fn final_contents(url: &str, schema: &str) -> Vec<(usize, Item)> {
        let store = Store::builder()
            .postgres(url)
            .postgres_schema(schema)
            .open()
            .expect("a store opens on the recovered server");
        let queues = QUEUES.map(|name| store.blocking_queue::<Item>(name).unwrap());
        let counted: u64 = queues.iter().map(|q| q.blocking_count().unwrap()).sum();
        let mut tx = store.begin();
        let mut found = Vec::new();
        for (index, q) in queues.iter().enumerate() {
            loop {
                let batch = q.blocking_try_dequeue_many(&mut tx, 1000).unwrap();
                if batch.is_empty() {
                    break;
                }
                found.extend(batch.into_iter().map(|item| (index, item)));
            }
        }
        tx.blocking_abort().unwrap();
        store.blocking_close().unwrap();
        assert_eq!(
            counted,
            found.len() as u64,
            "count() of the idle queues and what a dequeue finds agree"
        );
        let rows = pg::block_on(async {
            let client = pg::connect(url).await;
            let items: i64 = client
                .query_one(&format!("SELECT count(*) FROM \"{schema}\".items"), &[])
                .await
                .unwrap()
                .get(0);
            let dead: i64 = client
                .query_one(
                    &format!("SELECT count(*) FROM \"{schema}\".dead_letters"),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (items, dead)
        });
        assert_eq!(
            rows,
            (found.len() as i64, 0),
            "(rows of the items table, dead letters): every row is a visible item"
        );
        found
    }

    /// The checker's findings (see the module's documentation).
    #[derive(Debug, Default)]
    struct Verdict {
        lost: Vec<u32>,
        duplicated: Vec<u32>,
        torn: Vec<u32>,
        resurrected: Vec<u32>,
        phantom: Vec<u32>,
        /// Moves in doubt that the final state shows committed, and not committed.
        in_doubt_committed: usize,
        in_doubt_not_committed: usize,
    }

    impl Verdict {
        fn clean(&self) -> bool {
            self.lost.is_empty()
                && self.duplicated.is_empty()
                && self.torn.is_empty()
                && self.resurrected.is_empty()
                && self.phantom.is_empty()
        }
    }

    /// Known commits, moves in doubt and moves not committed of one hop of one id.
    #[derive(Debug, Default, Clone, Copy)]
    struct Tally {
        committed: u32,
        in_doubt: u32,
        not_committed: u32,
    }

    /// Checks the final contents against the workers' records.
    fn check(found: &[(usize, Item)], logs: &[WorkerLog]) -> (Verdict, String) {
        let mut copies: HashMap<u32, Vec<(usize, u32)>> = HashMap::new();
        for &(queue, item) in found {
            copies.entry(item.id).or_default().push((queue, item.hop));
        }
        let mut tallies: HashMap<(u32, u32), Tally> = HashMap::new();
        for attempt in logs.iter().flat_map(|log| &log.attempts) {
            let tally = tallies.entry((attempt.id, attempt.from)).or_default();
            match attempt.outcome {
                Outcome::Committed => tally.committed += 1,
                Outcome::InDoubt => tally.in_doubt += 1,
                Outcome::NotCommitted => tally.not_committed += 1,
            }
        }
        let tally = |id: u32, hop: u32| tallies.get(&(id, hop)).copied().unwrap_or_default();
        // The highest hop a known commit took each id to.
        let mut committed_to: HashMap<u32, u32> = HashMap::new();
        for (&(id, from), t) in &tallies {
            if t.committed > 0 {
                let to = committed_to.entry(id).or_default();
                *to = (*to).max(from + 1);
            }
        }

        let mut v = Verdict::default();
        for (&(id, _), t) in &tallies {
            if t.committed > 1 && !v.duplicated.contains(&id) {
                v.duplicated.push(id);
            }
        }
        for (item, _) in logs.iter().flat_map(|log| &log.misplaced) {
            v.torn.push(item.id);
        }
        for id in 0..ITEMS {
            let mut here = copies.get(&id).cloned().unwrap_or_default();
            here.sort_unstable_by_key(|&(_, hop)| hop);
            match here[..] {
                [] => v.lost.push(id),
                [(queue, hop)] => {
                    if queue != hop as usize % 2 {
                        v.torn.push(id);
                    }
                    if hop < committed_to.get(&id).copied().unwrap_or(0) {
                        v.resurrected.push(id);
                    }
                    for from in 0..hop {
                        let t = tally(id, from);
                        if t.committed == 0 && t.in_doubt == 0 {
                            v.phantom.push(id);
                            break;
                        }
                    }
                    for (&(tid, from), t) in &tallies {
                        if tid != id || t.in_doubt == 0 {
                            continue;
                        }
                        if from < hop && t.committed == 0 {
                            v.in_doubt_committed += 1;
                            v.in_doubt_not_committed += t.in_doubt as usize - 1;
                        } else {
                            v.in_doubt_not_committed += t.in_doubt as usize;
                        }
                    }
                }
                _ => {
                    if !v.duplicated.contains(&id) {
                        v.duplicated.push(id);
                    }
                    if here.windows(2).any(|w| w[1].1 == w[0].1 + 1) {
                        v.torn.push(id);
                    }
                }
            }
        }
        for ids in [
            &mut v.lost,
            &mut v.duplicated,
            &mut v.torn,
            &mut v.resurrected,
            &mut v.phantom,
        ] {
            ids.sort_unstable();
            ids.dedup();
        }

        // For a failure: the first offenders, with where they were found and their moves.
        let mut detail = String::new();
        let offenders = v
            .lost
            .iter()
            .chain(&v.duplicated)
            .chain(&v.torn)
            .chain(&v.resurrected)
            .chain(&v.phantom)
            .take(10);
        for &id in offenders {
            let mut moves: Vec<(u32, Tally)> = tallies
                .iter()
                .filter(|((tid, _), _)| *tid == id)
                .map(|(&(_, from), &t)| (from, t))
                .collect();
            moves.sort_unstable_by_key(|&(from, _)| from);
            let _ = writeln!(
                detail,
                "  id {id}: found as (queue, hop) {:?}; moves by hop {moves:?}",
                copies.get(&id).cloned().unwrap_or_default()
            );
        }
        (v, detail)
    }

    /// Checks the run: the final contents, the workers' unexpected errors; prints a summary.
    fn verify(test: &str, url: &str, schema: &str, logs: &[WorkerLog], extra: &str) {
        let found = final_contents(url, schema);
        let (verdict, detail) = check(&found, logs);
        let unexpected: Vec<&String> = logs.iter().flat_map(|l| &l.unexpected).collect();
        let mut errors: BTreeMap<&str, u64> = BTreeMap::new();
        for (kind, n) in logs.iter().flat_map(|l| &l.errors) {
            *errors.entry(kind).or_default() += n;
        }
        let attempts: usize = logs.iter().map(|l| l.attempts.len()).sum();
        let committed = logs
            .iter()
            .flat_map(|l| &l.attempts)
            .filter(|a| a.outcome == Outcome::Committed)
            .count();
        let in_a = found.iter().filter(|(q, _)| *q == 0).count();
        eprintln!(
            "    {test}: {extra}\n    {attempts} moves tried, {committed} committed, \
             {} in doubt (resolved: {} committed, {} not); {in_a} items in a, {} in b\n    \
             errors seen by the workers: {errors:?}",
            verdict.in_doubt_committed + verdict.in_doubt_not_committed,
            verdict.in_doubt_committed,
            verdict.in_doubt_not_committed,
            found.len() - in_a,
        );
        assert!(
            verdict.clean(),
            "lost {:?}, duplicated {:?}, torn {:?}, resurrected {:?}, phantom {:?}\n{detail}",
            verdict.lost,
            verdict.duplicated,
            verdict.torn,
            verdict.resurrected,
            verdict.phantom
        );
        assert!(
            unexpected.is_empty(),
            "errors no connection fault explains: {unexpected:?}"
        );
        assert_eq!(found.len(), ITEMS as usize);
    }

    /// `kill -9` of the postmaster while the workers move items, six times; each time the
    /// server stays down until the workers have met the outage (once each, or some forty
    /// times each: about a second), then `pg_ctl start` brings it back (crash recovery) and
    /// the same stores must commit again by themselves. At the end every item is exactly
    /// once in one queue, every committed move kept.
    pub(crate) fn kill_9_of_the_server_under_moving_workers_loses_nothing_and_the_store_recovers(
        server: &PgServer,
    ) {
        const ROUNDS: u64 = 6;
        let began = Instant::now();
        let schema = "faults_kill";
        let application = "rq-faults-kill";
        let url = format!("{} application_name={application}", server.url());
        fill(server.url(), schema);
        let mut rng = StdRng::seed_from_u64(7);
        let workers = Workers::start(&url, schema, 1);
        let progress = Arc::clone(&workers.progress);
        let mut report = String::new();
        for round in 1..=ROUNDS {
            let target = progress.commits() + rng.gen_range(100..300);
            wait_for(
                &progress,
                &format!("round {round}: the workers commit before the kill"),
                |p| p.commits() >= target,
            );
            let killed = server.kill_9();
            let (commits_at_kill, errors_at_kill) = (progress.commits(), progress.errors());
            // Down until the workers have run into the outage: each once (a short outage) or
            // some forty times (a longer one, about a second).
            let outage = if round % 2 == 1 { 1 } else { 40 };
            wait_for(
                &progress,
                &format!("round {round}: the workers see the server gone (a call hangs?)"),
                |p| p.errors() >= errors_at_kill + outage * WORKERS as u64,
            );
            let errors_while_down = progress.errors() - errors_at_kill;
            let restarting = Instant::now();
            server.restart();
            let restarted = restarting.elapsed();
            let recovered = wait_for(
                &progress,
                &format!(
                    "round {round}: the stores commit again after the restart \
                     ({commits_at_kill} commits at the kill)"
                ),
                |p| p.commits() >= commits_at_kill + RECOVERED_AFTER,
            );
            let _ = write!(
                report,
                "round {round}: killed postmaster {:?} and {} children after {commits_at_kill} \
                 commits, {errors_while_down} errors while down; restarted in {restarted:?}, \
                 {RECOVERED_AFTER} more commits {recovered:?} after that; ",
                killed.postmaster, killed.children,
            );
        }
        let logs = workers.finish();
        // Whatever the workers held was rolled back with its connection: wait (bounded) for
        // the server to see every worker session end.
        wait_until("the worker sessions end", DEADLINE, || {
            sessions(server.url(), application) == 0
        });
        let _ = write!(report, "ran {:?}", began.elapsed());
        verify("kill -9", server.url(), schema, &logs, &report);
    }

    /// `pg_terminate_backend`, from a connection of the test's own, of a random worker session
    /// that is inside a transaction (idle in it between statements, or running one: a dequeue,
    /// the `INSERT`, the `COMMIT`), again and again while the workers move items. Every
    /// commit cut off that way fails with a typed error (in doubt when the connection went
    /// during `COMMIT`), nothing is lost or doubled, and the stores go on with new
    /// connections. (tests/suite/postgres.rs ends one idle transaction of an otherwise idle
    /// store; this one ends them at random points under load.)
    pub(crate) fn pg_terminate_backend_mid_transaction_under_moving_workers_loses_nothing(
        server: &PgServer,
    ) {
        const TERMINATIONS: usize = 40;
        let began = Instant::now();
        let schema = "faults_terminate";
        let application = "rq-faults-terminate";
        let url = format!("{} application_name={application}", server.url());
        fill(server.url(), schema);
        let mut rng = StdRng::seed_from_u64(11);
        let workers = Workers::start(&url, schema, 2);
        let progress = Arc::clone(&workers.progress);

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let killer = rt.block_on(pg::connect(server.url()));
        let terminate = rt
            .block_on(killer.prepare(
                "SELECT t.state, split_part(ltrim(t.query), ' ', 1), pg_terminate_backend(t.pid) \
                 FROM (SELECT pid, state, query FROM pg_stat_activity \
                       WHERE application_name = $1 AND xact_start IS NOT NULL \
                       AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1) t",
            ))
            .unwrap();
        // (state, the statement's first word) of each session ended.
        let mut ended: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut terminated = 0;
        let mut misses = 0u64;
        let deadline = Instant::now() + DEADLINE;
        while terminated < TERMINATIONS {
            assert!(
                Instant::now() < deadline,
                "only {terminated} terminations within {DEADLINE:?} ({} commits)",
                progress.commits()
            );
            let target = progress.commits() + rng.gen_range(3..30);
            wait_for(&progress, "the workers commit between terminations", |p| {
                p.commits() >= target
            });
            let rows = rt
                .block_on(killer.query(&terminate, &[&application]))
                .unwrap();
            match rows.first() {
                Some(row) if row.get::<_, bool>(2) => {
                    terminated += 1;
                    let state: Option<String> = row.get(0);
                    let statement: Option<String> = row.get(1);
                    *ended
                        .entry((state.unwrap_or_default(), statement.unwrap_or_default()))
                        .or_default() += 1;
                }
                // No worker inside a transaction at that moment: try again after more commits.
                _ => misses += 1,
            }
        }
        drop(killer);
        let commits_after = progress.commits();
        let recovered = wait_for(
            &progress,
            "the stores commit again after the terminations",
            |p| p.commits() >= commits_after + RECOVERED_AFTER,
        );
        let logs = workers.finish();
        wait_until("the worker sessions end", DEADLINE, || {
            sessions(server.url(), application) == 0
        });
        let report = format!(
            "{terminated} sessions ended mid-transaction ((state, statement): {ended:?}; \
             {misses} looks found none); {RECOVERED_AFTER} commits {recovered:?} after the last; \
             ran {:?}",
            began.elapsed()
        );
        verify("pg_terminate_backend", server.url(), schema, &logs, &report);
    }

    /// What the consumers of [`waiting_consumers_survive_a_kill_9_of_the_server`] took: per
    /// id, when it was dequeued and what its commit said.
    type Taken = Arc<std::sync::Mutex<Vec<(u32, Instant, Outcome)>>>;

    /// A consumer waiting in `blocking_dequeue_timeout`, committing what it gets; every error
    /// is transient. Until told to stop.
    fn waiting_consumer(
        store: Store,
        q: ReliableConcurrentQueue<u32>,
        progress: Arc<Progress>,
        taken: Taken,
        seed: u64,
    ) -> WorkerLog {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut log = WorkerLog::default();
        while !progress.stop.load(Ordering::SeqCst) {
            let mut tx = store.begin();
            match q.blocking_dequeue_timeout(&mut tx, Duration::from_millis(500)) {
                Ok(Some(id)) => {
                    let at = Instant::now();
                    let outcome = match tx.blocking_commit() {
                        Ok(()) => {
                            progress.commits.fetch_add(1, Ordering::SeqCst);
                            Outcome::Committed
                        }
                        Err(e) => {
                            log.error(&progress, "commit", &e);
                            if matches!(e, Error::CommitOutcomeUnknown { .. }) {
                                Outcome::InDoubt
                            } else {
                                Outcome::NotCommitted
                            }
                        }
                    };
                    taken.lock().unwrap().push((id, at, outcome));
                }
                Ok(None) => {
                    if let Err(e) = tx.blocking_abort() {
                        log.error(&progress, "abort", &e);
                    }
                }
                Err(e) => {
                    log.error(&progress, "dequeue", &e);
                    drop(tx);
                    backoff(&mut rng);
                }
            }
        }
        log
    }

    /// Consumers waiting for items (`blocking_dequeue_timeout`, woken by the listener's
    /// notifications) when the server is killed with `SIGKILL`: once it is restarted they
    /// get the items committed after it, by another store, each exactly once, without being
    /// started again: the stores' pools and listeners reconnect by themselves. Reports the
    /// wake-up latency before the kill and after the restart (a listener that did not come
    /// back would leave the consumers to their fallback poll, about a second).
    pub(crate) fn waiting_consumers_survive_a_kill_9_of_the_server(server: &PgServer) {
        const CONSUMERS: usize = 3;
        const BEFORE: u32 = 10;
        const AFTER: u32 = 20;
        let began = Instant::now();
        let schema = "faults_wait";
        drop_schema(server.url(), schema);
        let consumer_url = format!("{} application_name=rq-faults-wait-c", server.url());
        let producer_url = format!("{} application_name=rq-faults-wait-p", server.url());
        let open = |url: &str, pool: usize| {
            Store::builder()
                .postgres(url)
                .postgres_schema(schema)
                .postgres_pool_size(pool)
                .open()
                .unwrap()
        };
        // One connection more than consumers: a waiting consumer holds one in its open
        // transaction and takes a second for a moment between looks (the next-due query);
        // with no spare connection they all wait for one forever (see the report of
        // tests/suite/postgres_faults.rs: a pool of 1 and one `blocking_dequeue_timeout` hang).
        let consumer_store = open(&consumer_url, CONSUMERS + 1);
        let producer_store = open(&producer_url, 2);
        let q = consumer_store.blocking_queue::<u32>("q").unwrap();
        let p = producer_store.blocking_queue::<u32>("q").unwrap();
        let progress = Arc::new(Progress::default());
        let _stop = StopOnDrop(Arc::clone(&progress));
        let taken: Taken = Arc::default();
        let consumers: Vec<JoinHandle<WorkerLog>> = (0..CONSUMERS)
            .map(|c| {
                let (store, q, progress, taken) = (
                    consumer_store.clone(),
                    q.clone(),
                    Arc::clone(&progress),
                    Arc::clone(&taken),
                );
                std::thread::spawn(move || waiting_consumer(store, q, progress, taken, c as u64))
            })
            .collect();
        let listening = || super::pg::watched_queues(server.url(), schema) > 0;

        // Commits `id` (retried while the store says it did not commit; an id in doubt is
        // given up and a new one used) and returns how long until a consumer took it.
        let mut produced: Vec<u32> = Vec::new();
        let mut in_doubt: Vec<u32> = Vec::new();
        let mut next_id = 0u32;
        let mut produce = |what: &str| -> Duration {
            let deadline = Instant::now() + DEADLINE;
            loop {
                let id = next_id;
                next_id += 1;
                let mut tx = producer_store.begin();
                p.enqueue(&mut tx, id).unwrap();
                match tx.blocking_commit() {
                    Ok(()) => {}
                    Err(Error::CommitOutcomeUnknown { .. }) => {
                        in_doubt.push(id);
                        continue;
                    }
                    Err(e) => {
                        assert!(
                            Instant::now() < deadline,
                            "{what}: the producer fails: {e:?}"
                        );
                        // A backoff between attempts, bounded by the deadline.
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
                produced.push(id);
                let committed = Instant::now();
                let mut took = None;
                wait_until(
                    &format!("{what}: a consumer takes item {id}"),
                    DEADLINE,
                    || {
                        took = taken
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|(t, _, outcome)| *t == id && *outcome != Outcome::NotCommitted)
                            .map(|&(_, at, _)| at);
                        took.is_some()
                    },
                );
                return took
                    .unwrap_or(committed)
                    .saturating_duration_since(committed);
            }
        };

        wait_until(
            "the consumers' listener watches the queue",
            DEADLINE,
            listening,
        );
        let before: Vec<Duration> = (0..BEFORE).map(|_| produce("before the kill")).collect();
        wait_until("the consumers wait again", DEADLINE, listening);
        let errors_at_kill = progress.errors();
        let killed = server.kill_9();
        wait_for(
            &progress,
            "the waiting consumers run into the outage",
            |p| p.errors() > errors_at_kill,
        );
        server.restart();
        // At once, before the listeners are known to be back.
        let first = produce("just after the restart");
        let relisten = wait_until(
            "the consumers' listener watches the queue again",
            DEADLINE,
            listening,
        );
        let after: Vec<Duration> = (1..AFTER).map(|_| produce("after the restart")).collect();

        progress.stop.store(true, Ordering::SeqCst);
        let logs: Vec<WorkerLog> = consumers
            .into_iter()
            .map(|t| t.join().expect("a consumer panicked"))
            .collect();
        consumer_store.blocking_close().unwrap();
        producer_store.blocking_close().unwrap();
        let left = {
            let store = open(server.url(), 1);
            let q = store.blocking_queue::<u32>("q").unwrap();
            let mut tx = store.begin();
            let left = q.blocking_try_dequeue_many(&mut tx, 1000).unwrap();
            tx.blocking_commit().unwrap();
            store.blocking_close().unwrap();
            left
        };

        // Each id produced: taken by exactly one committed (or, if none, one in-doubt)
        // consumer commit, or still in the queue; an id in doubt at the producer at most once.
        let taken = taken.lock().unwrap();
        let mut problems = Vec::new();
        for id in 0..next_id {
            let committed = taken
                .iter()
                .filter(|&&(t, _, o)| t == id && o == Outcome::Committed)
                .count();
            let doubtful = taken
                .iter()
                .filter(|&&(t, _, o)| t == id && o == Outcome::InDoubt)
                .count();
            let remaining = left.iter().filter(|&&t| t == id).count();
            let copies = committed + remaining;
            let fine = if produced.contains(&id) {
                copies == 1 || (copies == 0 && doubtful > 0)
            } else if in_doubt.contains(&id) {
                copies <= 1
            } else {
                copies == 0 && doubtful == 0
            };
            if !fine {
                problems.push(format!(
                    "id {id}: taken by {committed} commits ({doubtful} in doubt), {remaining} \
                     left in the queue"
                ));
            }
        }
        let unexpected: Vec<&String> = logs.iter().flat_map(|l| &l.unexpected).collect();
        let mut errors: BTreeMap<&str, u64> = BTreeMap::new();
        for (kind, n) in logs.iter().flat_map(|l| &l.errors) {
            *errors.entry(kind).or_default() += n;
        }
        let spread = |d: &[Duration]| {
            let mut d = d.to_vec();
            d.sort_unstable();
            format!(
                "median {:?}, max {:?}",
                d.get(d.len() / 2).copied().unwrap_or_default(),
                d.last().copied().unwrap_or_default()
            )
        };
        eprintln!(
            "    waiting consumers: killed postmaster {:?} and {} children; wake-up latency \
             before the kill {}; first item after the restart {first:?}; listener back \
             {relisten:?} after that; then {}; {} ids produced ({} in doubt), {} left; \
             consumer errors {errors:?}; ran {:?}",
            killed.postmaster,
            killed.children,
            spread(&before),
            spread(&after),
            produced.len(),
            in_doubt.len(),
            left.len(),
            began.elapsed()
        );
        assert!(problems.is_empty(), "{problems:#?}");
        assert!(
            unexpected.is_empty(),
            "errors no connection fault explains: {unexpected:?}"
        );
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
#[cfg(feature = "postgres")]
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    use cases::*;
    use pg::Needs;
    crate::common::engines::postgres_suite_with(vec![
        (
            "kill_9_of_the_server_under_moving_workers_loses_nothing_and_the_store_recovers",
            Needs::OwnCluster,
            kill_9_of_the_server_under_moving_workers_loses_nothing_and_the_store_recovers,
        ),
        (
            "waiting_consumers_survive_a_kill_9_of_the_server",
            Needs::OwnCluster,
            waiting_consumers_survive_a_kill_9_of_the_server,
        ),
        (
            "pg_terminate_backend_mid_transaction_under_moving_workers_loses_nothing",
            Needs::SharedServer,
            pg_terminate_backend_mid_transaction_under_moving_workers_loses_nothing,
        ),
    ])
}
