//! The metrics after a known workload, read back from a recorder installed for this test
//! binary, and the tracing a healthy store emits, read back from a subscriber of its own.
//! Both are global (sled commits on its own thread, the store's timers on theirs), so the
//! cases take a lock and run one after the other; each starts by draining the recorder (a
//! `metrics-util` 0.20 snapshot reads counters and gauges and resets them, and empties the
//! histograms), so what it reads afterwards is its own.

#[cfg(feature = "postgres")]
mod pg;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use reliable_queue::{metrics as m, Error, Failed, ManualClock, RetryPolicy, Store};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

// ---- the recorder ----

/// Every metric's value, by name and labels (`k=v` sorted, comma-joined).
#[derive(Debug, Default)]
struct Values(BTreeMap<(String, String), DebugValue>);

impl Values {
    /// What was recorded since the last read.
    fn read() -> Values {
        Values(
            recorder()
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let (_, key) = key.into_parts();
                    let mut labels: Vec<String> = key
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    labels.sort();
                    ((key.name().to_owned(), labels.join(",")), value)
                })
                .collect(),
        )
    }

    fn counter(&self, name: &str, labels: &str) -> u64 {
        match self.0.get(&(name.to_owned(), labels.to_owned())) {
            Some(DebugValue::Counter(c)) => *c,
            _ => 0,
        }
    }

    fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        match self.0.get(&(name.to_owned(), labels.to_owned())) {
            Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
            _ => None,
        }
    }

    /// The samples of a histogram (of any labels).
    fn samples(&self, name: &str) -> Vec<f64> {
        self.0
            .iter()
            .filter(|((n, _), _)| n == name)
            .flat_map(|(_, v)| match v {
                DebugValue::Histogram(h) => h.iter().map(|x| x.into_inner()).collect(),
                _ => Vec::new(),
            })
            .collect()
    }
}

fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("install the test recorder");
        snapshotter
    })
}

// ---- the subscriber ----

/// What the store traced: every event's level, target and message, and every span's name.
#[derive(Debug, Default)]
struct Traced {
    events: Vec<(Level, String)>,
    spans: Vec<&'static str>,
}

impl Traced {
    fn at_least(&self, level: Level) -> Vec<&(Level, String)> {
        // `Level`'s order: TRACE > DEBUG > INFO > WARN > ERROR (more verbose is greater).
        self.events.iter().filter(|(l, _)| *l <= level).collect()
    }

    fn messages(&self, level: Level, message: &str) -> usize {
        self.events
            .iter()
            .filter(|(l, m)| *l == level && m == message)
            .count()
    }

    fn spans(&self, name: &str) -> usize {
        self.spans.iter().filter(|s| **s == name).count()
    }
}

#[derive(Debug, Default)]
struct Catcher {
    traced: Mutex<Traced>,
    next_id: AtomicU64,
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Catcher {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("reliable_queue")
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.traced
            .lock()
            .unwrap()
            .spans
            .push(span.metadata().name());
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.traced
            .lock()
            .unwrap()
            .events
            .push((*event.metadata().level(), message.0));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

fn catcher() -> &'static Catcher {
    static CATCHER: OnceLock<&'static Catcher> = OnceLock::new();
    CATCHER.get_or_init(|| {
        let catcher: &'static Catcher = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Forward(catcher))
            .expect("install the test subscriber");
        catcher
    })
}

/// The global subscriber: forwards to the leaked [`Catcher`] the test reads.
struct Forward(&'static Catcher);

impl Subscriber for Forward {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.0.new_span(span)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        self.0.record(span, values)
    }
    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.0.record_follows_from(span, follows)
    }
    fn event(&self, event: &Event<'_>) {
        self.0.event(event)
    }
    fn enter(&self, span: &Id) {
        self.0.enter(span)
    }
    fn exit(&self, span: &Id) {
        self.0.exit(span)
    }
}

/// Takes what was traced since the last call.
fn traced() -> Traced {
    std::mem::take(&mut *catcher().traced.lock().unwrap())
}

/// One case at a time; the recorder and the subscriber drained for it.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    Values::read();
    traced();
    guard
}

// ---- the workload ----

fn clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000)).unwrap()
}

/// Waits (bounded) for `done`: the store's timers act when the clock moves.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < give_up, "{what} never happened");
        std::thread::yield_now();
    }
}

/// The known workload on `store` (whose clock is `clock`), queue `name`, at most 2 attempts:
/// - transactions of 5 enqueues, 3 enqueues, 7 dequeues: the 8th item is left;
/// - it is leased and failed (a retry), leased and failed again (a dead letter: `failed`);
/// - a transaction enqueues item 100; its lease runs out (an expiry); it is leased again
///   and completed (a commit with one dequeue);
/// - a transaction enqueues item 200; its lease is acknowledged in a transaction that
///   commits after the lease ran out (an expiry, a failed commit); its next lease runs out
///   at the maximum attempts (an expiry, a dead letter: `expired`);
/// - the depth gauges are reported.
///
/// Totals: 6 commits `ok`, 1 `error`; 10 enqueued, 8 dequeued; 1 retry; 3 expiries; dead
/// letters 1 `failed` + 1 `expired`; the queue ends empty with 2 dead letters.
fn workload(store: &Store, clock: &ManualClock, name: &str) {
    let q = store.blocking_queue::<u64>(name).unwrap();
    q.blocking_set_retry_policy(
        RetryPolicy::default()
            .max_attempts(2)
            .initial_backoff(Duration::ZERO)
            .jitter(0.0),
    )
    .unwrap();
    for items in [0..5u64, 5..8] {
        let mut tx = store.begin();
        for i in items {
            q.enqueue(&mut tx, i).unwrap();
        }
        tx.blocking_commit().unwrap();
    }
    let mut tx = store.begin();
    assert_eq!(q.blocking_try_dequeue_many(&mut tx, 7).unwrap().len(), 7);
    tx.blocking_commit().unwrap();

    let lease = q.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(*lease.item(), 7);
    assert!(matches!(
        lease.blocking_fail("once").unwrap(),
        Failed::Retry { .. }
    ));
    let again = q.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(*again.item(), 7);
    assert_eq!(again.blocking_fail("twice").unwrap(), Failed::Dead);

    let mut tx = store.begin();
    q.enqueue(&mut tx, 100).unwrap();
    tx.blocking_commit().unwrap();
    let short = q.blocking_lease(Duration::from_secs(1)).unwrap();
    clock.advance(Duration::from_secs(2));
    eventually("the first lease of 100 ending", || {
        q.blocking_count().unwrap() == 1
    });
    drop(short);
    let lease = q.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(*lease.item(), 100);
    lease.blocking_complete().unwrap();

    let mut tx = store.begin();
    q.enqueue(&mut tx, 200).unwrap();
    tx.blocking_commit().unwrap();
    let lease = q.blocking_lease(Duration::from_secs(1)).unwrap();
    let mut tx = store.begin();
    lease.ack(&mut tx).unwrap();
    clock.advance(Duration::from_secs(2));
    eventually("the first lease of 200 ending", || {
        q.blocking_count().unwrap() == 1
    });
    assert!(matches!(
        tx.blocking_commit(),
        Err(Error::LeaseExpired { .. })
    ));
    let last = q.blocking_lease(Duration::from_secs(1)).unwrap();
    assert_eq!(*last.item(), 200);
    clock.advance(Duration::from_secs(2));
    // A lease finds nothing to take; on PostgreSQL its statement is what moves the item.
    eventually("the last lease of 200 ending in the dead letters", || {
        q.blocking_try_lease(Duration::from_secs(60))
            .unwrap()
            .is_none()
            && q.blocking_stats().unwrap().dead == 2
    });
    drop(last);
    store.blocking_report_metrics().unwrap();
}

/// The counters and gauges of the workload, the same on every engine but for the lease
/// expiries, which PostgreSQL does not see (`expiries`: 3 or 0).
fn check(engine: &str, values: &Values, name: &str, expiries: u64) {
    assert_eq!(values.counter(m::COMMITS, "outcome=ok"), 6, "{engine}");
    assert_eq!(values.counter(m::COMMITS, "outcome=error"), 1, "{engine}");
    assert_eq!(values.counter(m::ENQUEUED, ""), 10, "{engine}");
    assert_eq!(values.counter(m::DEQUEUED, ""), 8, "{engine}");
    let queue = format!("queue={name}");
    assert_eq!(values.counter(m::RETRIES, &queue), 1, "{engine}");
    assert_eq!(
        values.counter(m::LEASE_EXPIRIES, &queue),
        expiries,
        "{engine}"
    );
    for cause in ["failed", "expired"] {
        assert_eq!(
            values.counter(m::DEAD_LETTER_MOVES, &format!("cause={cause},{queue}")),
            1,
            "{engine}: {cause}"
        );
    }
    for (state, n) in [
        ("visible", 0.0),
        ("delayed", 0.0),
        ("leased", 0.0),
        ("held", 0.0),
        ("dead", 2.0),
    ] {
        assert_eq!(
            values.gauge(m::DEPTH, &format!("{queue},state={state}")),
            Some(n),
            "{engine}: {state}"
        );
    }
    assert_eq!(
        values.gauge(m::FRONT_AGE_SECONDS, &queue),
        Some(0.0),
        "{engine}"
    );
}

/// What a healthy workload traced: nothing at INFO or above but the open's line; the spans
/// and DEBUG events of the three expiries and two dead-letter moves.
fn check_traced(engine: &str, traced: &Traced, opens: usize) {
    let loud = traced.at_least(Level::INFO);
    assert_eq!(loud.len(), opens, "{engine}: {loud:?}");
    assert_eq!(
        traced.messages(Level::INFO, "store opened"),
        opens,
        "{engine}"
    );
    assert_eq!(traced.spans("lease_expiry"), 3, "{engine}");
    assert_eq!(
        traced.messages(Level::DEBUG, "a lease expired"),
        3,
        "{engine}"
    );
    assert_eq!(
        traced.messages(Level::DEBUG, "a failed item moved to the dead letters"),
        1,
        "{engine}"
    );
    assert_eq!(
        traced.messages(
            Level::DEBUG,
            "an item whose last lease expired moved to the dead letters"
        ),
        1,
        "{engine}"
    );
}

#[test]
fn the_metrics_count_a_known_workload_in_memory() {
    let _serial = serial();
    let clock = clock();
    let store = Store::builder().clock(clock.clone()).open().unwrap();
    workload(&store, &clock, "mem");
    let values = Values::read();
    check("memory", &values, "mem", 3);
    assert!(
        values.samples(m::COMMIT_SECONDS).is_empty(),
        "memory commits are not timed"
    );
    for sled_only in [m::GROUP_SIZE, m::GROUP_BYTES, m::FSYNC_SECONDS] {
        assert!(values.samples(sled_only).is_empty(), "{sled_only}");
    }
    check_traced("memory", &traced(), 0);
}

#[test]
fn the_metrics_count_a_known_workload_on_disk() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let store = Store::builder()
        .clock(clock.clone())
        .path(dir.path().join("s"))
        .open()
        .unwrap();
    let opened = Values::read();
    assert_eq!(opened.gauge(m::QUARANTINED, ""), Some(0.0));
    workload(&store, &clock, "disk");
    let values = Values::read();
    check("sled", &values, "disk", 3);
    // Every transaction's commit is timed, the failed one too.
    let commits = values.samples(m::COMMIT_SECONDS);
    assert_eq!(commits.len(), 7);
    assert!(
        commits.iter().all(|s| (0.0..60.0).contains(s)),
        "{commits:?}"
    );
    // Each group is measured once (leases and settlements are written in groups too).
    let groups = values.samples(m::GROUP_SIZE);
    assert!(
        groups.len() >= 6,
        "at least the six transactions' groups: {groups:?}"
    );
    assert!(groups.iter().all(|&n| n >= 1.0), "{groups:?}");
    let bytes = values.samples(m::GROUP_BYTES);
    assert_eq!(bytes.len(), groups.len());
    assert!(bytes.iter().all(|&b| b > 0.0), "{bytes:?}");
    // One flush and fsync per group, and one for each catalog change the committer makes
    // durable on its own (the queue's creation, its retry policy).
    let fsyncs = values.samples(m::FSYNC_SECONDS).len();
    assert!(
        (groups.len()..=groups.len() + 2).contains(&fsyncs),
        "{fsyncs} fsyncs for {} groups",
        groups.len()
    );
    store.blocking_close().unwrap();
    // The close flushes once more.
    assert!(!Values::read().samples(m::FSYNC_SECONDS).is_empty());

    let traced = traced();
    check_traced("sled", &traced, 1);
    assert_eq!(traced.spans("open"), 1);
    assert_eq!(traced.spans("recovery"), 1);
    assert!(traced.spans("commit_group") >= 6);
}

/// A store whose log has a damaged record: the open sets it aside, says so at WARN, and
/// the gauge counts it.
#[test]
fn a_damaged_record_is_counted_as_quarantined() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let store = Store::open(&path).unwrap();
        let q = store.blocking_queue::<String>("q").unwrap();
        for item in ["kept", "to-be-damaged"] {
            let mut tx = store.begin();
            q.enqueue(&mut tx, item.to_owned()).unwrap();
            tx.blocking_commit().unwrap();
        }
        store.blocking_close().unwrap();
    }
    damage_record_holding(&path, b"to-be-damaged");
    traced();
    Values::read();

    let store = Store::open(&path).unwrap();
    assert_eq!(store.set_aside_records().len(), 1);
    assert_eq!(Values::read().gauge(m::QUARANTINED, ""), Some(1.0));
    let traced = traced();
    // Recovery's ERROR for the record itself, and the open's summary at WARN.
    let summary = "records are damaged or missing; their queues are fenced \
                   (see Store::set_aside_records)";
    assert_eq!(
        traced.messages(Level::WARN, summary),
        1,
        "{:?}",
        traced.events
    );
    assert_eq!(traced.messages(Level::INFO, "store opened"), 1);
    store.blocking_close().unwrap();
}

/// Flips a byte in the body of the one log record whose bytes hold `marker` (the format is
/// at the top of `src/engine/sled/record.rs`: a 24-byte fixed header whose bytes 8..12 are
/// the header's length, then the header, then the body).
fn damage_record_holding(path: &Path, marker: &[u8]) {
    let db = sled::open(path).unwrap();
    let log = db.open_tree("log").unwrap();
    let (key, mut bytes) = log
        .iter()
        .map(Result::unwrap)
        .find(|(_, v)| v.windows(marker.len()).any(|w| w == marker))
        .map(|(k, v)| (k, v.to_vec()))
        .expect("a record holds the marker");
    let header_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let at = 24 + header_len + 2;
    bytes[at] ^= 0x5a;
    log.insert(key, bytes).unwrap();
    db.flush().unwrap();
}

/// The workload on PostgreSQL (the tests' own server, see `tests/pg`): the same counts but
/// the lease expiries (the database's clock ends a lease, seen by no one); the expired item
/// at the maximum attempts is counted when a statement moves it.
#[cfg(feature = "postgres")]
#[test]
fn the_metrics_count_a_known_workload_on_postgres() {
    let _serial = serial();
    let server = match pg::PgServer::start() {
        Ok(server) => server,
        Err(skip) => {
            eprintln!("PostgreSQL skipped: {skip}");
            return;
        }
    };
    let clock = clock();
    let store = Store::builder()
        .clock(clock.clone())
        .postgres(server.url())
        .postgres_schema("metrics")
        .open()
        .unwrap();
    workload(&store, &clock, "pg");
    let values = Values::read();
    check("postgres", &values, "pg", 0);
    assert_eq!(values.samples(m::COMMIT_SECONDS).len(), 7);
    for sled_only in [m::GROUP_SIZE, m::GROUP_BYTES] {
        assert!(values.samples(sled_only).is_empty(), "{sled_only}");
    }
    store.blocking_close().unwrap();
    let traced = traced();
    let loud = traced.at_least(Level::INFO);
    assert!(loud.is_empty(), "{loud:?}");
    assert_eq!(
        traced.messages(Level::DEBUG, "a failed item moved to the dead letters"),
        1
    );
    assert_eq!(
        traced.messages(
            Level::DEBUG,
            "items whose last lease expired moved to the dead letters"
        ),
        1
    );
    assert_eq!(traced.spans("dead_letter_moves"), 1);
}

/// The front item's age is the store clock's time since its enqueue.
#[test]
fn the_front_age_is_the_oldest_visible_items_wait() {
    let _serial = serial();
    let clock = clock();
    let store = Store::builder().clock(clock.clone()).open().unwrap();
    let q = store.blocking_queue::<u64>("waiting").unwrap();
    for i in 0..2 {
        let mut tx = store.begin();
        q.enqueue(&mut tx, i).unwrap();
        tx.blocking_commit().unwrap();
        clock.advance(Duration::from_secs(5));
    }
    store.blocking_report_metrics().unwrap();
    let values = Values::read();
    assert_eq!(
        values.gauge(m::FRONT_AGE_SECONDS, "queue=waiting"),
        Some(10.0)
    );
    assert_eq!(
        values.gauge(m::DEPTH, "queue=waiting,state=visible"),
        Some(2.0)
    );
}
