//! How the committer answers a commit: [`Reply`], and [`Completion`] for blocked threads.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sync::process::{Condvar, Mutex};

/// Where a commit's outcome goes. A reply dropped without an answer (the committer stopped)
/// answers [`Error::Closed`], so no caller waits forever.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A thread blocked in `commit` or `Store::flush`.
    Blocking(Answer),
    /// A task awaiting `commit_async`; the receiving end of a oneshot reports a dropped sender.
    Async(tokio::sync::oneshot::Sender<Result<()>>),
}

impl Reply {
    /// Answers. The receiver may be gone (a cancelled `commit_async`): the outcome stands.
    pub(crate) fn send(self, result: Result<()>) {
        match self {
            Reply::Blocking(answer) => answer.0.complete(result),
            Reply::Async(tx) => drop(tx.send(result)),
        }
    }
}

/// How many times a waiting thread yields before it sleeps.
const YIELDS_BEFORE_PARKING: usize = 8;

/// A one-shot outcome a thread waits for, parked (no spinning: a committing thread can wait
/// for a whole fsync).
#[derive(Debug, Default)]
pub(crate) struct Completion {
    outcome: Mutex<Option<Result<()>>>,
    done: Condvar,
}

impl Completion {
    /// A completion and the reply that answers it.
    pub(crate) fn new() -> (Arc<Completion>, Reply) {
        let completion = Arc::new(Completion::default());
        (completion.clone(), Reply::Blocking(Answer(completion)))
    }

    fn complete(&self, result: Result<()>) {
        let mut outcome = self.outcome.lock();
        if outcome.is_none() {
            *outcome = Some(result);
            self.done.notify_one();
        }
    }

    /// Blocks until answered. A reply dropped unanswered answers `Error::Closed`.
    ///
    /// A commit usually waits for one sync of the disk (hundreds of microseconds), but under
    /// load its answer may already be on the way: yielding the processor a few times first
    /// avoids a sleep and a wake-up then, and costs little otherwise.
    pub(crate) fn wait(&self) -> Result<()> {
        for _ in 0..YIELDS_BEFORE_PARKING {
            if let Some(result) = self.outcome.lock().take() {
                return result;
            }
            std::thread::yield_now();
        }
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(result) = outcome.take() {
                return result;
            }
            self.done.wait(&mut outcome);
        }
    }
}

/// The answering side of a [`Completion`]; dropped unanswered, it answers `Error::Closed`.
#[derive(Debug)]
pub(crate) struct Answer(Arc<Completion>);

impl Drop for Answer {
    fn drop(&mut self) {
        self.0.complete(Err(Error::Closed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_thread_gets_the_answer() {
        let (completion, reply) = Completion::new();
        let answering = std::thread::spawn(move || reply.send(Ok(())));
        assert!(completion.wait().is_ok());
        answering.join().unwrap();
    }

    #[test]
    fn a_reply_dropped_unanswered_answers_closed() {
        let (completion, reply) = Completion::new();
        let dropping = std::thread::spawn(move || drop(reply));
        assert!(matches!(completion.wait(), Err(Error::Closed)));
        dropping.join().unwrap();
    }
}
