//! What the child reports and how the parent reads it back.
//!
//! One line per event, each starting with `RQ|` so the test harness's own output is ignored:
//!
//! ```text
//! RQ|o                 about to call Store::open
//! RQ|O                 Store::open returned, queues opened
//! RQ|i|<n>|<ops>       intent: transaction n is about to commit; ops like "+a17,-b3"
//! RQ|a|<n>             acknowledgement: the commit of transaction n returned Ok
//! RQ|l|<n>             a lease call (n) is about to dequeue and commit its attempts
//! RQ|L|<n>|<ops>       lease call n returned: the leases it granted ("Lc17@2"; empty: none)
//! RQ|fs|<n>            explicit flush n is about to call Store::flush
//! RQ|fd|<n>            explicit flush n returned Ok
//! RQ|e|<text>          the workload failed (always a violation)
//! ```
//!
//! An op is `<kind><queue><id>` with, for the processing-layer kinds, `@<attempt>`: the
//! attempt of the lease it settles, or the attempts of the dead letter it takes:
//!
//! | kind | call | the item goes from | to |
//! |---|---|---|---|
//! | `+` | `enqueue` | nowhere | the queue, 0 attempts |
//! | `>` | `enqueue_after`, `enqueue_at` (a delay of some ms) | nowhere | the queue (delayed), 0 attempts |
//! | `-` | `dequeue` | the queue | nowhere |
//! | `L` | `lease`, `lease_many`, `try_lease` | the queue, attempt - 1 | the queue (leased), attempt |
//! | `A` | `Lease::ack` | the queue (leased) | nowhere |
//! | `F` | `Lease::fail` below the maximum attempts | the queue (leased) | the queue (delayed) |
//! | `D` | `Lease::fail` at the maximum | the queue (leased) | its dead letters |
//! | `R` | `Lease::release` with a delay | the queue (leased) | the queue (delayed) |
//! | `Y` | `replay`, attempts kept | the dead letters | the queue |
//! | `Z` | `replay`, attempts reset | the dead letters | the queue, 0 attempts |
//! | `X` | `purge` | the dead letters | nowhere |
//!
//! Plain transactions (`+ > - A`), fails, releases, replays and purges report an intent
//! before they commit and an acknowledgement after. A lease call commits inside the call
//! (its dequeue and its durable attempt), so it reports `l` before the call (the commit's
//! start, for the commit order) and `L` after it returned, with the items and attempts (its
//! acknowledgement; also its place in the items' histories, since it may have waited for
//! them after `l`).
//!
//! A line is written with one `write` call on a pipe, so it is in the kernel's pipe buffer,
//! and reaches the parent, whatever happens to the child after the call returns.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

/// The queues of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Queue {
    A,
    B,
    /// The jobs queue of the lease workers (kept short, so that retried items come round
    /// again within a child's life).
    C,
}

impl Queue {
    pub(crate) const ALL: [Queue; 3] = [Queue::A, Queue::B, Queue::C];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Queue::A => "a",
            Queue::B => "b",
            Queue::C => "c",
        }
    }

    fn from_char(c: char) -> Option<Queue> {
        Queue::ALL.into_iter().find(|q| q.name().starts_with(c))
    }
}

/// Where an item can be in a recovered store: in a queue (visible or delayed: a restart
/// ends every lease), or among a queue's dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Place {
    In(Queue),
    Dead(Queue),
}

impl Place {
    pub(crate) fn name(self) -> String {
        match self {
            Place::In(q) => q.name().to_owned(),
            Place::Dead(q) => format!("the dead letters of {}", q.name()),
        }
    }

    pub(crate) fn is_dead(self) -> bool {
        matches!(self, Place::Dead(_))
    }
}

/// What an op does to its item (see the table in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Enqueue,
    EnqueueDelayed,
    Dequeue,
    Lease,
    Ack,
    Retry,
    Bury,
    Release,
    Replay,
    ReplayReset,
    Purge,
}

impl Kind {
    const ALL: [(Kind, char); 11] = [
        (Kind::Enqueue, '+'),
        (Kind::EnqueueDelayed, '>'),
        (Kind::Dequeue, '-'),
        (Kind::Lease, 'L'),
        (Kind::Ack, 'A'),
        (Kind::Retry, 'F'),
        (Kind::Bury, 'D'),
        (Kind::Release, 'R'),
        (Kind::Replay, 'Y'),
        (Kind::ReplayReset, 'Z'),
        (Kind::Purge, 'X'),
    ];

    fn sign(self) -> char {
        Kind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or('?', |(_, c)| *c)
    }

    fn from_sign(c: char) -> Option<Kind> {
        Kind::ALL.iter().find(|(_, s)| *s == c).map(|(k, _)| *k)
    }

    /// Does the op carry an attempt number?
    fn has_attempt(self) -> bool {
        !matches!(self, Kind::Enqueue | Kind::EnqueueDelayed | Kind::Dequeue)
    }
}

/// One operation of a transaction, on the item with that id (items carry their own ids,
/// unique in the whole run; the store's ids change with every version of an item).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) queue: Queue,
    pub(crate) id: u64,
    /// The lease's attempt, or the dead letter's attempts; 0 for plain ops.
    pub(crate) attempt: u32,
}

impl Op {
    pub(crate) fn new(kind: Kind, queue: Queue, id: u64, attempt: u32) -> Op {
        let attempt = if kind.has_attempt() { attempt } else { 0 };
        Op {
            kind,
            queue,
            id,
            attempt,
        }
    }

    pub(crate) fn plain(kind: Kind, queue: Queue, id: u64) -> Op {
        Op::new(kind, queue, id, 0)
    }
}

/// Formats the ops of an intent line.
pub(crate) fn format_ops(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}{}{}", op.kind.sign(), op.queue.name(), op.id);
        if op.kind.has_attempt() {
            let _ = write!(out, "@{}", op.attempt);
        }
    }
    out
}

fn parse_ops(text: &str) -> Option<Vec<Op>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|op| {
            let mut chars = op.chars();
            let kind = Kind::from_sign(chars.next()?)?;
            let queue = Queue::from_char(chars.next()?)?;
            let rest = chars.as_str();
            let (id, attempt) = match (kind.has_attempt(), rest.split_once('@')) {
                (true, Some((id, attempt))) => (id.parse().ok()?, attempt.parse().ok()?),
                (false, None) => (rest.parse().ok()?, 0),
                _ => return None,
            };
            Some(Op::new(kind, queue, id, attempt))
        })
        .collect()
}

/// A transaction the child reported: a commit of its own, or a lease call's.
#[derive(Debug, Clone)]
pub(crate) struct Tx {
    /// The child's number for it.
    pub(crate) number: u64,
    pub(crate) ops: Vec<Op>,
    /// Position (among the cycle's report lines) of the line written before the commit
    /// began: the intent, or a lease call's `l`.
    pub(crate) start: usize,
    /// Position that orders it among the transactions touching the same items: the intent,
    /// or a lease call's `L` (the call may have waited for its items after `l`).
    pub(crate) at: usize,
    /// Position of the acknowledgement line (a lease call's `L`), if there was one.
    pub(crate) ack: Option<usize>,
    /// When the parent read the acknowledgement.
    pub(crate) acked_at: Option<Instant>,
    /// A lease call's transaction.
    pub(crate) lease: bool,
}

/// An explicit `Store::flush` the child made.
#[derive(Debug, Clone)]
pub(crate) struct Flush {
    /// Position of the line written just before `flush` was called.
    pub(crate) start: usize,
    /// Position of the line written after it returned, if there was one.
    pub(crate) done: Option<usize>,
}

/// Everything one child reported before it was killed.
#[derive(Debug, Clone)]
pub(crate) struct CycleLog {
    pub(crate) cycle: usize,
    /// In the order of their `at` positions.
    pub(crate) txs: Vec<Tx>,
    pub(crate) flushes: Vec<Flush>,
    /// Workload failures, malformed lines, a child that exited on its own.
    pub(crate) errors: Vec<String>,
    /// When the parent read `RQ|o` and `RQ|O`.
    pub(crate) opening: Option<Instant>,
    pub(crate) opened: Option<Instant>,
    pub(crate) killed_at: Instant,
}

impl CycleLog {
    /// Reads the report lines (with the time the parent read each one).
    pub(crate) fn parse(cycle: usize, lines: &[(Instant, String)], killed_at: Instant) -> CycleLog {
        let mut log = CycleLog {
            cycle,
            txs: Vec::new(),
            flushes: Vec::new(),
            errors: Vec::new(),
            opening: None,
            opened: None,
            killed_at,
        };
        let mut tx_index: HashMap<u64, usize> = HashMap::new();
        let mut flush_index: HashMap<u64, usize> = HashMap::new();
        for (pos, (at, line)) in lines.iter().enumerate() {
            let fields: Vec<&str> = line.splitn(4, '|').collect();
            let parsed = match fields.as_slice() {
                ["RQ", "o"] => {
                    log.opening = Some(*at);
                    true
                }
                ["RQ", "O"] => {
                    log.opened = Some(*at);
                    true
                }
                ["RQ", "i", n, ops] => match (n.parse::<u64>(), parse_ops(ops)) {
                    (Ok(number), Some(ops)) if !ops.is_empty() => {
                        begin(&mut log, &mut tx_index, number, ops, pos)
                    }
                    _ => false,
                },
                ["RQ", "l", n] => match n.parse::<u64>() {
                    Ok(number) => begin(&mut log, &mut tx_index, number, Vec::new(), pos),
                    Err(_) => false,
                },
                ["RQ", "a", n] => match n.parse().ok().and_then(|n: u64| tx_index.get(&n)) {
                    Some(&i) if log.txs[i].ack.is_none() && !log.txs[i].lease => {
                        log.txs[i].ack = Some(pos);
                        log.txs[i].acked_at = Some(*at);
                        true
                    }
                    _ => false,
                },
                ["RQ", "L", n, ops] => {
                    let tx = n.parse().ok().and_then(|n: u64| tx_index.get(&n));
                    match (tx, parse_ops(ops)) {
                        (Some(&i), Some(ops))
                            if log.txs[i].lease
                                && log.txs[i].ack.is_none()
                                && ops.iter().all(|op| op.kind == Kind::Lease) =>
                        {
                            let tx = &mut log.txs[i];
                            tx.ops = ops;
                            tx.at = pos;
                            tx.ack = Some(pos);
                            tx.acked_at = Some(*at);
                            true
                        }
                        _ => false,
                    }
                }
                ["RQ", "fs", n] => match n.parse::<u64>() {
                    Ok(n) => {
                        flush_index.insert(n, log.flushes.len());
                        log.flushes.push(Flush {
                            start: pos,
                            done: None,
                        });
                        true
                    }
                    Err(_) => false,
                },
                ["RQ", "fd", n] => match n.parse().ok().and_then(|n: u64| flush_index.get(&n)) {
                    Some(&i) => {
                        log.flushes[i].done = Some(pos);
                        true
                    }
                    None => false,
                },
                ["RQ", "e", rest @ ..] => {
                    log.errors
                        .push(format!("the child reported: {}", rest.join("|")));
                    true
                }
                _ => false,
            };
            if !parsed {
                log.errors.push(format!("malformed report line {line:?}"));
            }
        }
        log.txs.sort_by_key(|t| t.at);
        log
    }

    /// One line on how the cycle went, for violation reports.
    pub(crate) fn summary(&self) -> String {
        let since = |t: Option<Instant>| {
            t.map_or("-".to_owned(), |t| {
                format!("{:.1} ms", (self.killed_at - t).as_secs_f64() * 1e3)
            })
        };
        format!(
            "cycle {}: killed {} after it began opening, {} after the open returned; \
             {} transactions, {} acknowledged",
            self.cycle,
            since(self.opening),
            since(self.opened),
            self.txs.len(),
            self.txs.iter().filter(|t| t.ack.is_some()).count()
        )
    }

    /// Was the child killed after it started opening the store and before the open returned?
    pub(crate) fn killed_during_open(&self) -> bool {
        self.opening.is_some() && self.opened.is_none()
    }
}

/// Records the start of transaction `number` at line `pos` (a lease call's when `ops` is
/// empty); false if the number was used already.
fn begin(
    log: &mut CycleLog,
    tx_index: &mut HashMap<u64, usize>,
    number: u64,
    ops: Vec<Op>,
    pos: usize,
) -> bool {
    if tx_index.contains_key(&number) {
        return false;
    }
    tx_index.insert(number, log.txs.len());
    log.txs.push(Tx {
        number,
        lease: ops.is_empty(),
        ops,
        start: pos,
        at: pos,
        ack: None,
        acked_at: None,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip() {
        let ops = vec![
            Op::plain(Kind::Enqueue, Queue::A, 1 << 40),
            Op::plain(Kind::Dequeue, Queue::B, 0),
            Op::plain(Kind::EnqueueDelayed, Queue::C, 7),
            Op::new(Kind::Lease, Queue::C, 8, 3),
            Op::new(Kind::Ack, Queue::A, 9, 1),
            Op::new(Kind::Retry, Queue::C, 10, 2),
            Op::new(Kind::Bury, Queue::C, 11, 3),
            Op::new(Kind::Release, Queue::B, 12, 1),
            Op::new(Kind::Replay, Queue::C, 13, 4),
            Op::new(Kind::ReplayReset, Queue::C, 14, 3),
            Op::new(Kind::Purge, Queue::A, 15, 3),
        ];
        let text = format_ops(&ops);
        assert_eq!(&text[..10], "+a10995116");
        assert_eq!(parse_ops(&text), Some(ops));
        assert_eq!(parse_ops("+d1"), None);
        assert_eq!(parse_ops("*a1"), None);
        assert_eq!(parse_ops("La1"), None, "a lease without its attempt");
        assert_eq!(parse_ops("+a1@2"), None, "a plain op with an attempt");
        assert_eq!(parse_ops(""), Some(Vec::new()));
    }

    #[test]
    fn a_lease_call_is_ordered_by_its_result_and_started_at_its_call() {
        let now = Instant::now();
        let lines: Vec<(Instant, String)> = ["O", "l|0", "i|1|+c5", "a|1", "L|0|Lc5@1"]
            .iter()
            .map(|l| (now, format!("RQ|{l}")))
            .collect();
        let log = CycleLog::parse(0, &lines, now);
        assert!(log.errors.is_empty(), "{:?}", log.errors);
        let numbers: Vec<u64> = log.txs.iter().map(|t| t.number).collect();
        assert_eq!(
            numbers,
            [1, 0],
            "the enqueue comes before the lease of its item"
        );
        assert_eq!((log.txs[1].start, log.txs[1].at), (1, 4));
        // An `a` for a lease call, an `L` for a commit, an `L` with other kinds: malformed.
        for bad in [
            ["l|0", "a|0"],
            ["i|0|+a1", "L|0|La1@1"],
            ["l|0", "L|0|Aa1@1"],
        ] {
            let lines: Vec<(Instant, String)> =
                bad.iter().map(|l| (now, format!("RQ|{l}"))).collect();
            let log = CycleLog::parse(0, &lines, now);
            assert_eq!(log.errors.len(), 1, "{bad:?}");
        }
    }
}
