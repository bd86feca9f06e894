//! What rq's commands share: the result type, the largest item rq writes, times in
//! milliseconds, queue names for a terminal and progress bars.

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The largest item rq writes (`import`), in bytes: the stores it opens take items up to
/// this size (the library's default), and `import` checks every item against it before it
/// writes one.
pub(crate) const ITEM_LIMIT: usize = 4 << 20;

/// Milliseconds since the epoch of `time`: the clock's now, or a time the library gave, made
/// from `u64` milliseconds. A time before the epoch (a clock set wrong) reads as 0, one past
/// `u64::MAX` ms as that: rq only writes it down.
pub(crate) fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A queue name for a terminal: control and other unprintable characters escaped as Rust
/// writes them (`\u{1b}`, `\0`), so a name cannot move the cursor or clear the screen. JSON
/// output keeps names exact.
pub(crate) fn printable(name: &str) -> String {
    name.escape_debug().to_string()
}

/// A progress bar on stderr with counts and rate; hidden unless both stdout and stderr are
/// terminals (a script reading stdout, or logging stderr, gets no bar).
pub(crate) fn progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} {{bar:30}} {{pos}}/{{len}} ({{per_sec}}, {{eta}} left)"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    if !(std::io::stderr().is_terminal() && std::io::stdout().is_terminal()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}
