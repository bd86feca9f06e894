//! What the child reports and how the parent reads it back.
//!
//! One line per event, each starting with `RQ|` so the test harness's own output is ignored:
//!
//! ```text
//! RQ|o                 about to call Store::open
//! RQ|O                 Store::open returned, queues opened
//! RQ|i|<n>|<ops>       intent: transaction n is about to call commit; ops like "+a17,-b3"
//!                      ("+a17": enqueue 17 into a, "-b3": dequeue 3 from b)
//! RQ|a|<n>             acknowledgement: commit of transaction n returned Ok
//! RQ|fs|<n>            explicit flush n is about to call Store::flush
//! RQ|fd|<n>            explicit flush n returned Ok
//! RQ|e|<text>          the workload failed (always a violation)
//! ```
//!
//! A line is written with one `write` call on a pipe, so it is in the kernel's pipe buffer,
//! and reaches the parent, whatever happens to the child after the call returns.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

/// The two queues of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Queue {
    A,
    B,
}

impl Queue {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Queue::A => "a",
            Queue::B => "b",
        }
    }
}

/// One operation of a transaction, on the item with that id (items are their own ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Enqueue(Queue, u64),
    Dequeue(Queue, u64),
}

impl Op {
    pub(crate) fn id(self) -> u64 {
        match self {
            Op::Enqueue(_, id) | Op::Dequeue(_, id) => id,
        }
    }
}

/// Formats the ops of an intent line.
pub(crate) fn format_ops(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let (sign, queue, id) = match *op {
            Op::Enqueue(q, id) => ('+', q, id),
            Op::Dequeue(q, id) => ('-', q, id),
        };
        let _ = write!(out, "{sign}{}{id}", queue.name());
    }
    out
}

fn parse_ops(text: &str) -> Option<Vec<Op>> {
    text.split(',')
        .map(|op| {
            let mut chars = op.chars();
            let sign = chars.next()?;
            let queue = match chars.next()? {
                'a' => Queue::A,
                'b' => Queue::B,
                _ => return None,
            };
            let id = chars.as_str().parse().ok()?;
            match sign {
                '+' => Some(Op::Enqueue(queue, id)),
                '-' => Some(Op::Dequeue(queue, id)),
                _ => None,
            }
        })
        .collect()
}

/// A transaction the child reported.
#[derive(Debug, Clone)]
pub(crate) struct Tx {
    /// The child's number for it.
    pub(crate) number: u64,
    pub(crate) ops: Vec<Op>,
    /// Position of the intent line among the cycle's report lines.
    pub(crate) intent: usize,
    /// Position of the acknowledgement line, if there was one.
    pub(crate) ack: Option<usize>,
    /// When the parent read the acknowledgement.
    pub(crate) acked_at: Option<Instant>,
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
    /// In the order of their intent lines.
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
                    (Ok(number), Some(ops)) if !tx_index.contains_key(&number) => {
                        tx_index.insert(number, log.txs.len());
                        log.txs.push(Tx {
                            number,
                            ops,
                            intent: pos,
                            ack: None,
                            acked_at: None,
                        });
                        true
                    }
                    _ => false,
                },
                ["RQ", "a", n] => match n.parse().ok().and_then(|n: u64| tx_index.get(&n)) {
                    Some(&i) if log.txs[i].ack.is_none() => {
                        log.txs[i].ack = Some(pos);
                        log.txs[i].acked_at = Some(*at);
                        true
                    }
                    _ => false,
                },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip() {
        let ops = vec![
            Op::Enqueue(Queue::A, 1 << 40),
            Op::Dequeue(Queue::B, 0),
            Op::Dequeue(Queue::A, 7),
        ];
        assert_eq!(parse_ops(&format_ops(&ops)), Some(ops));
        assert_eq!(parse_ops("+c1"), None);
        assert_eq!(parse_ops("*a1"), None);
    }
}
