//! A store's takes and commits, coalesced. The calls that come while earlier ones are at the
//! server go together in one call of the library's `batch` function, which runs them one
//! after the other and writes once what each of them would write again (held counts,
//! wake-ups, the end of holds, the plain enqueues of one queue): on the server, the call's
//! own cost and those writes are paid once for the group, as for the items of one large
//! transaction. A call that comes alone goes alone, as its own function: nothing waits to
//! fill a group.
//!
//! Each call keeps its own answer and its own failure: a group is not a transaction, and a
//! call that fails (a key tampered with) fails alone. A group lost in flight leaves the
//! outcome of each of its calls unknown, as a lost call of its own would.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::{oneshot, Notify, Semaphore};

use super::scripts::{now_arg, Script};
use crate::clock::Clock;
use crate::engine::line::{Call, Calls};
use crate::error::{Error, Result};
use crate::sync::process::Mutex;

/// How many groups may be at the server at once (1 to 16 measured: BENCHMARKS.md §16).
const IN_FLIGHT: usize = 4;

/// A group takes calls until their arguments reach this many (a call with more goes
/// alone), and no more than [`MAX_CALLS`] calls.
const MAX_ARGS: usize = 4096;
const MAX_CALLS: usize = 256;

/// The calls that go in groups.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Take,
    Commit,
}

impl Kind {
    /// The function's name in the library (its `BODIES`).
    fn name(self) -> &'static str {
        match self {
            Kind::Take => "take",
            Kind::Commit => "commit",
        }
    }

    fn script(self, to: &Sender) -> &Script {
        match self {
            Kind::Take => &to.take,
            Kind::Commit => &to.commit,
        }
    }
}

/// Where the groups go: the store's connection and catalog key, the functions, and the
/// arguments every function gets first (the prefix, the time, the store's name).
pub(super) struct Sender {
    pub(super) conn: ConnectionManager,
    pub(super) take: Script,
    pub(super) commit: Script,
    pub(super) batch: Script,
    pub(super) key: Arc<str>,
    pub(super) prefix: Arc<str>,
    pub(super) instance: Arc<str>,
    pub(super) clock: Clock,
}

/// What a call's task does with its answer before its caller gets it (see
/// `Redis::script`).
type Then = Box<dyn FnOnce(&RedisResult<Value>) + Send>;

/// One call waiting for its group.
struct Job {
    kind: Kind,
    args: Vec<Vec<u8>>,
    then: Then,
    answer: oneshot::Sender<RedisResult<Value>>,
    /// Counted among the store's calls until answered (a close lets it finish).
    _call: Call,
}

/// The calls waiting to be sent (`None` once the store closed), and where they go.
pub(super) struct Batcher {
    jobs: Mutex<Option<Vec<Job>>>,
    ready: Notify,
    to: Sender,
}

impl Batcher {
    pub(super) fn new(to: Sender) -> Batcher {
        Batcher {
            jobs: Mutex::new(Some(Vec::new())),
            ready: Notify::new(),
            to,
        }
    }

    /// Runs call `kind` with `args` (after the prefix, time and store every function gets)
    /// in the next group; `then` sees the answer first. The call runs on to its end when the
    /// caller's future is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the store closed; the call's own answer or error inside.
    pub(super) async fn call(
        &self,
        calls: &Arc<Calls>,
        kind: Kind,
        args: Vec<Vec<u8>>,
        then: impl FnOnce(&RedisResult<Value>) + Send + 'static,
    ) -> Result<RedisResult<Value>> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            kind,
            args,
            then: Box::new(then),
            answer,
            _call: calls.start()?,
        };
        match self.jobs.lock().as_mut() {
            Some(jobs) => jobs.push(job),
            None => return Err(Error::Closed),
        }
        self.ready.notify_one();
        match answered.await {
            Ok(got) => Ok(got),
            // Dropped unsent: the store closed.
            Err(_) => Err(Error::Closed),
        }
    }

    /// The calls waiting now, as many as one group takes; waits for one if there is none.
    async fn next(&self) -> Option<Vec<Job>> {
        loop {
            {
                let mut jobs = self.jobs.lock();
                let jobs = jobs.as_mut()?;
                if !jobs.is_empty() {
                    let mut args = 0;
                    let mut n = 0;
                    for job in jobs.iter() {
                        args += job.args.len() + 2;
                        if n > 0 && (args > MAX_ARGS || n == MAX_CALLS) {
                            break;
                        }
                        n += 1;
                    }
                    return Some(jobs.drain(..n).collect());
                }
            }
            self.ready.notified().await;
        }
    }

    /// The store closed: the calls not sent are dropped (their callers get `Closed`), and
    /// no more are taken.
    pub(super) fn close(&self) {
        drop(self.jobs.lock().take());
        self.ready.notify_one();
    }
}

/// The store's sender (a task on its runtime): sends each group when fewer than
/// [`IN_FLIGHT`] are at the server; ends when the store closes.
pub(super) async fn send_groups(batcher: Arc<Batcher>) {
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(permit) = Arc::clone(&room).acquire_owned().await else {
            return;
        };
        let Some(jobs) = batcher.next().await else {
            return;
        };
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move {
            send(&batcher.to, jobs).await;
            drop(permit);
        });
    }
}

/// Sends `jobs` (one call of its own function, or several in one call of `batch`) and hands
/// each its answer.
async fn send(to: &Sender, jobs: Vec<Job>) {
    let mut conn = to.conn.clone();
    let now = now_arg(&to.clock);
    let answers: Vec<RedisResult<Value>> = match jobs.as_slice() {
        [job] => {
            let mut call = job.kind.script(to).key(&to.key);
            call.arg(&*to.prefix).arg(now).arg(&*to.instance);
            for a in &job.args {
                call.arg(a.as_slice());
            }
            vec![call.invoke_async(&mut conn).await]
        }
        _ => {
            let mut call = to.batch.key(&to.key);
            call.arg(&*to.prefix)
                .arg(now)
                .arg(&*to.instance)
                .arg(jobs.len());
            for job in &jobs {
                call.arg(job.kind.name()).arg(job.args.len());
                for a in &job.args {
                    call.arg(a.as_slice());
                }
            }
            match call.invoke_async::<Value>(&mut conn).await {
                Ok(Value::Array(parts)) if parts.len() == jobs.len() => parts
                    .into_iter()
                    .map(|part| match part {
                        Value::ServerError(e) => Err(RedisError::from(e)),
                        part => Ok(part),
                    })
                    .collect(),
                Ok(_) => {
                    let e = RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "the batch function's answer is malformed",
                    ));
                    vec![Err(e); jobs.len()]
                }
                Err(e) => vec![Err(e); jobs.len()],
            }
        }
    };
    for (job, got) in jobs.into_iter().zip(answers) {
        (job.then)(&got);
        let _ = job.answer.send(got);
    }
}
