//! Reading what `scripts/bench.sh` collects: criterion's printed results and its estimates,
//! the `figure` lines of the recovery bench, the latency table, the Redis bench's table and
//! the soak's windows.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;

use crate::Error;

/// One criterion benchmark's result.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The full id, `<group>/<function>[/<value>]`.
    pub id: String,
    /// Elements per second, for benchmarks with a throughput.
    pub rate: Option<f64>,
}

/// The criterion results of one bench.
#[derive(Debug)]
pub struct Loaded {
    /// The file in the results directory.
    pub file: String,
    pub measurements: Vec<Measurement>,
    /// How many came from criterion's `estimates.json` (its median), and how many from the
    /// printed output (criterion's point estimate).
    pub from_json: usize,
    pub from_text: usize,
}

/// One benchmark's estimate as criterion stored it.
#[derive(Debug)]
struct Estimate {
    /// Median time per iteration, in nanoseconds.
    median_ns: f64,
    /// Elements per iteration, when the group set a throughput.
    elements: Option<f64>,
}

/// Criterion's stored estimates that were written during the run whose results are read.
#[derive(Debug, Default)]
pub struct CriterionResults {
    estimates: HashMap<String, Estimate>,
    note: Option<String>,
}

impl CriterionResults {
    /// Reads `<dir>/**/new/{benchmark,estimates}.json` (`dir` defaulting to
    /// `$CARGO_TARGET_DIR/criterion`, else `target/criterion`), keeping the estimates written
    /// after the results directory's `machine.txt`, which `scripts/bench.sh` writes first.
    pub fn load(dir: Option<&Path>, results: &Path) -> CriterionResults {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("target"))
                .join("criterion"),
        };
        let started = match fs::metadata(results.join("machine.txt")).and_then(|m| m.modified()) {
            Ok(t) => t,
            Err(_) => {
                return CriterionResults {
                    estimates: HashMap::new(),
                    note: Some(format!(
                        "no machine.txt in {}: criterion's estimates cannot be told from an \
                         earlier run's, so the printed results are used",
                        results.display()
                    )),
                }
            }
        };
        let mut found = Vec::new();
        walk(&dir, 0, &mut found);
        let mut out = CriterionResults::default();
        let (mut stale, mut unreadable) = (0, 0);
        for new_dir in found {
            match read_estimate(&new_dir, started) {
                Ok(Some((id, estimate))) => {
                    out.estimates.insert(id, estimate);
                }
                Ok(None) => stale += 1,
                Err(_) => unreadable += 1,
            }
        }
        out.note = Some(format!(
            "{} estimate(s) of this run under {}{}{}",
            out.estimates.len(),
            dir.display(),
            if stale > 0 {
                format!(", {stale} older one(s) left out")
            } else {
                String::new()
            },
            if unreadable > 0 {
                format!(
                    ", {unreadable} unreadable one(s) left out (their printed figures are used)"
                )
            } else {
                String::new()
            },
        ));
        out
    }

    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}

/// Collects the `new` directories holding a `benchmark.json` under `dir`.
fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    if depth > 8 {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        match entry.file_name().to_str() {
            Some("new") if path.join("benchmark.json").is_file() => found.push(path),
            Some("base" | "change" | "report" | "new") => {}
            _ => walk(&path, depth + 1, found),
        }
    }
}

/// The id and estimate in one `new` directory; `None` when written before `started`.
fn read_estimate(dir: &Path, started: SystemTime) -> Result<Option<(String, Estimate)>, String> {
    let estimates_path = dir.join("estimates.json");
    let modified = fs::metadata(&estimates_path)
        .and_then(|m| m.modified())
        .map_err(|e| e.to_string())?;
    if modified < started {
        return Ok(None);
    }
    let read = |p: &Path| -> Result<Value, String> {
        let text = fs::read_to_string(p).map_err(|e| e.to_string())?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    };
    let benchmark = read(&dir.join("benchmark.json"))?;
    let estimates = read(&estimates_path)?;
    let id = benchmark["full_id"]
        .as_str()
        .ok_or("benchmark.json without full_id")?
        .to_owned();
    let median_ns = estimates["median"]["point_estimate"]
        .as_f64()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or("estimates.json without a positive median")?;
    let elements = benchmark["throughput"]["Elements"].as_f64();
    Ok(Some((
        id,
        Estimate {
            median_ns,
            elements,
        },
    )))
}

/// The results directory and criterion's estimates of the same run.
pub struct Figures<'a> {
    pub dir: &'a Path,
    pub criterion: &'a CriterionResults,
}

impl Figures<'_> {
    /// The text of `name` in the results directory; `None` when it does not exist.
    fn read(&self, name: &str) -> Result<Option<(PathBuf, String)>, Error> {
        let path = self.dir.join(name);
        match fs::read(&path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Ok(Some((path, text))),
                Err(_) => Err(Error::Malformed {
                    path,
                    line: 0,
                    what: "not UTF-8 text".into(),
                }),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    /// Why `<stem>.txt` is missing: what bench.sh wrote to `<stem>.skipped`, if it did.
    pub fn missing(&self, stem: &str) -> String {
        match fs::read_to_string(self.dir.join(format!("{stem}.skipped"))) {
            Ok(why) if !why.trim().is_empty() => why.trim().to_owned(),
            _ => format!("no {stem}.txt in the results"),
        }
    }

    /// The criterion results printed in `name` (a bench's output), each taken from criterion's
    /// estimates of the same run where those exist.
    pub fn criterion_file(&self, name: &str) -> Result<Option<Loaded>, Error> {
        let Some((path, text)) = self.read(name)? else {
            return Ok(None);
        };
        let printed = parse_criterion(&path, &text)?;
        let mut loaded = Loaded {
            file: name.to_owned(),
            measurements: Vec::new(),
            from_json: 0,
            from_text: 0,
        };
        for m in printed {
            match self.criterion.estimates.get(&m.id) {
                Some(e) => {
                    loaded.from_json += 1;
                    loaded.measurements.push(Measurement {
                        rate: e.elements.map(|n| n * 1e9 / e.median_ns),
                        id: m.id,
                    });
                }
                None => {
                    loaded.from_text += 1;
                    loaded.measurements.push(m);
                }
            }
        }
        Ok(Some(loaded))
    }

    /// The rows of the Redis bench's table.
    pub fn redis(&self) -> Result<Option<RedisRows>, Error> {
        let Some((path, text)) = self.read("redis.txt")? else {
            return Ok(None);
        };
        let mut out = RedisRows {
            rows: Vec::new(),
            skipped: None,
        };
        for (n, line) in lines(&text) {
            if let Some(why) = line.split_once("SKIPPED:").map(|(_, why)| why.trim()) {
                out.skipped = Some(why.to_owned());
            }
            let Some(row) = line.strip_prefix('|') else {
                continue;
            };
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let workload = cells[0];
            let (clients, batch) = if let Some(rest) = workload.strip_prefix("move, ") {
                let n = rest.split_whitespace().next().unwrap_or("");
                (n.parse::<f64>().ok(), 1)
            } else if workload.starts_with("64-item transactions") {
                // "64-item transactions, 4+4 clients (items/s)"
                let sides = workload
                    .split(", ")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next())
                    .and_then(|s| s.split_once('+'))
                    .and_then(|(p, c)| Some(p.parse::<f64>().ok()? + c.parse::<f64>().ok()?));
                (sides, 64)
            } else {
                continue;
            };
            let malformed = |what: &str| Error::Malformed {
                path: path.clone(),
                line: n,
                what: what.to_owned(),
            };
            let clients = clients.ok_or_else(|| malformed("no client count in the workload"))?;
            if cells.len() < 7 {
                return Err(malformed("a row of fewer than 7 columns"));
            }
            let number = |cell: &str| -> Result<Option<f64>, Error> {
                if cell == "-" {
                    return Ok(None);
                }
                cell.replace(',', "")
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| malformed(&format!("`{cell}` is not a number")))
            };
            // | workload | engine | by hand | ratio | Redis CPU | PostgreSQL | sled |
            out.rows.push(RedisRow {
                clients,
                batch,
                values: [
                    number(cells[1])?,
                    number(cells[2])?,
                    number(cells[5])?,
                    number(cells[6])?,
                ],
            });
        }
        Ok(Some(out))
    }

    /// The latency example's table.
    pub fn latency(&self) -> Result<Option<Latency>, Error> {
        let Some((path, text)) = self.read("latency.txt")? else {
            return Ok(None);
        };
        let mut out = Latency {
            header: None,
            rows: Vec::new(),
        };
        for (n, line) in lines(&text) {
            if line.starts_with("commit latency,") {
                out.header = Some(line.trim_start_matches("commit latency, ").to_owned());
                continue;
            }
            let Some(row) = line.strip_prefix('|') else {
                continue;
            };
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if !matches!(cells[0], "enqueue" | "dequeue" | "all") {
                continue;
            }
            // | label | count | per sec | p50 | p90 | p99 | p999 | max |, in µs
            let mut micros = [0.0; 5];
            for (i, slot) in micros.iter_mut().enumerate() {
                let cell = cells.get(3 + i).copied().unwrap_or("");
                *slot = cell.parse::<f64>().map_err(|_| Error::Malformed {
                    path: path.clone(),
                    line: n,
                    what: format!("`{cell}` is not a latency in µs"),
                })?;
            }
            out.rows.push(LatencyRow {
                label: cells[0].to_owned(),
                micros,
            });
        }
        Ok(Some(out))
    }

    /// The recovery bench's figures, one per (size, peer), from `recovery.txt` and the runs at
    /// other sizes (`recovery-<items>.txt`); `None` when there are none of those files.
    pub fn recovery(&self) -> Result<Option<Vec<RecoveryFigure>>, Error> {
        let entries = fs::read_dir(self.dir).map_err(|source| Error::Io {
            path: self.dir.to_path_buf(),
            source,
        })?;
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("recovery") && n.ends_with(".txt"))
            .collect();
        if names.is_empty() {
            return Ok(None);
        }
        names.sort();
        let mut out: Vec<RecoveryFigure> = Vec::new();
        for name in names {
            if let Some((path, text)) = self.read(&name)? {
                recovery_figures(&path, &text, &mut out)?;
            }
        }
        Ok(Some(out))
    }

    /// The soak's windows.
    pub fn soak(&self) -> Result<Option<Soak>, Error> {
        let Some((path, text)) = self.read("pg_soak.txt")? else {
            return Ok(None);
        };
        let mut out = Soak {
            header: None,
            windows: Vec::new(),
            skipped: None,
        };
        // The column header names the columns; the rows follow it.
        let mut columns: Option<(usize, usize, usize, usize)> = None;
        for (n, line) in lines(&text) {
            if let Some(why) = line.split_once("SKIPPED:").map(|(_, why)| why.trim()) {
                out.skipped = Some(why.to_owned());
            }
            if line.starts_with("pg_soak: backlog") {
                out.header = Some(line.trim_start_matches("pg_soak: ").to_owned());
                continue;
            }
            if line.starts_with("pg_soak summary") {
                columns = None;
                continue;
            }
            let tokens: Vec<&str> = line.split_whitespace().collect();
            if tokens.first() == Some(&"t(s)") {
                let find = |name: &str| tokens.iter().position(|t| *t == name);
                columns = match (find("jobs/s"), find("lease99")) {
                    (Some(jobs), Some(p99)) => Some((0, jobs, p99, tokens.len())),
                    _ => {
                        return Err(Error::Malformed {
                            path,
                            line: n,
                            what: "a column header without jobs/s and lease99".into(),
                        })
                    }
                };
                continue;
            }
            let Some((t, jobs, p99, width)) = columns else {
                continue;
            };
            if tokens.first().and_then(|t| t.parse::<f64>().ok()).is_none() {
                continue;
            }
            let value = |i: usize| -> Result<f64, Error> {
                if tokens.len() != width {
                    return Err(Error::Malformed {
                        path: path.clone(),
                        line: n,
                        what: format!(
                            "a window of {} columns, the header has {width}",
                            tokens.len()
                        ),
                    });
                }
                tokens[i].parse::<f64>().map_err(|_| Error::Malformed {
                    path: path.clone(),
                    line: n,
                    what: format!("`{}` is not a number", tokens[i]),
                })
            };
            out.windows.push(Window {
                t: value(t)?,
                jobs: value(jobs)?,
                lease_p99_ms: value(p99)?,
            });
        }
        Ok(Some(out))
    }
}

#[derive(Debug)]
pub struct RedisRows {
    pub rows: Vec<RedisRow>,
    /// The bench's reason, when it skipped itself (no server).
    pub skipped: Option<String>,
}

/// One row: clients, items per transaction, and the rates of reliable-queue on Redis, the
/// redis-rs loop by hand, PostgreSQL and sled (`None`: not measured).
#[derive(Debug)]
pub struct RedisRow {
    pub clients: f64,
    pub batch: u64,
    pub values: [Option<f64>; 4],
}

#[derive(Debug)]
pub struct Latency {
    /// The example's first line, without "commit latency, ".
    pub header: Option<String>,
    pub rows: Vec<LatencyRow>,
}

/// p50, p90, p99, p99.9 and max of one row, in µs.
#[derive(Debug)]
pub struct LatencyRow {
    pub label: String,
    pub micros: [f64; 5],
}

#[derive(Debug)]
pub struct RecoveryFigure {
    pub peer: String,
    pub items: u64,
    pub memory_bytes_per_item: Option<f64>,
    pub disk_bytes_per_item: Option<f64>,
}

#[derive(Debug)]
pub struct Soak {
    /// The line describing the run, without "pg_soak: ".
    pub header: Option<String>,
    pub windows: Vec<Window>,
    pub skipped: Option<String>,
}

#[derive(Debug)]
pub struct Window {
    /// The window's end, in seconds since the churn started.
    pub t: f64,
    pub jobs: f64,
    pub lease_p99_ms: f64,
}

/// Adds the `figure recovery/<size>/<peer> ...` lines of one file to `out`.
fn recovery_figures(path: &Path, text: &str, out: &mut Vec<RecoveryFigure>) -> Result<(), Error> {
    for (n, line) in lines(text) {
        let Some(rest) = line.strip_prefix("figure recovery/") else {
            continue;
        };
        let malformed = |what: &str| Error::Malformed {
            path: path.to_path_buf(),
            line: n,
            what: what.to_owned(),
        };
        // <label>/<peer> build: ... store on disk <m> MiB ...
        // <label>/<peer> memory per queued item: <x> bytes ...
        let (key, what) = rest
            .split_once(' ')
            .ok_or_else(|| malformed("no figure after the id"))?;
        let (label, peer) = key
            .split_once('/')
            .ok_or_else(|| malformed("an id not of the form <size>/<peer>"))?;
        let items = items_of(label).ok_or_else(|| malformed("a size not like 1M, 200k or 5000"))?;
        let at = match out.iter().position(|f| f.peer == peer && f.items == items) {
            Some(i) => i,
            None => {
                out.push(RecoveryFigure {
                    peer: peer.to_owned(),
                    items,
                    memory_bytes_per_item: None,
                    disk_bytes_per_item: None,
                });
                out.len() - 1
            }
        };
        if let Some(v) = what.strip_prefix("memory per queued item: ") {
            let bytes = first_number(v).ok_or_else(|| malformed("no byte count"))?;
            out[at].memory_bytes_per_item = Some(bytes);
        } else if let Some((_, v)) = what.split_once("store on disk ") {
            let mib = first_number(v).ok_or_else(|| malformed("no store size"))?;
            out[at].disk_bytes_per_item = Some(mib * 1024.0 * 1024.0 / items as f64);
        }
    }
    Ok(())
}

/// Lines numbered from 1, each cut to what follows its last carriage return (a terminal's
/// progress lines overwrite themselves that way).
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.rsplit('\r').next().unwrap_or(l)))
}

/// `1M`, `200k` or `5000` as a count.
fn items_of(label: &str) -> Option<u64> {
    if let Some(m) = label.strip_suffix('M') {
        m.parse::<u64>().ok()?.checked_mul(1_000_000)
    } else if let Some(k) = label.strip_suffix('k') {
        k.parse::<u64>().ok()?.checked_mul(1_000)
    } else {
        label.parse().ok()
    }
    .filter(|n| *n > 0)
}

fn first_number(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Seconds per unit of criterion's time units.
fn time_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "ps" => 1e-12,
        "ns" => 1e-9,
        "µs" | "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    })
}

/// Elements per unit of criterion's throughput units.
fn rate_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "elem/s" => 1.0,
        "Kelem/s" => 1e3,
        "Melem/s" => 1e6,
        "Gelem/s" => 1e9,
        _ => return None,
    })
}

/// The three `value unit` pairs between `[` and `]`: `None` when the units are not of `unit`
/// (a `change:` line prints percentages there).
fn bracket(line: &str, unit: fn(&str) -> Option<f64>) -> Result<Option<[f64; 3]>, String> {
    let inner = line
        .split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(inner, _)| inner)
        .ok_or("no [low estimate high] on the line")?;
    let tokens: Vec<&str> = inner.split_whitespace().collect();
    if tokens.len() != 6 {
        if tokens.iter().any(|t| t.ends_with('%')) {
            return Ok(None);
        }
        return Err(format!("`[{inner}]` is not three values with units"));
    }
    let mut out = [0.0; 3];
    for (i, slot) in out.iter_mut().enumerate() {
        let Some(scale) = unit(tokens[2 * i + 1]) else {
            return Ok(None);
        };
        let v: f64 = tokens[2 * i]
            .parse()
            .map_err(|_| format!("`{}` is not a number", tokens[2 * i]))?;
        *slot = v * scale;
    }
    Ok(Some(out))
}

/// Criterion's printed results: an id on a line of its own (or first on its `time:` line),
/// then `time: [low estimate high]` and, with a throughput, `thrpt: [low estimate high]`.
fn parse_criterion(path: &Path, text: &str) -> Result<Vec<Measurement>, Error> {
    let mut out: Vec<Measurement> = Vec::new();
    let mut last_id: Option<String> = None;
    let mut current: Option<usize> = None;
    for (n, line) in lines(text) {
        let malformed = |what: String| Error::Malformed {
            path: path.to_path_buf(),
            line: n,
            what,
        };
        if line.starts_with("Benchmarking") {
            continue;
        }
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if !line.starts_with(char::is_whitespace) && tokens.len() == 1 {
            last_id = Some(tokens[0].to_owned());
            continue;
        }
        if let Some(at) = tokens.iter().position(|t| *t == "time:") {
            let Some([_, estimate, _]) = bracket(line, time_unit).map_err(malformed)? else {
                current = None; // a `change:` line
                continue;
            };
            let id = if at == 0 {
                last_id.clone().ok_or_else(|| {
                    malformed("a `time:` line with no benchmark id before it".into())
                })?
            } else {
                tokens[0].to_owned()
            };
            if estimate <= 0.0 {
                return Err(malformed(format!("{id}: a time of {estimate} s")));
            }
            out.retain(|m| m.id != id);
            out.push(Measurement { id, rate: None });
            current = Some(out.len() - 1);
        } else if tokens.contains(&"thrpt:") {
            let Some([_, estimate, _]) = bracket(line, rate_unit).map_err(malformed)? else {
                continue;
            };
            if let Some(i) = current {
                out[i].rate = Some(estimate);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_text() {
        let text = "Benchmarking durable/16p-16c/1-item-tx/reliable-queue: Warming up\n\
            durable/16p-16c/1-item-tx/reliable-queue\n\
            \x20                       time:   [55.1 µs 61.2 µs 66.0 µs]\n\
            \x20                       thrpt:  [15.1 Kelem/s 16.3 Kelem/s 18.1 Kelem/s]\n\
            \x20                change:\n\
            \x20                       time:   [-1.0% +2.0% +3.0%] (p = 0.1 > 0.05)\n\
            \x20                       thrpt:  [-3.0% -2.0% +1.0%]\n\
            contention/memory/consumers/1\n\
            \x20                       time:   [70.1 ns 70.8 ns 71.0 ns]\n\
            recovery/1M/pq-sled     time:   [1.40 s 1.47 s 1.50 s]\n";
        let m = parse_criterion(Path::new("x"), text).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].id, "durable/16p-16c/1-item-tx/reliable-queue");
        assert_eq!(m[0].rate, Some(16.3e3));
        assert_eq!(m[1].rate, None);
        assert_eq!(m[2].id, "recovery/1M/pq-sled");
    }

    #[test]
    fn criterion_text_malformed() {
        let text = "a/b\n    time:   [1.0 µs x µs 3.0 µs]\n";
        assert!(matches!(
            parse_criterion(Path::new("x"), text),
            Err(Error::Malformed { line: 2, .. })
        ));
        assert!(parse_criterion(Path::new("x"), "    time:   [1 µs 2 µs 3 µs]\n").is_err());
    }

    /// A results directory of its own under the system's temporary directory.
    fn results(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rq-charts-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            fs::write(dir.join(file), text).unwrap();
        }
        dir
    }

    #[test]
    fn server_benches_and_figures() {
        let dir = results(
            "figures",
            &[
                (
                    "redis.txt",
                    "| workload | a | b | c | d | e | f |\n\
                     | --- | --- | --- | --- | --- | --- | --- |\n\
                     | move, 16 client(s) (moves/s) | 6490 | 14015 | 0.46x | 72.9 / 19.6 µs | - | 23688 |\n\
                     | 64-item transactions, 4+4 clients (items/s) | 64287 | 140532 | 0.46x | 5.9 / 2.4 µs | 65798 | 217256 |\n",
                ),
                (
                    "pg_soak.txt",
                    "pg_soak: backlog 20000 filled in 0.1 s; 60 s in 5 s windows\n\
                     \x20 t(s)    jobs/s   lease50   lease99\n\
                     \x20    5      1903       3.6      15.2\n\
                     \x20   10      1599       4.4      16.3\n\
                     pg_soak summary: first window 1903 jobs/s\n",
                ),
                (
                    "recovery.txt",
                    "figure recovery/200k/pq-sled build: 16.9 s, store on disk 123.3 MiB (123.3 MiB allocated)\n\
                     figure recovery/200k/pq-sled memory per queued item: 338.4 bytes (RSS +64.5 MiB)\n",
                ),
                (
                    "recovery-10000.txt",
                    "figure recovery/10k/pq-sled memory per queued item: 533.7 bytes (RSS +5.1 MiB)\n",
                ),
            ],
        );
        let criterion = CriterionResults::default();
        let figures = Figures {
            dir: &dir,
            criterion: &criterion,
        };
        let redis = figures.redis().unwrap().unwrap();
        assert_eq!(redis.rows.len(), 2);
        assert_eq!(redis.rows[0].clients, 16.0);
        assert_eq!(
            redis.rows[0].values,
            [Some(6490.0), Some(14015.0), None, Some(23688.0)]
        );
        assert_eq!((redis.rows[1].clients, redis.rows[1].batch), (8.0, 64));
        let soak = figures.soak().unwrap().unwrap();
        assert_eq!(soak.windows.len(), 2);
        assert_eq!(
            (
                soak.windows[1].t,
                soak.windows[1].jobs,
                soak.windows[1].lease_p99_ms
            ),
            (10.0, 1599.0, 16.3)
        );
        let recovery = figures.recovery().unwrap().unwrap();
        assert_eq!(recovery.len(), 2);
        let at_10k = recovery.iter().find(|f| f.items == 10_000).unwrap();
        assert_eq!(at_10k.memory_bytes_per_item, Some(533.7));
        let at_200k = recovery.iter().find(|f| f.items == 200_000).unwrap();
        let disk = at_200k.disk_bytes_per_item.unwrap();
        assert!((disk - 123.3 * 1024.0 * 1024.0 / 200_000.0).abs() < 1e-6);
        assert!(
            figures.latency().unwrap().is_none(),
            "a missing file is no error"
        );

        fs::write(
            dir.join("pg_soak.txt"),
            "  t(s) jobs/s lease99\n     5 x 1.0\n",
        )
        .unwrap();
        assert!(matches!(
            figures.soak(),
            Err(Error::Malformed { line: 2, .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes() {
        assert_eq!(items_of("1M"), Some(1_000_000));
        assert_eq!(items_of("200k"), Some(200_000));
        assert_eq!(items_of("1234"), Some(1234));
        assert_eq!(items_of("x"), None);
        assert_eq!(items_of("0"), None);
    }
}
