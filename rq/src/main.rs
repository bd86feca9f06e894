//! `rq`: look into a reliable-queue store and repair it, on sled, PostgreSQL or Redis.
//!
//! Every command works on a store named by `--store DIR` (an embedded sled store, which must
//! not be open in another process) or `--postgres URL` (live, beside running workers);
//! `stats`, `browse` and `dead-letters` also through a running service's dashboard (`--url`).
//! `serve` serves the dashboard itself. Run
//! `rq --help` and `rq <command> --help` for the details and an example of each.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::ProgressBar;
use reliable_queue::{Error, RawItem, Replay, Store};
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

mod common;
mod export;
mod source;

use common::{printable, progress, Res, ITEM_LIMIT};
use reliable_queue_web::rows::{cut, human};
use reliable_queue_web::QueueRow;
use source::{Remote, Source};

/// What `main` returns for a store found damaged (`rq verify`); other failures return 1.
const DAMAGED: u8 = 2;

/// How long `verify` waits for a store's lock, as `Store::open` does.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

#[derive(Parser, Debug)]
#[command(
    name = "rq",
    version,
    about = "Look into a reliable-queue store and repair it: stats, browse, dead letters, \
             verify, export, import, and a web dashboard (serve).",
    long_about = "Look into a reliable-queue store and repair it: stats, browse, dead letters, \
                  verify, export, import, and a web dashboard (serve).\n\n\
                  The store is an embedded sled directory (--store DIR; it must not be open in \
                  another process: stop the service first, or copy the directory and point rq \
                  at the copy) or a PostgreSQL database (--postgres URL, optionally --schema; \
                  rq works beside running workers). A running service that mounts the \
                  dashboard (reliable_queue_web) is reached with --url: stats, browse and \
                  dead-letters then go through its JSON API, the live view of a sled store.\n\n\
                  Payloads are shown as text when they are UTF-8 strings or bytes, otherwise as \
                  hex: the encoding does not say what type an item is. A service can show its \
                  own types with reliable_queue::Decoders.",
    after_help = "Examples:\n  \
                  rq --store ./worker-pool-data stats\n  \
                  rq --postgres postgresql://app@db/app stats --watch\n  \
                  rq --store ./data dead-letters replay jobs --all --yes\n  \
                  rq --store ./data verify\n  \
                  rq --store ./data export backup.jsonl && \
                  rq --postgres postgresql://app@db/app import backup.jsonl\n  \
                  rq --postgres postgresql://app@db/app serve\n  \
                  rq --url http://127.0.0.1:8080/ops/queues stats"
)]
struct Cli {
    /// An embedded (sled) store's directory.
    #[arg(long, global = true, env = "RQ_STORE")]
    store: Option<PathBuf>,
    /// A PostgreSQL store's database URL (libpq form, e.g. postgresql://user@host/db).
    #[arg(long, global = true, env = "RQ_POSTGRES_URL")]
    postgres: Option<String>,
    /// A Redis store's server URL (redis://host:port/db, rediss://..., redis+unix:///path).
    #[arg(long, global = true, env = "RQ_REDIS_URL")]
    redis: Option<String>,
    /// The PostgreSQL schema the store's tables are in, or the Redis store's namespace.
    #[arg(long, global = true, default_value = "reliable_queue")]
    schema: String,
    /// A running service's dashboard (http://host:port[/path], where it is mounted): `stats`,
    /// `browse` and `dead-letters` go through its JSON API, the live view of an embedded
    /// store. Replay and purge need its admin token in RQ_ADMIN_TOKEN.
    #[arg(long, global = true, env = "RQ_URL")]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every queue with its ready, delayed, leased, held and dead items and the age of its
    /// oldest ready item.
    #[command(after_help = "Examples:\n  rq --store ./data stats\n  \
                            rq --postgres postgresql://app@db/app stats --watch --interval 2\n  \
                            rq --store ./data stats --json | jq '.[] | select(.dead > 0)'\n\n\
                            On sled, --watch works only on a store no service has open: watch a \
                            PostgreSQL store live, a sled one after its service stopped.")]
    Stats {
        /// Redraw every --interval seconds until Ctrl-C (the store is then closed cleanly).
        #[arg(long)]
        watch: bool,
        /// Seconds between redraws with --watch: from 0.1 to 86400 (a day).
        #[arg(long, default_value = "1", value_parser = interval, requires = "watch")]
        interval: Duration,
        /// With --watch, stop after this many redraws (at least 1).
        #[arg(long, value_parser = at_least_one::<u64>, requires = "watch")]
        count: Option<u64>,
        /// Also list the queues of import bookkeeping (rq.import.*: how far each import got),
        /// left out by default.
        #[arg(long)]
        all: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List a queue's items without taking them.
    #[command(
        after_help = "Examples:\n  rq --store ./data browse jobs --limit 20\n  \
                            rq --store ./data browse jobs --state leased --json"
    )]
    Browse {
        /// The queue.
        queue: String,
        /// Only items in this state.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        #[command(flatten)]
        page: Page,
    },
    /// List, replay or purge a queue's dead letters.
    #[command(
        subcommand,
        name = "dead-letters",
        after_help = "Examples:\n  rq --store ./data dead-letters list jobs\n  \
                      rq --store ./data dead-letters replay jobs --all --yes\n  \
                      rq --store ./data dead-letters purge jobs --ids 17,18"
    )]
    DeadLetters(DeadCommand),
    /// Check a sled store for damage without changing it (exit code 2 when damaged).
    #[command(
        long_about = "Check a sled store for damage without changing it.\n\n\
                            sled has no read-only open, so rq copies the directory (holding \
                            the store's lock during the copy, so no service can open it \
                            meanwhile) and opens the copy: the open reads every record of the \
                            log, checks every checksum, the high and low marks and the log's \
                            invariants, and sets aside records that fail. When records are \
                            missing, rq notes them and opens the copy as Builder::salvage \
                            would, to check the rest. rq then reads every item and dead letter \
                            of every queue that is not fenced. The store itself is never \
                            opened or written.\n\n\
                            Exit codes: 0 healthy, 2 damaged (records set aside now or at an \
                            earlier open, records missing, queues fenced, items that cannot be \
                            read, or the open refused the store), 1 could not check (for \
                            example: a service has the store open).",
        after_help = "Examples:\n  rq --store ./data verify\n  \
                            rq --store ./data verify --json"
    )]
    Verify {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve the web dashboard for the store (pages and JSON API) until Ctrl-C.
    #[command(
        long_about = "Serve the web dashboard for the store: every queue's figures with live \
                      charts, items, dead letters, and the JSON API `rq --url` uses.\n\n\
                      It binds 127.0.0.1:7878 unless --listen says otherwise, and is read-only \
                      unless RQ_ADMIN_TOKEN (or --admin-token-file) gives the admin token that \
                      replay and purge need. On sled, rq holds the store while it serves: to \
                      watch a running service's sled store, mount the dashboard in the service \
                      (reliable_queue_web::Dashboard) and point `rq --url` at it.",
        after_help = "Examples:\n  rq --postgres postgresql://app@db/app serve\n  \
                      RQ_ADMIN_TOKEN=$(cat token) rq --store ./data serve --listen 0.0.0.0:7878"
    )]
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// A file holding the admin token (instead of RQ_ADMIN_TOKEN).
        #[arg(long)]
        admin_token_file: Option<PathBuf>,
    },
    /// Write every queue, item and dead letter to a portable file (JSON lines).
    #[command(
        long_about = "Write every queue (with its retry policy), item (with its \
                            attempts, due time and enqueue time) and dead letter to a \
                            portable file of JSON lines, items as their encoded bytes. The file \
                            carries a fresh source id; `rq import` uses it to resume. A leased \
                            item is written as due at its lease's deadline. On PostgreSQL, \
                            stop the workers first for an exact copy: items that move during \
                            the export may be written twice or not at all. Queues named \
                            rq.import.* (import bookkeeping) are left out.",
        after_help = "Example:\n  rq --store ./data export backup.jsonl"
    )]
    Export {
        /// The file to write (replaced if it exists).
        file: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add the queues, items and dead letters of an export to this store.
    #[command(
        long_about = "Add the queues, items and dead letters of an export to this store.\n\n\
                            The whole file is checked before anything is written: every line \
                            must be an export line, every item base64 of an item envelope the \
                            store takes, every queue name valid, and the end line there with \
                            the right counts. A file that fails is refused with each bad line \
                            named by its number, and nothing is imported.\n\n\
                            It is then written in transactions of up to --batch lines (256 by \
                            default). Each transaction also records how far the import got, \
                            and a digest of the lines taken, in a queue named \
                            rq.import.<source id>, so an import that stopped half way can be \
                            run again: it takes only the rest, never an item twice, and an \
                            import that finished does nothing when run again; of two runs of \
                            one import at once, the one that finds the other holding the \
                            record stops with an error. A different file with the same source \
                            id is refused. Items keep their attempts, due times and enqueue \
                            times; each gets a new id, at the tail of its queue. A sled store \
                            that does not exist yet is created. `rq stats` leaves the \
                            rq.import.* queues out (--all lists them).",
        after_help = "Example:\n  rq --postgres postgresql://app@db/app import backup.jsonl"
    )]
    Import {
        /// The file `rq export` wrote.
        file: PathBuf,
        /// Lines per transaction (smaller: shorter transactions beside live workers).
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A page of a listing: `browse` and `dead-letters list`.
#[derive(Args, Debug)]
struct Page {
    /// At most this many (at least 1).
    #[arg(long, default_value_t = 50, value_parser = at_least_one::<usize>)]
    limit: usize,
    /// Start after this id (the last id of the previous page).
    #[arg(long)]
    after: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum DeadCommand {
    /// List a queue's dead letters, oldest first.
    #[command(after_help = "Example:\n  rq --store ./data dead-letters list jobs --limit 10")]
    List {
        /// The queue.
        queue: String,
        #[command(flatten)]
        page: Page,
    },
    /// Put dead letters back at the tail of their queue (asks first; --yes skips that).
    #[command(
        after_help = "Examples:\n  rq --store ./data dead-letters replay jobs --all\n  \
                            rq --store ./data dead-letters replay jobs --ids 41,42 \
                            --reset-attempts --yes"
    )]
    Replay {
        /// The queue.
        queue: String,
        #[command(flatten)]
        which: Which,
        /// Count their attempts from zero again.
        #[arg(long)]
        reset_attempts: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Delete dead letters for good (asks first; --yes skips that).
    #[command(
        after_help = "Example:\n  rq --store ./data dead-letters purge jobs --first 100 --yes"
    )]
    Purge {
        /// The queue.
        queue: String,
        #[command(flatten)]
        which: Which,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct Which {
    /// Every dead letter of the queue.
    #[arg(long)]
    all: bool,
    /// The oldest N (at least 1).
    #[arg(long, value_name = "N", value_parser = at_least_one::<usize>)]
    first: Option<usize>,
    /// These ids (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    ids: Option<Vec<u64>>,
}

impl Which {
    fn replay(&self) -> Replay {
        match (&self.ids, self.first) {
            (Some(ids), _) => Replay::Ids(ids.clone()),
            (None, Some(n)) => Replay::First(n),
            (None, None) => Replay::All,
        }
    }
}

/// The shortest and longest wait between two redraws of `stats --watch`: shorter would
/// redraw faster than anyone reads (and keep a store busy for nothing), longer is a typo.
const INTERVALS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(86_400));

/// `--interval`: seconds, within [`INTERVALS`]; anything else is refused, not clamped.
fn interval(text: &str) -> Result<Duration, String> {
    let (low, high) = INTERVALS;
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= low.as_secs_f64() && *s <= high.as_secs_f64())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            format!(
                "the wait between redraws must be between {} and {} seconds",
                low.as_secs_f64(),
                high.as_secs()
            )
        })
}

/// A count that must be at least 1 (`--limit`, `--first`, `--count`): 0 would do nothing
/// while seeming to do something, so it is refused.
fn at_least_one<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    match text.trim().parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err("must be at least 1".to_owned()),
        Err(_) => Err("not a whole number (at least 1)".to_owned()),
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StateFilter {
    Ready,
    Delayed,
    Leased,
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rq: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line. `--store` and `--postgres` exclude each other, and one given on
/// the command line overrides the other's environment variable (`RQ_POSTGRES_URL` exported
/// for a PostgreSQL store does not stop `rq --store DIR import FILE`).
fn parse() -> Result<Cli, clap::Error> {
    use clap::parser::ValueSource;
    use clap::{CommandFactory, FromArgMatches};
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    let mut cli = Cli::from_arg_matches(&matches)?;
    let typed = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    match (typed("store"), typed("postgres")) {
        (true, true) => {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                "--store and --postgres name two stores: give one",
            ))
        }
        (true, false) => cli.postgres = None,
        (false, true) => cli.store = None,
        (false, false) if cli.store.is_some() && cli.postgres.is_some() => {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                "RQ_STORE and RQ_POSTGRES_URL are both set: give --store or --postgres",
            ))
        }
        (false, false) => {}
    }
    // A Redis URL on the command line wins over the others' variables; beside another store
    // on the command line it is a conflict.
    if typed("redis") {
        if typed("store") || typed("postgres") {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                "--redis and --store or --postgres name two stores: give one",
            ));
        }
        cli.store = None;
        cli.postgres = None;
    } else if cli.store.is_some() || cli.postgres.is_some() {
        cli.redis = None;
    }
    Ok(cli)
}

/// Runs `read` on the store the options name, or on the dashboard `--url` names.
fn reading(cli: &Cli, read: impl FnOnce(&Source<'_>) -> Res<()>) -> Res<()> {
    if let Some(url) = &cli.url {
        if cli.store.is_some() || cli.postgres.is_some() || cli.redis.is_some() {
            return Err(
                "--url names a running service's dashboard: give it without --store or --postgres"
                    .into(),
            );
        }
        let remote = Remote::new(url, std::env::var("RQ_ADMIN_TOKEN").ok())?;
        return read(&Source::Url(&remote));
    }
    let store = open(cli, false)?;
    let result = read(&Source::Store(&store));
    close(store)?;
    result
}

fn run(cli: &Cli) -> Res<ExitCode> {
    if cli.url.is_some()
        && !matches!(
            cli.command,
            Command::Stats { .. } | Command::Browse { .. } | Command::DeadLetters(_)
        )
    {
        return Err("--url works with stats, browse and dead-letters; the other commands need --store or --postgres".into());
    }
    match &cli.command {
        Command::Stats {
            watch,
            interval,
            count,
            all,
            json,
        } => reading(cli, |source| {
            stats(source, *watch, *interval, *count, *all, *json)
        })?,
        Command::Browse { queue, state, page } => {
            reading(cli, |source| browse(source, queue, *state, page))?;
        }
        Command::DeadLetters(command) => reading(cli, |source| dead_letters(source, command))?,
        Command::Serve {
            listen,
            admin_token_file,
        } => serve(cli, *listen, admin_token_file.as_deref())?,
        Command::Verify { json } => return verify(cli, *json),
        Command::Export { file, json } => {
            let store = open(cli, false)?;
            let engine = if cli.store.is_some() {
                "sled"
            } else if cli.redis.is_some() {
                "redis"
            } else {
                "postgres"
            };
            let summary = export::export(&store, engine, file)?;
            close(store)?;
            summary.print(*json, "exported", file);
        }
        Command::Import { file, batch, json } => {
            // Checked whole before the store is opened: a refused file writes nothing, and
            // does not make a sled store that did not exist.
            let on_postgres = cli.postgres.is_some();
            let export = export::read(file, on_postgres)?;
            let store = open(cli, true)?;
            // As `open` chooses the store.
            let target = if cli.redis.is_some() {
                export::Target::Redis
            } else if on_postgres {
                export::Target::Postgres
            } else {
                export::Target::Sled
            };
            let summary = export::import(&store, &export, *batch as usize, target)?;
            close(store)?;
            summary.print(*json, "imported", file);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens the store the options name. A sled store must exist unless `create`.
fn open(cli: &Cli, create: bool) -> Res<Store> {
    if let Some(url) = &cli.redis {
        // As on PostgreSQL below: only a command that writes items may start a store.
        return Ok(Store::builder()
            .max_item_size(ITEM_LIMIT)
            .url(url)
            .namespace(&cli.schema)
            .redis_create(create)
            .open()?);
    }
    match (&cli.store, &cli.postgres) {
        (Some(dir), None) => {
            if !create && !dir.join("db").exists() {
                return Err(format!("no store at {}", dir.display()).into());
            }
            Store::builder()
                .path(dir)
                .max_item_size(ITEM_LIMIT)
                .open()
                .map_err(|e| opening(dir, e))
        }
        // Only a command that writes items may create the schema: a reading one against a
        // mistyped schema is an error, and runs under a role that may only read.
        (None, Some(url)) => Ok(Store::builder()
            .max_item_size(ITEM_LIMIT)
            .postgres(url)
            .postgres_schema(&cli.schema)
            .postgres_pool_size(4)
            .postgres_migrate(create)
            .open()?),
        _ => Err("name a store: --store DIR (sled), --postgres URL or --redis URL".into()),
    }
}

/// `rq serve`: the dashboard on `listen` until Ctrl-C or TERM, then the store closed.
fn serve(cli: &Cli, listen: std::net::SocketAddr, token_file: Option<&Path>) -> Res<()> {
    let token = match token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the admin token from {}: {e}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => std::env::var("RQ_ADMIN_TOKEN").ok(),
    }
    .filter(|t| !t.is_empty());
    let store = open(cli, false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let writable = token.is_some();
    let served = runtime.block_on(async {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let router = reliable_queue_web::Dashboard::new(store.clone())
            .admin_token(token)
            .router()?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        eprintln!(
            "rq: the dashboard is at http://{}/ ({}); Ctrl-C stops it",
            listener.local_addr()?,
            if writable {
                "admin token set: replay and purge allowed"
            } else {
                "read-only: set RQ_ADMIN_TOKEN to allow replay and purge"
            }
        );
        let stop = async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        };
        axum::serve(listener, router)
            .with_graceful_shutdown(stop)
            .await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    });
    drop(runtime);
    close(store)?;
    served
}

fn opening(dir: &Path, e: Error) -> Box<dyn std::error::Error> {
    match e {
        Error::AlreadyOpen { .. } => format!(
            "the store at {} is open in another process: stop it first, or copy the \
             directory and point rq at the copy",
            dir.display()
        )
        .into(),
        e => format!("cannot open the store at {}: {e}", dir.display()).into(),
    }
}

fn close(store: Store) -> Res<()> {
    Ok(store.blocking_close()?)
}

/// How long ago `time` was (zero for a time ahead of this machine's clock).
fn age(time: SystemTime) -> Duration {
    SystemTime::now().duration_since(time).unwrap_or_default()
}

/// How long until `time` (zero for a time past).
fn until(time: SystemTime) -> Duration {
    time.duration_since(SystemTime::now()).unwrap_or_default()
}

fn stats_table(rows: &[QueueRow], hidden: usize) -> String {
    let names: Vec<String> = rows.iter().map(|r| printable(&r.queue)).collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}\n",
        "QUEUE", "READY", "DELAYED", "LEASED", "HELD", "DEAD", "OLDEST"
    );
    for (r, name) in rows.iter().zip(&names) {
        let oldest = r
            .oldest_ms
            .map_or_else(|| "-".to_owned(), |ms| human(Duration::from_millis(ms)));
        out.push_str(&format!(
            "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}\n",
            name, r.ready, r.delayed, r.leased, r.held, r.dead, oldest
        ));
    }
    if rows.is_empty() {
        out.push_str("(no queues)\n");
    }
    match hidden {
        0 => {}
        1 => out.push_str(&format!(
            "(1 queue of import bookkeeping, {}*, left out: --all lists it)\n",
            export::MARKER_PREFIX
        )),
        n => out.push_str(&format!(
            "({n} queues of import bookkeeping, {}*, left out: --all lists them)\n",
            export::MARKER_PREFIX
        )),
    }
    out
}

fn stats(
    source: &Source<'_>,
    watch: bool,
    interval: Duration,
    count: Option<u64>,
    all: bool,
    json: bool,
) -> Res<()> {
    if !watch {
        let (rows, hidden) = source.stats_rows(all)?;
        if json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            print!("{}", stats_table(&rows, hidden));
        }
        return Ok(());
    }
    let terminal = std::io::stdout().is_terminal();
    // Ctrl-C (or a TERM) ends the watch and the store is closed as after any command; the
    // handlers are in place before the first draw, so a signal during a draw is not lost.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let (mut interrupt, mut terminate) = {
        let _entered = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    let mut drawn = 0u64;
    loop {
        let (rows, hidden) = source.stats_rows(all)?;
        if json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            if terminal {
                // Clear the screen and go home, so the table redraws in place.
                print!("\x1b[2J\x1b[H");
            }
            println!(
                "every {} at {} (Ctrl-C to stop)",
                human(interval),
                utc(SystemTime::now())
            );
            print!("{}", stats_table(&rows, hidden));
        }
        std::io::stdout().flush()?;
        drawn += 1;
        if count.is_some_and(|n| drawn >= n) {
            return Ok(());
        }
        // Paced for a person; a signal ends the wait at once.
        let stopped = runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => true,
                _ = terminate.recv() => true,
                () = tokio::time::sleep(interval) => false,
            }
        });
        if stopped {
            return Ok(());
        }
    }
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC` (no time zone database needed).
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (i64::try_from(secs / 86_400).unwrap_or(0), secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn browse(source: &Source<'_>, queue: &str, state: Option<StateFilter>, page: &Page) -> Res<()> {
    let Page { limit, after, json } = *page;
    let wanted = state.map(|s| match s {
        StateFilter::Ready => "ready",
        StateFilter::Delayed => "delayed",
        StateFilter::Leased => "leased",
    });
    let rows = source.items(queue, after, limit, wanted)?;
    if json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    println!(
        "{:>10}  {:<8}  {:>8}  {:>9}  {:>9}  PAYLOAD",
        "ID", "STATE", "ATTEMPTS", "AGE", "UNTIL"
    );
    for r in &rows {
        let age = r.enqueued_ms.map_or_else(
            || "-".to_owned(),
            |ms| human(age(UNIX_EPOCH + Duration::from_millis(ms))),
        );
        let until = r.until_ms.map_or_else(
            || "-".to_owned(),
            |ms| human(until(UNIX_EPOCH + Duration::from_millis(ms))),
        );
        println!(
            "{:>10}  {:<8}  {:>8}  {:>9}  {:>9}  {}",
            r.id,
            r.state,
            r.attempts,
            age,
            until,
            shown(r.text.as_deref(), &r.hex)
        );
    }
    if rows.is_empty() {
        println!("(no items)");
    }
    Ok(())
}

/// A payload on one line of a table: its text (escaped) or `0x` hex, cut at 80 characters.
fn shown(text: Option<&str>, hex: &str) -> String {
    let full = match text {
        Some(text) => text.escape_debug().to_string(),
        None => format!("0x{hex}"),
    };
    cut(full, 80)
}

fn dead_letters(source: &Source<'_>, command: &DeadCommand) -> Res<()> {
    match command {
        DeadCommand::List { queue, page } => {
            let Page { limit, after, json } = *page;
            let rows = source.dead(queue, after, limit)?;
            if json {
                println!("{}", serde_json::to_string(&rows)?);
                return Ok(());
            }
            println!(
                "{:>10}  {:>8}  {:>9}  {:<30}  PAYLOAD",
                "ID", "ATTEMPTS", "DIED", "REASON"
            );
            for r in &rows {
                let died = r.last_attempt_ms.map_or_else(
                    || "-".to_owned(),
                    |ms| human(age(UNIX_EPOCH + Duration::from_millis(ms))),
                );
                println!(
                    "{:>10}  {:>8}  {:>9}  {:<30}  {}",
                    r.id,
                    r.attempts,
                    died,
                    cut(r.reason.escape_debug().to_string(), 30),
                    shown(r.text.as_deref(), &r.hex)
                );
            }
            if rows.is_empty() {
                println!("(no dead letters)");
            }
            Ok(())
        }
        DeadCommand::Replay {
            queue,
            which,
            reset_attempts,
            yes,
        } => {
            let Some(what) = describe(source, queue, which)? else {
                println!("no dead letters in {queue:?}: nothing to replay");
                return Ok(());
            };
            confirm(*yes, &format!("Replay {what} of queue {queue:?}"))?;
            let n = source.replay(queue, which.replay(), *reset_attempts)?;
            println!(
                "replayed {} of {queue:?} to the tail of the queue",
                letters(n)
            );
            Ok(())
        }
        DeadCommand::Purge { queue, which, yes } => {
            let Some(what) = describe(source, queue, which)? else {
                println!("no dead letters in {queue:?}: nothing to purge");
                return Ok(());
            };
            confirm(*yes, &format!("Delete {what} of queue {queue:?} for good"))?;
            let n = source.purge(queue, which.replay())?;
            println!("purged {} of {queue:?}", letters(n));
            Ok(())
        }
    }
}

/// "1 dead letter", "12 dead letters".
fn letters(n: usize) -> String {
    match n {
        1 => "1 dead letter".to_owned(),
        n => format!("{n} dead letters"),
    }
}

/// "all 12 dead letters", "the oldest 5 dead letters (of 12)", "3 dead letters by id";
/// `None` when the queue has no dead letters (nothing to ask about).
fn describe(source: &Source<'_>, queue: &str, which: &Which) -> Res<Option<String>> {
    let dead = source.dead_count(queue)?;
    if dead == 0 {
        return Ok(None);
    }
    Ok(Some(match which.replay() {
        Replay::Ids(ids) => format!("{} dead letters by id (of {dead})", ids.len()),
        Replay::First(n) => format!("the oldest {} dead letters (of {dead})", dead.min(n as u64)),
        _ => format!("all {dead} dead letters"),
    }))
}

/// Asks on the terminal unless `yes`; refuses when there is no terminal to ask on.
fn confirm(yes: bool, question: &str) -> Res<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{question}? Not without confirmation: no terminal to ask on; pass --yes"
        )
        .into());
    }
    eprint!("{question}? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err("not confirmed; nothing changed".into())
    }
}

#[derive(Serialize, Debug, Default)]
struct VerifyReport {
    store: String,
    healthy: bool,
    /// Why the open refused the store, if it did.
    refused: Option<String>,
    queues: usize,
    items: u64,
    dead_letters: u64,
    set_aside: Vec<SetAside>,
    missing_records: Vec<(u64, u64)>,
    /// Queues refused until `Store::unfence`: touched by a record set aside or missing.
    fenced: Vec<String>,
    unreadable: Vec<String>,
    copied_bytes: u64,
}

#[derive(Serialize, Debug)]
struct SetAside {
    record: u64,
    queues: Option<Vec<String>>,
    reason: String,
}

fn verify(cli: &Cli, json: bool) -> Res<ExitCode> {
    let Some(dir) = &cli.store else {
        return Err(
            "verify checks a sled store (--store DIR); a PostgreSQL or Redis store's integrity \
             is the server's (use its own tools: amcheck, redis-check-aof)"
                .into(),
        );
    };
    if !dir.join("db").exists() {
        return Err(format!("no store at {}", dir.display()).into());
    }
    let copy = tempfile::tempdir()?;
    let target = copy.path().join("store");
    let copied = {
        // sled's lock is an advisory lock on its `db` file: held here, no service can open
        // the store while it is copied, and one that has it open makes this fail.
        let lock = File::open(dir.join("db"))?;
        // As patient as `Store::open`: sled's threads keep the lock for a moment after a
        // store closed.
        let give_up = Instant::now() + LOCK_PATIENCE;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(format!(
                        "the store at {} is open in another process: stop it first, or copy \
                         the directory yourself and verify the copy",
                        dir.display()
                    )
                    .into())
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
            }
        }
        let total = dir_size(dir)?;
        let bar = progress(total, "copying");
        let copied = copy_dir(dir, &target, &bar)?;
        bar.finish_and_clear();
        drop(lock);
        copied
    };
    let mut report = VerifyReport {
        store: dir.display().to_string(),
        copied_bytes: copied,
        ..VerifyReport::default()
    };
    let opened = match Store::open(&target) {
        // Records missing: note them, then open the copy as `salvage` would, to check the rest.
        Err(Error::MissingRecords {
            missing, queues, ..
        }) => {
            report.missing_records = missing.iter().map(|r| (*r.start(), *r.end())).collect();
            report.fenced = queues;
            Store::builder().path(&target).salvage(true).open()
        }
        opened => opened,
    };
    match opened {
        Err(e) => report.refused = Some(e.to_string()),
        Ok(store) => {
            report.set_aside = store
                .set_aside_records()
                .into_iter()
                .map(|r| SetAside {
                    record: r.record,
                    queues: r.queues,
                    reason: r.reason,
                })
                .collect();
            for r in store.missing_records() {
                if !report.missing_records.contains(&(*r.start(), *r.end())) {
                    report.missing_records.push((*r.start(), *r.end()));
                }
            }
            let names = store.blocking_list_queues()?;
            report.queues = names.len();
            let bar = progress(0, "reading");
            for name in names {
                read_queue(&store, &name, &mut report, &bar);
            }
            bar.finish_and_clear();
            if let Err(e) = store.blocking_close() {
                report.unreadable.push(format!("closing the copy: {e}"));
            }
        }
    }
    report.fenced.sort();
    report.fenced.dedup();
    report.healthy = report.refused.is_none()
        && report.set_aside.is_empty()
        && report.missing_records.is_empty()
        && report.fenced.is_empty()
        && report.unreadable.is_empty();
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_verify(&report);
    }
    Ok(if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(DAMAGED)
    })
}

/// Reads every item and dead letter of queue `name`, recording what cannot be read.
fn read_queue(store: &Store, name: &str, report: &mut VerifyReport, bar: &ProgressBar) {
    let q = match store.blocking_queue::<RawItem>(name) {
        Ok(q) => q,
        Err(Error::Fenced { .. }) => {
            report.fenced.push(name.to_owned());
            return;
        }
        Err(e) => {
            report.unreadable.push(format!("queue {name:?}: {e}"));
            return;
        }
    };
    let items = read_all(|after| {
        q.blocking_browse(after, 1000)
            .map(|page| page.iter().map(|i| i.id).collect())
    });
    let dead = read_all(|after| {
        q.blocking_dead_letters(after, 1000)
            .map(|page| page.iter().map(|d| d.id).collect())
    });
    for (what, (n, failed), total) in [
        ("items", items, &mut report.items),
        ("dead letters", dead, &mut report.dead_letters),
    ] {
        *total += n;
        bar.inc(n);
        if let Some(e) = failed {
            report.unreadable.push(format!("{what} of {name:?}: {e}"));
        }
    }
}

/// Pages through a listing (`page(after)` gives the ids of the next page): how many entries
/// were read, and the error that stopped it early, if one did.
fn read_all(
    mut page: impl FnMut(Option<u64>) -> reliable_queue::Result<Vec<u64>>,
) -> (u64, Option<Error>) {
    let (mut n, mut after) = (0, None);
    loop {
        match page(after) {
            Ok(ids) if ids.is_empty() => return (n, None),
            Ok(ids) => {
                n += ids.len() as u64;
                after = ids.last().copied();
            }
            Err(e) => return (n, Some(e)),
        }
    }
}

fn print_verify(r: &VerifyReport) {
    println!(
        "store {} ({} bytes checked on a copy)",
        r.store, r.copied_bytes
    );
    if let Some(why) = &r.refused {
        println!("DAMAGED: the store does not open: {why}");
        return;
    }
    println!(
        "{} queues, {} items and {} dead letters read",
        r.queues, r.items, r.dead_letters
    );
    for s in &r.set_aside {
        let queues = s.queues.as_ref().map_or_else(
            || "unknown queues".to_owned(),
            |q| {
                q.iter()
                    .map(|n| printable(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        println!(
            "DAMAGED: record {} set aside ({queues}): {}",
            s.record, s.reason
        );
    }
    for (from, to) in &r.missing_records {
        println!("DAMAGED: records {from}..={to} missing");
    }
    if !r.fenced.is_empty() {
        println!(
            "DAMAGED: queues fenced (not read; the store refuses them until unfenced): {}",
            r.fenced
                .iter()
                .map(|n| printable(n))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for u in &r.unreadable {
        println!("DAMAGED: cannot read {u}");
    }
    if r.healthy {
        println!("healthy: every record's checksum and the log's marks and invariants hold");
    }
}

fn dir_size(dir: &Path) -> Res<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += dir_size(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Copies directory `from` to `to` (files and subdirectories; nothing else is in a store).
fn copy_dir(from: &Path, to: &Path, bar: &ProgressBar) -> Res<u64> {
    // Owner-only, as the store requires of its directory.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(to)?;
    let mut copied = 0;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            copied += copy_dir(&entry.path(), &dest, bar)?;
        } else if kind.is_file() {
            let n = std::fs::copy(entry.path(), &dest)?;
            bar.inc(n);
            copied += n;
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        let at = |secs| utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(at(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }
}
