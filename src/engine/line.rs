//! What the server engines (PostgreSQL, Redis) share below the seam: the line of a store's
//! waiting consumers per queue ([`Waiters`]), each waiter's places ([`Seats`]), a granted
//! lease ([`Granted`]), what the seam's calls for both need of an engine ([`Host`]), the
//! calls a close waits for ([`Calls`]) and the runtime they run on ([`OwnThread`]). The
//! engine's listener (PostgreSQL's `LISTEN`ing connection, Redis's subscription) wakes the
//! waiters for the other stores' commits; the engine wakes them for its own.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use std::future::Future;
use std::pin::Pin;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::core::QueueCore;
use crate::error::{Error, Result};
use crate::sync::process::Mutex;

/// This store's consumers waiting on each queue (by the queue's number on the server: its
/// database id, its Redis number), each queue's in a line, and the line to the listener
/// task.
///
/// The line is how this process keeps first come, first served among its own consumers
/// (FoundationDB's staging, with the waiter's turn in the place of the item): each item a
/// commit of this store makes visible wakes the first waiter of its queue's line not woken
/// for an item yet (a *sure* wake); a notification of another store's commit (one per
/// commit) or a fallback poll wakes one waiter that, if it takes an item, wakes the next, as
/// there may be more (a waiter whose look is in flight is passed over then). Woken waiters
/// look one after the other, in their order (a woken waiter behind one that is still to look,
/// or is looking, waits for it). While a waiter is woken and has not started to look, this
/// process's other takes of the queue (a `try_dequeue`, a waiter behind it) find nothing;
/// beside a look in flight, a take that is not a woken waiter's (a `try_dequeue`, a waiter's
/// first look) looks too, as `SKIP LOCKED` gives each its own rows (so a backlog is taken by
/// every consumer at once, not one look at a time). Behind a waiter that is woken and has not
/// started to look, a take of its
/// own (not a waiter's, a waiter's first look, or one woken by a commit) is a *miss*, and the
/// second miss since it was woken takes its turn away (it leaves the line), so that a leaked
/// or stalled waiter holds nothing up for long (the embedded engines' rule for an item handed
/// to a request nobody polls). Other processes' consumers are not in the line: between
/// processes, order is best effort.
#[derive(Debug)]
pub(crate) struct Waiters {
    lines: Mutex<Lines>,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Debug, Default)]
struct Lines {
    queues: HashMap<i32, Line>,
    /// The next waiter's ticket: a waiter's place in every line it joins.
    next_ticket: u64,
}

/// One queue's waiting consumers of this store, in the order they came (by ticket).
#[derive(Debug, Default)]
struct Line {
    places: VecDeque<Place>,
    /// A miss just took a woken waiter's turn, and no other is woken: the waiter woken next
    /// (by the take that follows) has one miss counted already, so that `n` stalled waiters
    /// lose their turns to `n + 1` misses, as on the embedded engines.
    taken: bool,
    /// Takes looking now on a turn they took from a stalled waiter ([`TakenTurn`]): the
    /// first waiter's look without a wake waits for them, as they look for the item that
    /// waiter was woken for.
    taking: usize,
}

#[derive(Debug)]
struct Place {
    ticket: u64,
    wake: Arc<Notify>,
    /// Woken by a commit (or a waiter before it that took an item), and not looking yet.
    woken: bool,
    /// Woken by a commit to the queue (an item is there for it), not only by a waiter
    /// before it that took one (the commit may have brought more).
    sure: bool,
    /// Its look (or the one in flight) is for a commit's wake ([`Place::sure`]): an item it
    /// takes is the one that commit woke it for, and nobody else need look.
    turn_sure: bool,
    /// Looking for an item now (between its turn and the look's end).
    looking: bool,
    /// Misses since it was woken: the second takes its turn.
    misses: u8,
    /// Has counted a miss against a waiter ahead since its own last look.
    missed: bool,
    /// Has looked and found nothing (or was told to wait): counted among the queue's
    /// waiters from then on.
    counted: bool,
}

impl Place {
    /// Holds the line up: the takes behind it wait for it.
    fn holds_up(&self) -> bool {
        self.woken || self.looking
    }
}

/// What a take on a queue may do now (see [`Waiters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Look.
    Look,
    /// Look, in the turn of a waiter that did not take it in time; `sure` if a commit of
    /// this store woke that waiter (an item was there for it). Where not, an item taken
    /// wakes the next waiter, as there may be more ([`TakenTurn`]).
    Taken { sure: bool },
    /// Do not look: a waiter ahead is woken or looking.
    Wait,
    /// The waiter is not in the line any more (its turn was taken): it joins again, at its
    /// place.
    Gone,
}

impl Line {
    /// Wakes the first waiter not woken yet (`sure`: by a commit, the first not woken by a
    /// commit yet). With `lookers`, one that is looking is woken too: its look may have
    /// started before the change that wakes it (a commit), so it looks again. Without (a
    /// waiter that took an item passes on: there may be more), a waiter whose look is in
    /// flight is passed over: that look sees what the taker left.
    fn wake_next(&mut self, sure: bool, lookers: bool) {
        let misses = u8::from(std::mem::take(&mut self.taken));
        if let Some(place) = self
            .places
            .iter_mut()
            .find(|p| (!p.woken && (lookers || !p.looking)) || (sure && !p.sure))
        {
            if !place.woken {
                place.misses = misses;
            }
            place.woken = true;
            place.sure |= sure;
            place.wake.notify_one();
        }
    }

    /// A look ended: the first woken waiter, if none ahead of it holds the line up any
    /// more, may look now.
    fn go_on(&self) {
        if let Some(place) = self.places.iter().find(|p| p.holds_up()) {
            if place.woken {
                place.wake.notify_one();
            }
        }
    }

    /// A take held up by the first waiter ahead of `ahead_of` that holds the line up. For
    /// one that is looking, it waits where `lookers` hold it up (a woken waiter's look,
    /// which keeps the order of the wakes), else it looks beside it: a take that is not a
    /// woken waiter's (a `try_dequeue`, a waiter's first look), for which `SKIP LOCKED`
    /// gives each look its own rows, so that a backlog is taken by every consumer at once
    /// rather than one look at a time. For one that is woken and has not started to look,
    /// it is a miss where the take `counts` (see [`Waiters::turn`]), and on the second one
    /// it takes that waiter's turn (the waiter leaves the line, and is told).
    fn miss(&mut self, ahead_of: u64, counts: bool, lookers: bool) -> (Turn, bool) {
        let Some(at) = self
            .places
            .iter()
            .position(|p| p.holds_up() && p.ticket < ahead_of)
        else {
            return (Turn::Look, false);
        };
        let place = &mut self.places[at];
        if !place.woken {
            // A look in flight.
            let turn = if lookers { Turn::Wait } else { Turn::Look };
            return (turn, false);
        }
        if !counts {
            return (Turn::Wait, false);
        }
        place.misses = place.misses.saturating_add(1);
        if place.misses < 2 {
            return (Turn::Wait, true);
        }
        let removed = self.places.remove(at);
        // Told at once, so that it joins again (at its place) rather than at its poll.
        if let Some(p) = &removed {
            p.wake.notify_one();
        }
        let sure = removed.is_some_and(|p| p.sure);
        // The next woken waiter, or the one the take that follows wakes, has had its first
        // miss: misses take the turns of stalled waiters one each.
        match self.places.iter_mut().find(|p| p.woken) {
            Some(next) => next.misses = next.misses.max(1),
            None => self.taken = true,
        }
        (Turn::Taken { sure }, true)
    }
}

/// What the listener is asked to do: bring its advisory lock on a queue in line with the
/// number of consumers waiting on it (and answer once it holds it).
#[derive(Debug)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))] // Redis's subscription watches all
pub(crate) enum Command {
    Watch(i32, oneshot::Sender<()>),
    Unwatch(i32),
    /// Items became visible in these queues (a commit, a release): notify the stores with
    /// consumers waiting on them. Sent after the change is committed.
    Notify(Vec<i32>),
}

impl Waiters {
    /// No consumer waits yet; the receiving end of the line is the listener's.
    pub(crate) fn new() -> (Arc<Waiters>, mpsc::UnboundedReceiver<Command>) {
        let (commands, listened) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters {
            lines: Mutex::new(Lines::default()),
            commands,
        });
        (waiters, listened)
    }

    /// A new waiter's ticket and what wakes it (one for every queue it waits on).
    pub(crate) fn ticket(&self) -> (u64, Arc<Notify>) {
        let mut lines = self.lines.lock();
        lines.next_ticket += 1;
        (lines.next_ticket, Arc::new(Notify::new()))
    }

    /// Puts waiter `ticket` in `queue`'s line, at its place (after the waiters that came
    /// before it). Before it first looks for an item, the waiter waits for the returned
    /// receiver (when there is one): then the listener holds the advisory lock that makes
    /// committers notify this queue, so a commit after that look is never missed.
    pub(crate) fn join(
        &self,
        queue: i32,
        ticket: u64,
        wake: &Arc<Notify>,
    ) -> Option<oneshot::Receiver<()>> {
        let first = {
            let mut lines = self.lines.lock();
            let line = lines.queues.entry(queue).or_default();
            let at = line.places.partition_point(|p| p.ticket < ticket);
            if line.places.get(at).is_some_and(|p| p.ticket == ticket) {
                return None;
            }
            line.places.insert(
                at,
                Place {
                    ticket,
                    wake: Arc::clone(wake),
                    woken: false,
                    sure: false,
                    turn_sure: false,
                    looking: false,
                    misses: 0,
                    missed: false,
                    counted: false,
                },
            );
            line.places.len() == 1
        };
        first.then(|| {
            let (ack, acked) = oneshot::channel();
            // A listener gone (store closing) leaves the receiver closed: no wait.
            let _ = self.commands.send(Command::Watch(queue, ack));
            acked
        })
    }

    /// May waiter `ticket` look in `queue` now? Behind one that holds the line up it waits
    /// (and is told when to go on), counting a miss where that one has not started to look.
    /// Looking, it is not woken any more.
    pub(crate) fn turn(&self, queue: i32, ticket: u64) -> Turn {
        let mut lines = self.lines.lock();
        let Some(line) = lines.queues.get_mut(&queue) else {
            return Turn::Gone;
        };
        let Some(me) = line.places.iter().position(|p| p.ticket == ticket) else {
            return Turn::Gone;
        };
        let place = &line.places[me];
        // Without a wake, only the first of the line looks again (at its fallback poll, or
        // when the listener reconnects), and only while no other waiter has the turn: the
        // others have looked since they came, and a look of theirs could take the item a
        // commit is about to hand the first, or the one a take that missed twice is
        // looking for.
        if !place.woken
            && place.counted
            && (me > 0 || line.taking > 0 || line.places.iter().skip(1).any(Place::holds_up))
        {
            return Turn::Wait;
        }
        // A waiter counts one miss per look: woken again while still held up, it waits
        // without counting another. Only a look of its own counts: its first (it has not
        // waited yet), or one a commit woke it for. One woken by a waiter before it that
        // took an item (there may be more) waits behind a woken waiter without a miss: the
        // line's order stays, and a waiter slow to look loses its turn only to takes that
        // found the queue's items held up.
        let counts = !place.counted || (place.woken && place.sure);
        let (turn, counted) = if place.missed && line.places.iter().take(me).any(Place::holds_up) {
            (Turn::Wait, false)
        } else {
            // Only a waiter's first look (not woken, not counted) looks beside lookers.
            line.miss(ticket, counts, place.woken || place.counted)
        };
        // A turn taken from the waiter ahead (`Taken`) removed that one, before this one.
        let me = match turn {
            Turn::Taken { .. } => me.saturating_sub(1),
            _ => me,
        };
        let Some(place) = line.places.get_mut(me) else {
            return turn;
        };
        debug_assert_eq!(place.ticket, ticket, "a miss removes a place ahead only");
        place.missed |= counted;
        if turn != Turn::Wait {
            // Looking now. A look for its turn is not counted among the waiters until it has
            // found nothing; the first waiter's look without a wake (its fallback poll) is.
            place.counted &= !place.woken;
            place.turn_sure = place.sure;
            place.woken = false;
            place.sure = false;
            place.looking = true;
            place.missed = false;
        }
        turn
    }

    /// May a take that is not a waiter's (`try_dequeue`, a lease that does not wait) look
    /// in `queue` now? With [`Turn::Taken`], the returned [`TakenTurn`] is to be kept while
    /// the take looks.
    pub(crate) fn try_turn(&self, queue: i32) -> (Turn, Option<TakenTurn<'_>>) {
        let mut lines = self.lines.lock();
        let Some(line) = lines.queues.get_mut(&queue) else {
            return (Turn::Look, None);
        };
        let (turn, _) = line.miss(u64::MAX, true, false);
        let Turn::Taken { sure } = turn else {
            return (turn, None);
        };
        // Until its look ends (`turn_ended`). A waiter that takes a turn is in the line
        // already, looking, and holds it up as such.
        line.taking += 1;
        let taken = TakenTurn {
            waiters: self,
            queue,
            sure,
            took: false,
        };
        (turn, Some(taken))
    }

    /// A take's look on a turn taken from a stalled waiter ended (see [`TakenTurn`]).
    fn turn_ended(&self, queue: i32, sure: bool, took: bool) {
        if let Some(line) = self.lines.lock().queues.get_mut(&queue) {
            line.taking = line.taking.saturating_sub(1);
            if took && !sure {
                // The waiter it was taken from was woken by another store's commit or a
                // waiter before it, not surely for one item: the next waiter looks too, as
                // there may be more (waiters are woken one at a time, each by the one before).
                line.wake_next(false, false);
            } else if !took && sure {
                // The item a commit of this store woke that waiter for may still be there.
                line.wake_next(true, true);
            }
            line.go_on();
        }
    }

    /// Takes waiter `ticket` out of `queue`'s line; if it held the line up (woken, or
    /// looking) or `took` an item, the next waiter is woken in its place.
    pub(crate) fn leave(&self, queue: i32, ticket: u64, took: bool) {
        let empty = {
            let mut lines = self.lines.lock();
            let Some(line) = lines.queues.get_mut(&queue) else {
                return;
            };
            let Some(at) = line.places.iter().position(|p| p.ticket == ticket) else {
                return;
            };
            let Some(left) = line.places.remove(at) else {
                return;
            };
            if left.woken {
                // A wake it did not use goes to the next waiter as it was.
                line.wake_next(left.sure, true);
            } else if left.looking && !took {
                // Gone during its look (given up, or its look failed): the item that look
                // was for may still be there.
                line.wake_next(left.turn_sure, true);
            } else if took && !left.turn_sure {
                // It looked without a wake of this store's commit (the listener's, one per
                // commit of another store; its fallback poll): there may be more.
                line.wake_next(false, false);
            }
            if left.holds_up() || took {
                line.go_on();
            }
            line.places.is_empty()
        };
        if empty {
            let _ = self.commands.send(Command::Unwatch(queue));
        }
    }

    /// Waiter `ticket`'s look in `queue` ended, having `took` an item or not (noted by the
    /// look's task, so a waiter whose future is leaked with its look in flight holds nobody
    /// up): one that found nothing counts among the queue's waiters from now on; the woken
    /// waiter behind it may look.
    pub(crate) fn looked(&self, queue: i32, ticket: u64, took: bool) {
        if let Some(line) = self.lines.lock().queues.get_mut(&queue) {
            if let Some(place) = line.places.iter_mut().find(|p| p.ticket == ticket) {
                place.counted = !took;
                place.looking = false;
            }
            line.go_on();
        }
    }

    /// Waiter `ticket` waits behind one that holds the line up: it counts among the
    /// queue's waiters.
    pub(crate) fn waits(&self, queue: i32, ticket: u64) {
        if let Some(line) = self.lines.lock().queues.get_mut(&queue) {
            if let Some(place) = line.places.iter_mut().find(|p| p.ticket == ticket) {
                place.counted = true;
            }
        }
    }

    /// This store's consumers waiting on `queue` now: in its line, having looked and found
    /// nothing, and not woken or looking for its turn (such a consumer may take an item with
    /// its next look, so it is not counted until that look has found nothing).
    pub(crate) fn count(&self, queue: i32) -> usize {
        self.lines.lock().queues.get(&queue).map_or(0, |l| {
            l.places.iter().filter(|p| p.counted && !p.woken).count()
        })
    }

    /// Wakes this store's waiters on `queues` and has the listener notify the other stores'
    /// (see `Postgres::notify`).
    pub(crate) fn notify(&self, queues: Vec<i32>) {
        if queues.is_empty() {
            return;
        }
        // This store's own waiters at once: the notification the listener sends is for the
        // other stores (its own lock on a queue this store waits on hides this store from
        // the "anyone waiting?" check, and the listener drops what it sent itself).
        for queue in &queues {
            self.wake_one(*queue, true);
        }
        // A listener gone (store closing) has nobody left to wake.
        let _ = self.commands.send(Command::Notify(queues));
    }

    /// Items became visible in `queue`: its first waiter not woken yet is woken. `sure`: by
    /// this store's commit, one wake per item; else (the listener's notification, one per
    /// commit of another store) the waiter that takes an item wakes the next.
    pub(crate) fn wake_one(&self, queue: i32, sure: bool) {
        if let Some(line) = self.lines.lock().queues.get_mut(&queue) {
            line.taken = false;
            line.wake_next(sure, true);
        }
    }

    /// Wakes every consumer (the listener reconnected, or the store is closing): each looks
    /// for an item once more, in its turn.
    pub(crate) fn wake_all(&self) {
        for line in self.lines.lock().queues.values() {
            for place in &line.places {
                place.wake.notify_one();
            }
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn waiting(&self, queue: i32) -> bool {
        self.lines
            .lock()
            .queues
            .get(&queue)
            .is_some_and(|l| !l.places.is_empty())
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn waited_queues(&self) -> Vec<i32> {
        self.lines
            .lock()
            .queues
            .iter()
            .filter(|(_, l)| !l.places.is_empty())
            .map(|(q, _)| *q)
            .collect()
    }
}

/// A take's look on a turn it took from a stalled waiter ([`Turn::Taken`]), from
/// [`Waiters::try_turn`] to its drop, however the look ends (found, failed, cancelled). While
/// it lives, the line's first waiter does not look without a wake: that look could take the
/// item this one is looking for.
#[derive(Debug)]
pub(crate) struct TakenTurn<'a> {
    waiters: &'a Waiters,
    queue: i32,
    sure: bool,
    /// The look took items (set by the taker before the drop).
    pub(crate) took: bool,
}

impl Drop for TakenTurn<'_> {
    fn drop(&mut self) {
        self.waiters.turn_ended(self.queue, self.sure, self.took);
    }
}

/// A waiter's place in the lines of its queues, as its transaction notes it: a wait whose
/// future is leaked (never dropped) leaves the lines when its transaction ends or is used
/// again ([`Seats::leave_all`]).
#[derive(Debug, Clone)]
pub(crate) struct Seats {
    waiters: Arc<Waiters>,
    ticket: u64,
    queues: SmallVec<[i32; 1]>,
}

impl Seats {
    pub(crate) fn new(waiters: &Arc<Waiters>, ticket: u64) -> Seats {
        Seats {
            waiters: Arc::clone(waiters),
            ticket,
            queues: SmallVec::new(),
        }
    }

    pub(crate) fn ticket(&self) -> u64 {
        self.ticket
    }

    pub(crate) fn note(&mut self, queue: i32) {
        if !self.queues.contains(&queue) {
            self.queues.push(queue);
        }
    }

    /// Leaves every line, passing a wake-up on where this waiter had one; with `took`, the
    /// waiter took an item from `took`'s queue, whose next waiter looks too.
    pub(crate) fn leave_all(&mut self, took: Option<i32>) {
        for queue in self.queues.drain(..) {
            self.waiters.leave(queue, self.ticket, took == Some(queue));
        }
    }
}

impl Drop for Seats {
    fn drop(&mut self) {
        self.leave_all(None);
    }
}

/// Waits for `wake` (a commit to one of the waiter's queues), or `timeout` (timed on `rt`).
pub(crate) async fn wait_for(rt: &Handle, wake: &Notify, timeout: Duration) {
    let timer = rt.spawn(async move { tokio::time::sleep(timeout).await });
    tokio::pin!(timer);
    tokio::select! {
        _ = wake.notified() => {}
        _ = &mut timer => {}
    }
    timer.abort();
}

/// Waits for `ack` (the listener's lock), at most `timeout` (timed on `rt`): a listener that
/// is reconnecting must not hold the consumer up longer than its fallback poll would.
pub(crate) async fn watched(rt: &Handle, ack: oneshot::Receiver<()>, timeout: Duration) {
    let timer = rt.spawn(async move { tokio::time::sleep(timeout).await });
    tokio::pin!(timer, ack);
    tokio::select! {
        _ = &mut ack => {}
        _ = &mut timer => {}
    }
    timer.abort();
}

/// Where a server engine's connection and tasks run: the caller's multi-thread runtime
/// (`Builder::postgres_runtime`, `Builder::redis_runtime`), or by default a current-thread
/// runtime on a thread of the store's own, which this ends at close.
#[derive(Debug, Default)]
pub(crate) struct OwnThread {
    /// Ends the thread's runtime when fired or dropped; tasks still running there are
    /// dropped.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl OwnThread {
    /// The runtime to run on: `given` (checked multi-thread by the config's `validate`), or a
    /// new one on a thread named `name`.
    pub(crate) fn start(given: Option<&Handle>, name: &str) -> Result<(Handle, OwnThread)> {
        if let Some(handle) = given {
            return Ok((handle.clone(), OwnThread::default()));
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::storage)?;
        let rt = runtime.handle().clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = runtime.block_on(stopped);
            })
            .map_err(Error::storage)?;
        let own = OwnThread {
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        };
        Ok((rt, own))
    }

    /// Is this the store's own runtime thread (the last handle dropped in one of its tasks)?
    /// Nothing can be waited for there.
    pub(crate) fn is_current(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id())
    }

    /// Ends the thread and its runtime (waits for it, unless called on it); nothing on the
    /// caller's runtime.
    pub(crate) fn end(&self) {
        drop(self.stop.lock().take());
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            let name = thread.thread().name().unwrap_or_default().to_owned();
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!(thread = name, "a store's runtime thread panicked");
            }
        }
    }
}

/// The calls running on a server engine's runtime: a close refuses new ones and waits for
/// these to finish before it stops the runtime, so that a commit already submitted is
/// applied or not as its answer says, never cut off half way (and, on Redis, a dequeue in
/// flight has taken what the close then gives back).
#[derive(Debug, Default)]
pub(crate) struct Calls {
    running: AtomicUsize,
    pub(crate) closing: AtomicBool,
    /// Notified when the last call ends.
    idle: tokio::sync::Notify,
}

/// One call of [`Calls`], counted until dropped (its task ended or was cancelled).
pub(crate) struct Call(Arc<Calls>);

impl Drop for Call {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Calls {
    /// Counts a call, unless the store is closing.
    pub(crate) fn start(self: &Arc<Self>) -> Result<Call> {
        self.running.fetch_add(1, Ordering::AcqRel);
        let call = Call(Arc::clone(self));
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(call)
    }

    /// Refuses new calls and waits for those running to end.
    pub(crate) async fn drain(&self) {
        self.closing.store(true, Ordering::Release);
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// A lease as a server granted it: its item (with the attempt counted), token and deadline.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) entry: crate::core::Entry,
    pub(crate) token: u64,
    pub(crate) deadline: u64,
}

/// What the seam needs of a server engine (PostgreSQL, Redis) beside its own calls: the
/// line of waiting consumers, and leases.
pub(crate) trait Host: Send + Sync {
    /// The store's line of waiting consumers.
    fn line(&self) -> &Arc<Waiters>;
    /// A queue's number on the server, its key in the line.
    fn key(&self, core: &QueueCore) -> Result<i32>;
    /// How long a waiting consumer waits for a wake-up before it looks anyway.
    fn poll_interval(&self) -> Duration;
    /// The runtime of the store's connections, which times the waits.
    fn runtime(&self) -> &Handle;
    /// Milliseconds until the queue's next delayed item or lease falls due, if any.
    fn next_due<'a>(&'a self, core: &'a QueueCore) -> BoxFuture<'a, Result<Option<u64>>>;
    /// Leases up to `n` visible items of the queue for `ttl` ms, in queue order; a waiting
    /// consumer's look passes its ticket (see [`Waiters::looked`]).
    fn lease<'a>(
        &'a self,
        core: &'a QueueCore,
        n: usize,
        ttl: u64,
        waiter: Option<u64>,
    ) -> BoxFuture<'a, Result<Vec<Granted>>>;
    /// Gives back leases that were handed to nobody (their items did not decode), their
    /// attempts not counted, and wakes a waiter.
    fn unlease<'a>(&'a self, core: &'a QueueCore, tokens: Vec<u64>) -> BoxFuture<'a, Result<()>>;
}

/// A future of a [`Host`] call.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of `n` waiters on queue 1, in ticket order.
    fn line(n: usize) -> (Arc<Waiters>, Vec<(u64, Arc<Notify>)>) {
        let (waiters, _commands) = Waiters::new();
        let mut joined = Vec::new();
        for _ in 0..n {
            let (ticket, wake) = waiters.ticket();
            drop(waiters.join(1, ticket, &wake));
            joined.push((ticket, wake));
        }
        (waiters, joined)
    }

    #[test]
    fn a_first_look_goes_beside_a_look_in_flight_and_a_woken_waiter_waits_for_it() {
        let (waiters, w) = line(3);
        assert_eq!(waiters.turn(1, w[0].0), Turn::Look);
        // Its first look: `SKIP LOCKED` gives it other rows than the look in flight.
        assert_eq!(waiters.turn(1, w[1].0), Turn::Look);
        assert_eq!(waiters.try_turn(1).0, Turn::Look);
        // A waiter woken by a commit looks after the looks ahead of it, in order.
        waiters.looked(1, w[1].0, false);
        waiters.wake_one(1, true);
        assert_eq!(waiters.turn(1, w[1].0), Turn::Wait);
        waiters.looked(1, w[0].0, true);
        waiters.leave(1, w[0].0, true);
        assert_eq!(waiters.turn(1, w[1].0), Turn::Look);
    }

    #[test]
    fn a_waiter_whose_turn_is_taken_is_told_at_once() {
        let (waiters, w) = line(1);
        let (ticket, wake) = &w[0];
        waiters.looked(1, *ticket, false);
        waiters.wake_one(1, true);
        // The wake's permit, used as the waiter would before it looks.
        let woken = wake.notified();
        tokio::pin!(woken);
        assert!(woken.as_mut().enable());
        // It does not look: two misses take its turn.
        assert_eq!(waiters.try_turn(1).0, Turn::Wait);
        assert_eq!(waiters.try_turn(1).0, Turn::Taken { sure: true });
        let told = wake.notified();
        tokio::pin!(told);
        assert!(
            told.as_mut().enable(),
            "the waiter was not told its turn was taken"
        );
        assert_eq!(waiters.turn(1, *ticket), Turn::Gone);
    }

    /// Two waiters on queue 1 that looked and found nothing; a commit of this store woke
    /// the first, which stalls, and a `try_dequeue` missed once: the next take takes its turn.
    fn first_waiter_stalled() -> (Arc<Waiters>, Vec<(u64, Arc<Notify>)>) {
        let (waiters, w) = line(2);
        for (ticket, _) in &w {
            assert_eq!(waiters.turn(1, *ticket), Turn::Look);
            waiters.looked(1, *ticket, false);
        }
        waiters.wake_one(1, true);
        assert_eq!(waiters.try_turn(1).0, Turn::Wait);
        (waiters, w)
    }

    #[test]
    fn the_first_waiters_own_poll_waits_for_a_take_on_a_turn_taken_ahead_of_it() {
        let (waiters, w) = first_waiter_stalled();
        let (turn, taking) = waiters.try_turn(1);
        assert_eq!(turn, Turn::Taken { sure: true });
        assert_eq!(waiters.turn(1, w[0].0), Turn::Gone);
        // The second is first now. Its fallback poll must not look beside the take, which
        // looks for the item the first was woken for.
        assert_eq!(waiters.turn(1, w[1].0), Turn::Wait);
        let mut taking = taking.expect("a taken turn");
        taking.took = true;
        drop(taking);
        assert_eq!(waiters.turn(1, w[1].0), Turn::Look);
    }

    #[test]
    fn a_take_on_a_taken_turn_that_ends_empty_hands_the_wake_on() {
        let (waiters, w) = first_waiter_stalled();
        let (turn, taking) = waiters.try_turn(1);
        assert_eq!(turn, Turn::Taken { sure: true });
        // Its look failed, was cancelled or found nothing: the item the commit woke the
        // first waiter for may still be there, so the next waiter is woken and looks.
        drop(taking);
        let woken = w[1].1.notified();
        tokio::pin!(woken);
        assert!(woken.as_mut().enable(), "the next waiter was not woken");
        assert_eq!(waiters.turn(1, w[1].0), Turn::Look);
    }
}
