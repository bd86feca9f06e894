//! How the seam's operations map onto the Redis engine (`impl Engine`): the commit, the
//! take, and the waiting take. The handles reach these only through the engine's
//! operations, which choose them by the store's engine.

use std::time::Instant;

use super::line::Turn;
use super::redis::Redis;
use super::take::Found;
use super::{abort, drop_expired, Engine, Entry, Flavor, QueueRef, Work};
use crate::error::Result;

impl Engine {
    /// Redis's commit: the buffered enqueues and the items the transaction holds, in one
    /// script. The processing layer's moves are not served on Redis yet: such a commit is
    /// refused whole.
    pub(crate) async fn commit_on_redis(&self, rd: &Redis, mut work: Work) -> Result<()> {
        work.withdraw_leaked();
        if let Err(e) = self.check_open() {
            // Its slot's drop gives its items back.
            abort(work);
            return Err(e);
        }
        if let Err(e) = self.settle_deadline(&mut work) {
            // Its items were given back at the deadline (or are at its hold's end).
            drop_expired(work);
            return Err(e);
        }
        if !work.moves.is_empty() {
            abort(work);
            return Err(self.unsupported("the processing layer"));
        }
        let enqueues = std::mem::take(&mut work.enqueues).into_vec();
        let slot = std::mem::take(&mut work.rd);
        if enqueues.is_empty() && slot.token().is_none() {
            return Ok(());
        }
        rd.commit(slot, enqueues).await
    }

    /// Refuses `operation` of the processing layer on Redis, which does not serve it yet.
    pub(crate) fn redis_refuses(&self, operation: &'static str) -> Result<()> {
        match &self.flavor {
            Flavor::Redis(_) => Err(self.unsupported(operation)),
            _ => Ok(()),
        }
    }

    /// Redis's [`take`](Engine::take): this store's waiters first (a waiter woken for an
    /// item and still to look has it: see `Waiters`), then the script.
    pub(crate) async fn take_from_redis(
        &self,
        rd: &Redis,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        mut each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize> {
        work.withdraw_leaked();
        self.check_open()?;
        work.check_live()?;
        let id = rd.number(&queue.core)?;
        let turn = rd.line().try_turn(id);
        if turn == Turn::Wait {
            return Ok(0);
        }
        let taken = rd.take(&queue.core, &mut work.rd, n, None).await;
        self.arm_deadline(work);
        let taken = taken?;
        if turn == (Turn::Taken { sure: false }) && !taken.is_empty() {
            rd.line().pass_on(id);
        }
        for entry in &taken {
            each(entry)?;
        }
        Ok(taken.len())
    }

    /// Redis's waiting take: in the line of each queue (see `Waiters`), looks in each queue
    /// in order where no woken waiter is ahead of it; if none has an item, sleeps until a
    /// commit to any of them wakes it, the fallback poll or `deadline`, and looks again.
    pub(crate) async fn wait_on_redis<'a>(
        &self,
        rd: &Redis,
        queues: Vec<(usize, &'a QueueRef)>,
        work: &mut Work,
        deadline: Option<Instant>,
    ) -> Result<Option<Found<'a>>> {
        let refs: Vec<&QueueRef> = queues.iter().map(|(_, q)| *q).collect();
        let mut line = self.join_lines(rd, refs)?;
        // Noted by the transaction: should this future be leaked, its places are left
        // when the transaction ends or is used again.
        work.seats = Some(Box::new(line.seats().clone()));
        loop {
            for (i, &(index, queue)) in queues.iter().enumerate() {
                if !line.may_look(i) {
                    continue;
                }
                self.check_open()?;
                work.check_live()?;
                let ticket = Some(line.seats().ticket());
                let taken = rd.take(&queue.core, &mut work.rd, 1, ticket).await;
                self.arm_deadline(work);
                if let Some(entry) = taken?.into_iter().next() {
                    line.took(i);
                    work.seats = None;
                    return Ok(Some((index, queue, entry)));
                }
            }
            if line.watched().await {
                continue;
            }
            if !line.sleep(deadline).await? {
                work.seats = None;
                return Ok(None);
            }
        }
    }
}
