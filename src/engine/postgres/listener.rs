//! Waiting for items: this store's waiting consumers per queue ([`Waiters`], [`Watch`]), and
//! the listener, a connection of its own that `LISTEN`s for the other stores' commits and
//! holds the advisory locks that tell committers whom to notify (`NOTIFY`, sent by the
//! listener after a commit).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Socket};

use super::statements::Sql;
use super::tls::Tls;
use crate::sync::process::Mutex;

/// This store's consumers waiting on each queue (by database id), and the line to the
/// listener task.
#[derive(Debug)]
pub(super) struct Waiters {
    queues: Mutex<HashMap<i32, Waited>>,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Debug)]
struct Waited {
    count: usize,
    /// One notification wakes one consumer (a stored permit if none waits right now); a
    /// consumer that then takes an item wakes the next (see [`Watch::pass_on`]).
    notify: Arc<Notify>,
}

/// What the listener is asked to do: bring its advisory lock on a queue in line with the
/// number of consumers waiting on it (and answer once it holds it).
#[derive(Debug)]
pub(super) enum Command {
    Watch(i32, oneshot::Sender<()>),
    Unwatch(i32),
    /// Items became visible in these queues (a commit, a release): notify the stores with
    /// consumers waiting on them. Sent after the change is committed.
    Notify(Vec<i32>),
}

impl Waiters {
    /// No consumer waits yet; the receiving end of the line is the listener's.
    pub(super) fn new() -> (Arc<Waiters>, mpsc::UnboundedReceiver<Command>) {
        let (commands, listened) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters {
            queues: Mutex::new(HashMap::new()),
            commands,
        });
        (waiters, listened)
    }

    /// Puts a consumer of `queue` among this store's waiters. Before it first looks for an
    /// item, the consumer waits for the returned receiver (when there is one): then the
    /// listener holds the advisory lock that makes committers notify this queue, so a
    /// commit after that look is never missed.
    pub(super) fn watch(self: &Arc<Self>, queue: i32) -> (Watch, Option<oneshot::Receiver<()>>) {
        let (notify, first) = {
            let mut queues = self.queues.lock();
            let waited = queues.entry(queue).or_insert_with(|| Waited {
                count: 0,
                notify: Arc::new(Notify::new()),
            });
            waited.count += 1;
            (Arc::clone(&waited.notify), waited.count == 1)
        };
        let ack = first.then(|| {
            let (ack, acked) = oneshot::channel();
            // A listener gone (store closing) leaves the receiver closed: no wait.
            let _ = self.commands.send(Command::Watch(queue, ack));
            acked
        });
        let watch = Watch {
            waiters: Arc::clone(self),
            queue,
            notify,
        };
        (watch, ack)
    }

    /// This store's consumers waiting on `queue` now.
    pub(super) fn count(&self, queue: i32) -> usize {
        self.queues.lock().get(&queue).map_or(0, |w| w.count)
    }

    /// Wakes this store's waiters on `queues` and has the listener notify the other stores'
    /// (see `Postgres::notify`).
    pub(super) fn notify(&self, queues: Vec<i32>) {
        if queues.is_empty() {
            return;
        }
        // This store's own waiters at once: the notification the listener sends is for the
        // other stores (its own lock on a queue this store waits on hides this store from
        // the "anyone waiting?" check, and the listener drops what it sent itself).
        {
            let waited = self.queues.lock();
            for queue in &queues {
                if let Some(waited) = waited.get(queue) {
                    waited.notify.notify_one();
                }
            }
        }
        // A listener gone (store closing) has nobody left to wake.
        let _ = self.commands.send(Command::Notify(queues));
    }

    fn wake_one(&self, queue: i32) {
        if let Some(waited) = self.queues.lock().get(&queue) {
            waited.notify.notify_one();
        }
    }

    /// Wakes every consumer (the listener reconnected, or the store is closing): each looks
    /// for an item once more.
    pub(super) fn wake_all(&self) {
        for waited in self.queues.lock().values() {
            waited.notify.notify_waiters();
        }
    }

    fn waiting(&self, queue: i32) -> bool {
        self.queues.lock().get(&queue).is_some_and(|w| w.count > 0)
    }

    fn waited_queues(&self) -> Vec<i32> {
        self.queues
            .lock()
            .iter()
            .filter(|(_, w)| w.count > 0)
            .map(|(q, _)| *q)
            .collect()
    }
}

/// A consumer among its store's waiters on one queue; leaves them when dropped.
#[derive(Debug)]
pub(crate) struct Watch {
    waiters: Arc<Waiters>,
    queue: i32,
    notify: Arc<Notify>,
}

impl Watch {
    /// This consumer took an item: the next waiter looks too, as the commit that woke this
    /// one may have brought more (FoundationDB's staging: waiters are woken one at a time,
    /// each by the one before, never all at once).
    pub(crate) fn pass_on(&self) {
        let others = self
            .waiters
            .queues
            .lock()
            .get(&self.queue)
            .is_some_and(|w| w.count > 1);
        if others {
            self.notify.notify_one();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let last = {
            let mut queues = self.waiters.queues.lock();
            let waited = queues.get_mut(&self.queue);
            debug_assert!(
                waited.as_ref().is_some_and(|w| w.count > 0),
                "a queue's count of waiting consumers counts each live watch"
            );
            match waited {
                Some(waited) => {
                    waited.count = waited.count.saturating_sub(1);
                    waited.count == 0
                }
                None => false,
            }
        };
        if last {
            let _ = self.waiters.commands.send(Command::Unwatch(self.queue));
        }
    }
}

/// Waits for a notification for any of `watches`' queues, or `timeout` (timed on `rt`).
pub(super) async fn wait_any(rt: &Handle, watches: &[Watch], timeout: Duration) {
    let timer = rt.spawn(async move { tokio::time::sleep(timeout).await });
    let mut notified: Vec<_> = watches
        .iter()
        .map(|w| Box::pin(w.notify.notified()))
        .collect();
    tokio::pin!(timer);
    std::future::poll_fn(|cx| {
        if timer.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        for n in &mut notified {
            if n.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await;
    timer.abort();
}

/// Waits for `ack` (the listener's lock), at most `timeout` (timed on `rt`): a listener that
/// is reconnecting must not hold the consumer up longer than its fallback poll would.
pub(super) async fn watched(rt: &Handle, ack: oneshot::Receiver<()>, timeout: Duration) {
    let timer = rt.spawn(async move { tokio::time::sleep(timeout).await });
    tokio::pin!(timer, ack);
    tokio::select! {
        _ = &mut ack => {}
        _ = &mut timer => {}
    }
    timer.abort();
}

/// The listener: one connection of its own (not pooled) that `LISTEN`s on the schema's channel
/// and holds a shared advisory lock per queue this store has consumers waiting on, so that a
/// committer notifies only queues someone waits on. A notification wakes one local waiter of
/// its queue. Lost connection: every waiter is woken (notifications may have been missed),
/// and the listener reconnects with a backoff, taking its locks again. Ends when the store
/// closes (its command line closes).
pub(super) async fn listen(
    config: tokio_postgres::Config,
    bound: Duration,
    tls: Tls,
    sql: Arc<Sql>,
    waiters: Arc<Waiters>,
    commands: mpsc::UnboundedReceiver<Command>,
) {
    match tls {
        Tls::Off => listen_with(config, bound, NoTls, sql, waiters, commands).await,
        Tls::On(tls) => listen_with(config, bound, tls, sql, waiters, commands).await,
    }
}

/// [`listen`] with one kind of connection.
async fn listen_with<T>(
    config: tokio_postgres::Config,
    bound: Duration,
    tls: T,
    sql: Arc<Sql>,
    waiters: Arc<Waiters>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) where
    T: MakeTlsConnect<Socket> + Clone + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (channel, watch_key, notify) = (&sql.channel, sql.keys.watch, &sql.notify);
    let mut backoff = Duration::from_millis(50);
    loop {
        // A server that accepts the connection and never answers is given up on at the
        // bound, and tried again after the backoff like one that refused.
        let connected = tokio::time::timeout(bound, config.connect(tls.clone())).await;
        if let Ok(Ok((client, mut connection))) = connected {
            backoff = Duration::from_millis(50);
            let (noted, mut notes) = mpsc::unbounded_channel::<(i32, Option<i32>)>();
            let driver = tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    match message {
                        Ok(AsyncMessage::Notification(n)) => {
                            let note = (n.process_id(), n.payload().parse().ok());
                            if noted.send(note).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
            let mut locked = HashSet::new();
            let listening = client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await
                .is_ok();
            // Its own notifications come back to it; this store woke its waiters already.
            let own_pid = match client.query_one("SELECT pg_backend_pid()", &[]).await {
                Ok(row) => row.try_get::<_, i32>(0).ok(),
                Err(_) => None,
            };
            // Prepared once per connection: the listener sends every store's notifications.
            let notify_statement = client.prepare(notify).await.ok();
            if listening && notify_statement.is_some() && own_pid.is_some() {
                let mut up = true;
                for queue in waiters.waited_queues() {
                    up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                }
                // Whatever was committed while nobody listened.
                waiters.wake_all();
                while up {
                    tokio::select! {
                        note = notes.recv() => match note {
                            Some((from, Some(queue))) if Some(from) != own_pid => {
                                waiters.wake_one(queue);
                            }
                            Some(_) => {}
                            None => up = false,
                        },
                        command = commands.recv() => match command {
                            Some(Command::Watch(queue, ack)) => {
                                up = reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                let _ = ack.send(());
                            }
                            Some(Command::Unwatch(queue)) => {
                                up = reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                            }
                            Some(Command::Notify(mut queues)) => {
                                // Every notification asked for meanwhile, in one statement.
                                let mut later = Vec::new();
                                while let Ok(command) = commands.try_recv() {
                                    match command {
                                        Command::Notify(more) => queues.extend(more),
                                        other => later.push(other),
                                    }
                                }
                                queues.sort_unstable();
                                queues.dedup();
                                // A failure only delays the waiters until their fallback poll.
                                if let Some(statement) = &notify_statement {
                                    let _ = client.execute(statement, &[channel, &queues]).await;
                                }
                                for command in later {
                                    match command {
                                        Command::Watch(queue, ack) => {
                                            up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                            let _ = ack.send(());
                                        }
                                        Command::Unwatch(queue) => {
                                            up = up && reconcile(&client, watch_key, &waiters, &mut locked, queue).await;
                                        }
                                        Command::Notify(_) => {}
                                    }
                                }
                            }
                            None => {
                                driver.abort();
                                return;
                            }
                        },
                    }
                }
            }
            driver.abort();
        }
        waiters.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Takes or releases the listener's lock on `queue` so that it is held exactly while this
/// store has consumers waiting on it. False if the connection failed.
async fn reconcile(
    client: &tokio_postgres::Client,
    key: i32,
    waiters: &Waiters,
    locked: &mut HashSet<i32>,
    queue: i32,
) -> bool {
    let waiting = waiters.waiting(queue);
    if waiting == locked.contains(&queue) {
        return true;
    }
    let statement = if waiting {
        "SELECT pg_advisory_lock_shared($1, $2)"
    } else {
        "SELECT pg_advisory_unlock_shared($1, $2)"
    };
    if client.execute(statement, &[&key, &queue]).await.is_err() {
        return false;
    }
    if waiting {
        locked.insert(queue);
    } else {
        locked.remove(&queue);
    }
    true
}
