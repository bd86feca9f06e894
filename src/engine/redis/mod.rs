//! The Redis engine (feature `redis`): a store is a key prefix on one Redis server,
//! `rq:{<namespace>}:`, whose hash tag puts all of its keys in one slot.
//!
//! Items are records in a hash per queue, and their ids in a list per queue (the visible
//! ones, head first). A transaction's dequeue is a script that moves head ids into the
//! transaction's own list at once, and its token into the store's set of holds, scored by the
//! time its hold ends; its
//! enqueues are buffered by the handle; its commit is one script that checks the transaction
//! still holds everything it took, deletes those items and appends the enqueues, atomically,
//! or applies nothing. An abort or a dropped transaction runs a script that gives its items
//! back at the head of their queues. Redis has no session whose end undoes a client's work,
//! so every hold ends: at the transaction's deadline, or [`DEFAULT_HOLD_TIMEOUT`] after its
//! first dequeue when it has none; then any client's next look at the queue (and this
//! store's pass every second) puts the items back. A commit that comes later fails with
//! `Error::TransactionExpired` and applies nothing.
//!
//! Waiting consumers are woken by the commits: each script that makes items visible
//! publishes the queue's number on the store's channel, and one subscribed connection per
//! store wakes this store's consumers waiting on that queue, who look again. A consumer
//! that heard nothing looks again after the poll interval anyway (a message published while
//! the subscription was reconnecting is lost).
//!
//! The client is redis-rs: one multiplexed connection that reconnects by itself
//! (`ConnectionManager`), on a current-thread tokio runtime of the store's own, on a thread of
//! its own (`reliable-queue-redis`): every call is a task spawned there, so the async forms
//! work under any executor and the blocking forms wait on the task.
//!
//! The scripts and the keys are in `scripts.rs`; ARCHITECTURE.md ("The Redis engine") has
//! the mapping of each call.
//!
//! [`DEFAULT_HOLD_TIMEOUT`]: crate::config::DEFAULT_HOLD_TIMEOUT

mod batch;
pub(crate) mod calls;
mod scripts;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{AsyncCommands, Value};

use scripts::{Caller, Script, Scripts};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::catalog::Catalog;
use super::line::{Calls, OwnThread, Waiters};
use super::Entry;
use crate::clock::Clock;
use crate::config::RedisConfig;
use crate::core::{QueueCore, QueueId};
use crate::engine::proc::EXPIRED;
use crate::error::{Error, Result};
use crate::processing::RetryPolicy;
use crate::sync::process::Mutex;

/// The version of the key layout this build reads and writes (`<p>version`).
const LAYOUT_VERSION: i64 = 2;

/// How long a call waits for the server's answer before it fails: a server that stopped
/// answering must not hold a consumer, a commit or a close forever.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The transaction state a Redis store keeps in a transaction's `Work`: its token once its
/// first dequeue took one, when its hold ends (server ms), and how many items it holds.
///
/// Dropped with a token (the transaction was dropped, or its commit failed), it gives the
/// transaction's items back in the background, as a dropped PostgreSQL transaction rolls
/// back.
#[derive(Default)]
pub(crate) struct RedisSlot {
    /// 0: none yet.
    token: u64,
    ends: u64,
    held: usize,
    returner: Option<Arc<Returner>>,
    /// A dequeue whose answer its caller has not read yet: the ids its script took come on
    /// this once it ran. Left here when the caller's future is dropped (or leaked) half way:
    /// the next use of the slot gives those items back (the caller never had them), and a
    /// give-back of the whole transaction waits for it first.
    pending: Option<oneshot::Receiver<Vec<u64>>>,
    /// A dequeue failed: whether its script ran is not known (the connection was lost after
    /// it was sent), so the transaction is over: its commit gives everything back and fails.
    failed: bool,
}

impl fmt::Debug for RedisSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlot")
            .field("token", &self.token)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisSlot {
    fn drop(&mut self) {
        let token = self.disarm();
        if let (Some(returner), true) = (&self.returner, token != 0) {
            returner.later(token, self.pending.take());
        }
    }
}

/// What gives a transaction's items back, shared by the store and its transactions' slots;
/// with the tokens of the store's transactions that may hold items (given back at close).
struct Returner {
    rt: Handle,
    caller: Arc<Caller>,
    open: Mutex<HashSet<u64>>,
    waiters: Arc<Waiters>,
    calls: Arc<Calls>,
}

impl Returner {
    /// Gives back what transaction `token` still holds (run in a task of the store's
    /// runtime).
    /// This store's waiters on the queues whose items came back are woken (the other stores'
    /// through the wake channel).
    async fn give_back(&self, token: u64) -> redis::RedisResult<()> {
        let mut conn = self.caller.conn.clone();
        let queues: Vec<i32> = self
            .caller
            .call(|s| &s.give_back)
            .arg(token_arg(token))
            .invoke_async(&mut conn)
            .await?;
        // Given back: a close need not (until then it gives back every token left here).
        self.open.lock().remove(&token);
        for q in queues {
            self.waiters.wake_one(q, false);
        }
        Ok(())
    }

    /// [`give_back`](Self::give_back) in the background. Should the server be out of
    /// reach, the hold's end gives the items back.
    /// Waits for `pending` first (a dequeue of the transaction still running).
    /// Counted among the store's calls, so that a close waits for it; one that starts after
    /// the close began leaves the token to the close.
    fn later(self: &Arc<Self>, token: u64, pending: Option<oneshot::Receiver<Vec<u64>>>) {
        let this = Arc::clone(self);
        let Ok(call) = self.calls.start() else {
            return;
        };
        self.rt.spawn(async move {
            let _call = call;
            if let Some(pending) = pending {
                let _ = pending.await;
            }
            if let Err(e) = this.give_back(token).await {
                tracing::warn!(error = %e, "could not give a transaction's items back; they come back when its hold ends");
            }
        });
    }
}

/// A new transaction token: 64 random bits (never 0), from the standard library's
/// randomly keyed hasher and a process-wide counter.
fn new_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

/// A token as the scripts take it.
fn token_arg(token: u64) -> Vec<u8> {
    if token == 0 {
        Vec::new()
    } else {
        format!("{token:016x}").into_bytes()
    }
}

impl RedisSlot {
    /// Items the transaction holds on the server.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// The transaction's token, once a dequeue gave it one.
    pub(crate) fn token(&self) -> Option<u64> {
        (self.token != 0).then_some(self.token)
    }

    /// Fails once a dequeue of the transaction has failed (see [`RedisSlot::failed`]).
    pub(crate) fn check(&self) -> Result<()> {
        match self.failed {
            true => Err(Error::TransactionAborted {
                reason: "a dequeue of the transaction failed, so what it took is not known; \
                         its items go back to their queues",
            }),
            false => Ok(()),
        }
    }

    /// Takes the token out: the slot's drop gives nothing back then.
    fn disarm(&mut self) -> u64 {
        std::mem::take(&mut self.token)
    }
}

/// One connected Redis store.
pub(crate) struct Redis {
    rt: Handle,
    /// The runtime's thread, unless on the caller's runtime: ended at close.
    own: OwnThread,
    /// The subscription, the reclaim pass and the sender of groups: ended at close.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The connection and the functions: the key prefix (`rq:{<namespace>}:`), the catalog
    /// key every function names, this store's name in its commits' wake-ups (so that the
    /// subscription skips its own), the clock.
    caller: Arc<Caller>,
    /// The queues this process has opened: their local cores (for the handles) and their
    /// numbers on the server.
    catalog: Catalog,
    numbers: Mutex<HashMap<QueueId, i32>>,
    /// This store's waiting consumers, in a line per queue (by number): woken by this
    /// store's commits and, for the others', by the subscription.
    waiters: Arc<Waiters>,
    returner: Arc<Returner>,
    /// The calls running on the store's runtime, which a close lets finish.
    calls: Arc<Calls>,
    /// The takes and commits waiting to be sent, in groups.
    batcher: Arc<batch::Batcher>,
    /// How long a transaction's first dequeue holds its items when it has no deadline.
    hold_ms: u64,
    poll_interval: Duration,
    /// The numbers of the queues opened, for the reclaim pass.
    opened: Arc<Mutex<Vec<i32>>>,
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("prefix", &self.caller.prefix)
            .finish_non_exhaustive()
    }
}

/// A retry policy as the store keeps it: `max attempts,initial ms,max ms,jitter ‰`.
fn policy_text(policy: RetryPolicy) -> String {
    let (max, initial, cap, jitter) = policy.to_columns();
    format!("{max},{initial},{cap},{jitter}")
}

/// [`policy_text`] read back (the default for a malformed one).
fn policy_of(text: &str) -> RetryPolicy {
    let mut parts = text.split(',').map(|p| p.parse::<i64>().ok());
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(Some(m)), Some(Some(i)), Some(Some(x)), Some(Some(j))) => RetryPolicy::from_columns(
            i32::try_from(m).unwrap_or(i32::MAX),
            i,
            x,
            i32::try_from(j).unwrap_or(0),
        ),
        _ => RetryPolicy::default(),
    }
}

/// A [`Redis::script`] caller that needs nothing of the answer in the call's task.
fn ignore(_: &redis::RedisResult<Value>) {}

/// A client failure as the crate's error.
/// A connection to `server` that could not be made or checked: the server's address (host
/// and port, or the socket's path; never the URL's password) before the client's error.
#[derive(Debug)]
struct ConnectTo {
    server: String,
    source: redis::RedisError,
}

impl std::fmt::Display for ConnectTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot connect to the Redis server at {}", self.server)
    }
}

impl std::error::Error for ConnectTo {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// [`fail`] of a connection to `server` (see [`ConnectTo`]).
fn connect_failed(server: &str, e: redis::RedisError) -> Error {
    Error::Redis {
        operation: "connect",
        source: Arc::new(ConnectTo {
            server: server.to_owned(),
            source: e,
        }),
    }
}

fn fail(operation: &'static str, e: redis::RedisError) -> Error {
    Error::Redis {
        operation,
        source: Arc::new(e),
    }
}

/// Data on the server that this store did not write (a key tampered with).
fn damaged(operation: &'static str, what: String) -> Error {
    Error::Redis {
        operation,
        source: Arc::new(std::io::Error::new(std::io::ErrorKind::InvalidData, what)),
    }
}

/// A record ([`scripts::RECORD`]): a version byte, the enqueue time, the first and latest
/// attempt's times (ms, big-endian u64), the attempts (u32), then the enveloped item.
const RECORD_VERSION: u8 = 2;

/// The record of `entry` (its id is the record's key, not in it).
fn record(entry: &Entry) -> Vec<u8> {
    let mut r = Vec::with_capacity(scripts::RECORD + entry.bytes.len());
    r.push(RECORD_VERSION);
    r.extend_from_slice(&entry.enqueued_at.to_be_bytes());
    r.extend_from_slice(&entry.first_attempt().to_be_bytes());
    r.extend_from_slice(&entry.last_attempt().to_be_bytes());
    r.extend_from_slice(&entry.attempts().to_be_bytes());
    r.extend_from_slice(&entry.bytes);
    r
}

/// The record of a fresh item enqueued at `enqueued_at`.
fn fresh_record(bytes: &[u8], enqueued_at: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(scripts::RECORD + bytes.len());
    r.push(RECORD_VERSION);
    r.extend_from_slice(&enqueued_at.to_be_bytes());
    r.extend_from_slice(&[0; 20]);
    r.extend_from_slice(bytes);
    r
}

/// The entry a record of item `id` holds, or why it is not one.
fn entry_of(id: u64, rec: &[u8]) -> std::result::Result<Entry, String> {
    let (Some(header), Some(bytes)) = (rec.get(..scripts::RECORD), rec.get(scripts::RECORD..))
    else {
        return Err(format!(
            "item {id}'s record is not one this store wrote ({} bytes)",
            rec.len()
        ));
    };
    if header[0] != RECORD_VERSION {
        return Err(format!(
            "item {id}'s record has version {}, not {RECORD_VERSION}",
            header[0]
        ));
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let mut entry = Entry::new(id, bytes.into(), u64_at(1));
    entry.set_first_attempt(u64_at(9));
    entry.set_last_attempt(u64_at(17));
    let mut a = [0u8; 4];
    a.copy_from_slice(&header[25..29]);
    entry.set_attempts(u32::from_be_bytes(a));
    Ok(entry)
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

impl Redis {
    /// Starts the store's runtime, connects, checks the key layout's version and the server's
    /// durability settings, and starts the subscription and the reclaim pass.
    pub(crate) async fn connect(config: &RedisConfig, clock: Clock) -> Result<Redis> {
        config.validate()?;
        let client = match &config.tls_roots {
            Some(pem) => redis::Client::build_with_tls(
                config.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            None => redis::Client::open(config.url.as_str()),
        }
        .map_err(|e| fail("connect", e))?;
        let (rt, own) = OwnThread::start(config.runtime.as_ref(), "reliable-queue-redis")?;
        let prefix: Arc<str> = format!("rq:{{{}}}:", config.namespace).into();
        let catalog_key: Arc<str> = format!("{prefix}queues").into();
        let server = client.get_connection_info().addr().to_string();
        let connecting = {
            let client = client.clone();
            let server = server.clone();
            rt.spawn(async move {
                let settings = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(2);
                let mut conn = tokio::time::timeout(
                    CONNECT_TIMEOUT * 2,
                    client.get_connection_manager_with_config(settings),
                )
                .await
                .map_err(|_| {
                    damaged(
                        "connect",
                        format!("the Redis server at {server} did not answer in 10 s"),
                    )
                })?
                .map_err(|e| connect_failed(&server, e))?;
                let _: () = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| connect_failed(&server, e))?;
                Ok::<_, Error>(conn)
            })
        };
        let conn = match connecting.await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                own.end();
                return Err(e);
            }
            Err(e) => {
                own.end();
                return Err(Error::storage(e));
            }
        };
        // The line's commands are for a listener that watches queues; the subscription
        // watches them all.
        let (waiters, _commands) = Waiters::new();
        let caller = Arc::new(Caller {
            conn,
            key: catalog_key,
            prefix,
            instance: format!("{:016x}", new_token()).into(),
            clock,
            scripts: Scripts::new(&policy_text(RetryPolicy::default()), EXPIRED),
        });
        let calls = Arc::new(Calls::default());
        let store = Redis {
            rt: rt.clone(),
            own,
            background: Mutex::new(Vec::new()),
            caller: Arc::clone(&caller),
            catalog: Catalog::default(),
            numbers: Mutex::new(HashMap::new()),
            waiters: Arc::clone(&waiters),
            returner: Arc::new(Returner {
                rt: rt.clone(),
                caller: Arc::clone(&caller),
                open: Mutex::new(HashSet::new()),
                waiters: Arc::clone(&waiters),
                calls: Arc::clone(&calls),
            }),
            calls,
            batcher: Arc::new(batch::Batcher::new(caller)),
            hold_ms: u64::try_from(config.hold_timeout.as_millis()).unwrap_or(u64::MAX),
            poll_interval: config.poll_interval,
            opened: Arc::new(Mutex::new(Vec::new())),
        };
        let checked = store
            .check_server(config.require_fsync, config.create, &config.namespace)
            .await;
        if let Err(e) = checked {
            store.stop();
            return Err(e);
        }
        let subscribe = store.rt.spawn(subscribe(
            client,
            format!("{}wake", store.caller.prefix),
            Arc::clone(&store.waiters),
            Arc::clone(&store.caller.instance),
        ));
        let reclaim = store.rt.spawn(reclaim_pass(
            Arc::clone(&store.caller),
            Arc::clone(&store.opened),
            store.poll_interval,
        ));
        let groups = store
            .rt
            .spawn(batch::send_groups(Arc::clone(&store.batcher)));
        store.background.lock().extend([subscribe, reclaim, groups]);
        Ok(store)
    }

    /// Checks the key layout's version (writing it for a new store when `create`; else a
    /// store missing from `namespace` is [`Error::SchemaMissing`]) and whether the server
    /// writes every command to its append-only file before it answers.
    async fn check_server(&self, require_fsync: bool, create: bool, namespace: &str) -> Result<()> {
        let mut conn = self.caller.conn.clone();
        let version_key = format!("{}version", self.caller.prefix);
        let (found, fsync) = self
            .run(async move {
                if create {
                    let _: bool = conn
                        .set_nx(&version_key, LAYOUT_VERSION)
                        .await
                        .map_err(|e| fail("connect", e))?;
                }
                let found: Option<String> = conn
                    .get(&version_key)
                    .await
                    .map_err(|e| fail("connect", e))?;
                let aof: redis::RedisResult<HashMap<String, String>> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("append*")
                    .query_async(&mut conn)
                    .await;
                let fsync = aof.map(|c| {
                    c.get("appendonly").map(String::as_str) == Some("yes")
                        && c.get("appendfsync").map(String::as_str) == Some("always")
                });
                Ok((found, fsync))
            })
            .await?;
        let Some(found) = found else {
            return Err(Error::SchemaMissing {
                schema: namespace.to_owned(),
            });
        };
        let found = found.parse::<i64>().unwrap_or(-1);
        if found != LAYOUT_VERSION {
            return Err(Error::SchemaVersion {
                schema: self.caller.prefix.to_string(),
                found,
                supported: LAYOUT_VERSION,
            });
        }
        match fsync {
            Ok(true) => Ok(()),
            Ok(false) if require_fsync => Err(damaged(
                "connect",
                "the server does not fsync every write (appendonly yes and appendfsync \
                 always): an acknowledged commit can be lost when it crashes"
                    .to_owned(),
            )),
            Ok(false) => {
                tracing::warn!(
                    "the Redis server does not fsync every write (appendonly yes, appendfsync \
                     always): acknowledged commits can be lost when it crashes"
                );
                Ok(())
            }
            Err(e) if require_fsync => Err(fail("connect", e)),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the Redis server's durability settings");
                Ok(())
            }
        }
    }

    /// Runs `task` on the store's runtime. A task whose caller's future is dropped runs on
    /// to its end.
    async fn run<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let call = self.calls.start()?;
        let task = async move {
            let done = task.await;
            drop(call);
            done
        };
        self.rt.spawn(task).await.map_err(|e| {
            if e.is_cancelled() {
                Error::Closed
            } else {
                Error::storage(e)
            }
        })?
    }

    /// Runs script `which` with `args` after the prefix; `then` sees the answer in the
    /// call's task.
    async fn script(
        &self,
        operation: &'static str,
        which: fn(&Scripts) -> &Script,
        args: Vec<Vec<u8>>,
        then: impl FnOnce(&redis::RedisResult<Value>) + Send + 'static,
    ) -> Result<Value> {
        let caller = Arc::clone(&self.caller);
        self.run(async move {
            let mut call = caller.call(which);
            for a in &args {
                call.arg(a.as_slice());
            }
            let got = call.invoke_async(&mut caller.conn.clone()).await;
            then(&got);
            got.map_err(|e| fail(operation, e))
        })
        .await
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Opens queue `name`, adding it on the server if need be; with its retry policy as the
    /// server has it (`None`: opened before, the handle's is current).
    pub(crate) async fn queue(&self, name: &str) -> Result<(Arc<QueueCore>, Option<RetryPolicy>)> {
        crate::engine::catalog::check_name(name)?;
        if let Some(id) = self.catalog.id_of(name) {
            if self.numbers.lock().contains_key(&id) {
                return self
                    .catalog
                    .open_queue(name, |_| Ok(()))
                    .map(|(c, _)| (c, None));
            }
        }
        let answer = self
            .script(
                "queue",
                |s| &s.queue,
                vec![name.as_bytes().to_vec()],
                ignore,
            )
            .await?;
        let (got, policy) = match &answer {
            Value::Array(parts) if parts.len() == 2 => (&parts[0], text(&parts[1])),
            _ => (&answer, None),
        };
        let policy = policy.map(policy_of);
        let number = int(got)
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| {
                damaged(
                    "queue",
                    format!("queue {name:?} has no number (up to 2^31 - 1) on the server"),
                )
            })?;
        let (core, _) = self.catalog.open_queue(name, |_| Ok(()))?;
        self.numbers.lock().insert(core.id(), number);
        let mut opened = self.opened.lock();
        if !opened.contains(&number) {
            opened.push(number);
        }
        Ok((core, policy))
    }

    /// The server's number of `core`'s queue.
    pub(crate) fn number(&self, core: &QueueCore) -> Result<i32> {
        self.numbers
            .lock()
            .get(&core.id())
            .copied()
            .ok_or(Error::Bug {
                invariant: "a queue handle's queue has its number on the server",
            })
    }

    /// Names of every queue of the store on the server, sorted.
    pub(crate) async fn list_queues(&self) -> Result<Vec<String>> {
        let mut conn = self.caller.conn.clone();
        let key = Arc::clone(&self.caller.key);
        let mut names: Vec<String> = self
            .run(async move { conn.hkeys(&*key).await.map_err(|e| fail("list", e)) })
            .await?;
        names.sort();
        Ok(names)
    }

    /// Takes up to `n` items at the head of `core`'s queue into the transaction of `slot`,
    /// in queue order. A record that is not one this store wrote is set aside on the server
    /// and reported; what was taken before it stays held.
    ///
    /// A waiting consumer's look passes its `waiter` ticket: the look's end is noted in the
    /// line by the look's task, so that a waiter whose future is leaked with its look in
    /// flight holds nobody up.
    pub(crate) async fn take(
        &self,
        core: &QueueCore,
        slot: &mut RedisSlot,
        n: usize,
        waiter: Option<u64>,
    ) -> Result<Vec<Entry>> {
        let q = self.number(core)?;
        slot.check()?;
        self.settle_pending(slot).await?;
        if slot.token == 0 {
            slot.token = new_token();
            slot.returner = Some(Arc::clone(&self.returner));
            self.returner.open.lock().insert(slot.token);
        }
        let args = vec![
            q.to_string().into_bytes(),
            n.min(1 << 30).to_string().into_bytes(),
            token_arg(slot.token),
            self.hold_ms.to_string().into_bytes(),
            slot.ends.to_string().into_bytes(),
            slot.held.to_string().into_bytes(),
        ];
        let waiters = Arc::clone(&self.waiters);
        let (took_tx, took_rx) = oneshot::channel();
        // Until the answer is read here: see `RedisSlot::pending`.
        slot.pending = Some(took_rx);
        let got = self
            .batcher
            .call(
                &self.calls,
                |s| &s.take,
                args,
                move |got| {
                    let ids: Vec<u64> = match got {
                        Ok(Value::Array(parts)) => parts
                            .get(2..)
                            .unwrap_or_default()
                            .chunks(2)
                            .filter_map(|pair| pair.first().and_then(int))
                            .collect(),
                        _ => Vec::new(),
                    };
                    if let Some(ticket) = waiter {
                        waiters.looked(q, ticket, !ids.is_empty());
                    }
                    let _ = took_tx.send(ids);
                },
            )
            .await
            .and_then(|got| got.map_err(|e| fail("dequeue", e)));
        slot.pending = None;
        if got.is_err() {
            slot.failed = true;
        }
        let got = got?;
        let Value::Array(parts) = got else {
            return Err(damaged(
                "dequeue",
                "the take script answered no list".into(),
            ));
        };
        let bad = || damaged("dequeue", "the take script's answer is malformed".into());
        let (ends, status) = match parts.as_slice() {
            [e, s, ..] => (int(e).ok_or_else(bad)?, text(s)),
            _ => return Err(bad()),
        };
        slot.ends = ends;
        if status == Some("expired") {
            return Err(Error::TransactionExpired);
        }
        let mut taken = Vec::with_capacity((parts.len() - 2) / 2);
        let mut malformed = None;
        for pair in parts[2..].chunks(2) {
            let [id, rec] = pair else { return Err(bad()) };
            let (id, rec) = (int(id).ok_or_else(bad)?, bytes(rec).ok_or_else(bad)?);
            slot.held += 1;
            match entry_of(id, rec) {
                Ok(entry) => taken.push(entry),
                // Held by the transaction: it goes back with the transaction's other items.
                Err(what) => malformed = malformed.or(Some(what)),
            }
        }
        if let Some(what) = malformed {
            return Err(damaged(
                "dequeue",
                format!("queue {:?}: {what}", core.name()),
            ));
        }
        if let Some(missing) = status.and_then(|s| s.strip_prefix("missing:")) {
            return Err(damaged(
                "dequeue",
                format!(
                    "queue {:?}: item {missing} had no record; its id was set aside in the \
                     queue's damaged list",
                    core.name()
                ),
            ));
        }
        Ok(taken)
    }

    /// Gives back what the transaction of `slot` holds, and waits for it.
    pub(crate) async fn give_back(&self, mut slot: RedisSlot) -> Result<()> {
        let token = slot.disarm();
        if token == 0 {
            return Ok(());
        }
        let returner = Arc::clone(&self.returner);
        let pending = slot.pending.take();
        self.run(async move {
            if let Some(pending) = pending {
                let _ = pending.await;
            }
            returner
                .give_back(token)
                .await
                .map_err(|e| fail("abort", e))
        })
        .await
    }

    /// Gives back what a dequeue of `slot` took for a caller that did not read its answer
    /// (see [`RedisSlot::pending`]), once that dequeue has run.
    pub(crate) async fn settle_pending(&self, slot: &mut RedisSlot) -> Result<()> {
        let Some(pending) = slot.pending.as_mut() else {
            return Ok(());
        };
        let Ok(ids) = pending.await else {
            // The dequeue's task ended without running (the store closing).
            slot.pending = None;
            return Ok(());
        };
        slot.pending = None;
        if ids.is_empty() {
            return Ok(());
        }
        let mut args = vec![token_arg(slot.token)];
        args.extend(ids.iter().map(|id| id.to_string().into_bytes()));
        let got = self.script("abort", |s| &s.give_back, args, ignore).await?;
        if let Value::Array(queues) = got {
            for q in queues.iter().filter_map(int) {
                if let Ok(q) = i32::try_from(q) {
                    self.waiters.wake_one(q, false);
                }
            }
        }
        Ok(())
    }

    /// What the timer of a transaction's deadline does on Redis: gives its items back now,
    /// waiting for it (the server would at the hold's end).
    pub(crate) fn expirer(&self, token: u64) -> Box<dyn FnOnce() + Send> {
        let returner = Arc::clone(&self.returner);
        Box::new(move || {
            let rt = returner.rt.clone();
            let given = rt.spawn(async move {
                let _ = returner.give_back(token).await;
            });
            let _ = crate::engine::block_on(given);
        })
    }

    /// This store's consumers waiting on `core`'s queue now.
    pub(crate) fn waiters(&self, core: &QueueCore) -> usize {
        self.number(core).map_or(0, |q| self.waiters.count(q))
    }

    /// Closes the store: what its open transactions hold is given back, the subscription and
    /// the reclaim pass end, the connection closes and the runtime's thread ends.
    pub(crate) async fn close(&self) {
        self.waiters.wake_all();
        // The calls in flight first (a dequeue among them may take items for a token).
        let calls = Arc::clone(&self.calls);
        let drained = self.rt.spawn(async move {
            let _ = tokio::time::timeout(RESPONSE_TIMEOUT, calls.drain()).await;
        });
        if !self.own.is_current() {
            let _ = drained.await;
        }
        let open: Vec<u64> = self.returner.open.lock().drain().collect();
        if !open.is_empty() {
            let returner = Arc::clone(&self.returner);
            let given = self.rt.spawn(async move {
                for token in open {
                    if let Err(e) = returner.give_back(token).await {
                        tracing::warn!(error = %e, "could not give an open transaction's items back at close; they come back when its hold ends");
                    }
                }
            });
            if !self.own.is_current() {
                let _ = given.await;
            }
        }
        self.stop();
    }

    fn stop(&self) {
        for task in self.background.lock().drain(..) {
            task.abort();
        }
        self.batcher.close();
        self.waiters.wake_all();
        self.own.end();
    }
}

/// Whether a failed call may have been applied: the connection was lost, or the answer did
/// not come in time, after the command was sent.
fn lost_in_flight(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    source
        .downcast_ref::<redis::RedisError>()
        .is_some_and(|e| e.is_connection_dropped() || e.is_timeout() || e.is_io_error())
}

/// The store's subscription to its wake channel: wakes this store's consumers waiting on each
/// queue a message names. Reconnects after a failure, waking every consumer then (a message
/// may have been lost meanwhile).
async fn subscribe(
    client: redis::Client,
    channel: String,
    waiters: Arc<Waiters>,
    instance: Arc<str>,
) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(50);
    loop {
        let pubsub = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match pubsub.await {
            Ok(pubsub) => {
                backoff = Duration::from_millis(50);
                // Subscribed: whatever was published while it was not may be missed.
                waiters.wake_all();
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    // `<queue>` (items given back), or `<queue>:<store>` (a commit).
                    let Ok(payload) = msg.get_payload::<String>() else {
                        continue;
                    };
                    let (queue, from) = match payload.split_once(':') {
                        Some((q, from)) => (q, Some(from)),
                        None => (payload.as_str(), None),
                    };
                    // This store woke its own waiters at its commit.
                    if from == Some(&*instance) {
                        continue;
                    }
                    if let Ok(q) = queue.parse::<i32>() {
                        waiters.wake_one(q, false);
                    }
                }
                tracing::debug!("the Redis subscription ended; reconnecting");
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not subscribe to the Redis wake channel");
            }
        }
        waiters.wake_all();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Every `interval`: takes back the items whose hold ended in the queues this store opened
/// (of clients that died, or of transactions whose hold ended), so that they come back
/// without waiting for a dequeue on their queue.
async fn reclaim_pass(caller: Arc<Caller>, opened: Arc<Mutex<Vec<i32>>>, interval: Duration) {
    let mut conn = caller.conn.clone();
    loop {
        tokio::time::sleep(interval).await;
        let queues = opened.lock().clone();
        if queues.is_empty() {
            continue;
        }
        let mut call = caller.call(|s| &s.reclaim);
        for q in queues {
            call.arg(q);
        }
        let reclaimed: redis::RedisResult<Value> = call.invoke_async(&mut conn).await;
        if let Err(e) = reclaimed {
            tracing::debug!(error = %e, "the Redis reclaim pass failed; trying again");
        }
    }
}
