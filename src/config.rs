//! Store settings as plain data: [`Durability`], the validated [`Config`] and its limits, and
//! where a store on a server lives: (feature `postgres`) `PgConfig`, (feature `redis`)
//! `RedisConfig`. [`Config::validate`] chooses between them by the scheme of the URL given to
//! [`Builder::url`](crate::Builder::url).
//!
//! Nothing here opens anything: the [`Builder`](crate::Builder) fills a [`Config`], checks it
//! with [`Config::validate`] and hands it to an engine.

#[cfg(any(feature = "postgres", feature = "redis"))]
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "postgres")]
use tokio::runtime::Handle;

use crate::error::{Error, Result};

/// When a commit counts as done.
///
/// # Examples
///
/// ```
/// use reliable_queue::{Durability, Store};
///
/// let dir = tempfile::tempdir()?;
/// let store = Store::builder()
///     .path(dir.path().join("queues"))
///     .durability(Durability::Buffered)
///     .open()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `commit` returns once the transaction's log record is on disk (fsync). Concurrent
    /// commits share one fsync (group commit). The default.
    #[default]
    Sync,
    /// `commit` returns once the record is written to the storage engine's buffers; they are
    /// flushed to disk every [`Builder::flush_interval`](crate::Builder::flush_interval). A crash may lose the commits of the
    /// last interval, whole transactions only, never part of one.
    Buffered,
}

/// Validated settings of an open store.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) path: Option<PathBuf>,
    pub(crate) durability: Durability,
    pub(crate) max_item_size: usize,
    pub(crate) max_transaction_size: usize,
    pub(crate) group_size: usize,
    pub(crate) flush_interval: Duration,
    pub(crate) cache_capacity: u64,
    pub(crate) compaction_floor: u64,
    /// Accept an existing store directory owned by another user or open to its group or
    /// others (Unix); see [`Builder::allow_shared_directory`](crate::Builder::allow_shared_directory).
    pub(crate) allow_shared_directory: bool,
    /// Open a store whose log came back without records it held, fencing the queues they may
    /// have touched; see [`Builder::salvage`](crate::Builder::salvage).
    pub(crate) salvage: bool,
    /// The store's clock: the real one, or a test's [`ManualClock`](crate::ManualClock).
    pub(crate) clock: crate::clock::Clock,
    /// Default deadline of a transaction from `Store::begin`, in ms (none by default).
    pub(crate) transaction_timeout: Option<u64>,
    /// The PostgreSQL store to connect to, instead of a local one.
    #[cfg(feature = "postgres")]
    pub(crate) postgres: Option<PgConfig>,
    /// The Redis store to connect to, instead of a local one.
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<RedisConfig>,
    /// The URL given to [`Builder::url`](crate::Builder::url): resolved into one of the above
    /// by `validate`, by its scheme.
    pub(crate) url: Option<String>,
    /// [`Builder::namespace`](crate::Builder::namespace): the store's PostgreSQL schema or
    /// Redis key tag.
    pub(crate) namespace: Option<String>,
    /// [`Builder::require_fsync`](crate::Builder::require_fsync).
    pub(crate) require_fsync: bool,
    /// [`Builder::tls_root_certificates`](crate::Builder::tls_root_certificates).
    pub(crate) tls_roots: Option<Vec<u8>>,
    /// [`Builder::redis_create`](crate::Builder::redis_create).
    #[cfg(feature = "redis")]
    pub(crate) redis_create: bool,
    /// [`Builder::redis_runtime`](crate::Builder::redis_runtime).
    #[cfg(feature = "redis")]
    pub(crate) redis_runtime: Option<tokio::runtime::Handle>,
}

/// Default limit on one encoded item: 4 MiB.
pub(crate) const DEFAULT_MAX_ITEM_SIZE: usize = 4 << 20;
/// Default limit on the enqueued bytes of one transaction: 64 MiB.
pub(crate) const DEFAULT_MAX_TRANSACTION_SIZE: usize = 64 << 20;
/// Default soft cap on the bytes of one commit group: 8 MiB.
pub(crate) const DEFAULT_GROUP_SIZE: usize = 8 << 20;
/// Hard ceiling on any size setting: one sled value must stay well under 4 GiB.
const SIZE_CEILING: usize = 1 << 30;
/// The longest timeout, in milliseconds, a store takes: PostgreSQL's timeouts are int4
/// milliseconds.
pub(crate) const MAX_TIMEOUT_MS: u64 = i32::MAX as u64;

impl Default for Config {
    fn default() -> Self {
        Config {
            path: None,
            durability: Durability::Sync,
            max_item_size: DEFAULT_MAX_ITEM_SIZE,
            max_transaction_size: DEFAULT_MAX_TRANSACTION_SIZE,
            group_size: DEFAULT_GROUP_SIZE,
            flush_interval: Duration::from_millis(100),
            cache_capacity: 64 << 20,
            compaction_floor: 16 << 20,
            allow_shared_directory: false,
            salvage: false,
            clock: crate::clock::Clock::default(),
            transaction_timeout: None,
            #[cfg(feature = "postgres")]
            postgres: None,
            #[cfg(feature = "redis")]
            redis: None,
            url: None,
            namespace: None,
            require_fsync: false,
            tls_roots: None,
            #[cfg(feature = "redis")]
            redis_create: true,
            #[cfg(feature = "redis")]
            redis_runtime: None,
        }
    }
}

/// The engine a URL's scheme names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// `postgres://`, `postgresql://`, or a key-value string (`host=... dbname=...`).
    Postgres,
    /// `redis://`, `rediss://` (TLS), `redis+unix://` (a Unix socket).
    Redis,
}

impl Scheme {
    /// The engine `url` names, or `None` for a scheme no engine serves.
    pub(crate) fn of(url: &str) -> Option<Scheme> {
        let Some((scheme, _)) = url.split_once("://") else {
            // libpq's key-value form has no scheme.
            return url.contains('=').then_some(Scheme::Postgres);
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Some(Scheme::Postgres),
            "redis" | "rediss" | "redis+unix" | "unix" => Some(Scheme::Redis),
            _ => None,
        }
    }
}

impl Config {
    /// Do the settings name a store on a server (validated: `url` resolved)?
    pub(crate) fn is_remote(&self) -> bool {
        #[allow(unused_mut)]
        let mut remote = false;
        #[cfg(feature = "postgres")]
        {
            remote |= self.postgres.is_some();
        }
        #[cfg(feature = "redis")]
        {
            remote |= self.redis.is_some();
        }
        remote
    }

    /// Checks every setting against its documented range.
    pub(crate) fn validate(self) -> Result<Config> {
        let bad = |setting: &'static str, expected: &'static str| {
            Err(Error::InvalidConfig { setting, expected })
        };
        #[allow(unused_mut)] // mutated with the postgres feature only
        let mut c = self;
        if c.max_item_size == 0 || c.max_item_size > SIZE_CEILING {
            return bad("max_item_size", "between 1 byte and 1 GiB");
        }
        if c.max_transaction_size < c.max_item_size || c.max_transaction_size > SIZE_CEILING {
            return bad(
                "max_transaction_size",
                "at least max_item_size and at most 1 GiB",
            );
        }
        if c.group_size == 0 || c.group_size > SIZE_CEILING {
            return bad("group_size", "between 1 byte and 1 GiB");
        }
        if c.flush_interval < Duration::from_millis(1)
            || c.flush_interval > Duration::from_secs(3600)
        {
            return bad("flush_interval", "between 1 ms and 1 hour");
        }
        if c.cache_capacity < (1 << 20) {
            return bad("cache_capacity", "at least 1 MiB");
        }
        // The bound is PostgreSQL's for `idle_in_transaction_session_timeout` (an int4 of
        // milliseconds, about 24.8 days), which the deadline becomes there; the same on every
        // engine, so that a store's settings do not depend on where it runs.
        if c.transaction_timeout
            .is_some_and(|ms| ms == 0 || ms > MAX_TIMEOUT_MS)
        {
            return bad(
                "transaction_timeout",
                "between 1 ms and 2^31 - 1 ms (24.8 days)",
            );
        }
        if let Some(url) = c.url.take() {
            c.resolve_url(url)?;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = &mut c.redis {
            if let Some(ns) = &c.namespace {
                ns.clone_into(&mut redis.namespace);
            }
            redis.require_fsync = c.require_fsync;
            redis.create = c.redis_create;
            redis.runtime.clone_from(&c.redis_runtime);
            redis.tls_roots.clone_from(&c.tls_roots);
            redis.hold_timeout = c
                .transaction_timeout
                .map_or(DEFAULT_HOLD_TIMEOUT, Duration::from_millis);
            redis.validate()?;
            if c.path.is_some() {
                return bad("url", "either a path or a server's URL, not both");
            }
        }
        // PostgreSQL's settings make a PostgreSQL configuration whatever came first, so a
        // store named by a Redis URL, or by none, that was given one of them must not
        // connect to PostgreSQL with an empty URL (libpq's defaults: a local server).
        #[cfg(feature = "postgres")]
        if c.postgres.as_ref().is_some_and(|pg| pg.url.is_empty()) {
            return bad(
                "url",
                "a PostgreSQL URL (postgres:// or postgresql://) with the postgres_* settings",
            );
        }
        #[cfg(all(feature = "postgres", feature = "redis"))]
        if c.postgres.is_some() && c.redis.is_some() {
            return bad(
                "url",
                "one server's URL: either PostgreSQL's or Redis's, not both",
            );
        }
        #[cfg(feature = "postgres")]
        if let Some(pg) = &mut c.postgres {
            if let Some(ns) = &c.namespace {
                ns.clone_into(&mut pg.schema);
            }
            pg.require_fsync = c.require_fsync;
            if pg.tls_roots.is_none() {
                pg.tls_roots.clone_from(&c.tls_roots);
            }
            pg.validate()?;
            // The server-side guard of the deadline (P10): a transaction idle longer than
            // the deadline is past it, so the server ends it even when this process cannot
            // (partitioned, stopped).
            if pg.idle_transaction_timeout.is_none() {
                pg.idle_transaction_timeout =
                    c.transaction_timeout.map(std::time::Duration::from_millis);
            }
            if c.path.is_some() {
                return bad("postgres", "either a path or a PostgreSQL URL, not both");
            }
        }
        Ok(c)
    }

    /// Makes the engine settings of the URL given to [`Builder::url`](crate::Builder::url).
    fn resolve_url(&mut self, url: String) -> Result<()> {
        let unbuilt = |expected| {
            Err(Error::InvalidConfig {
                setting: "url",
                expected,
            })
        };
        match Scheme::of(&url) {
            None => unbuilt(
                "a URL whose scheme names an engine: redis://, rediss://, redis+unix://, \
                 postgres:// or postgresql:// (or a libpq key-value string)",
            ),
            #[cfg(feature = "postgres")]
            Some(Scheme::Postgres) => {
                let pg = self.postgres.get_or_insert_with(|| PgConfig::new(""));
                pg.url = url;
                Ok(())
            }
            #[cfg(not(feature = "postgres"))]
            Some(Scheme::Postgres) => {
                unbuilt("a PostgreSQL URL needs the crate's `postgres` feature, not built in")
            }
            #[cfg(feature = "redis")]
            Some(Scheme::Redis) => {
                self.redis = Some(RedisConfig::new(url));
                Ok(())
            }
            #[cfg(not(feature = "redis"))]
            Some(Scheme::Redis) => {
                unbuilt("a Redis URL needs the crate's `redis` feature, not built in")
            }
        }
    }
}

/// A server engine's runtime given by the caller (`setting`) must be multi-thread: a
/// current-thread runtime runs tasks only while its owner polls it, so a `blocking_` call from
/// another thread could wait forever.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn check_runtime(runtime: Option<&tokio::runtime::Handle>, setting: &'static str) -> Result<()> {
    match runtime {
        Some(handle) if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread => {
            Err(Error::InvalidConfig {
                setting,
                expected: "a handle of a multi-thread tokio runtime (a current-thread runtime \
                           runs tasks only while its owner polls it)",
            })
        }
        _ => Ok(()),
    }
}

/// How long the Redis engine lets a transaction hold the items it dequeued when the
/// transaction has no deadline of its own: past it the server gives them back (a client that
/// died cannot). `Builder::transaction_timeout` sets another.
#[cfg(feature = "redis")]
pub(crate) const DEFAULT_HOLD_TIMEOUT: Duration = Duration::from_secs(60);

/// The default key tag of a Redis store.
#[cfg(feature = "redis")]
pub(crate) const DEFAULT_REDIS_NAMESPACE: &str = "reliable_queue";

/// Where a Redis store lives.
#[cfg(feature = "redis")]
#[derive(Clone)]
pub(crate) struct RedisConfig {
    /// `redis://`, `rediss://` or `redis+unix://`.
    pub(crate) url: String,
    /// The store's keys are `rq:{<namespace>}:...`: one hash slot for a whole store.
    pub(crate) namespace: String,
    /// Refuse a server that does not fsync every write (else a warning is logged).
    pub(crate) require_fsync: bool,
    /// How long a transaction without a deadline may hold its items (see
    /// [`DEFAULT_HOLD_TIMEOUT`]).
    pub(crate) hold_timeout: Duration,
    /// How long a waiting consumer waits for a wake-up before it looks anyway.
    pub(crate) poll_interval: Duration,
    /// Certificates (PEM) trusted for `rediss://` instead of the system's roots.
    pub(crate) tls_roots: Option<Vec<u8>>,
    /// May connect write the layout's version key of a new store (else a namespace without
    /// one is [`Error::SchemaMissing`](crate::Error::SchemaMissing)).
    pub(crate) create: bool,
    /// The caller's multi-thread tokio runtime, to run the store's connection and tasks on
    /// instead of a runtime thread of the store's own.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

#[cfg(feature = "redis")]
impl fmt::Debug for RedisConfig {
    /// Leaves the URL out: it may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("namespace", &self.namespace)
            .field("require_fsync", &self.require_fsync)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "redis")]
impl RedisConfig {
    pub(crate) fn new(url: String) -> RedisConfig {
        RedisConfig {
            url,
            namespace: DEFAULT_REDIS_NAMESPACE.to_owned(),
            require_fsync: false,
            hold_timeout: DEFAULT_HOLD_TIMEOUT,
            poll_interval: Duration::from_secs(1),
            tls_roots: None,
            create: true,
            runtime: None,
        }
    }

    /// The namespace goes into every key: printable ASCII without braces, so that the hash
    /// tag is the whole of it.
    pub(crate) fn validate(&self) -> Result<()> {
        let ok = !self.namespace.is_empty()
            && self.namespace.len() <= 128
            && self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if !ok {
            return Err(Error::InvalidConfig {
                setting: "namespace",
                expected: "1 to 128 printable ASCII characters, no space, '{' or '}'",
            });
        }
        check_runtime(self.runtime.as_ref(), "redis_runtime")
    }
}

/// The default PostgreSQL schema (namespace) of a store.
#[cfg(feature = "postgres")]
pub(crate) const DEFAULT_SCHEMA: &str = "reliable_queue";

/// Default number of pooled connections.
#[cfg(feature = "postgres")]
pub(crate) const DEFAULT_POOL_SIZE: usize = 16;

/// How often a waiting consumer looks for an item when no notification came, by default: a
/// lost notification (the listening connection was down when it was sent) delays a consumer
/// by at most this.
#[cfg(feature = "postgres")]
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Where a PostgreSQL store lives.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub(crate) struct PgConfig {
    /// A libpq-style URL or key-value connection string.
    pub(crate) url: String,
    /// The schema (namespace) of the store's tables: lower-case letters, digits and `_`.
    pub(crate) schema: String,
    pub(crate) pool_size: usize,
    /// The server ends a transaction left idle longer than this
    /// (`idle_in_transaction_session_timeout` on every connection of the store).
    pub(crate) idle_transaction_timeout: Option<Duration>,
    /// Dead letters older than this are deleted by the maintenance pass.
    pub(crate) dead_letter_retention: Option<Duration>,
    /// PEM certificates to trust for TLS instead of the system's.
    pub(crate) tls_roots: Option<Vec<u8>>,
    /// The caller's multi-thread tokio runtime, to run the store's connections and tasks on
    /// instead of a runtime thread of the store's own.
    pub(crate) runtime: Option<Handle>,
    /// How long a waiting consumer waits for a notification before it looks anyway.
    pub(crate) poll_interval: Duration,
    /// Connect may create the schema or migrate it (else it only checks its version).
    pub(crate) migrate: bool,
    /// Refuse a server that does not fsync every commit (else a warning is logged).
    pub(crate) require_fsync: bool,
}

#[cfg(feature = "postgres")]
impl fmt::Debug for PgConfig {
    /// Leaves the URL out: it may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("own_runtime", &self.runtime.is_none())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "postgres")]
impl PgConfig {
    pub(crate) fn new(url: &str) -> PgConfig {
        PgConfig {
            url: url.to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            idle_transaction_timeout: None,
            dead_letter_retention: None,
            tls_roots: None,
            runtime: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            migrate: true,
            require_fsync: false,
        }
    }

    /// Checks the schema name: it is spliced into statements, so only a plain identifier is
    /// accepted.
    pub(crate) fn validate(&self) -> Result<()> {
        let ok = !self.schema.is_empty()
            && self.schema.len() <= 63
            && self
                .schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !self.schema.as_bytes()[0].is_ascii_digit();
        if !ok {
            return Err(Error::InvalidConfig {
                setting: "postgres_schema",
                expected:
                    "1 to 63 lower-case ASCII letters, digits or '_', not starting with a digit",
            });
        }
        if self.pool_size == 0 || self.pool_size > 1024 {
            return Err(Error::InvalidConfig {
                setting: "postgres_pool_size",
                expected: "between 1 and 1024 connections",
            });
        }
        if self
            .idle_transaction_timeout
            .is_some_and(|t| t.is_zero() || t.as_millis() > u128::from(MAX_TIMEOUT_MS))
        {
            // The server refuses every connection whose options carry a larger one.
            return Err(Error::InvalidConfig {
                setting: "postgres_idle_transaction_timeout",
                expected: "between 1 ms and 2^31 - 1 ms (24.8 days)",
            });
        }
        if self.poll_interval < Duration::from_millis(1)
            || self.poll_interval > Duration::from_secs(24 * 3600)
        {
            return Err(Error::InvalidConfig {
                setting: "postgres_poll_interval",
                expected: "between 1 ms and 24 hours",
            });
        }
        check_runtime(self.runtime.as_ref(), "postgres_runtime")
    }
}
