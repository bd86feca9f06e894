//! The conformance suite's engines (DESIGN.md, "Engines": "one conformance suite runs every
//! behaviour test on every engine; a new engine joins it with one line, and its documented
//! differences are asserted there"), and the `main` of the suite's test binary.
//!
//! The suite is one test binary, `tests/suite/main.rs` (`harness = false` in `Cargo.toml`):
//! each of its modules (one per behaviour) lists its cases, and [`main`] runs them all. Each
//! case written against an [`Engine`] becomes one trial per engine of [`ENGINES`], named
//! `<module>::<case>::<engine>` (filter with `cargo test --test suite -- waiting::` or
//! `-- ::postgres`). A case opens its stores with [`Engine::store`] (a fresh, empty store:
//! memory; sled in a temporary directory; PostgreSQL in a schema of its own on the binary's
//! server) and, where the contract lets engines differ, asserts each engine's behaviour by
//! [`Engine::name`], with a comment citing the contract. The PostgreSQL-only tests of the
//! binary ([`Case::postgres`], `<module>::<test>`) run once, against the same server or a
//! cluster of their own.
//!
//! An engine that needs a server starts it once per test binary (PostgreSQL: the harness of
//! `tests/pg/mod.rs`, or `RQ_TEST_POSTGRES_URL`). Without one, its trials are reported as
//! ignored and a banner before and after the summary says why (`RQ_TEST_REQUIRE_POSTGRES=1`
//! makes that a failure).
//!
//! **A new engine** (Redis is next) joins every case of the suite with one line in
//! [`ENGINES`]: its name, the function that starts its server for a binary, and the one that
//! gives a fresh place for a store; nothing in the tests changes. Its documented differences
//! then show up as failures of the cases that assert the embedded behaviour, each to be
//! asserted by name where the contract allows it.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Trial};
use reliable_queue::{Builder, Store};

use super::pg::{self, PgServer};

/// One engine of the suite.
#[derive(Debug)]
pub struct Engine {
    /// `memory`, `sled`, `postgres`: what a case compares where the contract lets engines
    /// differ, and the last part of each trial's name.
    pub name: &'static str,
    /// Starts what the engine needs for one test binary (its server) before the first test:
    /// a guard kept until the last has run, or why the engine cannot run here.
    start: fn() -> Result<Box<dyn Any>, String>,
    /// A fresh, empty place for a store (called after `start` succeeded).
    place: fn() -> Place,
}

/// Every engine each case of the suite runs on. **A new engine is one line here.**
pub const ENGINES: &[Engine] = &[
    Engine::new("memory", nothing_to_start, memory_place),
    Engine::new("sled", nothing_to_start, sled_place),
    #[cfg(feature = "postgres")]
    Engine::new("postgres", postgres::start, postgres::place),
    #[cfg(feature = "redis")]
    Engine::new("redis", redis::start, redis::place),
];

/// How long a dropped transaction or lease may take to give back (see
/// [`Engine::after_drop`]).
pub const DROP_LIMIT: Duration = Duration::from_secs(10);

/// How long a case may take before it counts as hung.
pub const CASE_LIMIT: Duration = Duration::from_secs(120);

/// A way to make builders for one store's data: the same data every time, except in memory.
type MakeBuilder = Box<dyn Fn() -> Builder + Send + Sync>;
/// Settings a case applies on top of an engine's builder.
type Settings = Arc<dyn Fn(Builder) -> Builder + Send + Sync>;

/// Where a store's data lives.
pub struct Place {
    builder: MakeBuilder,
    /// Whether a store opened again on this place finds what an earlier one committed.
    durable: bool,
    path: Option<PathBuf>,
    /// Removed (with the files) when the place is dropped.
    _dir: Option<tempfile::TempDir>,
}

fn nothing_to_start() -> Result<Box<dyn Any>, String> {
    Ok(Box::new(()))
}

fn memory_place() -> Place {
    Place {
        builder: Box::new(Store::builder),
        durable: false,
        path: None,
        _dir: None,
    }
}

fn sled_place() -> Place {
    let (dir, path) = super::temp_dir();
    let at = path.clone();
    Place {
        builder: Box::new(move || Store::builder().path(&at)),
        durable: true,
        path: Some(path),
        _dir: Some(dir),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::Place;

    /// The server's URL, and whether it is an existing server (`RQ_TEST_POSTGRES_URL`), where a
    /// schema of an earlier run may be left.
    static SERVER: OnceLock<(String, bool)> = OnceLock::new();

    /// The binary's PostgreSQL server ([`super::pg_server`]), which the PostgreSQL-only tests
    /// share.
    pub(super) fn start() -> Result<Box<dyn std::any::Any>, String> {
        let server = super::pg_server()?;
        let _ = SERVER.set((server.url().to_owned(), !server.started_here()));
        Ok(Box::new(server))
    }

    /// A schema of its own: `<binary>_<n>`.
    pub(super) fn place() -> Place {
        static SCHEMAS: AtomicU64 = AtomicU64::new(0);
        let (url, shared) = SERVER
            .get()
            .expect("the PostgreSQL server was started")
            .clone();
        let schema = format!(
            "{}_{}",
            env!("CARGO_CRATE_NAME"),
            SCHEMAS.fetch_add(1, Ordering::Relaxed)
        );
        if shared {
            // A server of the caller's: a schema of this name may be left by an earlier run.
            super::pg::block_on(async {
                let client = super::pg::connect(&url).await;
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await
                    .unwrap_or_else(|e| panic!("dropping the leftover schema {schema}: {e:?}"));
            });
        }
        Place {
            builder: Box::new(move || {
                reliable_queue::Store::builder()
                    .postgres(&url)
                    .postgres_schema(&schema)
            }),
            durable: true,
            path: None,
            _dir: None,
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::super::redis::{RedisServer, Reply};
    use super::Place;

    /// The binary's server, shared by every store of the suite (each in a namespace of its
    /// own).
    static SERVER: OnceLock<RedisServer> = OnceLock::new();

    /// The binary's Redis server: this harness's, or `RQ_TEST_REDIS_URL`'s. Kept in a static
    /// (the watchdog stops a server this harness started when the process ends).
    pub(super) fn start() -> Result<Box<dyn std::any::Any>, String> {
        if SERVER.get().is_none() {
            let _ = SERVER.set(RedisServer::start()?);
        }
        Ok(Box::new(()))
    }

    pub(super) fn server() -> &'static RedisServer {
        SERVER.get().expect("the Redis server was started")
    }

    /// A namespace of its own: `<binary>_<n>`; on a server of the caller's, the keys an
    /// earlier run left there are deleted first.
    pub(super) fn place() -> Place {
        static NAMESPACES: AtomicU64 = AtomicU64::new(0);
        let server = server();
        let namespace = format!(
            "{}_{}",
            env!("CARGO_CRATE_NAME"),
            NAMESPACES.fetch_add(1, Ordering::Relaxed)
        );
        if !server.started_here() {
            let pattern = format!("rq:{{{namespace}}}:*");
            if let Reply::Array(keys) = server.command(&[b"KEYS", pattern.as_bytes()]) {
                for key in keys {
                    if let Reply::Bulk(Some(key)) = key {
                        server.command(&[b"DEL", &key]);
                    }
                }
            }
        }
        let url = server.url().to_owned();
        Place {
            builder: Box::new(move || {
                reliable_queue::Store::builder()
                    .url(&url)
                    .namespace(&namespace)
            }),
            durable: true,
            path: None,
            _dir: None,
        }
    }
}

/// Why each engine that cannot run in this binary cannot (no server).
static UNAVAILABLE: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());

/// The binary's PostgreSQL server, for the `postgres` engine and the PostgreSQL-only tests
/// ([`Case::postgres`]): not asked for yet, started, or why there is none.
static PG_SERVER: Mutex<Option<Result<Arc<PgServer>, String>>> = Mutex::new(None);

/// The binary's PostgreSQL server, started at the first call ([`main`] makes it before the
/// first trial runs), or why there is none. [`PgServer::start`]: the harness's own server or
/// `RQ_TEST_POSTGRES_URL`'s; a missing one is a panic with `RQ_TEST_REQUIRE_POSTGRES=1`.
fn pg_server() -> Result<Arc<PgServer>, String> {
    PG_SERVER
        .lock()
        .unwrap()
        .get_or_insert_with(|| PgServer::start().map(Arc::new).map_err(|skip| skip.reason))
        .clone()
}

/// Stops the binary's PostgreSQL server, once no trial refers to it any more.
fn stop_pg_server() {
    let server = PG_SERVER.lock().unwrap().take();
    if let Some(Ok(server)) = server {
        match Arc::into_inner(server) {
            Some(server) => drop(server),
            None => eprintln!("==> the test PostgreSQL server is still referenced: not stopped"),
        }
    }
}

impl Engine {
    const fn new(
        name: &'static str,
        start: fn() -> Result<Box<dyn Any>, String>,
        place: fn() -> Place,
    ) -> Engine {
        Engine { name, start, place }
    }

    /// A fresh, empty store of this engine.
    pub fn store(&'static self) -> EngineStore {
        self.store_with(|b| b)
    }

    /// A fresh, empty store of this engine with `settings` applied to its builder (they apply
    /// to [`EngineStore::reopen`] too).
    pub fn store_with(
        &'static self,
        settings: impl Fn(Builder) -> Builder + Send + Sync + 'static,
    ) -> EngineStore {
        let place = (self.place)();
        let settings: Settings = Arc::new(settings);
        let store = settings((place.builder)())
            .open()
            .unwrap_or_else(|e| panic!("{}: open a fresh store: {e}", self.name));
        EngineStore {
            engine: self,
            store,
            settings,
            place,
        }
    }

    /// A builder for a fresh, empty place of this engine, for a case that checks what `open`
    /// says about its settings. The place (a directory, a schema) lives as long as the guard.
    pub fn fresh_builder(&'static self) -> (Builder, Place) {
        let place = (self.place)();
        ((place.builder)(), place)
    }

    /// Checks `done` after a transaction or a lease was dropped: at once on the embedded
    /// engines; on PostgreSQL a drop gives back from a task, "visible again a round trip
    /// later, not at once" (ARCHITECTURE.md, "Where this engine differs"), so there it is
    /// waited for, bounded by [`DROP_LIMIT`].
    pub fn after_drop(&self, what: &str, mut done: impl FnMut() -> bool) {
        match self.name {
            "postgres" | "redis" => wait_until(what, DROP_LIMIT, done),
            _ => assert!(done(), "{}: {what}, at once", self.name),
        }
    }

    /// Whether the engine keeps its queues on a server (PostgreSQL, Redis): a drop gives
    /// back from a task, a waiting consumer is woken by a notification and looks with a
    /// round trip, `queue_names` lists only the queues opened through the handle (DESIGN.md,
    /// "Engines"; ARCHITECTURE.md, "Where the server engines differ").
    pub fn on_server(&self) -> bool {
        matches!(self.name, "postgres" | "redis")
    }

    /// Whether this is the engine named `name`.
    pub fn is(&self, name: &str) -> bool {
        self.name == name
    }
}

/// A store of one engine, with the place its data lives (kept as long as this value).
pub struct EngineStore {
    pub engine: &'static Engine,
    pub store: Store,
    settings: Settings,
    place: Place,
}

impl std::ops::Deref for EngineStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl EngineStore {
    /// The engine's name.
    pub fn name(&self) -> &'static str {
        self.engine.name
    }

    /// Whether the data outlives the store (sled, PostgreSQL; not in memory, S9): whether
    /// [`reopen`](Self::reopen) finds what this store committed.
    pub fn durable(&self) -> bool {
        self.place.durable
    }

    /// The directory of an on-disk store.
    pub fn path(&self) -> Option<&Path> {
        self.place.path.as_deref()
    }

    /// Another store on the same data, as the next process finds it: `None` in memory, where
    /// nothing outlives the store. On sled the store must be closed (or every handle
    /// dropped) first; on PostgreSQL the first may stay open (it is another connection to the
    /// same schema).
    pub fn reopen(&self) -> Option<Store> {
        let settings = self.settings.clone();
        self.reopen_with(move |b| settings(b))
    }

    /// [`reopen`](Self::reopen) with other settings than the first open's.
    pub fn reopen_with(&self, settings: impl Fn(Builder) -> Builder) -> Option<Store> {
        self.place.durable.then(|| {
            settings((self.place.builder)())
                .open()
                .unwrap_or_else(|e| panic!("{}: reopen the store: {e}", self.engine.name))
        })
    }

    /// A builder for this store's data with its settings, for a case that checks what a
    /// second open says (`None` in memory).
    pub fn builder(&self) -> Option<Builder> {
        self.place
            .durable
            .then(|| (self.settings)((self.place.builder)()))
    }
}

/// Waits, without sleeping, until `done` holds; panics after `limit` naming `what`.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::yield_now();
    }
}

/// A case's body.
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

enum Body {
    /// Runs once per engine, on a thread of its own.
    Blocking(fn(&'static Engine)),
    /// Runs once per engine, on a two-worker tokio runtime.
    Async(fn(&'static Engine) -> BoxFuture),
    /// Runs once: a test of one engine's insides that lives in a module of the suite.
    Once(fn()),
    /// Runs once, against the binary's PostgreSQL server or a cluster of its own: a
    /// PostgreSQL-only test (`tests/pg/mod.rs`).
    Postgres(pg::Needs, pg::TestFn),
    /// Runs once, on a Redis server started for it alone, which it may kill and restart
    /// (`tests/redis/mod.rs`); reported ignored where there is no `redis-server`.
    #[cfg(feature = "redis")]
    Redis(fn(&super::redis::RedisServer)),
    /// Runs once, on a primary and a synchronous standby started for it alone
    /// (`tests/pg/pair.rs`), which it may kill, promote and rebuild.
    PgPair(fn(&mut pg::pair::Pair)),
}

/// One test of a module of the suite.
pub struct Case {
    name: &'static str,
    body: Body,
    /// Engines on which the case is ignored, with the defect that makes it fail there.
    ignored: Vec<(&'static str, &'static str)>,
}

/// What a trial needs started before the first trial runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// Nothing (a case run once).
    Nothing,
    /// The engine of this name (its server, if it has one).
    Engine(&'static str),
    /// The binary's PostgreSQL server ([`pg::Needs::SharedServer`]).
    PgServer,
    /// A PostgreSQL cluster of the test's own, which the trial starts
    /// ([`pg::Needs::OwnCluster`]).
    PgCluster,
    /// A primary and standby of the test's own ([`Case::postgres_pair`]): run after every
    /// other trial, one at a time, so that its servers' starts, promotions and rebuilds
    /// under load do not share the cores with the rest of the suite.
    PgPair,
}

impl Case {
    /// A case run on every engine (see [`engine_case!`](crate::engine_case)).
    pub fn blocking(name: &'static str, body: fn(&'static Engine)) -> Case {
        Case {
            name,
            body: Body::Blocking(body),
            ignored: Vec::new(),
        }
    }

    /// An async case run on every engine (see [`engine_case!`](crate::engine_case)).
    pub fn future(name: &'static str, body: fn(&'static Engine) -> BoxFuture) -> Case {
        Case {
            name,
            body: Body::Async(body),
            ignored: Vec::new(),
        }
    }

    /// A test run once, not per engine.
    pub fn once(name: &'static str, body: fn()) -> Case {
        Case {
            name,
            body: Body::Once(body),
            ignored: Vec::new(),
        }
    }

    /// A PostgreSQL-only test, run once: against the server the binary's other trials share
    /// ([`pg::Needs::SharedServer`]), or on a cluster started for it alone, which it may kill
    /// and restart ([`pg::Needs::OwnCluster`]; reported ignored with `RQ_TEST_POSTGRES_URL`
    /// set). Not bounded by [`CASE_LIMIT`], as under [`pg::run_suite`].
    pub fn postgres(name: &'static str, needs: pg::Needs, test: pg::TestFn) -> Case {
        Case {
            name,
            body: Body::Postgres(needs, test),
            ignored: Vec::new(),
        }
    }

    /// A Redis-only test, on a server of its own ([`Body::Redis`]), bounded by
    /// [`CASE_LIMIT`].
    #[cfg(feature = "redis")]
    pub fn redis(name: &'static str, test: fn(&super::redis::RedisServer)) -> Case {
        Case {
            name,
            body: Body::Redis(test),
            ignored: Vec::new(),
        }
    }

    /// A PostgreSQL-only test run once on a primary and a synchronous standby of its own
    /// (`tests/pg/pair.rs`), started for it alone and stopped after it; reported ignored,
    /// with the reason, where they cannot be started, and with `RQ_TEST_POSTGRES_URL` set (as
    /// [`pg::Needs::OwnCluster`]). Not bounded by [`CASE_LIMIT`].
    pub fn postgres_pair(name: &'static str, test: fn(&mut pg::pair::Pair)) -> Case {
        Case {
            name,
            body: Body::PgPair(test),
            ignored: Vec::new(),
        }
    }

    /// Ignores the case on `engine` because of a defect of the library, described in `why`
    /// (`--include-ignored` runs it). Never for a documented difference: assert that instead.
    pub fn ignore_on(mut self, engine: &'static str, why: &'static str) -> Case {
        self.ignored.push((engine, why));
        self
    }

    /// The case's trials, named `<module>::<case>` and, per engine, `<module>::<case>::<engine>`.
    fn trials(self, module: &str) -> Vec<(Setup, Trial)> {
        let Case {
            name,
            body,
            ignored,
        } = self;
        let name = format!("{module}::{name}");
        let per_engine = |run: Box<dyn Fn(&'static Engine) + Send + Sync>| {
            let run = Arc::new(run);
            ENGINES
                .iter()
                .map(|engine| {
                    let run = run.clone();
                    let ignore = ignored.iter().any(|(e, _)| *e == engine.name);
                    let trial =
                        Trial::ignorable_test(format!("{name}::{}", engine.name), move || {
                            if let Some(why) = UNAVAILABLE.lock().unwrap().get(engine.name) {
                                return Ok(Completion::ignored_with(why));
                            }
                            run(engine);
                            Ok(Completion::Completed)
                        })
                        .with_ignored_flag(ignore);
                    (Setup::Engine(engine.name), trial)
                })
                .collect::<Vec<_>>()
        };
        match body {
            Body::Blocking(body) => {
                let name = name.clone();
                per_engine(Box::new(move |engine| {
                    bounded(&name, engine.name, move || body(engine));
                }))
            }
            Body::Async(body) => {
                let name = name.clone();
                per_engine(Box::new(move |engine| {
                    bounded(&name, engine.name, move || {
                        tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(2)
                            .enable_all()
                            .build()
                            .expect("a runtime")
                            .block_on(body(engine));
                    });
                }))
            }
            Body::Once(body) => vec![(
                Setup::Nothing,
                Trial::test(name.clone(), move || {
                    bounded(&name, "", body);
                    Ok(())
                }),
            )],
            Body::Postgres(pg::Needs::SharedServer, test) => vec![(
                Setup::PgServer,
                Trial::ignorable_test(name, move || match pg_server() {
                    Ok(server) => {
                        test(&server);
                        Ok(Completion::Completed)
                    }
                    Err(why) => Ok(Completion::ignored_with(why)),
                }),
            )],
            Body::Postgres(pg::Needs::OwnCluster, test) => vec![(
                Setup::PgCluster,
                Trial::ignorable_test(name, move || {
                    if pg::external_url().is_some() {
                        return Ok(Completion::ignored_with(pg::OWN_CLUSTER_SKIP));
                    }
                    match PgServer::start_cluster() {
                        Ok(own) => {
                            test(&own);
                            Ok(Completion::Completed)
                        }
                        Err(skip) => Ok(Completion::ignored_with(skip.reason)),
                    }
                }),
            )],
            #[cfg(feature = "redis")]
            Body::Redis(test) => vec![(
                Setup::Nothing,
                Trial::ignorable_test(name.clone(), move || {
                    match super::redis::RedisServer::start_own() {
                        Ok(server) => {
                            bounded(&name, "", move || test(&server));
                            Ok(Completion::Completed)
                        }
                        Err(why) => Ok(Completion::ignored_with(why)),
                    }
                }),
            )],
            Body::PgPair(test) => vec![(
                Setup::PgPair,
                Trial::ignorable_test(name.clone(), move || {
                    if pg::external_url().is_some() {
                        return Ok(Completion::ignored_with(pg::OWN_CLUSTER_SKIP));
                    }
                    match pg::pair::Pair::start() {
                        Ok(mut pair) => {
                            test(&mut pair);
                            Ok(Completion::Completed)
                        }
                        Err(skip) => {
                            eprintln!("\n==> {name} SKIPPED: {}\n", skip.reason);
                            Ok(Completion::ignored_with(skip.reason))
                        }
                    }
                }),
            )],
        }
    }
}

/// The cases of a module of PostgreSQL-only tests, listed as for [`pg::run_suite`]: each
/// run once against the binary's server ([`Case::postgres`]).
pub fn postgres_suite(tests: Vec<(&'static str, pg::TestFn)>) -> Vec<Case> {
    tests
        .into_iter()
        .map(|(name, test)| Case::postgres(name, pg::Needs::SharedServer, test))
        .collect()
}

/// [`postgres_suite`] with tests that may need a cluster of their own
/// ([`pg::Needs::OwnCluster`]).
pub fn postgres_suite_with(tests: Vec<(&'static str, pg::Needs, pg::TestFn)>) -> Vec<Case> {
    tests
        .into_iter()
        .map(|(name, needs, test)| Case::postgres(name, needs, test))
        .collect()
}

/// Runs `case` on a thread of its own and fails the trial if it has not returned within
/// [`CASE_LIMIT`] (a hang, a blocking call that never returns, fails clearly rather than
/// holding up the binary; the thread is left behind until the process exits). A panic of the
/// case is the trial's.
fn bounded(name: &str, engine: &str, case: impl FnOnce() + Send + 'static) {
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{name}::{engine}"))
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case));
            let _ = done.send(result);
        })
        .expect("a thread for the case");
    match outcome.recv_timeout(CASE_LIMIT) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{name} on {engine}: still running after {CASE_LIMIT:?}: hung"),
    }
}

/// A [`Case`] from a function `fn(&'static Engine)`, or `async fn(&'static Engine)` written
/// `async name`, named after the function.
#[macro_export]
macro_rules! engine_case {
    (async $body:ident) => {
        $crate::common::engines::Case::future(stringify!($body), |engine| {
            ::std::boxed::Box::pin($body(engine))
        })
    };
    ($body:ident) => {
        $crate::common::engines::Case::blocking(stringify!($body), $body)
    };
}

/// A [`Case`] run once, from a function `fn()`, named after it.
#[macro_export]
macro_rules! once_case {
    ($body:ident) => {
        $crate::common::engines::Case::once(stringify!($body), $body)
    };
}

/// The `main` of the suite's binary: `modules` are its modules' names with their cases.
/// Starts each engine's server and the PostgreSQL server the PostgreSQL-only tests share
/// (one server for both, unless the run only lists the tests or runs none of theirs), runs
/// every trial, says which engines were skipped and which trials are ignored for a defect,
/// and stops the servers.
pub fn main(modules: Vec<(&'static str, Vec<Case>)>) -> ExitCode {
    let args = Arguments::from_args();
    let defects: Vec<String> = modules
        .iter()
        .flat_map(|(module, cases)| {
            cases.iter().flat_map(move |case| {
                case.ignored
                    .iter()
                    .map(move |(engine, why)| format!("{module}::{}::{engine}: {why}", case.name))
            })
        })
        .collect();
    let trials: Vec<(Setup, Trial)> = modules
        .into_iter()
        .flat_map(|(module, cases)| cases.into_iter().flat_map(move |case| case.trials(module)))
        .collect();
    // Whether a trial that needs `setup` is going to run (not for a child process that runs
    // one test by name, nor for `--list`).
    let runs = |setup: Setup| {
        !args.list
            && trials
                .iter()
                .any(|(n, t)| *n == setup && !args.is_filtered_out(t) && !args.is_ignored(t))
    };
    let mut guards = Vec::new();
    for engine in ENGINES {
        if runs(Setup::Engine(engine.name)) {
            match (engine.start)() {
                Ok(guard) => guards.push(guard),
                Err(why) => {
                    eprintln!("\n==> {} SKIPPED in these tests: {why}\n", engine.name);
                    UNAVAILABLE.lock().unwrap().insert(engine.name, why);
                }
            }
        }
    }
    // The server of the PostgreSQL-only tests: the `postgres` engine's, if it started one.
    let pg_skipped = if runs(Setup::PgServer) {
        pg_server().err()
    } else {
        None
    };
    if let Some(why) = &pg_skipped {
        eprintln!("\n==> PostgreSQL tests SKIPPED: {why}\n");
    }
    let own_skipped =
        (runs(Setup::PgCluster) || runs(Setup::PgPair)) && pg::external_url().is_some();
    let own_banner = || {
        eprintln!(
            "==> PostgreSQL tests that kill and restart their server SKIPPED \
             (reported ignored): each {}\n",
            pg::OWN_CLUSTER_SKIP
        )
    };
    if own_skipped {
        eprintln!();
        own_banner();
    }
    let (pairs, trials): (Vec<_>, Vec<_>) = trials
        .into_iter()
        .partition(|(setup, _)| *setup == Setup::PgPair);
    let mut conclusion = libtest_mimic::run(&args, trials.into_iter().map(|(_, t)| t).collect());
    if !pairs.is_empty() {
        let alone = Arguments {
            test_threads: Some(1),
            ..args.clone()
        };
        let after = libtest_mimic::run(&alone, pairs.into_iter().map(|(_, t)| t).collect());
        conclusion.num_passed += after.num_passed;
        conclusion.num_failed += after.num_failed;
        conclusion.num_ignored += after.num_ignored;
        conclusion.num_filtered_out += after.num_filtered_out;
        conclusion.num_measured += after.num_measured;
    }
    if !args.list {
        #[cfg(not(feature = "postgres"))]
        eprintln!(
            "==> postgres not in these tests: built without the `postgres` feature \
             (run `cargo test --features postgres`)"
        );
        for (engine, why) in UNAVAILABLE.lock().unwrap().iter() {
            eprintln!("==> {engine} SKIPPED in these tests: {why}");
        }
        if let Some(why) = &pg_skipped {
            eprintln!("==> PostgreSQL tests SKIPPED: {why}");
        }
        if own_skipped {
            own_banner();
        }
        for defect in &defects {
            eprintln!("==> ignored for a defect: {defect}");
        }
    }
    drop(guards);
    stop_pg_server();
    conclusion.exit_code()
}
