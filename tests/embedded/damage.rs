//! Damage campaign: a closed store whose exact contents are known is damaged in every way a
//! disk, a backup or a careless hand can damage it, and opened after each damage.
//!
//! The pristine store is made by child processes (`damage/workload.rs`), one per session, two
//! sessions: three queues, 303 committed items (twelve of 200 KiB, in sled's `blobs/` files),
//! 91 committed dequeues, aborted transactions in between. The cases (`damage/cases.rs`), each on
//! a fresh copy of it (directories 0700, as the store requires):
//!
//! - no damage (the control case: it must be intact, or the harness is wrong);
//! - a backup restored over part of the store: each class of files (`db`, `conf`, `snap.*`,
//!   `blobs/*`, the store's own files) and all of sled's files together replaced by their
//!   versions from a copy of the store taken after the first session;
//! - every file under the store directory deleted in turn, and every directory (`blobs/`);
//! - every file cut at 7 points: 0, 1, its quarters, one random point, `len - 1`;
//! - one bit flipped at 120 random places, one place per case: half in a class of files
//!   chosen uniformly (`db`, `conf`, `snap.*`, `blobs/*`, `marks`), where it wrote something,
//!   half anywhere in all the bytes.
//!
//! Each case is opened by a child process (this test binary again, its role chosen by
//! `RQ_DAMAGE_ROLE`; `damage/child.rs`), with default options, under a time limit. The child
//! prints what the open did: its error, or the set-aside records, the missing ranges and, for
//! each queue, `Fenced` or its exact contents (read by dequeuing everything in one transaction
//! and aborting it). After `Error::MissingRecords` it opens again with `Builder::salvage`,
//! reports that, then opens plainly once more (a salvaged store must open without the option,
//! its queues still fenced). Once a store opened with fenced queues, it unfences them and
//! reports what they hold. The parent judges each case (`damage/verdict.rs`):
//!
//! - intact: opened, nothing set aside or missing, every queue exactly as expected (the same
//!   items, intact, in item-id order, and `count()` agrees);
//! - set-aside records, their queues fenced, every unfenced queue exact;
//! - missing records reported: `MissingRecords`, then the salvage open (and the plain one after
//!   it) reports missing ranges, fences the queues the error named, and every unfenced queue is
//!   exact;
//! - a typed error: any other `Error` (from the open, from opening or reading a queue of the
//!   opened store, or from the salvage open);
//! - a typed error after a panic inside sled that the store caught at its boundary and turned
//!   into `Error::Damaged` (counted apart: the panic hook ran, and a program built with
//!   `panic = "abort"` would die);
//! - bad: a panic (the child failed, was killed by a signal, printed a panic it did not turn
//!   into an error, or gave no complete report), a hang (no end within the limit), a
//!   silent resurrection (an unfenced queue holds an item a committed dequeue consumed), a
//!   silent loss (an unfenced queue lacks a committed item or differs in any other way; also a
//!   queue that, once unfenced, holds an item never committed to it or one twice) or an
//!   inconsistent report (a queue a set-aside record names is not fenced, a salvage open that
//!   reports nothing missing, a salvaged store that does not reopen as it was).
//!
//! It prints the table of outcomes with a breakdown by kind of damage and by file (with
//! `--nocapture`), lists every bad case and fails if there is one.
//!
//! Scale, all optional: `RQ_DAMAGE_FLIPS` (bit flips, default 120), `RQ_DAMAGE_CUTS` (cut points
//! per file, default 7), `RQ_DAMAGE_SEED` (the seed of the cut and flip choices; random by
//! default and printed), `RQ_DAMAGE_JOBS` (children at a time, default: the number of CPUs),
//! `RQ_DAMAGE_TIMEOUT` (seconds a child may take, default 30). To look at cases again:
//! `RQ_DAMAGE_KEEP=1` keeps the pristine store (and the expected contents next to it) and
//! prints where; `RQ_DAMAGE_PRISTINE=<that directory>` reuses it instead of building one, and
//! with the same seed gives the same cases; `RQ_DAMAGE_ONLY=<text>` runs only the cases whose
//! description contains the text; `RQ_DAMAGE_VERBOSE=1` lists every case and its outcome.
//!
//! ```sh
//! cargo test --release --test embedded -- damage:: --nocapture
//! RQ_DAMAGE_FLIPS=2000 RQ_DAMAGE_CUTS=20 cargo test --release --test embedded -- damage:: --nocapture
//! ```

#[path = "damage/cases.rs"]
mod cases;
#[path = "damage/child.rs"]
mod child;
#[path = "damage/verdict.rs"]
mod verdict;
#[path = "damage/workload.rs"]
mod workload;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use cases::Damage;
use verdict::{ChildRun, Outcome, Verdict};
use workload::Expected;

/// The test's full name in the test binary, which the children are started with (and
/// libtest names its thread after).
const TEST_NAME: &str = "damage::damage_campaign_never_panics_hangs_or_loses_silently";

const DEFAULT_FLIPS: usize = 120;
const DEFAULT_CUTS: usize = 7;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The build child makes a store of a few MiB; generous.
const BUILD_TIMEOUT: Duration = Duration::from_secs(120);
/// File, under the kept directory, holding the expected contents.
const EXPECTED_FILE: &str = "expected.txt";
/// The pristine store's directory under the work directory.
const PRISTINE: &str = "pristine";
/// The store as the first session left it, under the work directory.
const OLDER: &str = "older";

#[test]
fn damage_campaign_never_panics_hangs_or_loses_silently() {
    if child::run_if_asked() {
        return;
    }
    let started = Instant::now();
    let config = Config::from_env();
    let work = tempfile::tempdir().expect("create a temporary directory");
    let (pristine_root, expected) = match &config.pristine {
        Some(root) => (root.clone(), load_expected(root)),
        None => (work.path().to_owned(), build_pristine(work.path())),
    };
    let pristine = pristine_root.join(PRISTINE);
    let older = pristine_root.join(OLDER);
    let built = started.elapsed();

    let files = cases::list_files(&pristine).expect("list the pristine store's files");
    let dirs = cases::list_dirs(&pristine).expect("list the pristine store's directories");
    let older_files = cases::list_files(&older).expect("list the older store's files");
    assert!(
        files.iter().any(|f| f.path.starts_with("blobs")),
        "the pristine store has no blob file: the large items should have made some ({files:?})"
    );
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut all = cases::enumerate(
        &pristine,
        &files,
        &older_files,
        &dirs,
        config.cuts,
        config.flips,
        &mut rng,
    )
    .expect("read the pristine store's files");
    if let Some(only) = &config.only {
        all.retain(|d| *d == Damage::None || d.label().contains(only.as_str()));
    }

    println!(
        "damage campaign: pristine store of {} files, {} bytes, {} committed transactions, \
         {} live items ({} per queue), {} consumed, {} aborted (built in {:.1} s); seed {} \
         (RQ_DAMAGE_SEED={} repeats the choices), {} cases and the control case, {} at a time, \
         time limit {:?}",
        files.len(),
        files.iter().map(|f| f.len).sum::<u64>(),
        expected.transactions,
        expected.live(),
        expected
            .queues
            .iter()
            .map(|q| q.len().to_string())
            .collect::<Vec<_>>()
            .join("/"),
        expected.consumed.len(),
        expected.aborted.len(),
        built.as_secs_f64(),
        config.seed,
        config.seed,
        all.len() - 1,
        config.jobs,
        config.timeout,
    );
    for f in &files {
        println!("  {:>9} {}", f.len, f.path.display());
    }

    // The control case first: a harness that cannot see an undamaged store as intact
    // would make every other verdict meaningless.
    let cases_dir = work.path().join("cases");
    cases::make_private_dir(&cases_dir).expect("create the cases directory");
    let campaign = Campaign {
        pristine: &pristine,
        older: &older,
        cases_dir: &cases_dir,
        expected: &expected,
        config: &config,
    };
    let control = campaign.run_case(0, &Damage::None);
    assert_eq!(
        control.1.outcome,
        Outcome::Intact,
        "the undamaged store did not open intact: {:?}",
        control.1
    );
    let results = campaign.run_all(&all[1..]);
    let elapsed = started.elapsed();
    if config.verbose {
        println!("\nEvery case:");
        for (damage, verdict, took) in &results {
            println!(
                "- [{}] {} ({:.2} s): {}",
                verdict.outcome.row(),
                damage.label(),
                took.as_secs_f64(),
                verdict.summary
            );
        }
    }
    let bad = report(&results, &expected, elapsed, &control);

    if config.keep && config.pristine.is_none() {
        let kept = work.keep();
        println!(
            "kept the pristine store: RQ_DAMAGE_PRISTINE={} RQ_DAMAGE_SEED={} reruns these cases",
            kept.display(),
            config.seed
        );
    }
    assert_eq!(
        bad, 0,
        "{bad} bad cases (seed {}; RQ_DAMAGE_SEED={} repeats the choices; RQ_DAMAGE_KEEP=1 \
         keeps the pristine store)",
        config.seed, config.seed
    );
}

struct Config {
    flips: usize,
    cuts: usize,
    seed: u64,
    jobs: usize,
    timeout: Duration,
    keep: bool,
    verbose: bool,
    pristine: Option<PathBuf>,
    only: Option<String>,
}

impl Config {
    fn from_env() -> Config {
        fn number<T: std::str::FromStr>(name: &str) -> Option<T> {
            let value = std::env::var(name).ok()?;
            Some(
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}")),
            )
        }
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Config {
            flips: number("RQ_DAMAGE_FLIPS").unwrap_or(DEFAULT_FLIPS),
            cuts: number("RQ_DAMAGE_CUTS").unwrap_or(DEFAULT_CUTS),
            seed: number("RQ_DAMAGE_SEED").unwrap_or_else(rand::random),
            jobs: number("RQ_DAMAGE_JOBS").unwrap_or(cpus).max(1),
            timeout: number("RQ_DAMAGE_TIMEOUT").map_or(DEFAULT_TIMEOUT, Duration::from_secs),
            keep: std::env::var_os("RQ_DAMAGE_KEEP").is_some_and(|v| v != "0"),
            verbose: std::env::var_os("RQ_DAMAGE_VERBOSE").is_some_and(|v| v != "0"),
            pristine: std::env::var_os("RQ_DAMAGE_PRISTINE").map(PathBuf::from),
            only: std::env::var("RQ_DAMAGE_ONLY").ok(),
        }
    }
}

/// Makes the pristine store under `root`, one child per session, keeping a copy of the
/// store as the first session left it; returns what the store holds.
fn build_pristine(root: &Path) -> Expected {
    let pristine = root.join(PRISTINE);
    let mut sessions = Vec::new();
    for number in 0..workload::SESSIONS {
        if number == 1 {
            cases::copy_store(&pristine, &root.join(OLDER)).expect("copy the older store");
        }
        let consumed: usize = sessions
            .iter()
            .map(|s: &workload::SessionLog| s.consumed.len())
            .sum();
        let env = [
            (child::SESSION_VAR, number.to_string()),
            (child::CONSUMED_VAR, consumed.to_string()),
        ];
        let run = run_child("build", &pristine, &env, BUILD_TIMEOUT);
        let lines: Vec<&str> = run.lines().collect();
        let log = workload::SessionLog::parse(lines.iter().copied()).unwrap_or_else(|| {
            panic!(
                "build session {number} gave no complete account ({:?}): {lines:?}; stderr: {}",
                run.status, run.stderr
            )
        });
        assert!(
            run.status.is_some_and(|s| s.success()),
            "build session {number} failed: {run:?}"
        );
        sessions.push(log);
    }
    let expected = Expected::after(&sessions);
    assert_eq!(
        expected.live() + expected.consumed.len(),
        workload::ITEMS as usize,
        "every committed item is live or consumed"
    );
    assert_eq!(expected.consumed.len(), workload::DEQUEUES);
    std::fs::write(
        root.join(EXPECTED_FILE),
        expected.to_lines().join("\n") + "\n",
    )
    .expect("write the expected contents");
    expected
}

fn load_expected(root: &Path) -> Expected {
    let text = std::fs::read_to_string(root.join(EXPECTED_FILE))
        .expect("read the expected contents of the kept store");
    Expected::parse(text.lines()).expect("the kept expected contents are complete")
}

/// Kills the child when dropped, so a failing parent leaves no process behind.
struct Killer(Child);

impl Drop for Killer {
    fn drop(&mut self) {
        // An error means it already exited.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs this test binary as a child in `role` on the store at `dir`; kills it at `limit`.
///
/// Two threads read its stdout and stderr to their end (the end comes when the process
/// exits) and say so on a channel; the parent waits on the channel until the limit, then kills
/// the child if it is still running and collects its status.
fn run_child(role: &str, dir: &Path, env: &[(&str, String)], limit: Duration) -> ChildRun {
    let started = Instant::now();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Killer(
        Command::new(exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(child::ROLE_VAR, role)
            .env(child::DIR_VAR, dir)
            .env("RUST_BACKTRACE", "0")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the child"),
    );
    let (sender, ended) = mpsc::channel();
    let mut readers = Vec::new();
    for (stream, mut pipe) in [
        (
            0,
            Box::new(child.0.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
        ),
        (1, Box::new(child.0.stderr.take().expect("stderr"))),
    ] {
        let sender = sender.clone();
        readers.push(std::thread::spawn(move || {
            let mut bytes = Vec::new();
            // A read error ends the output as the end of the stream does.
            let _ = pipe.read_to_end(&mut bytes);
            let _ = sender.send(stream);
            String::from_utf8_lossy(&bytes).into_owned()
        }));
    }
    drop(sender);
    let deadline = started + limit;
    let mut open_streams = 2;
    while open_streams > 0 {
        match ended.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(_) => open_streams -= 1,
            Err(_) => break,
        }
    }
    let timed_out = open_streams > 0;
    if timed_out {
        // It may have exited just now; then the kill fails and `wait` tells how it ended.
        let _ = child.0.kill();
    }
    let status = child.0.wait().expect("wait for the child");
    let mut outputs = readers
        .into_iter()
        .map(|r| r.join().expect("an output reader panicked"));
    let stdout = outputs.next().expect("stdout");
    let stderr = outputs.next().expect("stderr");
    ChildRun {
        status: (!timed_out).then_some(status),
        stdout,
        stderr,
        elapsed: started.elapsed(),
    }
}

/// One case's damage, verdict and child run time.
type CaseResult = (Damage, Verdict, Duration);

/// What every case needs.
struct Campaign<'a> {
    pristine: &'a Path,
    /// The store as the first session left it.
    older: &'a Path,
    /// Where the copies go.
    cases_dir: &'a Path,
    expected: &'a Expected,
    config: &'a Config,
}

impl Campaign<'_> {
    /// Copies the pristine store, damages the copy, opens it in a child and judges the
    /// outcome.
    fn run_case(&self, number: usize, damage: &Damage) -> CaseResult {
        let dir = self.cases_dir.join(number.to_string());
        cases::copy_store(self.pristine, &dir).expect("copy the pristine store");
        damage
            .apply(&dir, self.older)
            .unwrap_or_else(|e| panic!("apply {}: {e}", damage.label()));
        let run = run_child("open", &dir, &[], self.config.timeout);
        let verdict = verdict::judge(&run, self.expected);
        // Best effort: the directory is in a temporary directory that goes at the end.
        let _ = std::fs::remove_dir_all(&dir);
        (damage.clone(), verdict, run.elapsed)
    }

    /// Runs every case, `config.jobs` at a time.
    fn run_all(&self, all: &[Damage]) -> Vec<CaseResult> {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; all.len()]);
        std::thread::scope(|scope| {
            for _ in 0..self.config.jobs.min(all.len()) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(damage) = all.get(i) else {
                        return;
                    };
                    let result = self.run_case(i + 1, damage);
                    if result.1.outcome.is_bad() {
                        eprintln!(
                            "bad case: {}: {}: {}",
                            damage.label(),
                            result.1.outcome.row(),
                            result.1.summary
                        );
                    }
                    results.lock().expect("results")[i] = Some(result);
                });
            }
        });
        results
            .into_inner()
            .expect("results")
            .into_iter()
            .map(|r| r.expect("every case ran"))
            .collect()
    }
}

/// Prints the tables and the bad cases; returns the number of bad cases.
fn report(
    results: &[CaseResult],
    expected: &Expected,
    elapsed: Duration,
    control: &CaseResult,
) -> usize {
    let mut by_outcome: BTreeMap<Outcome, BTreeMap<&str, usize>> = BTreeMap::new();
    for (damage, verdict, _) in results {
        *by_outcome
            .entry(verdict.outcome)
            .or_default()
            .entry(damage.kind())
            .or_default() += 1;
    }
    let count = |o: Outcome| by_outcome.get(&o).map_or(0, |k| k.values().sum::<usize>());
    let kinds = |kind: &str| results.iter().filter(|r| r.0.kind() == kind).count();
    let child_time: Duration = results.iter().map(|r| r.2).sum();
    let slowest = results.iter().max_by_key(|r| r.2);
    let per_kind: Vec<String> = cases::KINDS
        .iter()
        .map(|k| format!("{} {k}", kinds(k)))
        .collect();
    println!(
        "\n{} cases ({}) in {:.1} s; children {:.1} s in all, slowest {:.2} s ({}); control \
         case {:.2} s, {} live items read\n",
        results.len(),
        per_kind.join(", "),
        elapsed.as_secs_f64(),
        child_time.as_secs_f64(),
        slowest.map_or(0.0, |r| r.2.as_secs_f64()),
        slowest.map_or(String::new(), |r| r.0.label()),
        control.2.as_secs_f64(),
        expected.live(),
    );
    println!("| outcome of `Store::open` | cases |");
    println!("|---|---|");
    for o in Outcome::ALL {
        if o.always_shown() || count(o) > 0 {
            println!("| {} | {} |", o.row(), count(o));
        }
    }
    println!("\nBy damage kind:\n");
    println!(
        "| outcome of `Store::open` | {} |",
        cases::KINDS.join(" | ")
    );
    println!("|---|{}", "---|".repeat(cases::KINDS.len()));
    for o in Outcome::ALL {
        if o.always_shown() || count(o) > 0 {
            let cells: Vec<String> = cases::KINDS
                .iter()
                .map(|k| {
                    by_outcome
                        .get(&o)
                        .and_then(|m| m.get(k))
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                })
                .collect();
            println!("| {} | {} |", o.row(), cells.join(" | "));
        }
    }

    // What the typed errors were, and which files gave which outcome.
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for (_, verdict, _) in results {
        if verdict.outcome == Outcome::TypedError {
            let key = verdict
                .summary
                .split(", close")
                .next()
                .unwrap_or_default()
                .split("; close")
                .next()
                .unwrap_or_default()
                .to_owned();
            *errors.entry(key).or_default() += 1;
        }
    }
    if !errors.is_empty() {
        println!("\nTyped errors:");
        for (e, n) in &errors {
            println!("  {n:>4}  {e}");
        }
    }
    let mut by_file: BTreeMap<String, BTreeMap<Outcome, usize>> = BTreeMap::new();
    for (damage, verdict, _) in results {
        let file = damage.target().map_or(String::new(), cases::file_class);
        *by_file
            .entry(file)
            .or_default()
            .entry(verdict.outcome)
            .or_default() += 1;
    }
    println!("\nBy file:");
    for (file, outcomes) in &by_file {
        let parts: Vec<String> = outcomes
            .iter()
            .map(|(o, n)| format!("{} {n}", o.row()))
            .collect();
        println!("  {file}: {}", parts.join(", "));
    }

    let bad: Vec<&CaseResult> = results.iter().filter(|r| r.1.outcome.is_bad()).collect();
    if !bad.is_empty() {
        println!("\nBad cases ({}):", bad.len());
        for (damage, verdict, took) in &bad {
            println!(
                "- [{}] {} ({:.2} s): {}\n    {}",
                verdict.outcome.row(),
                damage.label(),
                took.as_secs_f64(),
                verdict.summary,
                verdict.detail
            );
        }
    }
    bad.len()
}

/// The verdicts on made-up child reports: each outcome is told apart from the others, so a
/// campaign without bad cases means what it says.
#[cfg(unix)]
#[test]
fn the_verdicts_tell_the_outcomes_apart() {
    use std::os::unix::process::ExitStatusExt;

    let expected = Expected {
        queues: [
            vec!["a0".into(), "a2".into()],
            vec!["b1".into()],
            Vec::new(),
        ],
        consumed: ["a3".to_owned()].into(),
        aborted: ["a100000".to_owned()].into(),
        transactions: 3,
    };
    let run = |status: Option<i32>, lines: &[&str], stderr: &str| ChildRun {
        status: status.map(std::process::ExitStatus::from_raw),
        stdout: lines
            .iter()
            .map(|l| format!("{}{l}\n", child::PREFIX))
            .collect(),
        stderr: stderr.to_owned(),
        elapsed: Duration::from_millis(1),
    };
    let opened = |alpha: &str, beta: &str, extra: &str| {
        format!(
            "open\tok\tset_aside={extra}\tmissing=\tnames=alpha,beta,gamma\tq=alpha:{alpha}\t\
             q=beta:{beta}\tq=gamma:items:0:"
        )
    };
    let ok = |line: &str| run(Some(0), &[line, "close\tok", "end"], "");
    let judge = |r: &ChildRun| verdict::judge(r, &expected).outcome;

    let intact = opened("items:2:a0,a2", "items:1:b1", "");
    assert_eq!(judge(&ok(&intact)), Outcome::Intact);
    for (alpha, outcome) in [
        ("items:3:a0,a2,a3", Outcome::Resurrection),
        ("items:1:a0", Outcome::Loss),
        ("items:2:a2,a0", Outcome::Loss),
        ("items:3:a0,a2,a100000", Outcome::Loss),
        ("items:3:a0,a2,?12", Outcome::Loss),
        ("items:3:a0,a2,b1", Outcome::Loss),
        ("items:3:a0,a2,a2", Outcome::Loss),
        ("items:3:a0,a2", Outcome::Loss),
        ("error:Deserialize:bad", Outcome::TypedError),
    ] {
        let line = opened(alpha, "items:1:b1", "");
        assert_eq!(judge(&ok(&line)), outcome, "{alpha}");
    }

    // Set-aside records: their queues must be fenced, the others exact.
    let set_aside = opened("fenced:fenced", "items:1:b1", "7:alpha:checksum");
    assert_eq!(judge(&ok(&set_aside)), Outcome::SetAside);
    let all_fenced = opened("fenced:f", "fenced:f", "7:*:header unreadable");
    assert_eq!(judge(&ok(&all_fenced)), Outcome::Inconsistent, "gamma");
    let not_fenced = opened("items:2:a0,a2", "items:1:b1", "7:alpha:checksum");
    assert_eq!(judge(&ok(&not_fenced)), Outcome::Inconsistent);
    let beta_lost = opened("fenced:f", "items:0:", "7:alpha:checksum");
    assert_eq!(judge(&ok(&beta_lost)), Outcome::Loss);
    // Once unfenced: items may be missing or back, never foreign.
    for (unfenced, outcome) in [
        ("q=alpha:items:1:a3", Outcome::SetAside),
        ("q=alpha:items:1:a100000", Outcome::Loss),
        ("q=alpha:items:2:a0,a0", Outcome::Loss),
        ("q=alpha:items:1:b1", Outcome::Loss),
    ] {
        let line = format!("unfenced\tok\t{unfenced}");
        let r = run(Some(0), &[&set_aside, &line, "close\tok", "end"], "");
        assert_eq!(judge(&r), outcome, "{unfenced}");
    }

    // Missing records: the salvage open reports them and fences the queues named; the plain
    // reopen after it does too.
    let missing = "open\tmissing\tranges=3-5\tqueues=alpha\tmsg=gone";
    let salvaged = |phase: &str, ranges: &str, alpha: &str, beta: &str| {
        format!(
            "{phase}\tok\tset_aside=\tmissing={ranges}\tnames=alpha,beta,gamma\tq=alpha:{alpha}\t\
             q=beta:{beta}\tq=gamma:items:0:"
        )
    };
    let good = salvaged("salvage", "3-5", "fenced:f", "items:1:b1");
    let reopen = salvaged("reopen", "3-5", "fenced:f", "items:1:b1");
    let case = |lines: &[&str]| {
        let mut all = vec![missing];
        all.extend_from_slice(lines);
        all.push("end");
        judge(&run(Some(0), &all, ""))
    };
    assert_eq!(case(&[&good, &reopen]), Outcome::MissingReported);
    let no_ranges = salvaged("salvage", "", "fenced:f", "items:1:b1");
    assert_eq!(case(&[&no_ranges, &reopen]), Outcome::Inconsistent);
    let unfenced = salvaged("salvage", "3-5", "items:2:a0,a2", "items:1:b1");
    assert_eq!(case(&[&unfenced, &reopen]), Outcome::Inconsistent);
    let beta_back = salvaged("salvage", "3-5", "fenced:f", "items:2:b1,a3");
    assert_eq!(case(&[&beta_back, &reopen]), Outcome::Resurrection);
    let reopen_lost = salvaged("reopen", "3-5", "fenced:f", "items:0:");
    assert_eq!(case(&[&good, &reopen_lost]), Outcome::Loss);
    let reopen_unfenced = salvaged("reopen", "3-5", "items:2:a0,a2", "items:1:b1");
    assert_eq!(case(&[&good, &reopen_unfenced]), Outcome::Inconsistent);
    let reopen_fails = "reopen\terr\tvariant=MissingRecords\tmsg=again";
    assert_eq!(case(&[&good, reopen_fails]), Outcome::Inconsistent);
    let salvage_fails = "salvage\terr\tvariant=Damaged\tmsg=no";
    assert_eq!(case(&[salvage_fails]), Outcome::TypedError);

    // Errors, panics, hangs.
    let damaged = "open\terr\tvariant=Damaged\tmsg=conf";
    assert_eq!(
        judge(&run(Some(0), &[damaged, "end"], "")),
        Outcome::TypedError
    );
    assert_eq!(judge(&run(None, &[], "")), Outcome::Hang);
    assert_eq!(judge(&run(None, &[&intact], "")), Outcome::Hang);
    assert_eq!(judge(&run(Some(101 << 8), &[], "")), Outcome::Panic);
    assert_eq!(
        judge(&run(Some(9), &[damaged], "")),
        Outcome::Panic,
        "SIGKILL"
    );
    assert_eq!(
        judge(&run(Some(0), &[damaged], "")),
        Outcome::Panic,
        "no end"
    );
    assert_eq!(
        judge(&run(Some(0), &["open\tok\tq=alpha", "end"], "")),
        Outcome::Panic
    );
    let main_panic = format!("thread '{TEST_NAME}' (7) panicked at sled/src/tree.rs:1:1:");
    let other_panic = "thread 'committer' (8) panicked at src/engine/sled/committer.rs:1:1:";
    let caught = run(Some(0), &[damaged, "end"], &main_panic);
    assert_eq!(judge(&caught), Outcome::CaughtPanic);
    let background = run(Some(0), &[&intact, "close\tok", "end"], other_panic);
    assert_eq!(judge(&background), Outcome::Panic);
    let opened_then_panicked = run(Some(0), &[&intact, "close\tok", "end"], &main_panic);
    assert_eq!(judge(&opened_then_panicked), Outcome::CaughtPanic);
}
