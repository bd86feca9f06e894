//! The metrics after a known workload, read back from a recorder installed for this test
//! binary (global: sled commits on its own thread). The cases run one after the other and
//! compare the recorder's values before and after, so they do not see each other.

use std::time::{Duration, UNIX_EPOCH};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use reliable_queue::{metrics as m, ManualClock, RetryPolicy, Store};

/// Every metric's value, by kind, name and labels (`k=v` sorted, comma-joined).
#[derive(Debug, Default)]
struct Values(Vec<(MetricKind, String, String, DebugValue)>);

impl Values {
    fn read(snapshotter: &Snapshotter) -> Values {
        Values(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let (kind, key) = key.into_parts();
                    let mut labels: Vec<String> = key
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    labels.sort();
                    (kind, key.name().to_owned(), labels.join(","), value)
                })
                .collect(),
        )
    }

    fn counter(&self, name: &str, labels: &str) -> u64 {
        self.0
            .iter()
            .find_map(|(_, n, l, v)| match v {
                DebugValue::Counter(c) if n == name && l == labels => Some(*c),
                _ => None,
            })
            .unwrap_or(0)
    }

    fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        self.0.iter().find_map(|(_, n, l, v)| match v {
            DebugValue::Gauge(g) if n == name && l == labels => Some(g.into_inner()),
            _ => None,
        })
    }

    fn samples(&self, name: &str) -> usize {
        self.0
            .iter()
            .map(|(_, n, _, v)| match v {
                DebugValue::Histogram(h) if n == name => h.len(),
                _ => 0,
            })
            .sum()
    }
}

fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("install the test recorder");
        snapshotter
    })
}

/// The known workload on `store` (whose clock is `clock`), queue `name`:
/// - 4 transactions: 5 enqueues, 3 enqueues, 7 dequeues, 1 enqueue (in that order);
/// - a lease failed below the maximum attempts (a retry), then failed at it (a dead letter);
/// - a lease that runs out (an expiry).
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
    let item = *lease.item();
    assert!(matches!(
        lease.blocking_fail("once").unwrap(),
        reliable_queue::Failed::Retry { .. }
    ));
    let again = q.blocking_lease(Duration::from_secs(60)).unwrap();
    assert_eq!(*again.item(), item);
    assert_eq!(
        again.blocking_fail("twice").unwrap(),
        reliable_queue::Failed::Dead
    );

    let mut tx = store.begin();
    q.enqueue(&mut tx, 100).unwrap();
    tx.blocking_commit().unwrap();
    let short = q.blocking_lease(Duration::from_secs(1)).unwrap();
    std::mem::forget(short);
    let visible = q.blocking_count().unwrap();
    clock.advance(Duration::from_secs(2));
    // The store's timer ends the lease; wait (bounded) for the item to be visible again.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while q.blocking_count().unwrap() != visible + 1 {
        assert!(
            std::time::Instant::now() < give_up,
            "the lease never expired"
        );
        std::thread::yield_now();
    }
    store.blocking_report_metrics().unwrap();
}

fn check(engine: &str, before: &Values, after: &Values, name: &str) {
    let delta =
        |metric: &str, labels: &str| after.counter(metric, labels) - before.counter(metric, labels);
    assert_eq!(delta(m::COMMITS, "outcome=ok"), 4, "{engine}");
    assert_eq!(delta(m::ENQUEUED, ""), 9, "{engine}");
    assert_eq!(delta(m::DEQUEUED, ""), 7, "{engine}");
    let queue = format!("queue={name}");
    assert_eq!(delta(m::RETRIES, &queue), 1, "{engine}");
    assert_eq!(
        delta(m::DEAD_LETTER_MOVES, &format!("cause=failed,{queue}")),
        1,
        "{engine}"
    );
    assert_eq!(delta(m::LEASE_EXPIRIES, &queue), 1, "{engine}");
    // 9 - 7 - 1 dead = 1 item, visible again after the expiry; 1 dead letter.
    assert_eq!(
        after.gauge(m::DEPTH, &format!("{queue},state=visible")),
        Some(1.0),
        "{engine}"
    );
    assert_eq!(
        after.gauge(m::DEPTH, &format!("{queue},state=dead")),
        Some(1.0),
        "{engine}"
    );
    assert_eq!(
        after.gauge(m::DEPTH, &format!("{queue},state=leased")),
        Some(0.0),
        "{engine}"
    );
}

fn clock() -> ManualClock {
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000)).unwrap()
}

#[test]
fn the_metrics_count_a_known_workload_on_every_embedded_engine() {
    let snapshotter = recorder();
    // Memory: counted, not timed.
    let clock_m = clock();
    let memory = Store::builder().clock(clock_m.clone()).open().unwrap();
    let before = Values::read(snapshotter);
    let commits_timed = before.samples(m::COMMIT_SECONDS);
    workload(&memory, &clock_m, "mem");
    let after = Values::read(snapshotter);
    check("memory", &before, &after, "mem");
    assert_eq!(
        after.samples(m::COMMIT_SECONDS),
        commits_timed,
        "memory commits are not timed"
    );

    // sled: counted and timed; every group written and synced is measured.
    let dir = tempfile::tempdir().unwrap();
    let clock_s = clock();
    let sled = Store::builder()
        .clock(clock_s.clone())
        .path(dir.path().join("s"))
        .open()
        .unwrap();
    let before = Values::read(snapshotter);
    workload(&sled, &clock_s, "disk");
    let after = Values::read(snapshotter);
    check("sled", &before, &after, "disk");
    assert_eq!(
        after.samples(m::COMMIT_SECONDS) - before.samples(m::COMMIT_SECONDS),
        4
    );
    let groups = after.samples(m::GROUP_SIZE) - before.samples(m::GROUP_SIZE);
    assert!(
        groups >= 4,
        "at least the four transactions' groups: {groups}"
    );
    assert_eq!(
        after.samples(m::FSYNC_SECONDS) - before.samples(m::FSYNC_SECONDS),
        groups
    );
    assert_eq!(after.gauge(m::QUARANTINED, ""), Some(0.0));
    sled.blocking_close().unwrap();
}
