//! How a case is judged from what its child did and reported.

use std::collections::BTreeMap;
use std::process::ExitStatus;
use std::time::Duration;

use super::child::{OpenOutcome, Opened, Report, Seen};
use super::workload::{Expected, QUEUES};

/// The outcome of one case, in the order of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Outcome {
    /// Opened, nothing set aside or missing, every queue exactly as expected.
    Intact,
    /// Opened with set-aside records; their queues fenced, every other queue exact.
    SetAside,
    /// `Error::MissingRecords`; the salvage open reports missing ranges, fences the queues the
    /// error named, and every other queue is exact.
    MissingReported,
    /// Any other `Error` from the open (or from opening or reading a queue of an opened store,
    /// or from the salvage open).
    TypedError,
    /// The open returned a typed error (`Error::Damaged`) after a panic inside sled that the
    /// store caught at its boundary, as the issue asks: the process goes on, but the panic
    /// hook ran (sled's message on stderr), and a program built with `panic = "abort"` would
    /// have died. Not a failure of the campaign; counted apart so that it stays visible.
    CaughtPanic,
    /// The child panicked, or ended in a way other than reporting.
    Panic,
    /// The child did not finish within the time limit.
    Hang,
    /// An unfenced queue holds an item consumed by a committed dequeue.
    Resurrection,
    /// An unfenced queue lacks a committed item, or differs in any other way.
    Loss,
    /// The store opened, every unfenced queue is exact, but what it reported contradicts
    /// itself: a queue a set-aside record names is not fenced, the error's queues are not
    /// fenced after salvage, a salvage open reports no missing records.
    Inconsistent,
}

impl Outcome {
    /// Every outcome, in table order.
    pub(crate) const ALL: [Outcome; 10] = [
        Outcome::Intact,
        Outcome::SetAside,
        Outcome::MissingReported,
        Outcome::TypedError,
        Outcome::CaughtPanic,
        Outcome::Panic,
        Outcome::Hang,
        Outcome::Resurrection,
        Outcome::Loss,
        Outcome::Inconsistent,
    ];

    /// Its row in the table.
    pub(crate) fn row(self) -> &'static str {
        match self {
            Outcome::Intact => "intact",
            Outcome::SetAside => "set-aside records, queues fenced",
            Outcome::MissingReported => "missing records reported (salvage opens, queues fenced)",
            Outcome::TypedError => "typed error",
            Outcome::Panic => "panic",
            Outcome::CaughtPanic => "typed error, after a panic inside sled caught at the boundary",
            Outcome::Hang => "hang",
            Outcome::Resurrection => "silent resurrection",
            Outcome::Loss => "silent loss",
            Outcome::Inconsistent => "inconsistent report",
        }
    }

    /// Whether the outcome fails the campaign.
    pub(crate) fn is_bad(self) -> bool {
        self >= Outcome::Panic
    }

    /// Whether its row is printed when no case had it.
    pub(crate) fn always_shown(self) -> bool {
        !matches!(self, Outcome::Inconsistent | Outcome::CaughtPanic)
    }
}

/// How the child process ended.
#[derive(Debug)]
pub(crate) struct ChildRun {
    /// `None` when it was killed at the time limit.
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) elapsed: Duration,
}

impl ChildRun {
    /// The lines meant for the parent, without their prefix.
    pub(crate) fn lines(&self) -> impl Iterator<Item = &str> {
        self.stdout.lines().filter_map(|line| {
            line.find(super::child::PREFIX)
                .map(|at| &line[at + super::child::PREFIX.len()..])
        })
    }
}

/// The verdict on one case: its outcome and what was seen.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) outcome: Outcome,
    /// What the open did, in a few words (the error variant, the fenced queues, ...).
    pub(crate) summary: String,
    /// Why a bad case is bad.
    pub(crate) detail: String,
}

fn verdict(outcome: Outcome, summary: impl Into<String>, detail: impl Into<String>) -> Verdict {
    Verdict {
        outcome,
        summary: summary.into(),
        detail: detail.into(),
    }
}

/// Judges a case from its child's run.
pub(crate) fn judge(run: &ChildRun, expected: &Expected) -> Verdict {
    let report = Report::parse(run.lines());
    let seen = describe(&report);
    let panicked = run
        .stderr
        .lines()
        .filter(|l| l.contains("panicked at") || l.contains("fatal runtime error"))
        .take(3)
        .collect::<Vec<_>>();
    let Some(status) = run.status else {
        return verdict(
            Outcome::Hang,
            "killed at the time limit",
            format!("no outcome within {:?}; so far: {seen}", run.elapsed),
        );
    };
    let complete =
        status.success() && report.end && report.garbled.is_empty() && report.open.is_some();
    if !panicked.is_empty() {
        let tail: String = run.stderr.chars().take(1500).collect();
        // A panic in the child's main thread that the store caught and turned into an error:
        // uncaught, it would have failed the child's test and its exit status.
        let main_thread = format!("thread '{}'", super::TEST_NAME);
        let caught = complete && panicked.iter().all(|l| l.contains(&main_thread));
        return if caught {
            verdict(
                Outcome::CaughtPanic,
                format!("panicked, then {seen}"),
                panicked.join(" | "),
            )
        } else {
            verdict(
                Outcome::Panic,
                "panicked",
                format!("{}; seen: {seen}; stderr: {tail}", panicked.join(" | ")),
            )
        };
    }
    if !complete {
        let tail: String = run.stderr.chars().take(1500).collect();
        return verdict(
            Outcome::Panic,
            format!("child ended abnormally ({status})"),
            format!(
                "exit {status}, report complete: {}, unreadable lines {:?}; seen: {seen}; stderr: {tail}",
                report.end, report.garbled
            ),
        );
    }
    let mut v = match report.open.as_ref().expect("checked above") {
        OpenOutcome::Error { variant, msg } => {
            verdict(Outcome::TypedError, format!("Err({variant})"), msg.clone())
        }
        OpenOutcome::Opened(opened) => judge_opened(opened, expected, None),
        OpenOutcome::Missing { ranges, queues, .. } => match &report.salvage {
            None => verdict(
                Outcome::Panic,
                "MissingRecords, then no salvage outcome",
                seen.clone(),
            ),
            Some(OpenOutcome::Error { variant, msg }) => verdict(
                Outcome::TypedError,
                format!("Err(MissingRecords), salvage Err({variant})"),
                msg.clone(),
            ),
            Some(OpenOutcome::Missing { .. }) => verdict(
                Outcome::TypedError,
                "Err(MissingRecords), salvage Err(MissingRecords)",
                seen.clone(),
            ),
            Some(OpenOutcome::Opened(opened)) => {
                let mut v = judge_opened(opened, expected, Some((ranges, queues)));
                v.summary = format!(
                    "Err(MissingRecords {} in {}), salvage: {}",
                    format_ranges(ranges),
                    queue_list(queues),
                    v.summary
                );
                if !v.outcome.is_bad() {
                    judge_reopen(
                        &mut v,
                        opened,
                        report.reopen.as_ref(),
                        expected,
                        (ranges, queues),
                    );
                }
                v
            }
        },
    };
    if let Some(unfenced) = &report.unfenced {
        let (notes, problems) = judge_unfenced(unfenced, expected);
        v.summary.push_str(&format!("; once unfenced: {notes}"));
        if !problems.is_empty() && !v.outcome.is_bad() {
            v.outcome = Outcome::Loss;
            v.detail = format!("once unfenced: {}", problems.join("; "));
        }
    }
    if !report.close_errors.is_empty() {
        v.summary
            .push_str(&format!("; close: {}", report.close_errors.join(" | ")));
    }
    if v.outcome.is_bad() && v.detail.is_empty() {
        v.detail = seen;
    }
    v
}

/// The plain open after a salvage: it must open, with the same fences, the missing ranges
/// still reported and every unfenced queue exact.
fn judge_reopen(
    v: &mut Verdict,
    salvaged: &Opened,
    reopen: Option<&OpenOutcome>,
    expected: &Expected,
    missing: MissingError<'_>,
) {
    let fenced = |o: &Opened| -> Vec<String> {
        o.queues
            .iter()
            .filter(|(_, seen)| matches!(seen, Seen::Fenced(_)))
            .map(|(name, _)| name.clone())
            .collect()
    };
    match reopen {
        Some(OpenOutcome::Opened(again)) => {
            let r = judge_opened(again, expected, Some(missing));
            if r.outcome.is_bad() {
                v.outcome = r.outcome;
                v.detail = format!("at the plain reopen after salvage: {}", r.detail);
                v.summary.push_str(&format!("; reopen: {}", r.summary));
            } else if fenced(again) != fenced(salvaged) {
                v.outcome = Outcome::Inconsistent;
                v.detail = format!(
                    "the plain reopen after salvage fences {:?}, the salvage open fenced {:?}",
                    fenced(again),
                    fenced(salvaged)
                );
            }
        }
        Some(other) => {
            v.outcome = Outcome::Inconsistent;
            v.detail = format!("the salvaged store does not reopen plainly: {other:?}");
        }
        None => {
            v.outcome = Outcome::Inconsistent;
            v.detail = "no outcome of the plain reopen after salvage".to_owned();
        }
    }
}

/// What the fenced queues hold once unfenced. The damage is accepted then: items may be
/// missing, and items consumed may be back; but every item must be one committed to that
/// queue, intact, and there once. Returns a summary and the problems.
fn judge_unfenced(unfenced: &Opened, expected: &Expected) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    for (name, seen) in &unfenced.queues {
        let Some(q) = QUEUES.iter().position(|n| n == name) else {
            continue;
        };
        match seen {
            Seen::Items { tokens, .. } => {
                let live: std::collections::BTreeSet<&str> =
                    expected.queues[q].iter().map(String::as_str).collect();
                let mut once = std::collections::BTreeSet::new();
                let mut back = 0;
                let mut bad = Vec::new();
                for t in tokens {
                    if !once.insert(t.as_str()) {
                        bad.push(format!("{t} twice"));
                    } else if live.contains(t.as_str()) {
                    } else if expected.consumed.contains(t)
                        && super::workload::queue_of(t) == Some(q)
                    {
                        back += 1;
                    } else if expected.aborted.contains(t) {
                        bad.push(format!("{t} (enqueued by an aborted transaction)"));
                    } else {
                        bad.push(t.clone());
                    }
                }
                let present = tokens.len() - back - bad.len();
                notes.push(format!(
                    "{name} {present} of {} items, {back} consumed back",
                    expected.queues[q].len()
                ));
                if !bad.is_empty() {
                    problems.push(format!(
                        "{name} holds items never committed to it: {}",
                        abbreviate(&bad)
                    ));
                }
            }
            Seen::Fenced(msg) => notes.push(format!("{name} still fenced ({msg})")),
            Seen::Error { variant, msg } => notes.push(format!("{name}: {variant}: {msg}")),
        }
    }
    (notes.join(", "), problems)
}

fn format_ranges(ranges: &[(u64, u64)]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}..={hi}")
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn queue_list(queues: &[String]) -> String {
    format!("[{}]", queues.join(", "))
}

/// The ranges and queues of an `Error::MissingRecords`.
type MissingError<'a> = (&'a Vec<(u64, u64)>, &'a Vec<String>);

/// Judges an opened store; `missing`: the ranges and queues of the `MissingRecords` error
/// that preceded a salvage open.
fn judge_opened(
    opened: &Opened,
    expected: &Expected,
    missing: Option<MissingError<'_>>,
) -> Verdict {
    let mut fenced = Vec::new();
    let mut errors = Vec::new();
    let mut resurrected = Vec::new();
    let mut differences = Vec::new();
    for (q, name) in QUEUES.iter().enumerate() {
        match opened.queues.get(*name) {
            None => differences.push(format!("{name}: not reported")),
            Some(Seen::Fenced(_)) => fenced.push(name.to_string()),
            Some(Seen::Error { variant, msg }) => errors.push(format!("{name}: {variant}: {msg}")),
            Some(Seen::Items { count, tokens }) => {
                let c = compare(&expected.queues[q], tokens, expected);
                if !c.resurrected.is_empty() {
                    resurrected.push(format!("{name}: {}", c.resurrected.join(",")));
                }
                let mut diff = Vec::new();
                if !c.lost.is_empty() {
                    diff.push(format!("lost {} ({})", c.lost.len(), abbreviate(&c.lost)));
                }
                if !c.unexpected.is_empty() {
                    diff.push(format!(
                        "unexpected {} ({})",
                        c.unexpected.len(),
                        abbreviate(&c.unexpected)
                    ));
                }
                if c.lost.is_empty()
                    && c.unexpected.is_empty()
                    && c.resurrected.is_empty()
                    && tokens != &expected.queues[q]
                {
                    diff.push("same items in another order".to_owned());
                }
                if *count != tokens.len() as u64 {
                    diff.push(format!("count() {count}, read {}", tokens.len()));
                }
                if !diff.is_empty() {
                    differences.push(format!(
                        "{name}: {} (expected {} items, read {})",
                        diff.join(", "),
                        expected.queues[q].len(),
                        tokens.len()
                    ));
                }
            }
        }
    }
    let mut inconsistent = Vec::new();
    for record in &opened.set_aside {
        let named: Vec<&str> = match &record.queues {
            None => QUEUES.to_vec(),
            Some(names) => names.iter().map(String::as_str).collect(),
        };
        for name in named {
            if QUEUES.contains(&name) && !fenced.iter().any(|f| f == name) {
                inconsistent.push(format!(
                    "set-aside record {} names {name}, which is not fenced",
                    record.record
                ));
            }
        }
    }
    if let Some((_, queues)) = missing {
        if opened.missing.is_empty() {
            inconsistent.push("the salvage open reports no missing records".to_owned());
        }
        for name in queues {
            if QUEUES.contains(&name.as_str()) && !fenced.contains(name) {
                inconsistent.push(format!(
                    "{name}, named by MissingRecords, is not fenced after salvage"
                ));
            }
        }
    }
    let mut summary = Vec::new();
    summary.push(if missing.is_some() { "opened" } else { "Ok" }.to_owned());
    if !opened.set_aside.is_empty() {
        let records: Vec<String> = opened
            .set_aside
            .iter()
            .map(|r| format!("{} ({})", r.record, r.reason))
            .collect();
        summary.push(format!("set aside: {}", records.join(", ")));
    }
    if !opened.missing.is_empty() {
        summary.push(format!("missing {}", format_ranges(&opened.missing)));
    }
    if !fenced.is_empty() {
        summary.push(format!("fenced {}", queue_list(&fenced)));
    }
    if !errors.is_empty() {
        summary.push(format!("queue errors: {}", errors.join("; ")));
    }
    let extra: Vec<&String> = opened
        .names
        .iter()
        .filter(|n| !QUEUES.contains(&n.as_str()))
        .collect();
    if !extra.is_empty() {
        summary.push(format!("other queue names {extra:?}"));
    }
    let summary = summary.join(", ");
    let unfenced_state = {
        let mut parts = Vec::new();
        parts.extend(resurrected.iter().map(|r| format!("resurrected {r}")));
        parts.extend(differences.iter().cloned());
        parts.join("; ")
    };
    if !resurrected.is_empty() {
        return verdict(Outcome::Resurrection, summary, unfenced_state);
    }
    if !differences.is_empty() {
        return verdict(Outcome::Loss, summary, unfenced_state);
    }
    if !inconsistent.is_empty() {
        return verdict(Outcome::Inconsistent, summary, inconsistent.join("; "));
    }
    if !errors.is_empty() {
        return verdict(Outcome::TypedError, summary, errors.join("; "));
    }
    if missing.is_some() {
        return verdict(Outcome::MissingReported, summary, "");
    }
    if fenced.is_empty() && opened.set_aside.is_empty() && opened.missing.is_empty() {
        verdict(Outcome::Intact, summary, "")
    } else {
        verdict(Outcome::SetAside, summary, "")
    }
}

/// How a queue's items differ from the expected ones.
struct Comparison {
    /// Items consumed by a committed dequeue, back.
    resurrected: Vec<String>,
    /// Expected items not read.
    lost: Vec<String>,
    /// Items read that were not expected (not counting resurrected ones): enqueued by an
    /// aborted transaction, of another queue, read twice, or not an item at all (`?<len>`).
    unexpected: Vec<String>,
}

fn compare(expected: &[String], got: &[String], all: &Expected) -> Comparison {
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for t in expected {
        *left.entry(t).or_default() += 1;
    }
    let mut resurrected = Vec::new();
    let mut unexpected = Vec::new();
    for t in got {
        match left.get_mut(t.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ if all.consumed.contains(t) => resurrected.push(t.clone()),
            _ if all.aborted.contains(t) => unexpected.push(format!("{t} (aborted)")),
            _ => unexpected.push(t.clone()),
        }
    }
    let lost = expected
        .iter()
        .filter(|t| {
            let n = left.get_mut(t.as_str()).expect("counted");
            if *n > 0 {
                *n -= 1;
                true
            } else {
                false
            }
        })
        .cloned()
        .collect();
    Comparison {
        resurrected,
        lost,
        unexpected,
    }
}

fn abbreviate(tokens: &[String]) -> String {
    if tokens.len() <= 12 {
        tokens.join(",")
    } else {
        format!("{},... {} more", tokens[..10].join(","), tokens.len() - 10)
    }
}

/// A short account of a report, for the list of bad cases.
fn describe(report: &Report) -> String {
    let mut parts = Vec::new();
    let outcome = |o: &OpenOutcome| match o {
        OpenOutcome::Error { variant, msg } => format!("Err({variant}: {msg})"),
        OpenOutcome::Missing { ranges, queues, .. } => format!(
            "Err(MissingRecords {} in {})",
            format_ranges(ranges),
            queue_list(queues)
        ),
        OpenOutcome::Opened(o) => format!(
            "Ok ({} set aside, missing {}, queues {:?})",
            o.set_aside.len(),
            format_ranges(&o.missing),
            o.queues
                .iter()
                .map(|(name, seen)| match seen {
                    Seen::Items { tokens, .. } => format!("{name}: {} items", tokens.len()),
                    Seen::Fenced(_) => format!("{name}: fenced"),
                    Seen::Error { variant, .. } => format!("{name}: {variant}"),
                })
                .collect::<Vec<_>>()
        ),
    };
    match &report.open {
        None => parts.push("no open outcome".to_owned()),
        Some(o) => parts.push(format!("open: {}", outcome(o))),
    }
    if let Some(o) = &report.salvage {
        parts.push(format!("salvage: {}", outcome(o)));
    }
    if let Some(o) = &report.reopen {
        parts.push(format!("reopen: {}", outcome(o)));
    }
    parts.join("; ")
}
