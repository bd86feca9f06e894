//! A transaction's connection: taken from the pool by the transaction's first call that needs
//! one, `BEGIN` (pipelined with the first dequeue, which it runs), `ROLLBACK`, and back to
//! the pool, or closed when it cannot roll back or its transaction is past its deadline;
//! and the session of a transaction past its deadline ended from a connection of its own.

use std::fmt;

use deadpool_postgres::Object;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use super::failure::pg;
use super::pool::Pool;
use super::statements::{ms, Sql, BEGIN, BEGIN_KNOWN};
use crate::core::Entry;
use crate::error::{Error, Result};

/// A transaction's hold on PostgreSQL, as its `Work` keeps it: nothing yet (no dequeue: an
/// enqueue-only transaction needs no connection before its commit), or its [`PgTx`]. One
/// pointer wide, so the embedded engines' `Work` grows by no more than that.
#[derive(Debug, Default)]
pub(crate) struct PgSlot(Option<Box<PgTx>>);

/// Why a transaction was rolled back before its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Aborted {
    /// A call's future was dropped while its task had the connection.
    Cancelled,
    /// A statement failed inside the database transaction.
    Failed,
}

impl Aborted {
    pub(super) fn error(self) -> Error {
        Error::TransactionAborted {
            reason: match self {
                Aborted::Cancelled => {
                    "a call on the transaction was cancelled while the database worked on it"
                }
                Aborted::Failed => "a statement failed inside the database transaction",
            },
        }
    }
}

impl PgSlot {
    /// Rows dequeued in the open database transaction.
    pub(crate) fn held(&self) -> usize {
        self.0.as_ref().map_or(0, |tx| tx.held)
    }

    /// Has the transaction taken a connection (or been aborted)?
    pub(crate) fn is_idle(&self) -> bool {
        self.0.is_none()
    }

    /// The server process of the open database transaction, if one is open.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.0.as_ref().filter(|tx| tx.open).and_then(|tx| tx.pid)
    }

    /// The transaction's deadline passed: its connection is closed when dropped, never
    /// reused (see [`PgTx::discard`]).
    pub(crate) fn discard(&mut self) {
        if let Some(tx) = &mut self.0 {
            tx.discard = true;
        }
    }

    /// Takes the connection out for a call, leaving an aborted marker until
    /// [`end_call`](Self::end_call) puts it back: a call whose future is dropped half way
    /// leaves the transaction aborted, never silently without its database transaction.
    pub(super) fn begin_call(&mut self, rt: &Handle) -> Result<Box<PgTx>> {
        let marker = Box::new(PgTx::aborted(rt.clone(), Aborted::Cancelled));
        match self.0.replace(marker) {
            None => Ok(Box::new(PgTx::new(rt.clone()))),
            Some(tx) => match tx.aborted {
                None => Ok(tx),
                Some(why) => {
                    self.0 = Some(tx);
                    Err(why.error())
                }
            },
        }
    }

    pub(super) fn end_call(&mut self, mut tx: Box<PgTx>) {
        if tx.client.is_none() && !tx.open && !tx.failed && tx.aborted.is_none() {
            // The call ended the database transaction it began and gave its connection back
            // (it took nothing): the transaction holds none again.
            self.0 = None;
            return;
        }
        if tx.failed {
            // Kept with its connection, so that the commit or abort that ends the
            // transaction returns only once the server has rolled back and the items are
            // back (S4); dropped instead, it rolls back as it drops.
            tx.aborted = Some(Aborted::Failed);
        }
        self.0 = Some(tx);
    }

    /// Starts a call whose task hands the connection back through the returned sender
    /// rather than with its output: the receiving end is kept by the transaction (in its
    /// aborted marker), so that a call whose future is leaked (never dropped) still leaves
    /// the connection to the transaction's end, which rolls it back. [`Returning::back`]
    /// takes it back; a `Returning` dropped before that (the call's future was dropped)
    /// lets the connection go at once: rolled back as the task drops it.
    pub(super) fn begin_returning_call(
        &mut self,
        rt: &Handle,
    ) -> Result<(Box<PgTx>, oneshot::Sender<Box<PgTx>>, Returning<'_>)> {
        let held = self.begin_call(rt)?;
        let (back, returned) = oneshot::channel();
        if let Some(marker) = &mut self.0 {
            marker.returning = Some(returned);
            // What the transaction held before the call: more when the connection comes
            // back means the call took items.
            marker.held = held.held;
        }
        Ok((held, back, Returning(self)))
    }

    /// Takes back the connection of a call whose future was leaked with its task in flight
    /// (see [`begin_returning_call`](Self::begin_returning_call)), once the task hands it
    /// back: the transaction goes on as before the call if the call took nothing (a waiting
    /// dequeue that found nothing, the common case), and stays aborted (rolled back at its
    /// end, so the items nobody received go back) if it took items.
    pub(super) async fn reclaim(&mut self) {
        let Some(marker) = &mut self.0 else {
            return;
        };
        let Some(returned) = marker.returning.take() else {
            return;
        };
        let before = marker.held;
        if let Ok(mut held) = returned.await {
            if held.held > before {
                held.aborted = Some(Aborted::Cancelled);
            }
            self.end_call(held);
        }
    }

    /// The transaction's `PgTx` for its commit or abort (`None` if it has none; its
    /// `aborted` says whether a call aborted it).
    pub(super) fn take(self) -> Option<Box<PgTx>> {
        self.0
    }
}

/// A call in flight whose connection comes back through the transaction (see
/// [`PgSlot::begin_returning_call`]).
pub(super) struct Returning<'a>(&'a mut PgSlot);

impl Returning<'_> {
    /// Waits for the call's task to hand the connection back, and gives it to the
    /// transaction again (see [`PgSlot::end_call`]). Without it (the task was cancelled),
    /// the transaction stays aborted.
    pub(super) async fn back(self) {
        let returned = self.0 .0.as_mut().and_then(|m| m.returning.take());
        if let Some(returned) = returned {
            if let Ok(held) = returned.await {
                self.0.end_call(held);
            }
        }
    }
}

impl Drop for Returning<'_> {
    fn drop(&mut self) {
        // The call's future was dropped. A connection handed back already that took nothing
        // goes on as the transaction's; otherwise it is not waited for (rolled back as the
        // task, or here the channel, drops it) and the transaction stays aborted.
        let Some(marker) = &mut self.0 .0 else {
            return;
        };
        let Some(mut returned) = marker.returning.take() else {
            return;
        };
        let before = marker.held;
        if let Ok(held) = returned.try_recv() {
            if held.held == before && held.aborted.is_none() {
                self.0.end_call(held);
            }
        }
    }
}

/// A connection in a transaction's hands, with or without an open database transaction.
/// Dropped with one open, it rolls back in a task of the store's runtime and only then goes
/// back to the pool; a connection that cannot roll back is dropped from the pool.
pub(super) struct PgTx {
    pub(super) client: Option<Object>,
    /// `BEGIN` was sent and neither `COMMIT` nor `ROLLBACK` since.
    pub(super) open: bool,
    /// Rows dequeued (deleted) in the open database transaction.
    pub(super) held: usize,
    /// A statement failed inside the open database transaction: it can only roll back.
    pub(super) failed: bool,
    /// Set on a marker that stands for a transaction rolled back before its commit.
    pub(super) aborted: Option<Aborted>,
    /// On an aborted marker: where the connection of the call in flight comes back (see
    /// [`PgSlot::begin_returning_call`]).
    pub(super) returning: Option<oneshot::Receiver<Box<PgTx>>>,
    /// The server process of the connection, learnt with `BEGIN`: a transaction deadline
    /// ends the transaction by ending it (P10).
    pub(super) pid: Option<i32>,
    /// The transaction's deadline has passed (its session is being ended): the connection
    /// must never go back to the pool.
    pub(super) discard: bool,
    rt: Handle,
}

impl fmt::Debug for PgTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTx").field("open", &self.open).finish()
    }
}

impl PgTx {
    pub(super) fn new(rt: Handle) -> PgTx {
        PgTx {
            client: None,
            open: false,
            held: 0,
            failed: false,
            aborted: None,
            returning: None,
            pid: None,
            discard: false,
            rt,
        }
    }

    fn aborted(rt: Handle, why: Aborted) -> PgTx {
        let mut tx = PgTx::new(rt);
        tx.aborted = Some(why);
        tx
    }

    /// Is a database transaction open that this side must end? Not past its deadline: that
    /// connection is closed as it drops, and its server process is being ended, which rolls
    /// back.
    pub(super) fn must_roll_back(&self) -> bool {
        self.open && !self.discard
    }

    pub(super) fn client(&self) -> Result<&Object> {
        self.client.as_ref().ok_or(Error::Bug {
            invariant: "a PgTx holds its connection until dropped",
        })
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if self.discard {
            // Closed, never reused: its server process is being ended by the deadline.
            drop(Object::take(client));
            return;
        }
        if !self.open {
            return;
        }
        // The rollback must not block whoever drops the transaction; the connection is
        // reused only once it is out of the transaction.
        self.rt.spawn(async move {
            if client.batch_execute("ROLLBACK").await.is_err() {
                // Broken: out of the pool, closed when dropped (the server rolls back).
                drop(Object::take(client));
            }
        });
    }
}

/// The dequeue statement in `held`'s transaction (a connection taken and `BEGIN` sent first
/// if need be); nothing, before any statement is sent, once `gone` says nobody waits for it.
pub(super) async fn take(
    pool: &Pool,
    sql: &Sql,
    held: &mut PgTx,
    queue: i32,
    n: i64,
    now: Option<i64>,
    gone: &(dyn Fn() -> bool + Send + Sync),
) -> Result<Vec<Entry>> {
    if gone() {
        return Ok(Vec::new());
    }
    if held.client.is_none() {
        held.client = Some(pool.get().await.map_err(|e| pg("dequeue", e))?);
    }
    if gone() {
        return Ok(Vec::new());
    }
    // Open from before the `BEGIN` is sent: a call cancelled half way rolls back whatever
    // it began (a `ROLLBACK` with nothing begun is harmless).
    let was_open = std::mem::replace(&mut held.open, true);
    let client = held.client()?;
    // Prepared once per connection (deadpool's statement cache).
    let statement = match client
        .prepare_cached(if n == 1 { &sql.take_one } else { &sql.take })
        .await
    {
        Ok(statement) => statement,
        Err(e) => {
            // Inside a database transaction a failed statement aborts it; outside, nothing
            // was begun.
            match was_open {
                true => held.failed = true,
                false => held.open = false,
            }
            return Err(pg("dequeue", e));
        }
    };
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&queue, &n, &now];
    let rows = if was_open {
        client.query(&statement, &params).await
    } else {
        // `BEGIN` and the first dequeue pipelined (one round trip), the dequeue prepared. If
        // the `BEGIN` failed, the dequeue finds its setting off and takes nothing.
        let (begin, known) = begin_text(sql, client);
        let (begun, rows) = tokio::join!(
            client.simple_query(begin),
            client.query(&statement, &params)
        );
        match begun {
            Ok(begun) => {
                let pid = begun_pid(sql, client, known, &begun);
                held.pid = pid;
                rows
            }
            Err(e) => {
                held.failed = true;
                return Err(pg("dequeue", e));
            }
        }
    };
    let mut taken = match rows {
        Ok(rows) => rows
            .iter()
            .map(|row| entry(row.get(0), row.get(1)))
            .collect::<Vec<Entry>>(),
        Err(e) => {
            held.failed = true;
            return Err(pg("dequeue", e));
        }
    };
    debug_assert!(
        usize::try_from(n).is_ok_and(|n| taken.len() <= n),
        "a dequeue takes at most the rows it asks for"
    );
    held.held += taken.len();
    taken.sort_unstable_by_key(|e| e.id);
    Ok(taken)
}

/// Begins a transaction on `client` (see [`BEGIN`]); its server process's id, asked for
/// only the first time a connection is used.
fn begin_text(sql: &Sql, client: &Object) -> (&'static str, Option<i32>) {
    match sql.pids.lock().get(&Object::id(client)) {
        Some(&pid) => (BEGIN_KNOWN, Some(pid)),
        None => (BEGIN, None),
    }
}

/// The server process of `client` from the replies to its `BEGIN`, remembered.
fn begun_pid(
    sql: &Sql,
    client: &Object,
    known: Option<i32>,
    messages: &[tokio_postgres::SimpleQueryMessage],
) -> Option<i32> {
    if known.is_some() {
        return known;
    }
    let pid = backend_pid(messages)?;
    let mut pids = sql.pids.lock();
    if pids.len() > 4096 {
        // Connections come and go; their ids are never reused, so forget them all now and
        // then (each costs one more `SELECT` to learn again).
        pids.clear();
    }
    pids.insert(Object::id(client), pid);
    Some(pid)
}

/// The server process's id among the replies to [`BEGIN`].
pub(super) fn backend_pid(messages: &[tokio_postgres::SimpleQueryMessage]) -> Option<i32> {
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.len() == 1 => {
            row.get(0).and_then(|pid| pid.parse().ok())
        }
        _ => None,
    })
}

/// An item as the dequeue statement returns it.
fn entry(id: i64, payload: Vec<u8>) -> Entry {
    Entry::new(ms(id), payload.into_boxed_slice(), 0)
}

/// `ROLLBACK` on `held`'s connection, awaited, if it has a database transaction to end. A
/// connection that cannot roll back is broken: it leaves the pool (closed, so the server
/// rolls back when it notices).
pub(super) async fn roll_back(held: &mut PgTx) -> Result<()> {
    if !held.must_roll_back() {
        return Ok(());
    }
    let rolled_back = held.client()?.batch_execute("ROLLBACK").await;
    held.open = false;
    if let Err(e) = rolled_back {
        if let Some(client) = held.client.take() {
            drop(Object::take(client));
        }
        return Err(pg("abort", e));
    }
    Ok(())
}

/// Ends server process `pid` on a connection of its own.
pub(super) async fn terminate<T>(config: &tokio_postgres::Config, tls: T, pid: i32) -> Option<u64>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await.ok()?;
    let driver = tokio::spawn(connection);
    let ended = client
        .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .await;
    drop(client);
    let _ = driver.await;
    ended.ok()
}
