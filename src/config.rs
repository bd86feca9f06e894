//! Store settings as plain data: [`Durability`], the validated [`Config`] and its limits, and
//! (feature `postgres`) `PgConfig`, where a PostgreSQL store lives.
//!
//! Nothing here opens anything: the [`Builder`](crate::Builder) fills a [`Config`], checks it
//! with [`Config::validate`] and hands it to an engine.

#[cfg(feature = "postgres")]
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
        }
    }
}

impl Config {
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
        #[cfg(feature = "postgres")]
        if let Some(pg) = &mut c.postgres {
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
        if let Some(handle) = &self.runtime {
            if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
                return Err(Error::InvalidConfig {
                    setting: "postgres_runtime",
                    expected: "a handle of a multi-thread tokio runtime (a current-thread \
                               runtime runs tasks only while its owner polls it)",
                });
            }
        }
        Ok(())
    }
}
