//! The child roles (`build` and `open`) and the lines they print.
//!
//! Every line the parent reads starts with `RQD\t` (the test harness prints its own lines on
//! the same stdout); fields are separated by tabs, free text is cleaned of tabs, newlines and
//! `;`. The `open` child prints one line per open it makes:
//!
//! - `open\terr\tvariant=<Error variant>\tmsg=<Display>`: the open failed;
//! - `open\tmissing\tranges=<lo-hi,...>\tqueues=<names>\tmsg=<Display>`: the open failed
//!   with `Error::MissingRecords`; the child then opens again with `salvage(true)` and prints a
//!   `salvage\t...` line of the same forms;
//! - `<open|salvage>\tok\tset_aside=<seq:queues:reason;...>\tmissing=<lo-hi,...>\tnames=<...>`
//!   followed by one `q=<name>:<items:count:tokens|fenced:msg|error:variant:msg>` field per
//!   known queue: the store opened; what it reports and what each queue holds (read without
//!   consuming: everything dequeued in one transaction that is then aborted);
//!
//! - `unfenced\tok\tq=...`: after an open that fenced queues, what those queues hold once
//!   unfenced (`Store::unfence`);
//!
//! After a salvage open the child closes the store and opens it again plainly (`reopen\t...`
//! lines): a salvaged store opens without the option, its queues still fenced; the queues are
//! unfenced after that open. Every opened store is closed (`close\tok` or
//! `close\terr\t...`); the last line is `end`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use reliable_queue::{Error, Store};

use super::workload::{self, QUEUES};

/// Selects the child role; absent in the parent.
pub(crate) const ROLE_VAR: &str = "RQ_DAMAGE_ROLE";
/// The store directory the child works on.
pub(crate) const DIR_VAR: &str = "RQ_DAMAGE_DIR";
/// The build child's session (0, 1, ...).
pub(crate) const SESSION_VAR: &str = "RQ_DAMAGE_SESSION";
/// The dequeues committed by the sessions before.
pub(crate) const CONSUMED_VAR: &str = "RQ_DAMAGE_CONSUMED";
/// The prefix of every line meant for the parent.
pub(crate) const PREFIX: &str = "RQD\t";

/// Runs the child's role if this process is a child; returns whether it was.
pub(crate) fn run_if_asked() -> bool {
    let Some(role) = std::env::var_os(ROLE_VAR) else {
        return false;
    };
    let path = PathBuf::from(std::env::var_os(DIR_VAR).expect("the child's store directory"));
    match role.to_str() {
        Some("build") => build(&path),
        Some("open") => open(&path),
        other => panic!("unknown child role {other:?}"),
    }
    say("end");
    true
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // Nothing to do if the parent stopped reading.
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

fn build(path: &Path) {
    let number = |name: &str| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("the build child's {name}"))
    };
    match workload::session(path, number(SESSION_VAR), number(CONSUMED_VAR)) {
        Ok(log) => {
            for line in log.to_lines() {
                say(&line);
            }
        }
        Err(e) => say(&format!("session\tfailed\t{}", clean(&format!("{e:?}")))),
    }
}

/// Free text made safe for a field.
pub(crate) fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' | ';' => ' ',
            c => c,
        })
        .collect()
}

/// The name of an error's variant, from its `Debug` form.
pub(crate) fn variant(e: &Error) -> String {
    format!("{e:?}")
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn error_fields(e: &Error) -> String {
    format!("variant={}\tmsg={}", variant(e), clean(&e.to_string()))
}

fn ranges(ranges: &[std::ops::RangeInclusive<u64>]) -> String {
    ranges
        .iter()
        .map(|r| format!("{}-{}", r.start(), r.end()))
        .collect::<Vec<_>>()
        .join(",")
}

fn open(path: &Path) {
    let e = match Store::open(path) {
        Ok(store) => return opened("open", store, true),
        Err(e) => e,
    };
    let Error::MissingRecords {
        missing, queues, ..
    } = &e
    else {
        return say(&format!("open\terr\t{}", error_fields(&e)));
    };
    say(&format!(
        "open\tmissing\tranges={}\tqueues={}\tmsg={}",
        ranges(missing),
        clean(&queues.join(",")),
        clean(&e.to_string())
    ));
    match Store::builder().path(path).salvage(true).open() {
        Ok(store) => opened("salvage", store, false),
        Err(e) => return say(&format!("salvage\terr\t{}", error_fields(&e))),
    }
    // A salvaged store is the new starting point: it opens plainly, its queues still fenced.
    match Store::open(path) {
        Ok(store) => opened("reopen", store, true),
        Err(e) => say(&format!("reopen\terr\t{}", error_fields(&e))),
    }
}

/// Reports what an opened store shows; then, if `unfence`, lifts every fence of the known
/// queues and reports what they hold; then closes the store.
fn opened(phase: &str, store: Store, unfence: bool) {
    let set_aside: Vec<String> = store
        .set_aside_records()
        .iter()
        .map(|r| {
            let queues = match &r.queues {
                None => "*".to_owned(),
                Some(names) => names.join(","),
            };
            format!("{}:{}:{}", r.record, clean(&queues), clean(&r.reason))
        })
        .collect();
    let mut line = format!(
        "{phase}\tok\tset_aside={}\tmissing={}\tnames={}",
        set_aside.join(";"),
        ranges(&store.missing_records()),
        clean(&store.queue_names().join(","))
    );
    let mut fenced = Vec::new();
    for name in QUEUES {
        let seen = look(&store, name);
        if seen.starts_with("fenced:") {
            fenced.push(name);
        }
        line.push_str(&format!("\tq={name}:{seen}"));
    }
    say(&line);
    if unfence && !fenced.is_empty() {
        let mut line = "unfenced\tok".to_owned();
        for name in fenced {
            let seen = match store.blocking_unfence(name) {
                Ok(()) => look(&store, name),
                Err(e) => format!("error:{}:unfence: {}", variant(&e), clean(&e.to_string())),
            };
            line.push_str(&format!("\tq={name}:{seen}"));
        }
        say(&line);
    }
    match store.blocking_close() {
        Ok(()) => say("close\tok"),
        Err(e) => say(&format!("close\terr\t{}", error_fields(&e))),
    }
}

/// What queue `name` holds, read without consuming.
fn look(store: &Store, name: &str) -> String {
    let queue = match store.blocking_queue::<Vec<u8>>(name) {
        Ok(queue) => queue,
        Err(e @ Error::Fenced { .. }) => return format!("fenced:{}", clean(&e.to_string())),
        Err(e) => return format!("error:{}:{}", variant(&e), clean(&e.to_string())),
    };
    let count = match queue.blocking_count() {
        Ok(n) => n,
        Err(e) => return format!("error:{}:count: {}", variant(&e), clean(&e.to_string())),
    };
    let mut tx = store.begin();
    let mut tokens = Vec::new();
    loop {
        match queue.blocking_try_dequeue(&mut tx) {
            Ok(Some(bytes)) => tokens.push(workload::token(&bytes)),
            Ok(None) => break,
            Err(e) => {
                return format!(
                    "error:{}:dequeue after {} items: {}",
                    variant(&e),
                    tokens.len(),
                    clean(&e.to_string())
                )
            }
        }
    }
    if let Err(e) = tx.blocking_abort() {
        return format!("error:{}:abort: {}", variant(&e), clean(&e.to_string()));
    }
    format!("items:{count}:{}", tokens.join(","))
}

/// What one queue showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Its items, in dequeue order, and what `count()` said before.
    Items { count: u64, tokens: Vec<String> },
    /// `Error::Fenced`, with its message.
    Fenced(String),
    /// Another error from opening or reading the queue.
    Error { variant: String, msg: String },
}

/// A set-aside record as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetAside {
    pub(crate) record: u64,
    /// `None`: its header was unreadable, every queue is fenced.
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) reason: String,
}

/// What an opened store showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Opened {
    pub(crate) set_aside: Vec<SetAside>,
    pub(crate) missing: Vec<(u64, u64)>,
    pub(crate) names: Vec<String>,
    pub(crate) queues: BTreeMap<String, Seen>,
}

/// The outcome of one open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenOutcome {
    Opened(Opened),
    /// `Error::MissingRecords`.
    Missing {
        ranges: Vec<(u64, u64)>,
        queues: Vec<String>,
        msg: String,
    },
    Error {
        variant: String,
        msg: String,
    },
}

/// Everything the `open` child reported.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) open: Option<OpenOutcome>,
    pub(crate) salvage: Option<OpenOutcome>,
    /// The plain open after a salvage.
    pub(crate) reopen: Option<OpenOutcome>,
    /// What the fenced queues held once unfenced (after the open, or after the reopen).
    pub(crate) unfenced: Option<Opened>,
    /// Errors from closing an opened store.
    pub(crate) close_errors: Vec<String>,
    /// Lines the parent could not read.
    pub(crate) garbled: Vec<String>,
    pub(crate) end: bool,
}

fn parse_ranges(text: &str) -> Option<Vec<(u64, u64)>> {
    text.split(',')
        .filter(|r| !r.is_empty())
        .map(|r| {
            let (lo, hi) = r.split_once('-')?;
            Some((lo.parse().ok()?, hi.parse().ok()?))
        })
        .collect()
}

fn fields(rest: &str) -> BTreeMap<&str, &str> {
    rest.split('\t').filter_map(|f| f.split_once('=')).collect()
}

fn parse_error(rest: &str) -> Option<OpenOutcome> {
    let f = fields(rest);
    Some(OpenOutcome::Error {
        variant: f.get("variant")?.to_string(),
        msg: f.get("msg").unwrap_or(&"").to_string(),
    })
}

fn parse_opened(rest: &str) -> Option<OpenOutcome> {
    let mut opened = Opened::default();
    for field in rest.split('\t') {
        let (key, value) = field.split_once('=')?;
        match key {
            "set_aside" => {
                for record in value.split(';').filter(|r| !r.is_empty()) {
                    let mut parts = record.splitn(3, ':');
                    let seq = parts.next()?.parse().ok()?;
                    let queues = match parts.next()? {
                        "*" => None,
                        names => Some(
                            names
                                .split(',')
                                .filter(|n| !n.is_empty())
                                .map(str::to_owned)
                                .collect(),
                        ),
                    };
                    opened.set_aside.push(SetAside {
                        record: seq,
                        queues,
                        reason: parts.next().unwrap_or("").to_owned(),
                    });
                }
            }
            "missing" => opened.missing = parse_ranges(value)?,
            "names" => {
                opened.names = value
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
            "q" => {
                let (name, seen) = value.split_once(':')?;
                let seen = if let Some(rest) = seen.strip_prefix("items:") {
                    let (count, tokens) = rest.split_once(':')?;
                    Seen::Items {
                        count: count.parse().ok()?,
                        tokens: tokens
                            .split(',')
                            .filter(|t| !t.is_empty())
                            .map(str::to_owned)
                            .collect(),
                    }
                } else if let Some(msg) = seen.strip_prefix("fenced:") {
                    Seen::Fenced(msg.to_owned())
                } else {
                    let (variant, msg) = seen.strip_prefix("error:")?.split_once(':')?;
                    Seen::Error {
                        variant: variant.to_owned(),
                        msg: msg.to_owned(),
                    }
                };
                opened.queues.insert(name.to_owned(), seen);
            }
            _ => {}
        }
    }
    Some(OpenOutcome::Opened(opened))
}

fn parse_outcome(rest: &str) -> Option<OpenOutcome> {
    if let Some(rest) = rest.strip_prefix("ok\t") {
        parse_opened(rest)
    } else if let Some(rest) = rest.strip_prefix("err\t") {
        parse_error(rest)
    } else if let Some(rest) = rest.strip_prefix("missing\t") {
        let f = fields(rest);
        Some(OpenOutcome::Missing {
            ranges: parse_ranges(f.get("ranges")?)?,
            queues: f
                .get("queues")?
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
            msg: f.get("msg").unwrap_or(&"").to_string(),
        })
    } else {
        None
    }
}

impl Report {
    /// Reads the `open` child's lines (each after the prefix).
    pub(crate) fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Report {
        let mut report = Report::default();
        for line in lines {
            let parsed = if let Some(rest) = line.strip_prefix("open\t") {
                parse_outcome(rest).map(|o| report.open = Some(o))
            } else if let Some(rest) = line.strip_prefix("salvage\t") {
                parse_outcome(rest).map(|o| report.salvage = Some(o))
            } else if let Some(rest) = line.strip_prefix("reopen\t") {
                parse_outcome(rest).map(|o| report.reopen = Some(o))
            } else if let Some(rest) = line.strip_prefix("unfenced\tok\t") {
                match parse_opened(rest) {
                    Some(OpenOutcome::Opened(o)) => {
                        report.unfenced = Some(o);
                        Some(())
                    }
                    _ => None,
                }
            } else if line == "close\tok" {
                Some(())
            } else if let Some(rest) = line.strip_prefix("close\terr\t") {
                report.close_errors.push(rest.to_owned());
                Some(())
            } else if line == "end" {
                report.end = true;
                Some(())
            } else {
                None
            };
            if parsed.is_none() {
                report.garbled.push(line.chars().take(300).collect());
            }
        }
        report
    }
}
