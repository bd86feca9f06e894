//! The seam's calls that serve both server engines (`impl Engine`) through their [`Host`]: a
//! lease that may wait, and a waiting consumer's place in its queues' lines ([`InLine`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::line::{wait_for, watched, Granted, Host, Seats, Turn};
use super::{Engine, Entry, QueueRef, Work};
use crate::core::QueueCore;
use crate::error::Result;

impl Engine {
    /// A server engine's lease of up to `n` items of the first of `queues` (in their order)
    /// that has any, for `ttl` ms; with `wait`, waits for the first (woken like a waiting
    /// take) until `deadline`, if any. `None` only without `wait` or past the deadline.
    pub(crate) async fn lease_on_server<'q>(
        &self,
        host: &dyn Host,
        queues: &[(usize, &'q QueueRef)],
        n: usize,
        ttl: u64,
        wait: bool,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<(usize, &'q QueueRef, Vec<Granted>)>> {
        if !wait {
            self.check_open()?;
            for &(index, queue) in queues {
                let look = host.lease(&queue.core, n, ttl, None);
                match self.in_turn(host, queue, look).await? {
                    Some(granted) if !granted.is_empty() => {
                        return Ok(Some((index, queue, granted)))
                    }
                    _ => {}
                }
            }
            return Ok(None);
        }
        let mut line = self.join_lines(host, queues.iter().map(|(_, q)| *q).collect())?;
        loop {
            self.check_open()?;
            for (i, &(index, queue)) in queues.iter().enumerate() {
                if !line.may_look(i) {
                    continue;
                }
                let granted = host
                    .lease(&queue.core, n, ttl, Some(line.seats().ticket()))
                    .await?;
                if !granted.is_empty() {
                    line.took(i);
                    return Ok(Some((index, queue, granted)));
                }
            }
            if line.watched().await {
                continue;
            }
            if !line.sleep(deadline).await? {
                return Ok(None);
            }
        }
    }

    /// A server engine's [`take`](Engine::take): this store's waiters first (a waiter woken
    /// for an item and still to look has it: see `Waiters`), then the engine's take.
    pub(crate) async fn take_from_server(
        &self,
        host: &impl TakeInto,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize> {
        work.withdraw_leaked();
        self.check_open()?;
        work.check_live()?;
        let look = self.take_on_server(host, queue, work, n, None);
        self.take_in_turn(host, queue, look, each).await
    }

    /// The engine's take of up to `n` items of `queue` into `work`, between the checks that
    /// the store and the transaction are open and the arming of the transaction's deadline.
    async fn take_on_server(
        &self,
        host: &impl TakeInto,
        queue: &QueueRef,
        work: &mut Work,
        n: usize,
        waiter: Option<u64>,
    ) -> Result<Vec<Entry>> {
        self.check_open()?;
        work.check_live()?;
        let taken = host.take_into(&queue.core, work, n, waiter).await;
        self.arm_deadline(work);
        taken
    }

    /// A server engine's take that is not a waiter's: this store's waiters first (a waiter
    /// woken for an item and still to look has it: see `Waiters`), then `look` (not polled
    /// when a waiter ahead has the turn); each item it took is handed to `each`.
    async fn take_in_turn<F>(
        &self,
        host: &dyn Host,
        queue: &QueueRef,
        look: F,
        mut each: impl FnMut(&Entry) -> Result<()>,
    ) -> Result<usize>
    where
        F: std::future::Future<Output = Result<Vec<Entry>>>,
    {
        let taken = self.in_turn(host, queue, look).await?.unwrap_or_default();
        for entry in &taken {
            each(entry)?;
        }
        Ok(taken.len())
    }

    /// `look` (a take or a lease of `queue` that is not a waiter's) when this store's line
    /// gives it the turn; `None`, without polling `look`, when a woken waiter ahead has it.
    /// A look on a turn taken from a stalled waiter holds the line's first waiter's own poll
    /// until it ends; one that took items on a turn that was not surely its own passes the
    /// turn on.
    async fn in_turn<T>(
        &self,
        host: &dyn Host,
        queue: &QueueRef,
        look: impl std::future::Future<Output = Result<Vec<T>>>,
    ) -> Result<Option<Vec<T>>> {
        let id = host.key(&queue.core)?;
        let (turn, mut taking) = host.line().try_turn(id);
        if turn == Turn::Wait {
            return Ok(None);
        }
        let taken = look.await?;
        if let Some(taking) = &mut taking {
            taking.took = !taken.is_empty();
        }
        Ok(Some(taken))
    }

    /// A server engine's waiting take: in the line of each of `queues` (see `Waiters`),
    /// `look`s (a take of one item, with the waiter's ticket) in each queue in order where no
    /// woken waiter is ahead of it; if none has an item, sleeps until a commit to any of them
    /// wakes it, the fallback poll or `deadline`, and looks again. What it found: the
    /// queue's index in the caller's list, the queue and the item (`take::Found`).
    pub(crate) async fn wait_in_line<'a>(
        &self,
        host: &impl TakeInto,
        queues: Vec<(usize, &'a QueueRef)>,
        work: &mut Work,
        deadline: Option<Instant>,
    ) -> Result<Option<(usize, &'a QueueRef, Entry)>> {
        let refs: Vec<&QueueRef> = queues.iter().map(|(_, q)| *q).collect();
        let mut line = self.join_lines(host, refs)?;
        // Noted by the transaction: should this future be leaked, its places are left
        // when the transaction ends or is used again.
        work.seats = Some(Box::new(line.seats().clone()));
        let ticket = Some(line.seats().ticket());
        loop {
            for (i, &(index, queue)) in queues.iter().enumerate() {
                if !line.may_look(i) {
                    continue;
                }
                let taken = self.take_on_server(host, queue, work, 1, ticket).await?;
                if let Some(entry) = taken.into_iter().next() {
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

    /// Puts a consumer in the line of each of `queues` (one queue, or a queue set), with
    /// one ticket: its place in every line. Where it is the first, the listener is asked
    /// to watch the queue (see [`InLine::watched`]).
    pub(crate) fn join_lines<'e>(
        &'e self,
        host: &'e dyn Host,
        queues: Vec<&'e QueueRef>,
    ) -> Result<InLine<'e>> {
        let (ticket, wake) = host.line().ticket();
        let mut seats = Seats::new(host.line(), ticket);
        let mut ids = Vec::with_capacity(queues.len());
        let mut acks = Vec::new();
        for queue in queues {
            let id = host.key(&queue.core)?;
            seats.note(id);
            acks.extend(host.line().join(id, ticket, &wake));
            ids.push((queue, id));
        }
        Ok(InLine {
            engine: self,
            host,
            queues: ids,
            seats,
            wake,
            acks,
        })
    }

    /// How long a waiting consumer that found nothing waits for a wake-up before it looks
    /// again: until the next delayed item or lease of the queue falls due, at most the
    /// fallback poll, never past `deadline` (`None`: the deadline has passed).
    async fn next_look(
        &self,
        host: &dyn Host,
        queue: &QueueRef,
        deadline: Option<Instant>,
    ) -> Result<Option<Duration>> {
        let mut wait = host.poll_interval();
        if !self.config().clock.is_manual() {
            if let Some(due) = host.next_due(&queue.core).await? {
                wait = wait.min(Duration::from_millis(due.max(1)));
            }
        }
        Ok(match deadline {
            None => Some(wait),
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left.min(wait)),
                _ => None,
            },
        })
    }
}

/// A server engine's own take into a transaction: what the shared takes
/// ([`Engine::take_from_server`], [`Engine::wait_in_line`]) call.
pub(crate) trait TakeInto: Host {
    /// Up to `n` items at the head of `core`'s queue into `work`'s transaction on the server,
    /// in queue order (`waiter`: the ticket of the waiting consumer that looks).
    fn take_into<'l>(
        &'l self,
        core: &'l QueueCore,
        work: &'l mut Work,
        n: usize,
        waiter: Option<u64>,
    ) -> impl std::future::Future<Output = Result<Vec<Entry>>> + Send + 'l;
}

/// A consumer waiting on a server engine: its place in the line of each of its queues (one
/// queue, or a queue set), left when it is dropped or takes an item.
pub(crate) struct InLine<'e> {
    engine: &'e Engine,
    host: &'e dyn Host,
    queues: Vec<(&'e QueueRef, i32)>,
    seats: Seats,
    wake: Arc<Notify>,
    /// The listener's answers still to come for the queues whose line this consumer
    /// started.
    acks: Vec<oneshot::Receiver<()>>,
}

impl InLine<'_> {
    /// The consumer's places, for its transaction to note: a wait whose future is leaked
    /// leaves the lines when its transaction ends or is used again.
    pub(crate) fn seats(&self) -> &Seats {
        &self.seats
    }

    /// May the consumer look in its `i`th queue now (no waiter woken before it is still to
    /// look)? A consumer whose turn was taken (it did not look in time) joins again at its
    /// place first.
    pub(crate) fn may_look(&self, i: usize) -> bool {
        let (id, ticket) = (self.queues[i].1, self.seats.ticket());
        let line = self.host.line();
        for _ in 0..2 {
            match line.turn(id, ticket) {
                Turn::Look | Turn::Taken { .. } => return true,
                Turn::Wait => {
                    // Waiting behind one that holds the line up: counted as waiting.
                    line.waits(id, ticket);
                    return false;
                }
                Turn::Gone => {
                    // The listener's watch is taken again if this made the line non-empty;
                    // until then the fallback poll stands in for a missed wake-up.
                    drop(line.join(id, ticket, &self.wake));
                }
            }
        }
        true
    }

    /// Waits for the listener to watch the queues whose line this consumer started (at
    /// most the fallback poll): true if it had to, and the consumer looks again then, as a
    /// commit of another store between its look and the listener's watch woke nobody.
    pub(crate) async fn watched(&mut self) -> bool {
        if self.acks.is_empty() {
            return false;
        }
        for ack in std::mem::take(&mut self.acks) {
            watched(self.host.runtime(), ack, self.host.poll_interval()).await;
        }
        true
    }

    /// The consumer took an item from its `i`th queue: it leaves every line, and the next
    /// waiter of that queue looks too (the commit may have brought more).
    pub(crate) fn took(mut self, i: usize) {
        let id = self.queues[i].1;
        self.seats.leave_all(Some(id));
    }

    /// Sleeps until a commit to one of the queues wakes the consumer, the first of them has
    /// an item falling due, the fallback poll, or `deadline`. False once the deadline has
    /// passed.
    pub(crate) async fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
        self.engine.check_open()?;
        let mut wait = None;
        for (queue, _) in &self.queues {
            match self.engine.next_look(self.host, queue, deadline).await? {
                None => return Ok(false),
                Some(w) => wait = Some(wait.map_or(w, |v: Duration| v.min(w))),
            }
        }
        wait_for(
            self.host.runtime(),
            &self.wake,
            wait.unwrap_or(self.host.poll_interval()),
        )
        .await;
        Ok(true)
    }
}
