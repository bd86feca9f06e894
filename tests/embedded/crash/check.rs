//! The checker: does what the store holds after one or more crashes agree with what the
//! children reported?
//!
//! The parent knows exactly what the store held at its last look (`Model::known`: where each
//! item was, and with how many attempts). Since then, one or more children ran and were
//! killed; each reported its transactions (intent before `commit`, acknowledgement after
//! `commit` returned `Ok`; a lease call's start and its result, see `report.rs`). Every
//! reported transaction either survived the crash that ended its child (all its operations
//! are in the recovered store) or did not (none of them are): one boolean per transaction,
//! and that one boolean for all of a transaction's operations *is* the atomicity of S3. The
//! check asks whether some choice of survivors obeys the rules below and explains exactly
//! what the store holds now. Every rule is a clause of at most two literals, so the question
//! is a 2-SAT instance.
//!
//! Where an item can be: in a queue (`a`, `b`, `c`: visible or delayed; a restart ends every
//! lease, so a leased item is back in its queue), among a queue's dead letters, or nowhere
//! (consumed, acknowledged, purged). Each item also has its attempts: the leases granted so
//! far (0 after an enqueue or a move; a lease adds one; a fail, a release, a kept replay
//! keep them; a reset replay clears them). A plain dequeue does not tell them.
//!
//! Rules that hold in both durability modes:
//!
//! 1. **History of an item.** Within one child, the transactions touching an item are
//!    reported in the order they happened (a transaction can only take an item after the
//!    commit that put it there was applied; a lease call is placed by its result line, and
//!    what its holder does next is reported after it). A later one survives only if the
//!    earlier one did: its log record comes later in the one committer's log, and the engine
//!    recovers a prefix of its log. Each step starts where the one before left the item,
//!    with the same attempts (checked in the child's own history: `in-process`).
//! 2. **Where it is now.** The survivors of an item's history in a child put it somewhere,
//!    with some attempts; that must be where the next child found it (where its first step
//!    took it from) or, after the last child, where the parent finds it (nowhere, when
//!    consumed). Before its first transaction an item must be where the parent last saw it,
//!    and a fresh id must never have been seen. Attempts may be higher than the survivors
//!    say by at most one per child in which the item sat in a queue after its last reported
//!    step (a lease call killed before it reported its result), never lower: **attempts
//!    never go down**. A dead letter's attempts do not change.
//! 3. **Commit order.** If transaction `T` was acknowledged before transaction `U` started
//!    (its intent; a lease call's start), `U`'s record comes after `T`'s, so `U` survives
//!    only if `T` did (prefix).
//!
//! `Durability::Sync` adds (S8, S7, S9: a commit returns only once it is on disk):
//!
//! 4. Every acknowledged transaction survived (an acknowledged lease's attempt, a fail that
//!    reached the maximum attempts: the item is a dead letter unless an acknowledged replay
//!    or purge took it since).
//! 5. Every transaction that a later transaction of the same child saw the effect of (it
//!    took an item the first one put somewhere) survived: the committer applies a commit
//!    only after the fsync.
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
//! in the wrong queue or on the wrong side of the dead letters, has too few or too many
//! attempts, is duplicated, is in two places or was never enqueued; a transaction that is
//! partly applied; a survivor that follows a lost acknowledged transaction. And it checks
//! the reopened store against itself: counts, stats (no lease, no delayed item, no held
//! item, the dead letters counted), browsing against dequeuing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use reliable_queue::Durability;

use super::report::{format_ops, CycleLog, Kind, Op, Place, Queue, Tx};
use super::twosat::{Lit, TwoSat};

/// Where an item is, at some point of its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    /// Not enqueued yet.
    New,
    /// There, with these attempts (`None`: not known: a plain dequeue took it from there).
    At(Place, Option<u32>),
    /// Consumed, acknowledged or purged.
    Gone,
}

impl Pos {
    /// Where a reader of the store finds the item (`None`: nowhere).
    fn place(self) -> Option<Place> {
        match self {
            Pos::At(p, _) => Some(p),
            Pos::New | Pos::Gone => None,
        }
    }

    fn attempts(self) -> Option<u32> {
        match self {
            Pos::At(_, a) => a,
            Pos::New | Pos::Gone => None,
        }
    }

    /// Can an item at `self` be the one `later` describes, the same in-process history
    /// going on (same place, same attempts when both are known)?
    fn continues_as(self, later: Pos) -> bool {
        match (self, later) {
            (Pos::At(p, a), Pos::At(q, b)) => p == q && (a.is_none() || b.is_none() || a == b),
            _ => self == later,
        }
    }
}

fn place_name(place: Option<Place>) -> String {
    place.map_or("nowhere".to_owned(), Place::name)
}

fn pos_name(pos: Pos) -> String {
    match pos {
        Pos::At(p, Some(a)) => format!("{} ({a} attempts)", p.name()),
        Pos::At(p, None) => p.name(),
        Pos::New => "not enqueued".to_owned(),
        Pos::Gone => "nowhere".to_owned(),
    }
}

/// Where an op takes its item from and where it leaves it (`None`: nowhere), with attempts.
fn effect(op: &Op) -> (Option<Pos>, Option<Pos>) {
    let n = Some(op.attempt);
    let queue = |a| Some(Pos::At(Place::In(op.queue), a));
    let dead = |a| Some(Pos::At(Place::Dead(op.queue), a));
    match op.kind {
        Kind::Enqueue | Kind::EnqueueDelayed => (None, queue(Some(0))),
        Kind::Dequeue => (queue(None), None),
        Kind::Lease => (queue(Some(op.attempt.saturating_sub(1))), queue(n)),
        Kind::Ack => (queue(n), None),
        Kind::Retry | Kind::Release => (queue(n), queue(n)),
        Kind::Bury => (queue(n), dead(n)),
        Kind::Replay => (dead(n), queue(n)),
        Kind::ReplayReset => (dead(n), queue(Some(0))),
        Kind::Purge => (dead(n), None),
    }
}

/// Does an item at `pos` agree with `found` (where it was found, with the attempts seen if
/// they were seen), if up to `slack` leases nobody reported may have counted attempts since?
fn fits(pos: Pos, found: Option<(Place, Option<u32>)>, slack: u32) -> bool {
    match (pos.place(), found) {
        (None, None) => true,
        (Some(p), Some((f, seen))) if p == f => match (pos.attempts(), seen) {
            (Some(had), Some(seen)) => had <= seen && seen - had <= slack,
            _ => true,
        },
        _ => false,
    }
}

/// How many leases nobody reported may have counted attempts of an item at `pos` in
/// `children` children: none for a dead letter, none where there is no item.
fn slack(pos: Pos, children: usize) -> u32 {
    match pos.place() {
        Some(Place::In(_)) => u32::try_from(children).unwrap_or(u32::MAX),
        _ => 0,
    }
}

/// The kind of violation when `found` fits none of the positions an item may be at.
fn misfit_kind(possible: &[Pos], found: Option<Place>) -> &'static str {
    let places: Vec<Option<Place>> = possible.iter().map(|p| p.place()).collect();
    if places.contains(&found) {
        return "attempts";
    }
    match found {
        None if places.iter().all(Option::is_some) => "lost",
        Some(_) if places.iter().all(Option::is_none) => {
            if possible.contains(&Pos::Gone) {
                "came back"
            } else {
                "unexpected"
            }
        }
        Some(f) if places.iter().flatten().all(|p| p.is_dead() != f.is_dead()) => "dead letters",
        Some(_) => "wrong queue",
        None => "inconsistent",
    }
}

/// One queue of the reopened store, as the parent found it.
#[derive(Debug, Clone, Default)]
pub(crate) struct FoundQueue {
    /// Everything one transaction could dequeue.
    pub(crate) dequeued: Vec<u64>,
    /// What browsing listed: each item with its attempts.
    pub(crate) browsed: Vec<(u64, u32)>,
    /// Browsed items not ready (delayed or leased), although nothing should be.
    pub(crate) not_ready: Vec<u64>,
    /// The dead letters: each item with its attempts.
    pub(crate) dead: Vec<(u64, u32)>,
    /// Dead letters whose reason is not the one their item was failed with.
    pub(crate) wrong_reasons: Vec<(u64, String)>,
    /// `count()` before that transaction, and after it aborted.
    pub(crate) count: u64,
    pub(crate) count_after_abort: u64,
    /// `stats()` before that transaction: leased and delayed items, dead letters.
    pub(crate) leased: u64,
    pub(crate) delayed: u64,
    pub(crate) dead_count: u64,
    /// `stats().held` after the transaction aborted.
    pub(crate) held_after_abort: u64,
}

/// What the parent found in the reopened store.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    pub(crate) queues: BTreeMap<Queue, FoundQueue>,
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
    /// Acknowledged transactions (lease calls that leased something included), and their
    /// item operations.
    pub(crate) acked_txs: u64,
    pub(crate) acked_ops: u64,
    /// Transactions that reported an intent (a lease call: its start) but no
    /// acknowledgement.
    pub(crate) unknown_txs: u64,
    /// Acknowledged transactions that the store shows were lost (Buffered only), and the
    /// longest time between such an acknowledgement and the kill.
    pub(crate) lost_acked_txs: u64,
    pub(crate) max_lost_age: Duration,
    /// Acknowledged processing-layer operations: delayed enqueues, leases, acks, fails that
    /// retried, fails that buried, releases with a delay, replays, purges.
    pub(crate) delayed: u64,
    pub(crate) leases: u64,
    pub(crate) acks: u64,
    pub(crate) retries: u64,
    pub(crate) buries: u64,
    pub(crate) releases: u64,
    pub(crate) replays: u64,
    pub(crate) purges: u64,
    /// Dead letters, and items with attempts, the checks found (summed over the checks);
    /// the most attempts of one item.
    pub(crate) dead_found: u64,
    pub(crate) tried_found: u64,
    pub(crate) max_attempts: u32,
}

impl Figures {
    pub(crate) fn add(&mut self, other: &Figures) {
        self.acked_txs += other.acked_txs;
        self.acked_ops += other.acked_ops;
        self.unknown_txs += other.unknown_txs;
        self.lost_acked_txs += other.lost_acked_txs;
        self.max_lost_age = self.max_lost_age.max(other.max_lost_age);
        self.delayed += other.delayed;
        self.leases += other.leases;
        self.acks += other.acks;
        self.retries += other.retries;
        self.buries += other.buries;
        self.releases += other.releases;
        self.replays += other.replays;
        self.purges += other.purges;
        self.dead_found += other.dead_found;
        self.tried_found += other.tried_found;
        self.max_attempts = self.max_attempts.max(other.max_attempts);
    }

    fn count(&mut self, op: &Op) {
        let counter = match op.kind {
            Kind::EnqueueDelayed => &mut self.delayed,
            Kind::Lease => &mut self.leases,
            Kind::Ack => &mut self.acks,
            Kind::Retry => &mut self.retries,
            Kind::Bury => &mut self.buries,
            Kind::Release => &mut self.releases,
            Kind::Replay | Kind::ReplayReset => &mut self.replays,
            Kind::Purge => &mut self.purges,
            Kind::Enqueue | Kind::Dequeue => return,
        };
        *counter += 1;
    }
}

/// Where the store holds an item, with its attempts.
pub(crate) type Held = (Place, u32);

/// The parent's knowledge of the store.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Exactly what the store held at the last check.
    known: HashMap<u64, Held>,
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
        "cycle {} {} {} [{}] {}",
        log.cycle,
        if tx.lease { "lease call" } else { "tx" },
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
    pub(crate) fn items(&self) -> &HashMap<u64, Held> {
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
        let place = check_found(found, &mut verdict);
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
                    if !pair[0].post.continues_as(pair[1].pre) {
                        let (l0, t0) = tx(pair[0].var);
                        let (_, t1) = tx(pair[1].var);
                        verdict.add(
                            "in-process",
                            format!(
                                "item {id}: {} left it {}, then {} took it from {}",
                                describe(l0, t0),
                                pos_name(pair[0].post),
                                describe(l0, t1),
                                pos_name(pair[1].pre)
                            ),
                        );
                    }
                }
                let ci = seg[0].cycle;
                // Where the item was next seen, and in which cycle (the parent's look
                // counts as the cycle after the last).
                let (required, next_cycle) = match segs.get(si + 1) {
                    Some(next) => {
                        if next[0].pre == Pos::New {
                            let (l, t) = tx(next[0].var);
                            verdict.add(
                                "reused id",
                                format!("item {id} enqueued again by {}", describe(l, t)),
                            );
                        }
                        let pre = next[0].pre;
                        (pre.place().map(|p| (p, pre.attempts())), next[0].cycle)
                    }
                    None => (place.get(&id).map(|&(p, a)| (p, Some(a))), cycles.len()),
                };
                let k = seg.len();
                let position = |j: usize| if j == 0 { seg[0].pre } else { seg[j - 1].post };
                // Unreported leases: one per child in which the item sat in a queue after
                // its last reported step (in this child only if every step survived).
                let children = |j: usize| next_cycle - ci - 1 + usize::from(j == k);
                let fits_at =
                    |j: usize| fits(position(j), required, slack(position(j), children(j)));
                let lo = (1..=k)
                    .filter(|&i| forced[seg[i - 1].var])
                    .max()
                    .unwrap_or(0);
                let allowed: Vec<usize> = (lo..=k).filter(|&j| fits_at(j)).collect();
                let (Some(&min), Some(&max)) = (allowed.first(), allowed.last()) else {
                    let possible: Vec<Pos> = (lo..=k).map(position).collect();
                    let kind = misfit_kind(&possible, required.map(|r| r.0));
                    let mut detail = format!(
                        "item {id}: {} {}{}, but its history allows only {:?}:",
                        if si + 1 < segs.len() {
                            "the next child found it in"
                        } else {
                            "found"
                        },
                        place_name(required.map(|r| r.0)),
                        match required.and_then(|r| r.1) {
                            Some(a) => format!(" with {a} attempts"),
                            None => String::new(),
                        },
                        possible.iter().map(|p| pos_name(*p)).collect::<Vec<_>>()
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
                    if fits_at(m) {
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
        for (&id, &(was, had)) in &self.known {
            if segments.contains_key(&id) {
                continue;
            }
            let now = place.get(&id).copied();
            let then = Pos::At(was, Some(had));
            if !fits(
                then,
                now.map(|(p, a)| (p, Some(a))),
                slack(then, cycles.len()),
            ) {
                let kind = misfit_kind(&[then], now.map(|n| n.0));
                verdict.add(
                    kind,
                    format!(
                        "item {id} was in {}, no transaction touched it, now {}",
                        pos_name(then),
                        now.map_or("nowhere".to_owned(), |(p, a)| pos_name(Pos::At(p, Some(a))))
                    ),
                );
            }
        }
        for (&id, &(now, _)) in &place {
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
                        now.name()
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
                events.push((t.start, false, ti));
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
                Some(_) if t.ops.is_empty() => {} // a lease call that found nothing
                Some(at) => {
                    figures.acked_txs += 1;
                    figures.acked_ops += t.ops.len() as u64;
                    for op in &t.ops {
                        figures.count(op);
                    }
                    if sure_lost[var] {
                        figures.lost_acked_txs += 1;
                        let age = log.killed_at.saturating_duration_since(at);
                        figures.max_lost_age = figures.max_lost_age.max(age);
                    }
                }
                None => figures.unknown_txs += 1,
            }
        }
        for &(p, attempts) in place.values() {
            figures.dead_found += u64::from(p.is_dead());
            figures.tried_found += u64::from(attempts > 0);
            figures.max_attempts = figures.max_attempts.max(attempts);
        }

        for log in cycles {
            for t in &log.txs {
                for op in &t.ops {
                    if matches!(op.kind, Kind::Enqueue | Kind::EnqueueDelayed) {
                        self.ever.insert(op.id);
                    }
                }
            }
        }
        self.known = place;
        (verdict.0, figures)
    }

    /// Rule 2 at the start: an item's first transaction since the last check found it where
    /// the parent last saw it, with as many attempts or (after children that may have leased
    /// it without a word) a few more.
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
            Pos::At(p, attempts) => {
                let was = self.known.get(&id).copied();
                let then = was.map_or(Pos::Gone, |(w, a)| Pos::At(w, Some(a)));
                let fine = match was {
                    Some(_) => fits(then, Some((p, attempts)), slack(then, first.cycle)),
                    None => false,
                };
                if !fine {
                    let kind = match was {
                        None if self.ever.contains(&id) => "came back",
                        None => "unexpected",
                        Some(_) => misfit_kind(&[then], Some(p)),
                    };
                    verdict.add(
                        kind,
                        format!(
                            "{} took item {id} from {}, but at the last check it was {}",
                            describe(l, t),
                            pos_name(first.pre),
                            pos_name(then)
                        ),
                    );
                }
            }
            Pos::Gone => unreachable!("a step never starts from Gone"),
        }
    }
}

/// The store as found: each queue against itself (counts, stats, browsing), duplicates,
/// items in two places, set-aside records. Returns where each item is, with its attempts.
fn check_found(found: &Found, verdict: &mut Verdict) -> HashMap<u64, Held> {
    let mut place: HashMap<u64, Held> = HashMap::new();
    let mut put = |id: u64, held: Held, verdict: &mut Verdict| match place.insert(id, held) {
        Some((p, _)) if p == held.0 => {
            verdict.add("duplicate", format!("item {id} twice in {}", p.name()))
        }
        Some((p, _)) => {
            let kind = if p.is_dead() || held.0.is_dead() {
                "two places"
            } else {
                "both queues"
            };
            verdict.add(
                kind,
                format!("item {id} in {} and in {}", p.name(), held.0.name()),
            );
        }
        None => {}
    };
    for (&queue, fq) in &found.queues {
        let name = queue.name();
        let taken = fq.dequeued.len() as u64;
        if fq.count != taken {
            verdict.add(
                "count",
                format!(
                    "count() of {name} is {}, but a transaction dequeued {taken} items",
                    fq.count
                ),
            );
        }
        if fq.count_after_abort != fq.count {
            verdict.add(
                "count",
                format!(
                    "count() of {name} was {} before a dequeue-everything transaction, {} \
                     after it aborted",
                    fq.count, fq.count_after_abort
                ),
            );
        }
        let problems = [
            (fq.leased, "leased items after a restart"),
            (fq.delayed, "delayed items long after all were due"),
            (
                fq.held_after_abort,
                "items held after the only transaction aborted",
            ),
        ];
        for (n, what) in problems {
            if n > 0 {
                verdict.add("stats", format!("{name}: {n} {what}"));
            }
        }
        if fq.dead_count != fq.dead.len() as u64 {
            verdict.add(
                "stats",
                format!(
                    "{name}: stats() counts {} dead letters, dead_letters() lists {}",
                    fq.dead_count,
                    fq.dead.len()
                ),
            );
        }
        for (id, reason) in &fq.wrong_reasons {
            verdict.add(
                "dead letters",
                format!("{name}: the dead letter of item {id} gives the reason {reason:?}"),
            );
        }
        let mut browsed: Vec<u64> = fq.browsed.iter().map(|b| b.0).collect();
        let mut dequeued = fq.dequeued.clone();
        browsed.sort_unstable();
        dequeued.sort_unstable();
        if browsed != dequeued || !fq.not_ready.is_empty() {
            verdict.add(
                "browse",
                format!(
                    "{name}: browsing listed {} items ({} not ready: {:?}), a transaction \
                     dequeued {}",
                    browsed.len(),
                    fq.not_ready.len(),
                    &fq.not_ready[..fq.not_ready.len().min(5)],
                    dequeued.len()
                ),
            );
        }
        let attempts: HashMap<u64, u32> = fq.browsed.iter().copied().collect();
        for &id in &fq.dequeued {
            let seen = attempts.get(&id).copied().unwrap_or(0);
            put(id, (Place::In(queue), seen), verdict);
        }
        for &(id, seen) in &fq.dead {
            put(id, (Place::Dead(queue), seen), verdict);
        }
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
            // id -> (taken from, left in)
            let mut effects: Vec<(u64, Option<Pos>, Option<Pos>)> = Vec::new();
            for op in &t.ops {
                let slot = match effects.iter().position(|e| e.0 == op.id) {
                    Some(slot) => slot,
                    None => {
                        effects.push((op.id, None, None));
                        effects.len() - 1
                    }
                };
                let (takes, leaves) = effect(op);
                let mut twice = false;
                if let Some(from) = takes {
                    twice |= effects[slot].1.replace(from).is_some();
                }
                if let Some(to) = leaves {
                    twice |= effects[slot].2.replace(to).is_some();
                }
                if twice {
                    verdict.add(
                        "duplicate",
                        format!(
                            "item {} twice in one transaction: {}",
                            op.id,
                            describe(log, t)
                        ),
                    );
                }
            }
            for (id, from, to) in effects {
                let step = Step {
                    var: vars[ci][ti],
                    cycle: ci,
                    pre: from.unwrap_or(Pos::New),
                    post: to.unwrap_or(Pos::Gone),
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

    const A: Place = Place::In(Queue::A);
    const B: Place = Place::In(Queue::B);
    const C: Place = Place::In(Queue::C);
    const DEAD_C: Place = Place::Dead(Queue::C);

    fn cycle(cycle: usize, lines: &[&str]) -> CycleLog {
        let now = Instant::now();
        let lines: Vec<(Instant, String)> =
            lines.iter().map(|l| (now, format!("RQ|{l}"))).collect();
        CycleLog::parse(cycle, &lines, now)
    }

    /// A store that holds `items` (place, item, attempts), consistent with itself.
    fn store(items: &[(Place, u64, u32)]) -> Found {
        let mut found = Found::default();
        for queue in Queue::ALL {
            found.queues.insert(queue, FoundQueue::default());
        }
        for &(place, id, attempts) in items {
            let (Place::In(q) | Place::Dead(q)) = place;
            let fq = found.queues.get_mut(&q).unwrap();
            match place {
                Place::In(_) => {
                    fq.dequeued.push(id);
                    fq.browsed.push((id, attempts));
                    fq.count += 1;
                    fq.count_after_abort += 1;
                }
                Place::Dead(_) => {
                    fq.dead.push((id, attempts));
                    fq.dead_count += 1;
                }
            }
        }
        found
    }

    /// A store with these items in `a` and `b`, never leased.
    fn found(a: &[u64], b: &[u64]) -> Found {
        let items: Vec<(Place, u64, u32)> = (a.iter().map(|&id| (A, id, 0)))
            .chain(b.iter().map(|&id| (B, id, 0)))
            .collect();
        store(&items)
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
        store.queues.get_mut(&Queue::A).unwrap().count = 2;
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

    /// Item 1 enqueued into `c`, then leased twice (released at once in between).
    const LEASED_TWICE: [&str; 7] = [
        "O",
        "i|0|+c1",
        "a|0",
        "l|1",
        "L|1|Lc1@1",
        "l|2",
        "L|2|Lc1@2",
    ];

    #[test]
    fn attempts_never_go_down() {
        let c = [cycle(0, &LEASED_TWICE)];
        // Sync: both leases were acknowledged, so 2 attempts; 3 if a third lease was under
        // way at the kill.
        for (attempts, expected) in [
            (0, "attempts"),
            (1, "attempts"),
            (2, ""),
            (3, ""),
            (4, "attempts"),
        ] {
            let k = kinds(
                &mut Model::default(),
                Durability::Sync,
                &c,
                &store(&[(C, 1, attempts)]),
            );
            assert_eq!(
                k.first().copied().unwrap_or(""),
                expected,
                "{attempts} attempts"
            );
        }
        // Buffered: the leases may be lost (the second, or both), but not more.
        for (attempts, expected) in [(0, ""), (1, ""), (3, ""), (4, "attempts")] {
            let k = kinds(
                &mut Model::default(),
                Durability::Buffered,
                &c,
                &store(&[(C, 1, attempts)]),
            );
            assert_eq!(
                k.first().copied().unwrap_or(""),
                expected,
                "{attempts} attempts"
            );
        }
        // A lease whose result was not reported may have counted: one per child.
        let mut model = Model::default();
        assert!(kinds(&mut model, Durability::Sync, &c, &store(&[(C, 1, 2)])).is_empty());
        let quiet = [cycle(1, &["O"]), cycle(2, &["O", "l|0"])];
        let k = kinds(&mut model, Durability::Sync, &quiet, &store(&[(C, 1, 4)]));
        assert!(k.is_empty(), "{k:?}");
        let k = kinds(&mut model, Durability::Sync, &quiet, &store(&[(C, 1, 3)]));
        assert_eq!(k, ["attempts"], "down from 4");
    }

    #[test]
    fn the_next_child_sees_the_attempts_of_the_last() {
        let first = cycle(0, &LEASED_TWICE);
        for (line, expected) in [
            ("L|0|Lc1@3", ""),
            ("L|0|Lc1@4", ""), // a lease under way at the kill counted one more
            ("L|0|Lc1@2", "attempts"),
            ("L|0|Lc1@5", "attempts"),
        ] {
            let second = cycle(1, &["O", "l|0", line]);
            let attempts = line[line.len() - 1..].parse().unwrap();
            let c = [first.clone(), second];
            let k = kinds(
                &mut Model::default(),
                Durability::Sync,
                &c,
                &store(&[(C, 1, attempts)]),
            );
            assert_eq!(k.first().copied().unwrap_or(""), expected, "{line}");
        }
        // Within one child, attempts follow each other exactly.
        let mut lines = LEASED_TWICE.to_vec();
        lines.extend(["l|3", "L|3|Lc1@4"]);
        let k = kinds(
            &mut Model::default(),
            Durability::Sync,
            &[cycle(0, &lines)],
            &store(&[(C, 1, 4)]),
        );
        assert_eq!(k, ["in-process"]);
    }

    /// Item 1 into `c`, then leased three times and failed each time, the third time to
    /// the dead letters (acknowledged, or not when `acked` is false).
    fn failed_thrice(acked: bool) -> CycleLog {
        let mut lines = vec![
            "O",
            "i|0|+c1",
            "a|0",
            "l|1",
            "L|1|Lc1@1",
            "i|2|Fc1@1",
            "a|2",
        ];
        lines.extend([
            "l|3",
            "L|3|Lc1@2",
            "i|4|Rc1@2",
            "a|4",
            "l|5",
            "L|5|Lc1@3",
            "i|6|Dc1@3",
        ]);
        if acked {
            lines.push("a|6");
        }
        cycle(0, &lines)
    }

    #[test]
    fn an_acknowledged_fail_at_the_maximum_makes_a_dead_letter() {
        let c = [failed_thrice(true)];
        let sync = Durability::Sync;
        assert!(kinds(&mut Model::default(), sync, &c, &store(&[(DEAD_C, 1, 3)])).is_empty());
        let k = kinds(&mut Model::default(), sync, &c, &store(&[(C, 1, 3)]));
        assert_eq!(k, ["dead letters"]);
        let k = kinds(&mut Model::default(), sync, &c, &store(&[]));
        assert_eq!(k, ["lost"]);
        let k = kinds(&mut Model::default(), sync, &c, &store(&[(DEAD_C, 1, 2)]));
        assert_eq!(k, ["attempts"]);
        let k = kinds(
            &mut Model::default(),
            sync,
            &c,
            &store(&[(DEAD_C, 1, 3), (C, 1, 3)]),
        );
        assert!(k.contains(&"two places"), "{k:?}");
        // Under Buffered the fail may be lost, and a lease or two before it.
        let buffered = Durability::Buffered;
        for attempts in [1, 2, 3] {
            let k = kinds(
                &mut Model::default(),
                buffered,
                &c,
                &store(&[(C, 1, attempts)]),
            );
            assert!(k.is_empty(), "{attempts}: {k:?}");
        }
        // Not acknowledged: either way.
        let c = [failed_thrice(false)];
        for place in [C, DEAD_C] {
            let k = kinds(&mut Model::default(), sync, &c, &store(&[(place, 1, 3)]));
            assert!(k.is_empty(), "{place:?}: {k:?}");
        }
    }

    #[test]
    fn replays_and_purges_take_dead_letters_and_nothing_else_moves_them() {
        let sync = Durability::Sync;
        let dead = || {
            let mut model = Model::default();
            let k = kinds(
                &mut model,
                sync,
                &[failed_thrice(true)],
                &store(&[(DEAD_C, 1, 3)]),
            );
            assert!(k.is_empty(), "{k:?}");
            model
        };
        type Items = &'static [(Place, u64, u32)];
        let cases: [(&str, Items, &str); 9] = [
            ("i|0|Zc1@3", &[(C, 1, 0)], ""),
            ("i|0|Zc1@3", &[(C, 1, 3)], "attempts"),
            ("i|0|Zc1@3", &[(DEAD_C, 1, 3)], "dead letters"),
            ("i|0|Yc1@3", &[(C, 1, 3)], ""),
            ("i|0|Yc1@3", &[(C, 1, 4)], ""), // leased without a word
            ("i|0|Yc1@2", &[(C, 1, 2)], "attempts"), // not the dead letter's attempts
            ("i|0|Xc1@3", &[], ""),
            ("i|0|Xc1@3", &[(DEAD_C, 1, 3)], "came back"),
            ("i|0|Xc1@3", &[(C, 1, 3)], "came back"),
        ];
        for (line, items, expected) in cases {
            let c = [cycle(1, &["O", line, "a|0"])];
            let k = kinds(&mut dead(), sync, &c, &store(items));
            assert_eq!(
                k.first().copied().unwrap_or(""),
                expected,
                "{line} {items:?}"
            );
        }
        // A dead letter nobody touched stays as it was.
        let quiet = [cycle(1, &["O"])];
        assert!(kinds(&mut dead(), sync, &quiet, &store(&[(DEAD_C, 1, 3)])).is_empty());
        let k = kinds(&mut dead(), sync, &quiet, &store(&[(DEAD_C, 1, 4)]));
        assert_eq!(k, ["attempts"]);
        let k = kinds(&mut dead(), sync, &quiet, &store(&[(C, 1, 3)]));
        assert_eq!(k, ["dead letters"]);
    }

    #[test]
    fn acks_consume_leased_items_atomically_with_their_follow_ups() {
        let lines = [
            "O",
            "i|0|+c1",
            "a|0",
            "l|1",
            "L|1|Lc1@1",
            "fs|0",
            "fd|0",
            "i|2|Ac1@1,+a2",
            "a|2",
        ];
        let c = [cycle(0, &lines)];
        let sync = Durability::Sync;
        assert!(kinds(&mut Model::default(), sync, &c, &found(&[2], &[])).is_empty());
        let k = kinds(
            &mut Model::default(),
            sync,
            &c,
            &store(&[(A, 2, 0), (C, 1, 1)]),
        );
        assert_eq!(k, ["came back"]);
        let buffered = Durability::Buffered;
        let k = kinds(&mut Model::default(), buffered, &c, &store(&[(C, 1, 1)]));
        assert!(k.is_empty(), "the ack lost whole: {k:?}");
        let k = kinds(&mut Model::default(), buffered, &c, &store(&[]));
        assert_eq!(k, ["partial"], "the ack applied, its follow-up lost");
    }

    #[test]
    fn buffered_lease_calls_keep_the_commit_order() {
        let d = Durability::Buffered;
        // The lease was acknowledged before the enqueue of 2 began: 2 survives only with it.
        let lines = [
            "O",
            "i|0|+c1",
            "a|0",
            "fs|0",
            "fd|0",
            "l|1",
            "L|1|Lc1@1",
            "i|2|+c2",
            "a|2",
        ];
        let c = [cycle(0, &lines)];
        let k = kinds(
            &mut Model::default(),
            d,
            &c,
            &store(&[(C, 1, 0), (C, 2, 0)]),
        );
        assert_eq!(k, ["not a prefix"]);
        assert!(kinds(
            &mut Model::default(),
            d,
            &c,
            &store(&[(C, 1, 1), (C, 2, 0)])
        )
        .is_empty());
        // Started before the enqueue was acknowledged, and reported after it: either way.
        let lines = [
            "O",
            "i|0|+c1",
            "a|0",
            "fs|0",
            "fd|0",
            "l|1",
            "i|2|+c2",
            "a|2",
            "L|1|Lc1@1",
        ];
        let c = [cycle(0, &lines)];
        assert!(kinds(
            &mut Model::default(),
            d,
            &c,
            &store(&[(C, 1, 0), (C, 2, 0)])
        )
        .is_empty());
    }

    #[test]
    fn the_reopened_store_agrees_with_itself() {
        let c = [cycle(0, &["O", "i|0|+c1,+c2", "a|0"])];
        let sync = Durability::Sync;
        let good = store(&[(C, 1, 0), (C, 2, 0)]);
        assert!(kinds(&mut Model::default(), sync, &c, &good).is_empty());
        type Spoil = fn(&mut FoundQueue);
        let spoilers: [(Spoil, &str); 6] = [
            (
                |q| q.wrong_reasons.push((1, "lease expired".into())),
                "dead letters",
            ),
            (|q| q.leased = 1, "stats"),
            (|q| q.delayed = 1, "stats"),
            (|q| q.dead_count = 1, "stats"),
            (|q| q.not_ready.push(1), "browse"),
            (|q| q.browsed.truncate(1), "browse"),
        ];
        for (spoil, expected) in spoilers {
            let mut bad = good.clone();
            spoil(bad.queues.get_mut(&Queue::C).unwrap());
            let k = kinds(&mut Model::default(), sync, &c, &bad);
            assert_eq!(k.first().copied(), Some(expected));
        }
    }
}
