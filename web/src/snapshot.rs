//! The one task per dashboard that reads the store: every `refresh` it lists the queues, reads
//! each queue's `stats()` and the store's [`Activity`], and publishes the result (and its JSON,
//! made once) to every page, event stream and API call. Viewers never cause a read of the
//! store of their own for the overview: ten viewers cost what one does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use reliable_queue::metrics::Activity;
use reliable_queue::{QueueStats, RawItem, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::rows::millis;

/// One queue's figures in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueueRow {
    /// The queue's name.
    pub queue: String,
    /// Visible items: what the next dequeue or lease may take.
    pub ready: u64,
    /// Items not due yet.
    pub delayed: u64,
    /// Items leased now.
    pub leased: u64,
    /// Items held by open transactions.
    pub held: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long ago the item at the front was enqueued, in ms (`None`: nothing visible).
    pub oldest_ms: Option<u64>,
}

impl QueueRow {
    /// The row of queue `queue` with `stats`, its front's age at `now`.
    pub fn new(queue: String, stats: &QueueStats, now: SystemTime) -> QueueRow {
        QueueRow {
            queue,
            ready: stats.visible,
            delayed: stats.delayed,
            leased: stats.leased,
            held: stats.held,
            dead: stats.dead,
            oldest_ms: stats.front_enqueued_at.map(|t| {
                now.duration_since(t)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }),
        }
    }
}

/// One point of the charts: rates over the second (or so) before `t_ms`, and depths at it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Point {
    /// When, in ms since the epoch.
    pub t_ms: u64,
    /// Items enqueued per second by this process.
    pub enqueued: f64,
    /// Items done (dequeued or acknowledged) per second by this process.
    pub done: f64,
    /// Lease failures per second in this process.
    pub failed: f64,
    /// Dead letters added per second, store-wide (growth of the dead-letter counts).
    pub dead_lettered: f64,
    /// Visible items, all queues.
    pub ready: u64,
    /// Delayed items, all queues.
    pub delayed: u64,
    /// Leased items, all queues.
    pub leased: u64,
    /// Dead letters, all queues.
    pub dead: u64,
}

/// What every viewer is shown: the latest read of the store.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// When it was taken, in ms since the epoch.
    pub at_ms: u64,
    /// Every queue, by name.
    pub queues: Vec<QueueRow>,
    /// The last chart point (absent before the second read).
    pub point: Option<Point>,
    /// Why the last read failed, if it did (the figures are then the read before it).
    pub error: Option<String>,
}

/// The snapshot task's output: the snapshot, its JSON, and the chart history.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) snapshot: Snapshot,
    /// `snapshot` as JSON, made once for every event stream.
    pub(crate) json: Arc<str>,
    /// Whether the store was read for it (false only before the task's first read).
    pub(crate) read: bool,
}

/// The state the task keeps and the handlers read.
#[derive(Debug)]
pub(crate) struct Feed {
    latest: watch::Receiver<Arc<Published>>,
    /// The last `HISTORY` points, oldest first.
    pub(crate) history: Mutex<VecDeque<Point>>,
}

impl Feed {
    /// The latest snapshot, once the task has read the store once (a request that comes
    /// before the first read waits for it, rather than showing an empty store).
    pub(crate) async fn current(&self) -> Arc<Published> {
        let mut latest = self.latest.clone();
        let waited = latest.wait_for(|p| p.read).await.map(|p| Arc::clone(&p));
        // Err: the task is gone (the runtime is stopping): what it last published.
        waited.unwrap_or_else(|_| Arc::clone(&self.latest.borrow()))
    }

    /// Every snapshot from now on, the latest first, for an event stream.
    pub(crate) fn updates(&self) -> watch::Receiver<Arc<Published>> {
        self.latest.clone()
    }
}

/// Points kept: 15 minutes at one a second.
pub(crate) const HISTORY: usize = 900;

/// One read of the store: every queue's stats.
pub(crate) async fn read_store(store: &Store) -> reliable_queue::Result<Vec<QueueRow>> {
    let now = SystemTime::now();
    let mut rows = Vec::new();
    for name in store.list_queues().await? {
        let queue = store.queue::<RawItem>(&name).await?;
        let stats = queue.stats().await?;
        rows.push(QueueRow::new(name, &stats, now));
    }
    Ok(rows)
}

/// Starts the task that reads `store` every `refresh` while the feed (held by the routers)
/// lives.
pub(crate) fn start(
    store: Store,
    refresh: Duration,
    runtime: &tokio::runtime::Handle,
) -> Arc<Feed> {
    let first = Arc::new(Published {
        snapshot: Snapshot {
            at_ms: millis(SystemTime::now()),
            queues: Vec::new(),
            point: None,
            error: Some("the first read of the store has not finished".to_owned()),
        },
        json: Arc::from("{}"),
        read: false,
    });
    let (tx, rx) = watch::channel(first);
    let feed = Arc::new(Feed {
        latest: rx,
        history: Mutex::new(VecDeque::with_capacity(HISTORY)),
    });
    let task_feed = Arc::downgrade(&feed);
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(refresh);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut before: Option<(SystemTime, Activity, u64)> = None;
        let mut queues = Vec::new();
        loop {
            ticks.tick().await;
            // Every router was dropped: stop reading.
            let Some(feed) = task_feed.upgrade() else {
                return;
            };
            let now = SystemTime::now();
            let activity = store.activity();
            let (error, point) = match read_store(&store).await {
                Ok(rows) => {
                    queues = rows;
                    let dead: u64 = queues.iter().map(|q| q.dead).sum();
                    let point = before.map(|(then, was, dead_before)| {
                        let secs = now
                            .duration_since(then)
                            .unwrap_or(Duration::from_millis(1))
                            .as_secs_f64()
                            .max(0.001);
                        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
                        Point {
                            t_ms: millis(now),
                            enqueued: rate(activity.enqueued, was.enqueued),
                            done: rate(activity.done, was.done),
                            failed: rate(activity.failed, was.failed),
                            dead_lettered: rate(dead, dead_before),
                            ready: queues.iter().map(|q| q.ready).sum(),
                            delayed: queues.iter().map(|q| q.delayed).sum(),
                            leased: queues.iter().map(|q| q.leased).sum(),
                            dead,
                        }
                    });
                    before = Some((now, activity, dead));
                    (None, point)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the dashboard's read of the store failed");
                    (Some(e.to_string()), None)
                }
            };
            if let Some(point) = point {
                let mut history = feed.history.lock();
                if history.len() == HISTORY {
                    history.pop_front();
                }
                history.push_back(point);
            }
            let snapshot = Snapshot {
                at_ms: millis(now),
                queues: queues.clone(),
                point,
                error,
            };
            let json = serde_json::to_string(&snapshot).unwrap_or_else(|_| "{}".to_owned());
            // No receiver is an error only when the feed is gone, handled above.
            let _ = tx.send(Arc::new(Published {
                snapshot,
                json: Arc::from(json),
                read: true,
            }));
        }
    });
    feed
}
