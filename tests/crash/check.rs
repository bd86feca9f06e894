//! The checker: does what the store holds after one or more crashes agree with what the
//! children reported?
//!
//! The parent knows exactly what the store held at its last look (`Model::known`). Since
//! then, one or more children ran and were killed; each reported its transactions (intent
//! before `commit`, acknowledgement after `commit` returned `Ok`). Every reported transaction
//! either survived the crash that ended its child (all its operations are in the recovered
//! store) or did not (none of them are): one boolean per transaction, and that one boolean
//! for all of a transaction's operations *is* the atomicity of S3. The check asks whether
//! some choice of survivors obeys the rules below and explains exactly what the store holds
//! now. Every rule is a clause of at most two literals, so the question is a 2-SAT instance.
//!
//! Rules that hold in both durability modes:
//!
//! 1. **History of an item.** The workload moves an item forward only: enqueued into `a`,
//!    then perhaps moved to `b`, then consumed. Within one child, the transactions touching
//!    an item are reported in the order they happened (a transaction can only dequeue an
//!    item after the commit that made it visible). A later one survives only if the earlier
//!    one did: its log record comes later in the one committer's log, and the engine
//!    recovers a prefix of its log.
//! 2. **Where it is now.** The survivors of an item's history in a child put it somewhere;
//!    that must be where the next child found it (the queue its first dequeue took it from)
//!    or, after the last child, where the parent finds it (nowhere, when consumed). Before
//!    its first transaction an item must be where the parent last saw it, and a fresh id
//!    must never have been seen.
//! 3. **Commit order.** If transaction `T` was acknowledged before transaction `U` reported
//!    its intent, `U`'s record comes after `T`'s, so `U` survives only if `T` did (prefix).
//!
//! `Durability::Sync` adds (S8, S7, S9: a commit returns only once it is on disk):
//!
//! 4. Every acknowledged transaction survived.
//! 5. Every transaction that a later transaction of the same child saw the effect of (it
//!    dequeued an item the first one enqueued or moved) survived: the committer makes items
//!    visible only after the fsync.
//!
//! `Durability::Buffered` adds (S9: only the last flush interval may be lost):
//!
//! 4'. Every transaction acknowledged before an explicit `Store::flush` that returned
//!     survived.
//!
//! Under Buffered an acknowledged transaction may be lost, but only whole (the one boolean),
//! only with everything acknowledged after it that depends on it (rules 1 and 3), and a
//! consumed item comes back only when its consuming commit is lost (rule 2).
//!
//! Besides the 2-SAT verdict, the checker looks for the common failures one by one, so that
//! a violation names the item or transaction at fault: an item that is lost, came back, sits
//! in the wrong queue, is duplicated or was never enqueued; a transaction that is partly
//! applied; a survivor that follows a lost acknowledged transaction.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use reliable_queue::Durability;

use crate::report::{format_ops, CycleLog, Op, Queue, Tx};
use crate::twosat::{Lit, TwoSat};

/// Where an item is, at some point of its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    /// Not enqueued yet.
    New,
    In(Queue),
    /// Consumed.
    Gone,
}

impl Pos {
    /// Where a reader of the store finds the item (`None`: nowhere).
    fn place(self) -> Option<Queue> {
        match self {
            Pos::In(q) => Some(q),
            Pos::New | Pos::Gone => None,
        }
    }
}

fn place_name(place: Option<Queue>) -> &'static str {
    place.map_or("nowhere", Queue::name)
}

/// What the parent found in the reopened store.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    /// Everything one transaction could dequeue from each queue.
    pub(crate) a: Vec<u64>,
    pub(crate) b: Vec<u64>,
    /// `count()` before that transaction.
    pub(crate) count_a: u64,
    pub(crate) count_b: u64,
    /// `count()` after that transaction aborted.
    pub(crate) count_after_abort: (u64, u64),
    /// Records the store set aside at open.
    pub(crate) set_aside: usize,
    /// Items whose payload is not the one their id calls for.
    pub(crate) damaged: Vec<u64>,
    /// Files in sled's blob directory (records too large for its log).
    pub(crate) blob_files: usize,
}

/// A broken promise, with what it concerns.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    pub(crate) kind: &'static str,
    pub(crate) detail: String,
}

/// What a check covered.
#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    /// Acknowledged transactions, and their item operations.
    pub(crate) acked_txs: u64,
    pub(crate) acked_ops: u64,
    /// Transactions that reported an intent but no acknowledgement.
    pub(crate) unknown_txs: u64,
    /// Acknowledged transactions that the store shows were lost (Buffered only), and the
    /// longest time between such an acknowledgement and the kill.
    pub(crate) lost_acked_txs: u64,
    pub(crate) max_lost_age: Duration,
}

impl Figures {
    pub(crate) fn add(&mut self, other: &Figures) {
        self.acked_txs += other.acked_txs;
        self.acked_ops += other.acked_ops;
        self.unknown_txs += other.unknown_txs;
        self.lost_acked_txs += other.lost_acked_txs;
        self.max_lost_age = self.max_lost_age.max(other.max_lost_age);
    }
}

/// The parent's knowledge of the store.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Exactly what the store held at the last check.
    known: HashMap<u64, Queue>,
    /// Every id ever enqueued (acknowledged or not).
    ever: HashSet<u64>,
}

/// One transaction's effect on one item.
#[derive(Debug, Clone, Copy)]
struct Step {
    var: usize,
    cycle: usize,
    pre: Pos,
    post: Pos,
}

/// Collects violations.
#[derive(Debug, Default)]
struct Verdict(Vec<Violation>);

impl Verdict {
    fn add(&mut self, kind: &'static str, detail: String) {
        self.0.push(Violation { kind, detail });
    }
}

fn describe(log: &CycleLog, tx: &Tx) -> String {
    format!(
        "cycle {} tx {} [{}] {}",
        log.cycle,
        tx.number,
        format_ops(&tx.ops),
        if tx.ack.is_some() {
            "acknowledged"
        } else {
            "not acknowledged"
        }
    )
}

impl Model {
    /// Items in the store at the last check.
    pub(crate) fn present(&self) -> usize {
        self.known.len()
    }

    /// Exactly what the store held at the last check.
    pub(crate) fn items(&self) -> &HashMap<u64, Queue> {
        &self.known
    }

    /// Checks `found` against the model and the reports of the `cycles` run since the last
    /// check, then takes `found` as the new model.
    pub(crate) fn check(
        &mut self,
        durability: Durability,
        cycles: &[CycleLog],
        found: &Found,
    ) -> (Vec<Violation>, Figures) {
        let mut verdict = Verdict::default();
        let place = self.check_found(found, &mut verdict);
        for log in cycles {
            for e in &log.errors {
                verdict.add("workload", format!("cycle {}: {e}", log.cycle));
            }
        }

        // One variable per reported transaction: did it survive?
        let mut sat = TwoSat::default();
        let mut tx_of_var = Vec::new();
        let vars: Vec<Vec<usize>> = cycles
            .iter()
            .enumerate()
            .map(|(ci, log)| {
                (0..log.txs.len())
                    .map(|ti| {
                        tx_of_var.push((ci, ti));
                        sat.var()
                    })
                    .collect()
            })
            .collect();
        let tx = |var: usize| {
            let (ci, ti) = tx_of_var[var];
            (&cycles[ci], &cycles[ci].txs[ti])
        };

        let segments = item_histories(cycles, &vars, &mut verdict);

        // Rules 4, 5 and 4': transactions that must have survived.
        let mut forced = vec![false; tx_of_var.len()];
        for (ci, log) in cycles.iter().enumerate() {
            let barrier = log
                .flushes
                .iter()
                .filter(|f| f.done.is_some())
                .map(|f| f.start)
                .max();
            for (ti, t) in log.txs.iter().enumerate() {
                forced[vars[ci][ti]] = match (durability, t.ack) {
                    (Durability::Sync, Some(_)) => true,
                    (Durability::Buffered, Some(ack)) => barrier.is_some_and(|b| ack < b),
                    _ => false,
                };
            }
        }
        if durability == Durability::Sync {
            for seg in segments.values().flatten() {
                for step in &seg[..seg.len() - 1] {
                    forced[step.var] = true;
                }
            }
        }
        for (var, &f) in forced.iter().enumerate() {
            if f {
                sat.require(Lit::yes(var));
            }
        }

        // Rules 1 and 2, item by item.
        let mut sure_survived = vec![false; tx_of_var.len()];
        let mut sure_lost = vec![false; tx_of_var.len()];
        let mut ids: Vec<u64> = segments.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let segs = &segments[&id];
            self.check_start(id, segs[0][0], &tx, &mut verdict);
            for (si, seg) in segs.iter().enumerate() {
                for pair in seg.windows(2) {
                    sat.implies(Lit::yes(pair[1].var), Lit::yes(pair[0].var));
                    if pair[1].pre != pair[0].post {
                        let (l0, t0) = tx(pair[0].var);
                        let (_, t1) = tx(pair[1].var);
                        verdict.add(
                            "in-process",
                            format!(
                                "item {id}: {} left it {:?}, then {} took it from {:?}",
                                describe(l0, t0),
                                pair[0].post,
                                describe(l0, t1),
                                pair[1].pre
                            ),
                        );
                    }
                }
                let required = match segs.get(si + 1) {
                    Some(next) => {
                        if next[0].pre == Pos::New {
                            let (l, t) = tx(next[0].var);
                            verdict.add(
                                "reused id",
                                format!("item {id} enqueued again by {}", describe(l, t)),
                            );
                        }
                        next[0].pre.place()
                    }
                    None => place.get(&id).copied(),
                };
                let k = seg.len();
                let position = |j: usize| if j == 0 { seg[0].pre } else { seg[j - 1].post };
                let lo = (1..=k)
                    .filter(|&i| forced[seg[i - 1].var])
                    .max()
                    .unwrap_or(0);
                let allowed: Vec<usize> = (lo..=k)
                    .filter(|&j| position(j).place() == required)
                    .collect();
                let (Some(&min), Some(&max)) = (allowed.first(), allowed.last()) else {
                    let possible: Vec<Option<Queue>> =
                        (lo..=k).map(|j| position(j).place()).collect();
                    let kind = match required {
                        None if possible.iter().all(Option::is_some) => "lost",
                        Some(_) if possible.iter().all(Option::is_none) => {
                            if (lo..=k).any(|j| position(j) == Pos::Gone) {
                                "came back"
                            } else {
                                "unexpected"
                            }
                        }
                        Some(_) => "wrong queue",
                        None => "inconsistent",
                    };
                    let mut detail = format!(
                        "item {id}: {} {}, but its history allows only {:?}:",
                        if si + 1 < segs.len() {
                            "the next child found it in"
                        } else {
                            "found"
                        },
                        place_name(required),
                        possible.iter().map(|p| place_name(*p)).collect::<Vec<_>>()
                    );
                    for step in seg {
                        let (l, t) = tx(step.var);
                        let _ = write!(
                            detail,
                            " {}{};",
                            describe(l, t),
                            if forced[step.var] {
                                " (must survive)"
                            } else {
                                ""
                            }
                        );
                    }
                    verdict.add(kind, detail);
                    continue;
                };
                // Exactly the first j steps survived, for some j in `allowed`: forbid the
                // others. "Not exactly m" is "step m lost or step m+1 survived".
                for m in 0..=k {
                    if position(m).place() == required {
                        continue;
                    }
                    match (m, m == k) {
                        (0, _) => sat.require(Lit::yes(seg[0].var)),
                        (_, true) => sat.require(Lit::no(seg[k - 1].var)),
                        _ => sat.either(Lit::no(seg[m - 1].var), Lit::yes(seg[m].var)),
                    }
                }
                for i in 1..=k {
                    sure_survived[seg[i - 1].var] |= min >= i;
                    sure_lost[seg[i - 1].var] |= max < i;
                }
            }
        }
        for (&id, &queue) in &self.known {
            if segments.contains_key(&id) {
                continue;
            }
            match place.get(&id) {
                Some(&q) if q == queue => {}
                Some(&q) => verdict.add(
                    "wrong queue",
                    format!(
                        "item {id} was in {}, no transaction touched it, now in {}",
                        queue.name(),
                        q.name()
                    ),
                ),
                None => verdict.add(
                    "lost",
                    format!(
                        "item {id} was in {}, no transaction touched it, now gone",
                        queue.name()
                    ),
                ),
            }
        }
        for (&id, &queue) in &place {
            if !segments.contains_key(&id) && !self.known.contains_key(&id) {
                let kind = if self.ever.contains(&id) {
                    "came back"
                } else {
                    "unexpected"
                };
                verdict.add(
                    kind,
                    format!(
                        "item {id} found in {} but no transaction touched it since it was gone",
                        queue.name()
                    ),
                );
            }
        }

        // Atomicity, transaction by transaction.
        for var in 0..tx_of_var.len() {
            if sure_survived[var] && sure_lost[var] {
                let (l, t) = tx(var);
                verdict.add(
                    "partial",
                    format!(
                        "{}: some of its operations survived, others did not",
                        describe(l, t)
                    ),
                );
            }
        }

        // Rule 3, with one helper variable per acknowledgement: "every transaction
        // acknowledged so far survived".
        for (ci, log) in cycles.iter().enumerate() {
            let mut events: Vec<(usize, bool, usize)> = Vec::new();
            for (ti, t) in log.txs.iter().enumerate() {
                events.push((t.intent, false, ti));
                if let Some(ack) = t.ack {
                    events.push((ack, true, ti));
                }
            }
            events.sort_unstable();
            let mut all_acked_survived: Option<usize> = None;
            let mut first_lost_ack: Option<usize> = None;
            for (_, is_ack, ti) in events {
                let var = vars[ci][ti];
                if is_ack {
                    let helper = sat.var();
                    sat.implies(Lit::yes(helper), Lit::yes(var));
                    if let Some(previous) = all_acked_survived {
                        sat.implies(Lit::yes(helper), Lit::yes(previous));
                    }
                    all_acked_survived = Some(helper);
                    if sure_lost[var] && first_lost_ack.is_none() {
                        first_lost_ack = Some(ti);
                    }
                } else {
                    if let Some(previous) = all_acked_survived {
                        sat.implies(Lit::yes(var), Lit::yes(previous));
                    }
                    if let (true, Some(lost)) = (sure_survived[var], first_lost_ack) {
                        verdict.add(
                            "not a prefix",
                            format!(
                                "{} survived, but {}, acknowledged before it started, was lost",
                                describe(log, &log.txs[ti]),
                                describe(log, &log.txs[lost])
                            ),
                        );
                    }
                }
            }
        }

        if verdict.0.is_empty() && sat.solve().is_none() {
            verdict.add(
                "no explanation",
                format!(
                    "no set of surviving transactions of cycles {:?} explains the store: \
                     some transaction is partly applied, or the survivors are not a prefix \
                     of the commit order",
                    cycles.iter().map(|l| l.cycle).collect::<Vec<_>>()
                ),
            );
        }

        let mut figures = Figures::default();
        for (var, &(ci, ti)) in tx_of_var.iter().enumerate() {
            let (log, t) = (&cycles[ci], &cycles[ci].txs[ti]);
            match t.acked_at {
                Some(at) => {
                    figures.acked_txs += 1;
                    figures.acked_ops += t.ops.len() as u64;
                    if sure_lost[var] {
                        figures.lost_acked_txs += 1;
                        let age = log.killed_at.saturating_duration_since(at);
                        figures.max_lost_age = figures.max_lost_age.max(age);
                    }
                }
                None => figures.unknown_txs += 1,
            }
        }

        for log in cycles {
            for t in &log.txs {
                for op in &t.ops {
                    if let Op::Enqueue(_, id) = *op {
                        self.ever.insert(id);
                    }
                }
            }
        }
        self.known = place;
        (verdict.0, figures)
    }

    /// The store as found: duplicates, items in both queues, counts, set-aside records.
    fn check_found(&self, found: &Found, verdict: &mut Verdict) -> HashMap<u64, Queue> {
        let mut place = HashMap::new();
        for (queue, ids, count) in [
            (Queue::A, &found.a, found.count_a),
            (Queue::B, &found.b, found.count_b),
        ] {
            if count != ids.len() as u64 {
                verdict.add(
                    "count",
                    format!(
                        "count() of {} is {count}, but a transaction dequeued {} items",
                        queue.name(),
                        ids.len()
                    ),
                );
            }
            for &id in ids {
                match place.insert(id, queue) {
                    Some(q) if q == queue => {
                        verdict.add("duplicate", format!("item {id} twice in {}", q.name()))
                    }
                    Some(_) => verdict.add("both queues", format!("item {id} in a and in b")),
                    None => {}
                }
            }
        }
        if found.count_after_abort != (found.count_a, found.count_b) {
            verdict.add(
                "count",
                format!(
                    "counts were {:?} before a dequeue-everything transaction, {:?} after it aborted",
                    (found.count_a, found.count_b),
                    found.count_after_abort
                ),
            );
        }
        for id in &found.damaged {
            verdict.add(
                "damaged",
                format!("item {id} has a payload it was not given"),
            );
        }
        if found.set_aside > 0 {
            verdict.add(
                "set aside",
                format!(
                    "{} log records failed their checksum after a kill",
                    found.set_aside
                ),
            );
        }
        place
    }

    /// Rule 2 at the start: an item's first transaction since the last check found it where
    /// the parent last saw it.
    fn check_start<'a>(
        &self,
        id: u64,
        first: Step,
        tx: &impl Fn(usize) -> (&'a CycleLog, &'a Tx),
        verdict: &mut Verdict,
    ) {
        let (l, t) = tx(first.var);
        match first.pre {
            Pos::New => {
                if self.known.contains_key(&id) || self.ever.contains(&id) {
                    verdict.add(
                        "reused id",
                        format!("item {id} enqueued again by {}", describe(l, t)),
                    );
                }
            }
            Pos::In(q) => {
                let was = self.known.get(&id).copied();
                if was != Some(q) {
                    let kind = match was {
                        Some(_) => "wrong queue",
                        None if self.ever.contains(&id) => "came back",
                        None => "unexpected",
                    };
                    verdict.add(
                        kind,
                        format!(
                            "{} took item {id} from {}, but at the last check it was {}",
                            describe(l, t),
                            q.name(),
                            place_name(was)
                        ),
                    );
                }
            }
            Pos::Gone => unreachable!("a step never starts from Gone"),
        }
    }
}

/// Every item's steps, split by cycle (one segment per cycle that touched it), in the order
/// the child reported them.
fn item_histories(
    cycles: &[CycleLog],
    vars: &[Vec<usize>],
    verdict: &mut Verdict,
) -> HashMap<u64, Vec<Vec<Step>>> {
    let mut segments: HashMap<u64, Vec<Vec<Step>>> = HashMap::new();
    for (ci, log) in cycles.iter().enumerate() {
        for (ti, t) in log.txs.iter().enumerate() {
            // id -> (dequeued from, enqueued into)
            let mut effects: Vec<(u64, Option<Queue>, Option<Queue>)> = Vec::new();
            for op in &t.ops {
                let id = op.id();
                let slot = match effects.iter().position(|e| e.0 == id) {
                    Some(slot) => slot,
                    None => {
                        effects.push((id, None, None));
                        effects.len() - 1
                    }
                };
                let twice = match *op {
                    Op::Dequeue(q, _) => effects[slot].1.replace(q).is_some(),
                    Op::Enqueue(q, _) => effects[slot].2.replace(q).is_some(),
                };
                if twice {
                    verdict.add(
                        "duplicate",
                        format!("item {id} twice in one transaction: {}", describe(log, t)),
                    );
                }
            }
            for (id, from, to) in effects {
                let step = Step {
                    var: vars[ci][ti],
                    cycle: ci,
                    pre: from.map_or(Pos::New, Pos::In),
                    post: to.map_or(Pos::Gone, Pos::In),
                };
                let segs = segments.entry(id).or_default();
                match segs.last_mut() {
                    Some(seg) if seg[0].cycle == ci => seg.push(step),
                    _ => segs.push(vec![step]),
                }
            }
        }
    }
    segments
}

/// The checker must be able to fail: histories that break the contract, and some that keep it.
#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn cycle(cycle: usize, lines: &[&str]) -> CycleLog {
        let now = Instant::now();
        let lines: Vec<(Instant, String)> =
            lines.iter().map(|l| (now, format!("RQ|{l}"))).collect();
        CycleLog::parse(cycle, &lines, now)
    }

    fn found(a: &[u64], b: &[u64]) -> Found {
        let (na, nb) = (a.len() as u64, b.len() as u64);
        Found {
            a: a.to_vec(),
            b: b.to_vec(),
            count_a: na,
            count_b: nb,
            count_after_abort: (na, nb),
            set_aside: 0,
            damaged: Vec::new(),
            blob_files: 0,
        }
    }

    fn kinds(
        model: &mut Model,
        durability: Durability,
        cycles: &[CycleLog],
        store: &Found,
    ) -> Vec<&'static str> {
        let (violations, _) = model.check(durability, cycles, store);
        let mut kinds: Vec<_> = violations.iter().map(|v| v.kind).collect();
        kinds.dedup();
        kinds
    }

    const BOTH: [Durability; 2] = [Durability::Sync, Durability::Buffered];

    #[test]
    fn sync_rejects_a_lost_acknowledged_enqueue() {
        let c = [cycle(0, &["O", "i|0|+a1,+a2", "a|0"])];
        let k = kinds(
            &mut Model::default(),
            Durability::Sync,
            &c,
            &found(&[1], &[]),
        );
        assert_eq!(k, ["lost"]);
    }

    #[test]
    fn sync_rejects_a_lost_commit_that_a_later_transaction_saw() {
        // Never acknowledged, but the move saw its item: it had committed.
        let c = [cycle(0, &["O", "i|0|+a1", "i|1|-a1,+b1"])];
        let k = kinds(
            &mut Model::default(),
            Durability::Sync,
            &c,
            &found(&[], &[]),
        );
        assert_eq!(k, ["lost"]);
        let mut model = Model::default();
        assert!(kinds(&mut model, Durability::Sync, &c, &found(&[1], &[])).is_empty());
    }

    #[test]
    fn consumed_items_must_not_come_back() {
        for durability in BOTH {
            let mut model = Model::default();
            let first = [cycle(0, &["O", "i|0|+a5", "a|0", "fs|0", "fd|0"])];
            assert!(kinds(&mut model, durability, &first, &found(&[5], &[])).is_empty());
            let second = [cycle(1, &["O", "i|0|-a5", "a|0", "fs|0", "fd|0"])];
            let k = kinds(&mut model, durability, &second, &found(&[5], &[]));
            assert_eq!(k, ["came back"], "{durability:?}");
            // Later, a child takes it again: it came back in between.
            let third = [cycle(2, &["O", "i|0|-a5", "a|0"])];
            let mut model = Model::default();
            model.check(durability, &first, &found(&[5], &[]));
            model.check(durability, &second, &found(&[], &[]));
            let k = kinds(&mut model, durability, &third, &found(&[], &[]));
            assert_eq!(k, ["came back"], "{durability:?}");
        }
    }

    #[test]
    fn a_moved_item_is_in_exactly_one_queue() {
        for durability in BOTH {
            let mut model = Model::default();
            let first = [cycle(0, &["O", "i|0|+a1", "a|0", "fs|0", "fd|0"])];
            model.check(durability, &first, &found(&[1], &[]));
            let mv = [cycle(1, &["O", "i|0|-a1,+b1", "a|0", "fs|0", "fd|0"])];
            let mut other = Model::default();
            let k = kinds(&mut other, durability, &first, &found(&[1], &[1]));
            assert!(k.contains(&"both queues"), "{durability:?}: {k:?}");
            let k = kinds(&mut model, durability, &mv, &found(&[1], &[]));
            assert_eq!(k, ["wrong queue"], "{durability:?}");
        }
    }

    #[test]
    fn nothing_appears_that_was_never_enqueued() {
        for durability in BOTH {
            // An aborted transaction is never reported; its items must not show up.
            let c = [cycle(0, &["O", "i|0|+a1", "a|0"])];
            let k = kinds(&mut Model::default(), durability, &c, &found(&[1, 99], &[]));
            assert_eq!(k, ["unexpected"], "{durability:?}");
            let k = kinds(&mut Model::default(), durability, &c, &found(&[1, 1], &[]));
            assert_eq!(k, ["duplicate"], "{durability:?}");
        }
    }

    #[test]
    fn counts_must_match_what_a_transaction_finds() {
        let mut store = found(&[1], &[]);
        store.count_a = 2;
        let c = [cycle(0, &["O", "i|0|+a1", "a|0"])];
        let k = kinds(&mut Model::default(), Durability::Sync, &c, &store);
        assert_eq!(k, ["count"]);
    }

    #[test]
    fn buffered_may_lose_the_tail_but_only_whole_transactions() {
        let lines = ["O", "i|0|+a1,+a2", "a|0", "i|1|-a1,+b1,-a2,+b2", "a|1"];
        let c = [cycle(0, &lines)];
        let d = Durability::Buffered;
        // The move was lost, or both were: fine.
        let (v, figures) = Model::default().check(d, &c, &found(&[1, 2], &[]));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(figures.lost_acked_txs, 1);
        let (v, figures) = Model::default().check(d, &c, &found(&[], &[]));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(figures.lost_acked_txs, 2);
        // Half a move: never.
        let k = kinds(&mut Model::default(), d, &c, &found(&[2], &[1]));
        assert_eq!(k, ["partial"]);
        // Half an enqueue: never.
        let k = kinds(&mut Model::default(), d, &c, &found(&[1], &[]));
        assert_eq!(k, ["partial"]);
    }

    #[test]
    fn buffered_survivors_are_a_prefix_of_the_commit_order() {
        let c = [cycle(0, &["O", "i|0|+a1", "a|0", "i|1|+a2", "a|1"])];
        let k = kinds(
            &mut Model::default(),
            Durability::Buffered,
            &c,
            &found(&[2], &[]),
        );
        assert_eq!(k, ["not a prefix"]);
        // Concurrent commits (neither acknowledged before the other began) may go either way.
        let c = [cycle(0, &["O", "i|0|+a1", "i|1|+a2", "a|0", "a|1"])];
        let k = kinds(
            &mut Model::default(),
            Durability::Buffered,
            &c,
            &found(&[2], &[]),
        );
        assert!(k.is_empty(), "{k:?}");
    }

    #[test]
    fn buffered_keeps_what_an_explicit_flush_covered() {
        let c = [cycle(
            0,
            &["O", "i|0|+a1", "a|0", "fs|0", "fd|0", "i|1|+a2", "a|1"],
        )];
        let d = Durability::Buffered;
        assert!(kinds(&mut Model::default(), d, &c, &found(&[1], &[])).is_empty());
        let k = kinds(&mut Model::default(), d, &c, &found(&[], &[]));
        assert_eq!(k, ["lost"]);
        // A flush that never returned promises nothing.
        let c = [cycle(0, &["O", "i|0|+a1", "a|0", "fs|0"])];
        assert!(kinds(&mut Model::default(), d, &c, &found(&[], &[])).is_empty());
    }

    #[test]
    fn only_the_whole_history_can_rule_out_some_crashes() {
        // Item 1 is gone: its enqueue and its consumption both survived, or neither did.
        // Item 2 is still in a: the consuming transaction was lost, so the enqueue of 1 was
        // lost too, yet the enqueue of 2 survived though it began after that of 1 was
        // acknowledged. No single item shows it; only the 2-SAT verdict does.
        let lines = ["O", "i|0|+a1", "a|0", "i|1|+a2", "a|1", "i|2|-a1,-a2"];
        let c = [cycle(0, &lines)];
        let k = kinds(
            &mut Model::default(),
            Durability::Buffered,
            &c,
            &found(&[2], &[]),
        );
        assert_eq!(k, ["no explanation"]);
        let k = kinds(
            &mut Model::default(),
            Durability::Buffered,
            &c,
            &found(&[1, 2], &[]),
        );
        assert!(k.is_empty(), "{k:?}");
    }

    #[test]
    fn ids_are_never_reused_and_reports_are_well_formed() {
        let mut model = Model::default();
        let first = [cycle(0, &["O", "i|0|+a1", "a|0"])];
        model.check(Durability::Sync, &first, &found(&[1], &[]));
        let again = [cycle(1, &["O", "i|0|+a1", "a|0"])];
        let k = kinds(&mut model, Durability::Sync, &again, &found(&[1], &[]));
        assert_eq!(k, ["reused id"]);
        let bad = [cycle(2, &["O", "i|zero|+a1", "e|commit failed"])];
        let k = kinds(
            &mut Model::default(),
            Durability::Sync,
            &bad,
            &found(&[], &[]),
        );
        assert_eq!(k, ["workload"]);
    }
}
