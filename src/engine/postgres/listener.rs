//! The PostgreSQL listener: a connection of its own that `LISTEN`s for the other stores'
//! commits and holds the advisory locks that tell committers whom to notify (`NOTIFY`, sent
//! by the listener after a commit). It wakes the store's waiting consumers (`engine/line.rs`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Socket};

use super::statements::Sql;
use super::tls::Tls;
use crate::engine::line::{Command, Waiters};

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
                                waiters.wake_one(queue, false);
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
