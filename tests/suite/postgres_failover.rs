//! Through failovers of a primary and its synchronous standby, under load: nothing
//! acknowledged is lost, nothing consumed comes back, nothing is there twice.
//!
//! The pair is `tests/pg/pair.rs`'s: PostgreSQL 15 from Debian's binaries, a primary and a
//! synchronous standby (`synchronous_commit = on`) on TCP ports of 127.0.0.1. Worker processes
//! (this binary started again, see [`WORKER`]) all use one multi-host URL,
//! `postgresql://rq@127.0.0.1:<a>,127.0.0.1:<b>/failover?target_session_attrs=read-write`,
//! and report each operation on their standard output, a line each:
//!
//! - producers enqueue with a deduplication key (the item's id) and retry an enqueue only
//!   when its commit's outcome is unknown ([`Error::CommitOutcomeUnknown`]), under the same
//!   key, until a commit of it succeeds: the key makes the retry a no-op if the first commit
//!   applied. Any other error says that nothing was applied: that item is given up, never
//!   retried, and the test checks that it is indeed nowhere;
//! - consumers lease (waiting, with a timeout, through a [`QueueSet`]) and ack in a
//!   transaction, and report each acknowledged id;
//! - a waiting consumer takes items with a waiting `dequeue` on a queue that is empty most of
//!   the time, from a store whose fallback poll is an hour away: only its listener (a
//!   notification, or the wake it gives on reconnecting) can wake it, so every item it takes
//!   after a failover shows that its listener listens again, on the new primary.
//!
//! The parent kills the primary (SIGKILL to every process of it), promotes the standby as an
//! operator's tool would, rebuilds the old primary as the new standby, five times, a random
//! number of worker commits apart. Around each failover it also checks:
//!
//! - while no host accepts writes (the primary dead, the standby not promoted yet), a new
//!   store and a commit each give a typed error within a bound, and the commit applies
//!   nothing;
//! - leases are kept by the database's clock: a lease taken before the failover whose
//!   deadline has not passed is acknowledged after it; one whose deadline passed is refused
//!   with [`Error::LeaseExpired`] and its item is back;
//! - the waiting consumer, waiting from before the kill, takes an item committed after the
//!   promote;
//! - how long after the promote began a worker committed again (printed per failover).
//!
//! At the end every worker is stopped cleanly (so that each operation it began is reported)
//! and everything is read from the final primary: every acknowledged enqueue is consumed
//! (acknowledged by a consumer, or by one whose commit's outcome was unknown) or still in its
//! queue or dead letters (*lost*: 0); no acknowledged consumption is followed by the item
//! again, acknowledged or in the queue (*back*: 0); no item is in the queues twice
//! (*duplicated*: 0). A summary line gives the figures.
//!
//! Before the load, a write on the standby alone (a URL without `target_session_attrs`) is
//! checked to be a typed error that says the session is read-only.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use rand::{Rng, SeedableRng};
    use reliable_queue::{Error, QueueSet, ReliableConcurrentQueue, SetOrder, Store};

    use super::pg::pair::Pair;
    use super::pg::{block_on, connect, watched_queues};

    /// The environment variable that makes this binary a worker process of this test: the
    /// pair's multi-host URL.
    pub(crate) const WORKER_VAR: &str = "RQ_PG_FAILOVER_URL";
    /// The worker's role: `producer <n>`, `consumer <n>` or `waiter <n>`.
    const ROLE_VAR: &str = "RQ_PG_FAILOVER_ROLE";

    /// The database of the test, on the pair.
    const DB: &str = "failover";
    /// The schema of the jobs (and of the parent's `held` and `probe` queues).
    const JOBS: &str = "jobs";
    /// The schema of the waiting consumer's queue: its own, so that the watch locks of that
    /// schema are the waiting consumer's alone.
    const WAKE: &str = "wake";
    /// What the workers' sessions are called, to wait for them to end.
    const APP: &str = "rq-failover";

    const FAILOVERS: usize = 5;
    const PRODUCERS: u64 = 2;
    const CONSUMERS: u64 = 2;
    /// Items in the queue before the workers start. A producer commits an item in one
    /// transaction and a consumer in two (the lease, the ack), so the backlog grows from here
    /// (and each kill waits for at least [`MIN_BACKLOG`]): an item whose enqueue is retried
    /// after an unknown outcome is far behind the head when the retry runs (at once, once a
    /// host accepts writes), so it is not consumed before its key has made the retry a no-op.
    /// A key protects only while its item is in the queue (P11).
    const PREFILL: u64 = 1000;
    const MIN_BACKLOG: u64 = 500;
    /// The consumers' leases: long enough to outlive a failover, short enough that an item
    /// whose ack failed comes back during the run.
    const CONSUMER_TTL: Duration = Duration::from_secs(8);
    /// Acknowledged operations of the workers (enqueues and consumptions) between failovers,
    /// at random in this range, counted once the standby is synchronous again.
    const LOAD: std::ops::Range<usize> = 150..400;
    /// How long any one step the test waits for may take before it fails.
    const STEP: Duration = Duration::from_secs(60);
    /// The bound on a connect or a commit while no host accepts writes: the connects fail at
    /// once (a refused port, a read-only standby), so this is generous.
    const NO_PRIMARY_BOUND: Duration = Duration::from_secs(15);
    /// A client's pause between attempts while no host accepts writes: each attempt fails
    /// at once, and the test shares two cores with the servers.
    const RETRY_PAUSE: Duration = Duration::from_millis(10);

    /// Item ids: the writer's tag in the high 32 bits, a sequence number in the low ones.
    /// Producers are tags 1..=PRODUCERS.
    const PREFILL_TAG: u64 = 100;
    const WAKE_TAG: u64 = 200;
    const HELD_TAG: u64 = 300;
    const PROBE_TAG: u64 = 400;
    /// The item that ends the waiting consumer.
    const STOP_ITEM: u64 = u64::MAX;

    fn id(tag: u64, seq: u64) -> u64 {
        (tag << 32) | seq
    }

    fn unix_us() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    }

    fn open(url: &str, schema: &str, poll: Option<Duration>) -> Result<Store, Error> {
        let mut builder = Store::builder()
            .postgres(url)
            .postgres_schema(schema)
            .postgres_pool_size(2);
        if let Some(poll) = poll {
            builder = builder.postgres_poll_interval(poll);
        }
        builder.open()
    }

    /// A worker's report, a line on its standard output, flushed at once: the parent reads
    /// them as they come, and a worker stopped after a line has its operation counted.
    struct Out(std::io::Stdout);

    impl Out {
        fn line(&mut self, text: std::fmt::Arguments<'_>) {
            // A parent gone is the end of the test: nothing to report to.
            let mut out = self.0.lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }

    /// An error on one line.
    fn one_line(e: &Error) -> String {
        e.to_string().replace('\n', " ")
    }

    /// A worker process (see the module's documentation): its role from [`ROLE_VAR`]. It
    /// stops when its standard input closes (the waiting consumer: when it takes
    /// [`STOP_ITEM`]), after the operation in hand.
    pub(crate) fn worker(url: &str) {
        let role = std::env::var(ROLE_VAR).unwrap_or_default();
        let (kind, n) = role.split_once(' ').unwrap_or(("", ""));
        let n: u64 = n.parse().unwrap_or(0);
        let stop = Arc::new(AtomicBool::new(false));
        {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
                stop.store(true, Ordering::Release);
            });
        }
        let mut out = Out(std::io::stdout());
        match kind {
            "producer" => produce(url, n, &stop, &mut out),
            "consumer" => consume(url, &stop, &mut out),
            "waiter" => wait_and_take(url, &mut out),
            _ => panic!("{ROLE_VAR}={role:?}: not a role of the failover test"),
        }
    }

    /// Enqueues items `id(tag, 1..)` with their ids as keys, one per transaction.
    fn produce(url: &str, tag: u64, stop: &AtomicBool, out: &mut Out) {
        let store = open(url, JOBS, None).expect("producer: connect");
        let q = store
            .blocking_queue::<u64>("jobs")
            .expect("producer: queue");
        out.line(format_args!("R"));
        for seq in 1.. {
            if stop.load(Ordering::Acquire) {
                break;
            }
            let item = id(tag, seq);
            let mut in_doubt = false;
            loop {
                let mut tx = store.begin();
                q.enqueue_unique(&mut tx, item, &item.to_be_bytes(), Duration::ZERO)
                    .expect("producer: buffer a keyed enqueue");
                match tx.blocking_commit() {
                    Ok(()) => {
                        out.line(format_args!("E {item} {}", unix_us()));
                        break;
                    }
                    Err(Error::CommitOutcomeUnknown { .. }) => {
                        out.line(format_args!("U {item}"));
                        in_doubt = true;
                    }
                    // In doubt already: only a commit of it settles it, under its key.
                    Err(e) if in_doubt => out.line(format_args!("X commit {}", one_line(&e))),
                    Err(e) => {
                        // The error says nothing was applied: given up, and checked to be
                        // nowhere at the end.
                        out.line(format_args!("F {item} {}", one_line(&e)));
                        std::thread::sleep(RETRY_PAUSE);
                        break;
                    }
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }

    /// Leases items of `jobs` and acks each in a transaction of its own.
    fn consume(url: &str, stop: &AtomicBool, out: &mut Out) {
        let store = open(url, JOBS, None).expect("consumer: connect");
        let q = store
            .blocking_queue::<u64>("jobs")
            .expect("consumer: queue");
        let set = QueueSet::new(&[q], SetOrder::Priority).expect("consumer: a set of one");
        out.line(format_args!("R"));
        while !stop.load(Ordering::Acquire) {
            // Waits while the queue is empty, a while at a time, to see `stop`.
            let lease = match set.blocking_lease(CONSUMER_TTL, Some(Duration::from_millis(250))) {
                Ok(Some((_, lease))) => lease,
                Ok(None) => continue,
                Err(e) => {
                    out.line(format_args!("X lease {}", one_line(&e)));
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
            };
            let item = *lease.item();
            let mut tx = store.begin();
            if let Err(e) = lease.ack(&mut tx) {
                out.line(format_args!("X ack {}", one_line(&e)));
                continue;
            }
            match tx.blocking_commit() {
                Ok(()) => out.line(format_args!("A {item} {}", unix_us())),
                Err(Error::CommitOutcomeUnknown { .. }) => out.line(format_args!("D {item}")),
                // Not applied: the item is leased until its deadline, then back.
                Err(e) => {
                    out.line(format_args!("N {item} {}", one_line(&e)));
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Takes items of `wake` with a waiting dequeue, each in a transaction it commits, until
    /// it takes [`STOP_ITEM`].
    fn wait_and_take(url: &str, out: &mut Out) {
        // Only the listener wakes it: the fallback poll is an hour away.
        let store =
            open(url, WAKE, Some(Duration::from_secs(3600))).expect("waiting consumer: connect");
        let q = store
            .blocking_queue::<u64>("wake")
            .expect("waiting consumer: queue");
        out.line(format_args!("R"));
        loop {
            let mut tx = store.begin();
            let item = match q.blocking_dequeue(&mut tx) {
                Ok(item) => item,
                Err(e) => {
                    out.line(format_args!("X dequeue {}", one_line(&e)));
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
            };
            match tx.blocking_commit() {
                Ok(()) => out.line(format_args!("A {item} {}", unix_us())),
                Err(Error::CommitOutcomeUnknown { .. }) => out.line(format_args!("D {item}")),
                Err(e) => out.line(format_args!("N {item} {}", one_line(&e))),
            }
            if item == STOP_ITEM {
                return;
            }
        }
    }

    /// A worker process and the end of its standard input that stops it.
    struct Worker {
        role: String,
        child: Child,
        stdin: Option<ChildStdin>,
    }

    /// One line of a worker, as it arrived.
    struct Report {
        worker: usize,
        /// `None`: the worker's output has ended.
        line: Option<String>,
    }

    /// What the workers reported so far.
    #[derive(Default)]
    struct Log {
        ready: usize,
        /// Acknowledged enqueues.
        enqueued: BTreeSet<u64>,
        /// Enqueues whose commit's outcome was unknown, retried (each also in `enqueued` once
        /// a retry succeeded).
        unknown: BTreeSet<u64>,
        /// Enqueues refused with an error that says nothing was applied.
        refused: BTreeMap<u64, String>,
        /// Acknowledged consumptions: id, how many times.
        acked: HashMap<u64, u32>,
        /// Consumptions whose commit's outcome was unknown.
        in_doubt: BTreeSet<u64>,
        /// Acks refused with an error that says nothing was applied.
        not_acked: usize,
        /// Other errors (a lease, a dequeue, or a retried commit that failed).
        errors: usize,
        /// Acknowledged operations (enqueues and consumptions).
        commits: usize,
        /// The earliest commit seen at or after `since` (µs since the epoch, by the workers'
        /// clock, which is the parent's: one machine), of any kind and per kind (`E`, `A`).
        first_after: Option<u128>,
        first_kinds: BTreeMap<char, u128>,
        since: u128,
        /// The last error line of each kind, for the summary.
        last_errors: BTreeMap<char, String>,
    }

    impl Log {
        fn take(&mut self, worker: usize, line: &str) {
            let mut words = line.splitn(3, ' ');
            let kind = words.next().unwrap_or_default();
            let letter = kind.chars().next().unwrap_or('?');
            let item: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            let rest = words.next().unwrap_or_default();
            let mut committed_at = |at: &str| {
                let at: u128 = at.parse().unwrap_or(0);
                self.commits += 1;
                if at >= self.since && self.first_after.is_none_or(|first| at < first) {
                    self.first_after = Some(at);
                }
                if at >= self.since {
                    self.first_kinds.entry(letter).or_insert(at);
                }
            };
            match kind {
                "R" => self.ready += 1,
                "E" => {
                    committed_at(rest);
                    assert!(
                        self.enqueued.insert(item),
                        "worker {worker}: item {item} enqueued twice by its producer"
                    );
                }
                "A" => {
                    committed_at(rest);
                    *self.acked.entry(item).or_default() += 1;
                }
                "U" => {
                    self.unknown.insert(item);
                }
                "D" => {
                    self.in_doubt.insert(item);
                }
                "F" => {
                    self.refused.insert(item, rest.to_owned());
                }
                "N" | "X" => {
                    if kind == "N" {
                        self.not_acked += 1;
                    } else {
                        self.errors += 1;
                    }
                    self.last_errors.insert(letter, line.to_owned());
                }
                _ => panic!("worker {worker}: unexpected line {line:?}"),
            }
        }
    }

    /// The parent's side of the workers: their processes, and their reports as they come.
    struct Crew {
        workers: Vec<Worker>,
        /// Whose output has ended (read to its end).
        ended: Vec<bool>,
        reports: mpsc::Receiver<Report>,
        log: Log,
    }

    impl Crew {
        fn start(url: &str) -> Crew {
            let (send, reports) = mpsc::channel();
            let roles = (1..=PRODUCERS)
                .map(|n| format!("producer {n}"))
                .chain((1..=CONSUMERS).map(|n| format!("consumer {n}")))
                .chain(std::iter::once("waiter 1".to_owned()));
            let workers: Vec<Worker> = roles
                .enumerate()
                .map(|(index, role)| {
                    let mut child = Command::new(std::env::current_exe().expect("this binary"))
                        .env(WORKER_VAR, url)
                        .env(ROLE_VAR, &role)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .expect("start a worker");
                    let stdout = child.stdout.take().expect("the worker's stdout");
                    let send = send.clone();
                    std::thread::spawn(move || {
                        for line in BufReader::new(stdout).lines() {
                            let Ok(line) = line else { break };
                            let report = Report {
                                worker: index,
                                line: Some(line),
                            };
                            if send.send(report).is_err() {
                                return;
                            }
                        }
                        let _ = send.send(Report {
                            worker: index,
                            line: None,
                        });
                    });
                    let stdin = child.stdin.take();
                    Worker { role, child, stdin }
                })
                .collect();
            Crew {
                ended: vec![false; workers.len()],
                workers,
                reports,
                log: Log::default(),
            }
        }

        fn receive(&mut self, report: Report) {
            match &report.line {
                Some(line) => self.log.take(report.worker, line),
                None => self.ended[report.worker] = true,
            }
        }

        /// Takes in the reports that have come, then waits for more (at most a few ms) until
        /// `done` holds; panics after [`STEP`], naming `what`.
        fn wait(&mut self, what: &str, mut done: impl FnMut(&Log) -> bool) {
            let deadline = Instant::now() + STEP;
            loop {
                while let Ok(report) = self.reports.try_recv() {
                    self.receive(report);
                }
                if done(&self.log) {
                    return;
                }
                self.check_alive(what);
                assert!(
                    Instant::now() < deadline,
                    "timed out after {STEP:?} waiting for {what}"
                );
                // Bounded: a report wakes it at once.
                if let Ok(report) = self.reports.recv_timeout(Duration::from_millis(5)) {
                    self.receive(report);
                }
            }
        }

        /// Panics if a worker has exited while it should run.
        fn check_alive(&mut self, what: &str) {
            for worker in &mut self.workers {
                if worker.stdin.is_some() {
                    if let Ok(Some(status)) = worker.child.try_wait() {
                        panic!(
                            "the {} worker exited ({status}) while waiting for {what}",
                            worker.role
                        );
                    }
                }
            }
        }

        /// Stops the workers whose role starts with `prefix` (closes their standard input)
        /// and waits for them to exit, successfully.
        fn stop(&mut self, prefix: &str) {
            for worker in &mut self.workers {
                if worker.role.starts_with(prefix) {
                    worker.stdin = None;
                }
            }
            self.wait_exited(prefix);
        }

        fn wait_exited(&mut self, prefix: &str) {
            let deadline = Instant::now() + STEP;
            for i in 0..self.workers.len() {
                if !self.workers[i].role.starts_with(prefix) {
                    continue;
                }
                let mut exited = false;
                loop {
                    while let Ok(report) = self.reports.try_recv() {
                        self.receive(report);
                    }
                    let worker = &mut self.workers[i];
                    if let Some(status) = worker.child.try_wait().expect("wait for a worker") {
                        worker.stdin = None;
                        assert!(
                            status.success(),
                            "the {} worker failed: {status}",
                            worker.role
                        );
                        exited = true;
                    }
                    // Exited, and every line it wrote read.
                    if exited && self.ended[i] {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "the {} worker did not stop within {STEP:?}",
                        worker.role
                    );
                    if let Ok(report) = self.reports.recv_timeout(Duration::from_millis(5)) {
                        self.receive(report);
                    }
                }
            }
        }
    }

    impl Drop for Crew {
        fn drop(&mut self) {
            // A failed test: no worker outlives it.
            for worker in &mut self.workers {
                if worker.child.try_wait().ok().flatten().is_none() {
                    let _ = worker.child.kill();
                    let _ = worker.child.wait();
                }
            }
        }
    }

    /// The first column of the first row of `query` on `url`.
    fn sql_i64(url: &str, query: &str) -> i64 {
        block_on(async {
            connect(url)
                .await
                .query_one(query, &[])
                .await
                .unwrap_or_else(|e| panic!("{query}: {e:?}"))
                .get(0)
        })
    }

    /// Retries `op` until it succeeds: the parent's own store may hold connections to the
    /// killed primary, which the first call after a failover finds closed.
    fn settled<T>(what: &str, mut op: impl FnMut() -> Result<T, Error>) -> T {
        let deadline = Instant::now() + STEP;
        loop {
            match op() {
                Ok(value) => return value,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "{what}: still failing after {STEP:?}: {e}"
                ),
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Every item of `q` (in the queue, ready, delayed or leased, and in its dead letters).
    fn everything(q: &ReliableConcurrentQueue<u64>) -> Vec<u64> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = q.blocking_browse(after, 1000).expect("browse");
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            all.extend(page.iter().map(|b| b.item));
        }
        let mut after = None;
        loop {
            let page = q.blocking_dead_letters(after, 1000).expect("dead letters");
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            all.extend(page.iter().map(|d| d.item));
        }
        all
    }

    /// A write on the standby alone (no `target_session_attrs`) is a typed error that says
    /// why: the session is read-only.
    fn a_write_on_the_standby_is_refused(pair: &Pair) {
        // The database and the schema, there once the standby has replayed them.
        pair.wait_for_replay();
        let url = pair.standby_url(DB);
        let refused = match open(&url, JOBS, None) {
            // Opening a schema that exists writes nothing: the store opens, its writes fail.
            Ok(store) => {
                let q = store.blocking_queue::<u64>("jobs").expect("open the queue");
                let mut tx = store.begin();
                q.enqueue(&mut tx, id(PROBE_TAG, 0)).expect("buffer");
                tx.blocking_commit()
                    .expect_err("a commit on a standby must fail")
            }
            Err(e) => e,
        };
        assert!(
            matches!(refused, Error::Postgres { .. }),
            "a write on the standby: want Error::Postgres, got {refused:?}"
        );
        let said = refused.to_string();
        assert!(
            said.contains("read-only"),
            "a write on the standby says why: {said}"
        );
        eprintln!("    a write on the standby: {said}");
    }

    /// Figures of one failover.
    struct Failover {
        promote_to_commit: Duration,
        kill_to_commit: Duration,
        wake_after: Duration,
        no_primary_connect: Duration,
        no_primary_commit: Duration,
    }

    pub(crate) fn five_failovers_under_load_lose_nothing_acknowledged(pair: &mut Pair) {
        let began = Instant::now();
        pair.create_database(DB);
        let url = pair.url(DB, "");
        let store = open(&url, JOBS, None).expect("connect through the multi-host URL");
        let jobs = store.blocking_queue::<u64>("jobs").unwrap();
        let probe = store.blocking_queue::<u64>("probe").unwrap();
        let wake_store = open(&url, WAKE, None).expect("connect the wake schema");
        let wake = wake_store.blocking_queue::<u64>("wake").unwrap();

        a_write_on_the_standby_is_refused(pair);

        let mut tx = store.begin();
        for seq in 0..PREFILL {
            let item = id(PREFILL_TAG, seq);
            jobs.enqueue_unique(&mut tx, item, &item.to_be_bytes(), Duration::ZERO)
                .unwrap();
        }
        tx.blocking_commit().unwrap();
        let mut acknowledged: BTreeSet<u64> = (0..PREFILL).map(|s| id(PREFILL_TAG, s)).collect();

        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut crew = Crew::start(&pair.url(DB, &format!("&application_name={APP}")));
        let workers = crew.workers.len();
        crew.wait("every worker connected", |log| log.ready == workers);

        let mut figures = Vec::new();
        let mut held_queues = Vec::new();
        for n in 1..=FAILOVERS {
            // Under load: a random number of operations since the standby caught up, and a
            // backlog (see `PREFILL`).
            let until = crew.log.commits + rng.gen_range(LOAD);
            crew.wait("the workers' operations", |log| log.commits >= until);
            crew.wait("a backlog", |_| {
                jobs.blocking_count().is_ok_and(|n| n >= MIN_BACKLOG)
            });
            // The waiting consumer waits (its listener watches its queue on the primary).
            let primary = pair.primary_url(DB);
            crew.wait("the waiting consumer to wait", |_| {
                watched_queues(&primary, WAKE) > 0
            });

            // Two leases on a queue of this failover's own: one to outlive the failover,
            // one to expire across it.
            let held = store.blocking_queue::<u64>(&format!("held{n}")).unwrap();
            let (long_id, short_id) = (id(HELD_TAG, 2 * n as u64), id(HELD_TAG, 2 * n as u64 + 1));
            let mut tx = store.begin();
            held.enqueue_unique(&mut tx, long_id, &long_id.to_be_bytes(), Duration::ZERO)
                .unwrap();
            tx.blocking_commit().unwrap();
            let long = held
                .blocking_try_lease(Duration::from_secs(120))
                .unwrap()
                .expect("the held item");
            let mut tx = store.begin();
            held.enqueue_unique(&mut tx, short_id, &short_id.to_be_bytes(), Duration::ZERO)
                .unwrap();
            tx.blocking_commit().unwrap();
            let short = held
                .blocking_try_lease(Duration::from_millis(50))
                .unwrap()
                .expect("the held item");
            assert_eq!((*long.item(), *short.item()), (long_id, short_id));
            let short_deadline_ms = short
                .deadline()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());

            let (was_primary, was_standby) = pair.roles();
            let backlog = jobs.blocking_count().expect("count the backlog");
            let killed_at = (Instant::now(), unix_us());
            let killed = pair.kill_primary();

            // No host accepts writes: a new store and a commit each fail, typed, in bounds.
            let t = Instant::now();
            match open(&url, JOBS, None) {
                Err(Error::Postgres { .. }) => {}
                other => panic!("connect with no primary: want Error::Postgres, got {other:?}"),
            }
            let no_primary_connect = t.elapsed();
            let t = Instant::now();
            let mut tx = store.begin();
            probe.enqueue(&mut tx, id(PROBE_TAG, n as u64)).unwrap();
            match tx.blocking_commit() {
                Err(Error::Postgres { .. } | Error::CommitOutcomeUnknown { .. }) => {}
                other => panic!("commit with no primary: want a typed error, got {other:?}"),
            }
            let no_primary_commit = t.elapsed();
            assert!(
                no_primary_connect < NO_PRIMARY_BOUND && no_primary_commit < NO_PRIMARY_BOUND,
                "with no primary, a connect took {no_primary_connect:?} and a commit \
                 {no_primary_commit:?} to fail (bound {NO_PRIMARY_BOUND:?})"
            );

            let promoted_at = (Instant::now(), unix_us());
            crew.log.since = promoted_at.1;
            crew.log.first_after = None;
            crew.log.first_kinds.clear();
            pair.promote();
            let promote_took = promoted_at.0.elapsed();
            crew.wait("a worker's commit on the new primary", |log| {
                log.first_after.is_some()
            });
            let first = crew.log.first_after.unwrap_or(promoted_at.1);
            crew.wait("an enqueue and a consumption on the new primary", |log| {
                log.first_kinds.len() == 2
            });
            let first_of = |kind: char| {
                crew.log
                    .first_kinds
                    .get(&kind)
                    .map_or(0, |t| t.saturating_sub(promoted_at.1) / 1000)
            };
            let (first_enqueue, first_consumption) = (first_of('E'), first_of('A'));
            let promote_to_commit = Duration::from_micros(
                u64::try_from(first.saturating_sub(promoted_at.1)).unwrap_or(u64::MAX),
            );
            let kill_to_commit = Duration::from_micros(
                u64::try_from(first.saturating_sub(killed_at.1)).unwrap_or(u64::MAX),
            );

            // Leases by the database's clock: the live one is acknowledged, the expired one
            // refused, and its item is back.
            settled("the parent's store on the new primary", || {
                held.blocking_count()
            });
            let mut tx = store.begin();
            long.ack(&mut tx).unwrap();
            tx.blocking_commit()
                .expect("a lease taken before the failover, acked after it within its ttl");
            let primary = pair.primary_url(DB);
            let deadline = Instant::now() + STEP;
            while u128::try_from(sql_i64(
                &primary,
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
            ))
            .unwrap_or(0)
                <= short_deadline_ms
            {
                assert!(Instant::now() < deadline, "the database's clock moves on");
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut tx = store.begin();
            short.ack(&mut tx).unwrap();
            match tx.blocking_commit() {
                Err(Error::LeaseExpired { .. }) => {}
                other => panic!(
                    "an ack past its lease's deadline across a failover: want \
                     Error::LeaseExpired, got {other:?}"
                ),
            }
            held_queues.push((held, long_id, short_id));

            // The waiting consumer, waiting since before the kill, listens on the new
            // primary and takes an item committed there.
            crew.wait("the waiting consumer to listen on the new primary", |_| {
                watched_queues(&primary, WAKE) > 0
            });
            let wake_id = id(WAKE_TAG, n as u64);
            settled("an enqueue to the waiting consumer", || {
                let mut tx = wake_store.begin();
                wake.enqueue_unique(&mut tx, wake_id, &wake_id.to_be_bytes(), Duration::ZERO)?;
                tx.blocking_commit()
            });
            let woken = Instant::now();
            crew.wait("the waiting consumer to take the item", |log| {
                log.acked.contains_key(&wake_id)
            });
            let wake_after = woken.elapsed();
            acknowledged.insert(wake_id);

            pair.rebuild_standby();
            eprintln!(
                "    failover {n}: promote->first commit {} ms (first enqueue {first_enqueue} \
                 ms, first consumption {first_consumption} ms; kill->first commit {} ms); \
                 {was_primary} killed ({killed} processes, backlog {backlog}), {was_standby} \
                 promoted (pg_ctl promote {} ms); with no primary a connect failed in {} ms, \
                 a commit in {} ms; waiting consumer woken {} ms after a commit",
                promote_to_commit.as_millis(),
                kill_to_commit.as_millis(),
                promote_took.as_millis(),
                no_primary_connect.as_millis(),
                no_primary_commit.as_millis(),
                wake_after.as_millis()
            );
            figures.push(Failover {
                promote_to_commit,
                kill_to_commit,
                wake_after,
                no_primary_connect,
                no_primary_commit,
            });
        }
        // Load on the last primary too, then stop: producers first (each finishes the item
        // in hand, retries included), then consumers, then the waiting consumer.
        let until = crew.log.commits + LOAD.start;
        crew.wait("the workers' operations", |log| log.commits >= until);
        crew.stop("producer");
        crew.stop("consumer");
        settled("the stop item", || {
            let mut tx = wake_store.begin();
            wake.enqueue(&mut tx, STOP_ITEM)?;
            tx.blocking_commit()
        });
        crew.wait_exited("waiter");
        // A process's session may outlive it by a moment (the server sees the socket close):
        // until then what it held is not visible.
        let primary = pair.primary_url(DB);
        let deadline = Instant::now() + STEP;
        while sql_i64(
            &primary,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{APP}'"),
        ) > 0
        {
            assert!(
                Instant::now() < deadline,
                "worker sessions outlive their processes"
            );
            std::thread::sleep(Duration::from_millis(5));
        }

        // Everything, from the final primary.
        let log = std::mem::take(&mut crew.log);
        let mut present: HashMap<u64, u32> = HashMap::new();
        for item in everything(&jobs).into_iter().chain(everything(&wake)) {
            *present.entry(item).or_default() += 1;
        }
        acknowledged.extend(&log.enqueued);
        let mut acked = log.acked.clone();
        assert_eq!(
            acked.remove(&STOP_ITEM),
            Some(1),
            "the stop item, taken once"
        );
        let lost: Vec<u64> = acknowledged
            .iter()
            .copied()
            .filter(|i| !acked.contains_key(i) && !present.contains_key(i))
            .filter(|i| !log.in_doubt.contains(i))
            .collect();
        let back: Vec<u64> = acked
            .iter()
            .filter(|&(i, &n)| n > 1 || present.contains_key(i))
            .map(|(i, _)| *i)
            .collect();
        let duplicated: Vec<u64> = present
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(i, _)| *i)
            .collect();
        let refused_but_applied: Vec<u64> = log
            .refused
            .keys()
            .copied()
            .filter(|i| {
                acked.contains_key(i) || present.contains_key(i) || log.in_doubt.contains(i)
            })
            .collect();
        let unexpected: Vec<u64> = acked
            .keys()
            .chain(present.keys())
            .chain(&log.in_doubt)
            .copied()
            .filter(|i| !acknowledged.contains(i) && !log.refused.contains_key(i))
            .collect();
        let unsettled: Vec<u64> = log
            .unknown
            .iter()
            .copied()
            .filter(|i| !log.enqueued.contains(i))
            .collect();
        // In-doubt consumptions: applied (the item is gone) or not (it came back).
        let doubt_applied = log
            .in_doubt
            .iter()
            .filter(|i| !acked.contains_key(i) && !present.contains_key(i))
            .count();

        // The parent's own queues: the live leases acknowledged, the expired ones' items
        // back; nothing of the commits tried with no primary.
        for (held, long_id, short_id) in &held_queues {
            assert_eq!(
                everything(held),
                [*short_id],
                "{}: the expired lease's item is back, the acknowledged one ({long_id}) gone",
                held.name()
            );
        }
        assert_eq!(
            everything(&probe),
            Vec::<u64>::new(),
            "a commit with no primary applied"
        );

        let ops = acknowledged.len() + acked.values().map(|&n| n as usize).sum::<usize>();
        let ms = |f: fn(&Failover) -> Duration| {
            figures
                .iter()
                .map(|x| f(x).as_millis().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        eprintln!(
            "    failovers {FAILOVERS}, acknowledged operations checked {ops} ({} enqueues, {} \
             consumptions), lost {}, back {}, duplicated {}; promote->first commit ms: [{}]; \
             {:.1} s",
            acknowledged.len(),
            acked.values().sum::<u32>(),
            lost.len(),
            back.len(),
            duplicated.len(),
            ms(|f| f.promote_to_commit),
            began.elapsed().as_secs_f64()
        );
        eprintln!(
            "    kill->first commit ms: [{}]; waiting consumer woken after ms: [{}]; with no \
             primary, connect/commit failed after ms: [{}] / [{}]; enqueues retried after an \
             unknown outcome {} (left in doubt {}), refused as not applied {} (applied {}); \
             consumptions with an unknown outcome {} ({} applied), acks refused {}, other \
             errors {}; the test's leases acked across a failover {FAILOVERS}, refused past \
             their deadline {FAILOVERS}; {} items left; seed {seed}",
            ms(|f| f.kill_to_commit),
            ms(|f| f.wake_after),
            ms(|f| f.no_primary_connect),
            ms(|f| f.no_primary_commit),
            log.unknown.len(),
            unsettled.len(),
            log.refused.len(),
            refused_but_applied.len(),
            log.in_doubt.len(),
            doubt_applied,
            log.not_acked,
            log.errors,
            present.values().sum::<u32>(),
        );
        for (kind, line) in &log.last_errors {
            eprintln!("    last {kind} line: {line}");
        }
        let few = |v: &[u64]| v.iter().take(10).copied().collect::<Vec<_>>();
        assert!(lost.is_empty(), "acknowledged and lost: {:?}", few(&lost));
        assert!(back.is_empty(), "consumed and back: {:?}", few(&back));
        assert!(duplicated.is_empty(), "duplicated: {:?}", few(&duplicated));
        assert!(
            refused_but_applied.is_empty(),
            "enqueues refused as not applied that applied: {:?} ({:?})",
            few(&refused_but_applied),
            log.refused.values().next()
        );
        assert!(
            unexpected.is_empty(),
            "items nobody enqueued: {:?}",
            few(&unexpected)
        );
        assert!(
            unsettled.is_empty(),
            "enqueues left in doubt: {:?}",
            few(&unsettled)
        );
        drop(crew);
    }
}

/// This module's worker process: started by its test with the variable set to the pair's
/// multi-host URL (see `tests/suite/main.rs`), not as a test run.
#[cfg(feature = "postgres")]
pub(crate) const WORKER: (&str, fn(&str)) = (cases::WORKER_VAR, cases::worker);

/// The cases of this module of the suite (`tests/suite/main.rs`).
#[cfg(feature = "postgres")]
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    vec![crate::common::engines::Case::postgres_pair(
        "five_failovers_under_load_lose_nothing_acknowledged",
        cases::five_failovers_under_load_lose_nothing_acknowledged,
    )]
}
