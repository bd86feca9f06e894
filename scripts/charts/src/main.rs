//! Draws the charts BENCHMARKS.md shows from the results `scripts/bench.sh` collects.
//!
//! ```text
//! reliable-queue-charts <results dir> <charts dir> [--criterion <criterion dir>]
//! ```
//!
//! The results directory is the one `scripts/bench.sh` writes (`RQ_BENCH_OUT`): one text file
//! per bench. Criterion's medians are read from its own estimates
//! (`<criterion dir>/<group>/<id>/new/estimates.json`) when those were written during that run
//! (after its `machine.txt`), else from the bench's printed output. Each chart is an SVG file
//! of its own in the charts directory; a chart whose input is missing is skipped with a line
//! saying so, and one whose input cannot be read or parsed is reported as an error (the exit
//! status is then 1; the other charts are still drawn).

#![forbid(unsafe_code)]

mod draw;
mod input;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use draw::{Axis, Chart, Format, Line, Marker, Series};
use input::{CriterionResults, Figures, Loaded};

/// What went wrong with one chart, or with the command line.
#[derive(Debug)]
pub enum Error {
    /// The command line is not `<results dir> <charts dir> [--criterion <dir>]`.
    Usage(String),
    /// A file exists but could not be read (or the charts directory could not be made).
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file does not hold what its bench prints.
    Malformed {
        path: PathBuf,
        line: usize,
        what: String,
    },
    /// The drawing backend failed (writing the SVG file).
    Draw { path: PathBuf, message: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(why) => write!(
                f,
                "{why}\nusage: reliable-queue-charts <results dir> <charts dir> [--criterion <dir>]"
            ),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Malformed {
                path,
                line: 0,
                what,
            } => write!(f, "{}: {what}", path.display()),
            Error::Malformed { path, line, what } => {
                write!(f, "{}:{line}: {what}", path.display())
            }
            Error::Draw { path, message } => {
                write!(f, "{}: could not draw: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

/// What happened to one chart.
enum Outcome {
    /// Drawn; the text says what it holds.
    Wrote(String),
    /// Not drawn, for want of input; the text says which.
    Skipped(String),
}

struct Args {
    results: PathBuf,
    charts: PathBuf,
    criterion: Option<PathBuf>,
}

fn parse_args() -> Result<Args, Error> {
    let mut positional = Vec::new();
    let mut criterion = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--criterion" {
            let dir = args
                .next()
                .ok_or_else(|| Error::Usage("--criterion needs a directory".into()))?;
            criterion = Some(PathBuf::from(dir));
        } else if arg == "-h" || arg == "--help" {
            return Err(Error::Usage("draws BENCHMARKS.md's charts".into()));
        } else if arg.to_string_lossy().starts_with('-') {
            return Err(Error::Usage(format!(
                "unknown option {}",
                arg.to_string_lossy()
            )));
        } else {
            positional.push(PathBuf::from(arg));
        }
    }
    let mut positional = positional.into_iter();
    match (positional.next(), positional.next(), positional.next()) {
        (Some(results), Some(charts), None) => Ok(Args {
            results,
            charts,
            criterion,
        }),
        _ => Err(Error::Usage(
            "expected two arguments: the results directory and the charts directory".into(),
        )),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("charts: {e}");
            return ExitCode::from(2);
        }
    };
    if !args.results.is_dir() {
        eprintln!(
            "charts: {}: not a directory (the results directory of scripts/bench.sh)",
            args.results.display()
        );
        return ExitCode::from(2);
    }
    if let Err(source) = std::fs::create_dir_all(&args.charts) {
        eprintln!(
            "charts: {}",
            Error::Io {
                path: args.charts.clone(),
                source
            }
        );
        return ExitCode::FAILURE;
    }
    let criterion = CriterionResults::load(args.criterion.as_deref(), &args.results);
    if let Some(note) = criterion.note() {
        println!("charts: {note}");
    }
    let figures = Figures {
        dir: &args.results,
        criterion: &criterion,
    };

    type Maker = fn(&Figures<'_>, &Path) -> Result<Outcome, Error>;
    let charts: [(&str, Maker); 7] = [
        ("throughput-inmemory", throughput_inmemory),
        ("throughput-durable", throughput_durable),
        ("throughput-contention", throughput_contention),
        ("throughput-redis", throughput_redis),
        ("commit-latency", commit_latency),
        ("memory-per-item", memory_per_item),
        ("pg-soak", pg_soak),
    ];
    let mut failed = 0;
    for (name, make) in charts {
        let path = args.charts.join(format!("{name}.svg"));
        match make(&figures, &path) {
            Ok(Outcome::Wrote(what)) => println!("wrote   {}: {what}", path.display()),
            Ok(Outcome::Skipped(why)) => {
                let kept = if path.exists() {
                    " (the file there is from an earlier run)"
                } else {
                    ""
                };
                println!("skipped {}: {why}{kept}", path.display());
            }
            Err(e) => {
                failed += 1;
                println!("FAILED  {}: {e}", path.display());
            }
        }
    }
    if failed > 0 {
        eprintln!("charts: {failed} chart(s) could not be drawn");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The workload a point belongs to, where a chart mixes two: one-item transactions are
/// joined by a line, 64-item ones stand as triangles.
fn workload_style(batch: u64) -> (Line, Marker) {
    if batch == 1 {
        (Line::Solid, Marker::Circle)
    } else {
        (Line::Dashed, Marker::Triangle)
    }
}

/// Builds one series per (peer, batch), in the order `peers` lists the peers. The points of
/// a 64-item workload measured at one client count only are moved sideways a little
/// each (by 5%, a few pixels on the log axis) so that equal values do not hide each other.
fn series_by_peer(peers: &[&str], points: &[(String, u64, f64, f64)]) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    let mut batches: Vec<u64> = points.iter().map(|p| p.1).collect();
    batches.sort_unstable();
    batches.dedup();
    for (color, peer) in peers.iter().enumerate() {
        for &batch in &batches {
            let mut pts: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.0 == *peer && p.1 == batch)
                .map(|p| (p.2, p.3))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (line, marker) = workload_style(batch);
            if batch != 1 && pts.len() == 1 {
                let shift = 1.05f64.powf(color as f64 - (peers.len() as f64 - 1.0) / 2.0);
                for p in &mut pts {
                    p.0 *= shift;
                }
            }
            out.push(Series {
                name: (*peer).to_owned(),
                color,
                line,
                marker,
                points: pts,
                secondary: false,
            });
        }
    }
    out
}

fn style_legend(batches: &[(u64, &str)]) -> Vec<(Line, Marker, String)> {
    batches
        .iter()
        .map(|&(batch, text)| {
            let (line, marker) = workload_style(batch);
            (line, marker, text.to_owned())
        })
        .collect()
}

fn sources_text(points: usize, loaded: &Loaded) -> String {
    format!(
        "{points} point(s); of the {} results in {}, {} taken from criterion's estimates \
         (median), {} from the printed output",
        loaded.from_json + loaded.from_text,
        loaded.file,
        loaded.from_json,
        loaded.from_text,
    )
}

/// A point's peer, items per transaction and clients, as read from a benchmark id.
type Point = (String, u64, f64);

/// A chart of items/s against clients from one criterion bench's results: each point, parsed
/// from a benchmark id by `point`, is (peer, items per transaction, clients, items/s).
struct Throughput<'a> {
    file: &'a str,
    /// The ids `point` reads, for the message when it finds none.
    ids: &'a str,
    point: fn(&[&str]) -> Option<Point>,
    peers: &'a [&'a str],
    title: &'a str,
    subtitle: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    styles: &'a [(u64, &'a str)],
}

impl Throughput<'_> {
    fn draw(&self, figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
        let Some(loaded) = figures.criterion_file(self.file)? else {
            return Ok(Outcome::Skipped(format!("no {} in the results", self.file)));
        };
        let mut points = Vec::new();
        for m in &loaded.measurements {
            let parts: Vec<&str> = m.id.split('/').collect();
            if let (Some((peer, batch, clients)), Some(rate)) = ((self.point)(&parts), m.rate) {
                points.push((peer, batch, clients, rate));
            }
        }
        if points.is_empty() {
            return Ok(Outcome::Skipped(format!(
                "{} holds no {} results",
                self.file, self.ids
            )));
        }
        let chart = Chart {
            title: self.title.into(),
            subtitle: self.subtitle.into(),
            x: Axis::clients(
                self.x_label,
                &points.iter().map(|p| p.2).collect::<Vec<_>>(),
            ),
            y: Axis::fit(self.y_label, Format::Count, points.iter().map(|p| p.3)),
            y2: None,
            series: series_by_peer(self.peers, &points),
            styles: style_legend(self.styles),
        };
        chart.draw(path)?;
        Ok(Outcome::Wrote(sources_text(points.len(), &loaded)))
    }
}

/// §1: items/s against threads, in memory, for each peer; one-item and 64-item transactions.
fn throughput_inmemory(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    Throughput {
        file: "inmemory.txt",
        ids: "inmemory/<batch>-item-tx/<threads>-threads",
        // inmemory/<batch>-item-tx/<threads>-threads/<peer>; the `-vec` and `-struct` groups are
        // left out.
        point: |parts| match parts {
            ["inmemory", batch, threads, peer] => Some((
                (*peer).to_owned(),
                batch.strip_suffix("-item-tx")?.parse().ok()?,
                threads.strip_suffix("-threads")?.parse().ok()?,
            )),
            _ => None,
        },
        peers: &["reliable-queue", "segqueue", "mutex-vecdeque", "pq-memstore"],
        title: "In memory: items/s against threads (§1)",
        subtitle: "each thread: one transaction of 1 (or 64) enqueues, then one of as many dequeues; 100-byte items",
        x_label: "threads",
        y_label: "items/s (round trips)",
        styles: &[(1, "1-item transactions"), (64, "64-item transactions")],
    }
    .draw(figures, path)
}

/// §2: durable items/s against client threads or tasks, for each peer.
fn throughput_durable(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    Throughput {
        file: "durable.txt",
        ids: "durable/<clients>/<batch>-item-tx",
        // durable/<P>p-<C>c/<batch>-item-tx/<peer> or durable/<N>-tasks/<batch>-item-tx/<peer>;
        // `buffered/...` (not durable) is left out.
        point: |parts| match parts {
            ["durable", clients, batch, peer] => {
                let clients = match clients.strip_suffix("-tasks") {
                    Some(tasks) => tasks.parse::<f64>().ok()?,
                    None => {
                        let (p, c) = clients.split_once("p-")?;
                        p.parse::<f64>().ok()? + c.strip_suffix('c')?.parse::<f64>().ok()?
                    }
                };
                let batch = batch.strip_suffix("-item-tx")?.parse().ok()?;
                Some(((*peer).to_owned(), batch, clients))
            }
            _ => None,
        },
        peers: &["reliable-queue", "pq-sled-group", "pq-sled-sync", "sled-batch-flush"],
        title: "Durable: items/s against clients (§2)",
        subtitle: "every commit fsync'd; 32 = 16 producer + 16 consumer threads, 1024 = tokio tasks, 8 = 4 + 4 threads",
        x_label: "clients (threads or tasks)",
        y_label: "items/s (round trips)",
        styles: &[(1, "1-item transactions"), (64, "64-item transactions")],
    }
    .draw(figures, path)
}

/// §3: committed dequeues/s against consumer threads, memory and disk.
fn throughput_contention(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    Throughput {
        file: "contention.txt",
        ids: "contention/<store>/consumers/<n>",
        // contention/<store>/consumers/<n>
        point: |parts| match parts {
            ["contention", store, "consumers", n] => {
                Some((format!("reliable-queue, {store}"), 1, n.parse().ok()?))
            }
            _ => None,
        },
        peers: &["reliable-queue, memory", "reliable-queue, disk-sync"],
        title: "Dequeue contention: dequeues/s against consumers (§3)",
        subtitle: "a pre-filled queue; each consumer: try_dequeue one item, commit; disk-sync: every commit fsync'd",
        x_label: "consumer threads",
        y_label: "committed dequeues/s",
        styles: &[],
    }
    .draw(figures, path)
}

/// §16: moves/s against clients for the Redis engine, a redis-rs loop by hand, and the engine
/// on PostgreSQL and on sled; the 64-item transactions as a point at 4 + 4 clients.
fn throughput_redis(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    let Some(rows) = figures.redis()? else {
        return Ok(Outcome::Skipped(figures.missing("redis")));
    };
    if rows.rows.is_empty() {
        return Ok(Outcome::Skipped(format!(
            "redis.txt holds no `| move, N client(s) ...` rows{}",
            rows.skipped
                .as_deref()
                .map(|why| format!(" ({why})"))
                .unwrap_or_default()
        )));
    }
    let sides = [
        "reliable-queue on Redis",
        "redis-rs by hand",
        "PostgreSQL",
        "sled",
    ];
    let mut points = Vec::new();
    for row in &rows.rows {
        for (side, value) in sides.iter().zip(row.values) {
            if let Some(v) = value {
                points.push(((*side).to_owned(), row.batch, row.clients, v));
            }
        }
    }
    let chart = Chart {
        title: "Redis engine and peers: moves/s against clients (§16)".into(),
        subtitle: "PostgreSQL, sled: reliable-queue on those stores, the same loop; 16-byte items; medians".into(),
        x: Axis::clients(
            "clients (tokio tasks)",
            &points.iter().map(|p| p.2).collect::<Vec<_>>(),
        ),
        y: Axis::fit("items moved/s", Format::Count, points.iter().map(|p| p.3)),
        y2: None,
        series: series_by_peer(&sides, &points),
        styles: style_legend(&[
            (1, "one-item moves"),
            (64, "64-item transactions, 4 + 4 clients"),
        ]),
    };
    chart.draw(path)?;
    Ok(Outcome::Wrote(format!(
        "{} point(s) from {} row(s) of redis.txt",
        points.len(),
        rows.rows.len()
    )))
}

/// §6: commit latency at p50, p90, p99, p99.9 and the maximum.
fn commit_latency(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    let Some(latency) = figures.latency()? else {
        return Ok(Outcome::Skipped("no latency.txt in the results".into()));
    };
    if latency.rows.is_empty() {
        return Ok(Outcome::Skipped(
            "latency.txt holds no `| enqueue | ...` table".into(),
        ));
    }
    let labels = ["p50", "p90", "p99", "p99.9", "max"];
    // The three rows are close to each other: "all" is drawn first, dashed, and each row has
    // a marker of its own, so that the ones on top do not hide it.
    let order = [
        ("all", 2, Line::Dashed, Marker::Square),
        ("enqueue", 0, Line::Solid, Marker::Circle),
        ("dequeue", 1, Line::Solid, Marker::Triangle),
    ];
    let mut series = Vec::new();
    for (name, color, line, marker) in order {
        if let Some(row) = latency.rows.iter().find(|r| r.label == name) {
            series.push(Series {
                name: format!("{name} commits"),
                color,
                line,
                marker,
                points: row
                    .micros
                    .iter()
                    .enumerate()
                    .map(|(i, &us)| (i as f64, us))
                    .collect(),
                secondary: false,
            });
        }
    }
    let values: Vec<f64> = latency.rows.iter().flat_map(|r| r.micros).collect();
    let chart = Chart {
        title: "reliable-queue commit latency, Durability::Sync (§6)".into(),
        subtitle: latency.header.clone().unwrap_or_default(),
        x: Axis::categories("percentile", &labels),
        y: Axis::fit(
            "commit latency (µs, ms)",
            Format::Micros,
            values.iter().copied(),
        ),
        y2: None,
        series,
        styles: Vec::new(),
    };
    chart.draw(path)?;
    Ok(Outcome::Wrote(format!(
        "{} row(s) of latency.txt",
        latency.rows.len()
    )))
}

/// §4: memory (and store size on disk) per queued item against the number of queued items.
fn memory_per_item(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    let Some(recovery) = figures.recovery()? else {
        return Ok(Outcome::Skipped("no recovery*.txt in the results".into()));
    };
    if recovery.is_empty() {
        return Ok(Outcome::Skipped(
            "the recovery*.txt files hold no `figure recovery/...` lines".into(),
        ));
    }
    let peers = ["reliable-queue", "pq-sled", "sled-batch-flush"];
    let mut series = Vec::new();
    for (color, peer) in peers.iter().enumerate() {
        for disk in [false, true] {
            let mut pts: Vec<(f64, f64)> = recovery
                .iter()
                .filter(|f| f.peer == *peer)
                .filter_map(|f| {
                    let v = if disk {
                        f.disk_bytes_per_item
                    } else {
                        f.memory_bytes_per_item
                    };
                    v.map(|v| (f.items as f64, v))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                name: (*peer).to_owned(),
                color,
                line: if disk { Line::Dashed } else { Line::Solid },
                marker: if disk { Marker::Square } else { Marker::Circle },
                points: pts,
                secondary: false,
            });
        }
    }
    let xs: Vec<f64> = recovery.iter().map(|f| f.items as f64).collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let chart = Chart {
        title: "Bytes per queued item against queue length (§4)".into(),
        subtitle: "memory: RSS growth of a fresh process opening the store; disk: the store's files; 100-byte items".into(),
        x: Axis::clients("queued items", &xs),
        y: Axis::fit("bytes per queued item", Format::Bytes, ys.into_iter()),
        y2: None,
        series,
        styles: vec![
            (Line::Solid, Marker::Circle, "memory (RSS) per item".into()),
            (Line::Dashed, Marker::Square, "store on disk per item".into()),
        ],
    };
    chart.draw(path)?;
    Ok(Outcome::Wrote(format!(
        "{} (size, peer) figure(s) from recovery*.txt",
        recovery.len()
    )))
}

/// §14: the PostgreSQL soak's jobs/s per window over time, and the lease's p99.
fn pg_soak(figures: &Figures<'_>, path: &Path) -> Result<Outcome, Error> {
    let Some(soak) = figures.soak()? else {
        return Ok(Outcome::Skipped(figures.missing("pg_soak")));
    };
    if soak.windows.is_empty() {
        return Ok(Outcome::Skipped(format!(
            "pg_soak.txt holds no windows{}",
            soak.skipped
                .as_deref()
                .map(|why| format!(" ({why})"))
                .unwrap_or_default()
        )));
    }
    let rates: Vec<(f64, f64)> = soak.windows.iter().map(|w| (w.t, w.jobs)).collect();
    let p99: Vec<(f64, f64)> = soak.windows.iter().map(|w| (w.t, w.lease_p99_ms)).collect();
    let times: Vec<f64> = rates.iter().map(|p| p.0).collect();
    let chart = Chart {
        title: "PostgreSQL soak: jobs/s over time (§14)".into(),
        subtitle: soak.header.clone().unwrap_or_default(),
        x: Axis::time("time since the churn started (s)", &times),
        y: Axis::linear_from_zero(
            "jobs/s (per window)",
            Format::Count,
            &rates.iter().map(|p| p.1).collect::<Vec<_>>(),
        ),
        y2: Some(Axis::linear_from_zero(
            "lease p99 (ms)",
            Format::Plain,
            &p99.iter().map(|p| p.1).collect::<Vec<_>>(),
        )),
        series: vec![
            Series {
                name: "reliable-queue on PostgreSQL: jobs/s (left)".into(),
                color: 0,
                line: Line::Solid,
                marker: Marker::Circle,
                points: rates,
                secondary: false,
            },
            Series {
                name: "lease p99, ms (right)".into(),
                color: 1,
                line: Line::Dashed,
                marker: Marker::Square,
                points: p99,
                secondary: true,
            },
        ],
        styles: Vec::new(),
    };
    chart.draw(path)?;
    Ok(Outcome::Wrote(format!(
        "{} window(s) of pg_soak.txt",
        soak.windows.len()
    )))
}
