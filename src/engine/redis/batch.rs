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

use redis::{RedisError, RedisResult, Value};
use tokio::sync::{oneshot, Notify, Semaphore};

use super::scripts::{Caller, Script, Scripts};
use crate::engine::line::{Call, Calls};
use crate::error::{Error, Result};
use crate::sync::process::Mutex;

/// How many groups may be at the server at once (1 to 16 measured: BENCHMARKS.md §16).
const IN_FLIGHT: usize = 4;

/// A group takes calls until their arguments reach this many (a call with more goes
/// alone), and no more than [`MAX_CALLS`] calls.
const MAX_ARGS: usize = 4096;
const MAX_CALLS: usize = 256;

/// What a call's task does with its answer before its caller gets it (see
/// `Redis::script`).
type Then = Box<dyn FnOnce(&RedisResult<Value>) + Send>;

/// One call waiting for its group.
struct Job {
    which: fn(&Scripts) -> &Script,
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
    caller: Arc<Caller>,
}

impl Batcher {
    pub(super) fn new(caller: Arc<Caller>) -> Batcher {
        Batcher {
            jobs: Mutex::new(Some(Vec::new())),
            ready: Notify::new(),
            caller,
        }
    }

    /// Runs function `which` with `args` (after the prefix, time and store every function
    /// gets) in the next group; `then` sees the answer first. The call runs on to its end when the
    /// caller's future is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the store closed; the call's own answer or error inside.
    pub(super) async fn call(
        &self,
        calls: &Arc<Calls>,
        which: fn(&Scripts) -> &Script,
        args: Vec<Vec<u8>>,
        then: impl FnOnce(&RedisResult<Value>) + Send + 'static,
    ) -> Result<RedisResult<Value>> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            which,
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
            send(&batcher.caller, jobs).await;
            drop(permit);
        });
    }
}

/// Sends `jobs` (one call of its own function, or several in one call of `batch`) and hands
/// each its answer.
async fn send(caller: &Caller, jobs: Vec<Job>) {
    let mut conn = caller.conn.clone();
    let answers: Vec<RedisResult<Value>> = match jobs.as_slice() {
        [job] => {
            let mut call = caller.call(job.which);
            for a in &job.args {
                call.arg(a.as_slice());
            }
            vec![call.invoke_async(&mut conn).await]
        }
        _ => {
            let mut call = caller.call(|s| &s.batch);
            call.arg(jobs.len());
            for job in &jobs {
                let name = (job.which)(&caller.scripts).name();
                call.arg(name).arg(job.args.len());
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
