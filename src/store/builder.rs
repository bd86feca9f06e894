//! [`Builder`]: the settings of a store, checked, then opened.

use std::path::Path;
use std::time::Duration;

use crate::config::{Config, Durability};

/// Configures and opens a [`Store`](crate::Store).
///
/// Without [`path`](Builder::path) the store lives in memory only.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use reliable_queue::{Durability, Store};
///
/// let dir = tempfile::tempdir()?;
/// let store = Store::builder()
///     .path(dir.path().join("store"))
///     .durability(Durability::Buffered)
///     .flush_interval(Duration::from_millis(50))
///     .max_item_size(64 * 1024)
///     .open()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct Builder {
    /// Read by `open` and `connect`, which are in `store.rs` (they make the `Store`).
    pub(super) config: Config,
}

impl Builder {
    /// Starts from the defaults: in memory, [`Durability::Sync`], 4 MiB items, 64 MiB
    /// transactions.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Builder::new().open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the store on disk in directory `path`, created (owner-only permissions) if missing.
    /// An existing directory must be owned by this process's user and closed to everyone else
    /// (Unix), unless [`allow_shared_directory`](Builder::allow_shared_directory) says otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::builder().path(dir.path().join("store")).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path(mut self, path: impl AsRef<Path>) -> Self {
        self.config.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// When a commit counts as done; [`Durability::Sync`] by default. Ignored in memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use reliable_queue::{Durability, Store};
    /// let dir = tempfile::tempdir()?;
    /// let store = Store::builder().path(dir.path().join("store")).durability(Durability::Sync).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// Largest encoded item accepted by `enqueue`, in bytes (default 4 MiB). Larger items get
    /// [`Error::ItemTooLarge`](crate::Error::ItemTooLarge).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().max_item_size(1024).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn max_item_size(mut self, bytes: usize) -> Self {
        self.config.max_item_size = bytes;
        self
    }

    /// Largest total one transaction may enqueue (default 64 MiB): each item counts as its
    /// encoded size plus a fixed 56 bytes (on 64-bit targets) for its bookkeeping, so many
    /// tiny items cannot grow a transaction without bound. Must be at least the item limit; a
    /// transaction's first item is never refused by this limit. Going over gives
    /// [`Error::TransactionTooLarge`](crate::Error::TransactionTooLarge).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().max_transaction_size(16 << 20).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn max_transaction_size(mut self, bytes: usize) -> Self {
        self.config.max_transaction_size = bytes;
        self
    }

    /// Soft cap on the bytes written as one commit group (default 8 MiB). The committer stops
    /// adding waiting commits to a group once it reaches this size; a single transaction larger
    /// than the cap gets a group of its own.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().group_size(1 << 20).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn group_size(mut self, bytes: usize) -> Self {
        self.config.group_size = bytes;
        self
    }

    /// How often buffered commits are flushed to disk under [`Durability::Buffered`]
    /// (default 100 ms): the most a crash can lose.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let store = reliable_queue::Store::builder().flush_interval(Duration::from_millis(20)).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.config.flush_interval = interval;
        self
    }

    /// Memory the storage engine may use for its page cache, in bytes (default 64 MiB). The
    /// log is read only when the store opens and when compaction moves items, so a larger cache
    /// mostly holds records read once at open.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().cache_capacity(32 << 20).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.config.cache_capacity = bytes;
        self
    }

    /// Log size below which compaction leaves live items where they are (default 16 MiB).
    /// Above it, compaction keeps the log within about twice the live backlog.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder().compaction_floor(1 << 20).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn compaction_floor(mut self, bytes: u64) -> Self {
        self.config.compaction_floor = bytes;
        self
    }

    /// Accepts an existing store directory that another user owns, or whose permissions let
    /// its group or others in (default `false`: such a directory is refused with
    /// [`Error::UnsafeDirectory`](crate::Error::UnsafeDirectory)). With `true` the directory's
    /// owner and permissions are left as they are, and so are those of sled's `blobs/`
    /// directory in it. Symbolic links are refused either way.
    ///
    /// A directory the store creates is owner-only (0700) whatever this says. Unix only: on
    /// other platforms owner and permissions are not checked.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("shared");
    /// std::fs::create_dir(&path)?;
    /// #[cfg(unix)]
    /// {
    ///     use std::os::unix::fs::PermissionsExt;
    ///     // Group members may read the store (e.g. a backup job).
    ///     std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750))?;
    ///     assert!(matches!(
    ///         reliable_queue::Store::open(&path),
    ///         Err(reliable_queue::Error::UnsafeDirectory { .. })
    ///     ));
    /// }
    /// let store = reliable_queue::Store::builder()
    ///     .path(&path)
    ///     .allow_shared_directory(true)
    ///     .open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_shared_directory(mut self, allow: bool) -> Self {
        self.config.allow_shared_directory = allow;
        self
    }

    /// Gives every transaction from [`Store::begin`](crate::Store::begin) a deadline
    /// `timeout` after it begins (none by default; from 1 ms to 2^31 - 1 ms, about 24.8 days,
    /// on every engine, else [`Error::InvalidConfig`](crate::Error::InvalidConfig) at open): past it the items it holds
    /// go back to their queues at once, and its later calls and its commit fail with
    /// [`Error::TransactionExpired`](crate::Error::TransactionExpired). A transaction can set
    /// its own with [`Transaction::set_timeout`](crate::Transaction::set_timeout). Each such
    /// transaction keeps a copy of the items it holds (for the timer to put back): a cost
    /// only transactions with a deadline pay.
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::builder()
    ///     .transaction_timeout(std::time::Duration::from_secs(30))
    ///     .open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn transaction_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.config.transaction_timeout = Some(crate::clock::millis(timeout));
        self
    }

    /// Runs the store on `clock` instead of the real clock: lease deadlines, backoffs and
    /// delayed items then move only when the test advances it (see [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = reliable_queue::ManualClock::new(std::time::SystemTime::now())?;
    /// let store = reliable_queue::Store::builder().clock(clock).open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn clock(mut self, clock: crate::ManualClock) -> Self {
        self.config.clock = crate::clock::Clock::Manual(clock);
        self
    }

    /// Opens a store whose log came back without records it is known to have held
    /// ([`Error::MissingRecords`](crate::Error::MissingRecords)) instead of refusing it.
    ///
    /// Such a store lost records it had made durable: a file was deleted or truncated, an
    /// older backup was copied over part of it, or damage made the storage engine drop the
    /// end of its log. With this option the store opens what is left, fences every queue the
    /// missing records may have touched (as [`Store::set_aside_records`](crate::Store::set_aside_records)
    /// fences the queues of a damaged record: [`Error::Fenced`](crate::Error::Fenced) until
    /// [`Store::unfence`](crate::Store::unfence)), records the missing ranges
    /// ([`Store::missing_records`](crate::Store::missing_records)) and takes what is left as
    /// the new starting point: the next open opens it plainly, with those queues still fenced.
    ///
    /// Off by default: without it such a store is refused and the store writes nothing to it
    /// (sled's own recovery, which runs first, may already have cut its log at the damage:
    /// to restore from a backup, replace the whole directory). A healthy store opens the same
    /// either way.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = reliable_queue::Store::builder()
    ///     .path(dir.path().join("store"))
    ///     .salvage(true)
    ///     .open()?;
    /// assert!(store.missing_records().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn salvage(mut self, salvage: bool) -> Self {
        self.config.salvage = salvage;
        self
    }

    /// Keeps the store on the server `url` names instead of in this process; the URL's scheme
    /// chooses the engine:
    ///
    /// - `redis://host:port/db`, `rediss://` (TLS) or `redis+unix:///path/to/socket`: the
    ///   Redis engine (feature `redis`);
    /// - `postgres://` or `postgresql://` (or a libpq key-value string such as
    ///   `host=/run/postgresql dbname=app`): the PostgreSQL engine (feature `postgres`), as
    ///   [`postgres`](Builder::postgres).
    ///
    /// Every process that connects to the same server and [`namespace`](Builder::namespace)
    /// shares the same queues. Open it with [`connect`](Builder::connect) (or
    /// [`open`](Builder::open), which blocks). Any other scheme, or an engine this build
    /// leaves out, is [`Error::InvalidConfig`](crate::Error::InvalidConfig) (`url`) there.
    ///
    /// # Examples
    ///
    /// ```
    /// let refused = reliable_queue::Store::builder().url("ftp://host/queues").open();
    /// assert!(matches!(
    ///     refused,
    ///     Err(reliable_queue::Error::InvalidConfig { setting: "url", .. })
    /// ));
    /// ```
    pub fn url(mut self, url: &str) -> Self {
        self.config.url = Some(url.to_owned());
        self
    }

    /// The store's name on its server, so that one server keeps several stores: the
    /// PostgreSQL schema of its tables (as [`postgres_schema`](Builder::postgres_schema)),
    /// or the hash tag of its Redis keys (`rq:{<namespace>}:...`, one slot of a Redis Cluster:
    /// printable ASCII without space or braces, at most 128 bytes). `reliable_queue` by
    /// default. Ignored by the embedded engines.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::builder()
    ///     .url("redis://cache.internal:6379/0")
    ///     .namespace("billing")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.config.namespace = Some(namespace.to_owned());
        self
    }

    /// Refuses to connect to a server that does not write every commit to disk before it
    /// answers: Redis without `appendonly yes` and `appendfsync always`; PostgreSQL with
    /// `fsync` or `synchronous_commit` off. Such a server loses acknowledged commits when it
    /// crashes. Off by default: the store connects and logs a warning. Ignored by the embedded
    /// engines, whose [`durability`](Builder::durability) says when a commit is on disk.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::builder()
    ///     .url("redis://localhost:6379")
    ///     .require_fsync(true)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn require_fsync(mut self, require: bool) -> Self {
        self.config.require_fsync = require;
        self
    }

    /// Trusts these certificates (PEM, one or more) for TLS connections to the store's
    /// server instead of the system's root certificates: typically the certificate authority
    /// that signed the server's certificate. The server's certificate is always verified,
    /// chain and name. TLS is what the URL asks for: `rediss://` on Redis; on PostgreSQL
    /// `sslmode=require`, as with [`postgres_tls_root_certificates`], which wins where both
    /// are given. Ignored by the embedded engines.
    ///
    /// [`postgres_tls_root_certificates`]: Builder::postgres_tls_root_certificates
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/ssl/redis-ca.pem")?;
    /// let store = reliable_queue::Store::builder()
    ///     .url("rediss://cache.internal:6380/0")
    ///     .tls_root_certificates(ca)
    ///     .open()?;
    /// # Ok(()) }
    /// ```
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.config.tls_roots = Some(pem.into());
        self
    }

    /// Keeps the store in the PostgreSQL database at `url` (a libpq URL such as
    /// `postgresql://user@host/db`, or a key-value string such as `host=/run/postgresql
    /// dbname=app`) instead of in this process: every process that connects to the same
    /// database and schema shares the same queues. Open it with [`connect`](Builder::connect)
    /// (or [`open`](Builder::open), which blocks). Feature `postgres`.
    ///
    /// The store's tables are created on first use in the schema
    /// [`postgres_schema`](Builder::postgres_schema) names (`reliable_queue` by default), and
    /// their version is checked at every connect.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::builder()
    ///     .postgres("postgresql://app@db.internal/app")
    ///     .postgres_schema("jobs")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: &str) -> Self {
        // The other PostgreSQL settings may have come first.
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(url));
        url.clone_into(&mut pg.url);
        self
    }

    /// The PostgreSQL schema (namespace) of the store's tables: 1 to 63 lower-case ASCII
    /// letters, digits or `_`, not starting with a digit (`reliable_queue` by default). Two
    /// stores in one database are two schemas. Takes effect with [`postgres`](Builder::postgres)
    /// (in either order).
    #[cfg(feature = "postgres")]
    pub fn postgres_schema(mut self, schema: &str) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.schema = schema.to_owned();
        self
    }

    /// Runs the store's PostgreSQL connections and background tasks on this tokio runtime
    /// (the service's own, multi-thread) instead of on a runtime thread of the store's own.
    /// Each database call of an async method is then a task on the caller's runtime, and
    /// each statement's reply wakes it without a hop between threads: measured at 16
    /// concurrent clients on 2 CPUs, 12-25 % more one-item moves per second (BENCHMARKS.md,
    /// "The PostgreSQL engine"). The `blocking_` methods work as before, from threads outside
    /// the runtime. Without it (the default) the async methods work under any executor.
    ///
    /// The runtime must outlive the store: once it shuts down, every call fails with
    /// [`Error::Postgres`](crate::Error::Postgres). [`Store::close`](crate::Store::close) ends
    /// the store's own tasks on it (the listener, the maintenance pass).
    ///
    /// # Errors
    ///
    /// At [`connect`](Builder::connect) or [`open`](Builder::open):
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (`postgres_runtime`) for a
    /// current-thread runtime, which runs tasks only while its owner polls it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::builder()
    ///     .postgres("postgresql://app@db.internal/app")
    ///     .postgres_runtime(tokio::runtime::Handle::current())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.runtime = Some(runtime);
        self
    }

    /// Connections the store keeps open to PostgreSQL at most (16 by default): each open
    /// transaction that has dequeued holds one until it commits or aborts.
    #[cfg(feature = "postgres")]
    pub fn postgres_pool_size(mut self, connections: usize) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.pool_size = connections;
        self
    }

    /// Has the server end a transaction of this store that stays idle (no statement) longer
    /// than `timeout` (`idle_in_transaction_session_timeout` on each of its connections), so
    /// that a worker that hangs, or is cut off from the database with its connection half
    /// open, cannot hold items for longer: the server rolls back and the items are visible
    /// again; the transaction's later calls and its commit fail with
    /// [`Error::Postgres`](crate::Error::Postgres) (or
    /// [`Error::TransactionAborted`](crate::Error::TransactionAborted)). Off by default: a
    /// transaction may legitimately stay open while its items are processed; set it above the
    /// longest such processing. The store's connections also use TCP keepalives (30 s idle),
    /// so a vanished peer is noticed within minutes. Whole milliseconds, from 1 ms to 2^31 - 1
    /// ms (about 24.8 days, the server's limit): a longer one is
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) at connect.
    #[cfg(feature = "postgres")]
    pub fn postgres_idle_transaction_timeout(mut self, timeout: std::time::Duration) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.idle_transaction_timeout = Some(timeout);
        self
    }

    /// How long a consumer waiting on PostgreSQL (`dequeue`, `lease`, a queue set) waits for a
    /// notification before it looks for an item anyway (1 s by default, from 1 ms to 24
    /// hours). Commits wake waiting consumers at once, in this store and in others, through
    /// the server's notifications; this poll only bounds the delay when one was lost (the
    /// store's listening connection was down when it was sent). Shorter costs one statement
    /// per waiting queue and interval; longer delays such consumers after a lost
    /// notification.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let store = reliable_queue::Store::builder()
    ///     .postgres("postgresql://app@db.internal/app")
    ///     .postgres_poll_interval(std::time::Duration::from_secs(5))
    ///     .open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_poll_interval(mut self, interval: std::time::Duration) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.poll_interval = interval;
        self
    }

    /// Whether [`connect`](Builder::connect) may start a new store in the Redis namespace
    /// (write its key layout's version; `true` by default). With `false` connect writes
    /// nothing: for a tool that only looks (`rq stats`), where a mistyped namespace must be
    /// an error, not a new empty store. An existing store is connected either way.
    ///
    /// # Errors
    ///
    /// With `false`, at connect: [`Error::SchemaMissing`](crate::Error::SchemaMissing) when
    /// the namespace holds no store.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let store = reliable_queue::Store::builder()
    ///     .url("redis://cache.internal:6379")
    ///     .namespace("jobs")
    ///     .redis_create(false)
    ///     .open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis_create(mut self, create: bool) -> Self {
        self.config.redis_create = create;
        self
    }

    /// Runs the store's Redis connection and background tasks on this tokio runtime (the
    /// service's own, multi-thread) instead of on a runtime thread of the store's own, as
    /// [`postgres_runtime`](Builder::postgres_runtime) does on PostgreSQL: each call of an
    /// async method is then a task on the caller's runtime, without a hop between threads.
    /// The `blocking_` methods work as before, from threads outside the runtime. Without it
    /// (the default) the async methods work under any executor.
    ///
    /// The runtime must outlive the store: once it shuts down, every call fails with
    /// [`Error::Redis`](crate::Error::Redis). [`Store::close`](crate::Store::close) ends the
    /// store's own tasks on it (the subscription, the reclaim pass, the sender of groups); its
    /// connection closes when the store's last handle (queues, transactions) is dropped.
    ///
    /// # Errors
    ///
    /// At [`connect`](Builder::connect) or [`open`](Builder::open):
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (`redis_runtime`) for a
    /// current-thread runtime, which runs tasks only while its owner polls it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), reliable_queue::Error> {
    /// let store = reliable_queue::Store::builder()
    ///     .url("redis://cache.internal:6379")
    ///     .redis_runtime(tokio::runtime::Handle::current())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.config.redis_runtime = Some(runtime);
        self
    }

    /// Whether [`connect`](Builder::connect) may create the store's schema, or migrate an
    /// older one to this build's version (`true` by default). A schema already at this
    /// build's version is only read either way, so a role without the privilege to create
    /// (workers' roles, in production) connects to it. With `false` connect changes nothing
    /// in the database: for a tool that only looks (`rq stats`), where a mistyped schema must
    /// be an error, not a new empty store.
    ///
    /// # Errors
    ///
    /// With `false`, at connect: [`Error::SchemaMissing`](crate::Error::SchemaMissing) when
    /// the schema is not there, [`Error::SchemaVersion`](crate::Error::SchemaVersion) when it
    /// is at another version.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let store = reliable_queue::Store::builder()
    ///     .postgres("postgresql://readonly@db.internal/app")
    ///     .postgres_migrate(false)
    ///     .open()?;
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_migrate(mut self, migrate: bool) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.migrate = migrate;
        self
    }

    /// Deletes dead letters older than `retention` (by the time they died), so that a queue
    /// whose failures nobody replays does not grow its dead-letter table without bound. Off
    /// by default (dead letters are kept until replayed or purged). Applied by the store's
    /// maintenance pass on each queue it has opened (every 30 s, and at every stats, browse
    /// and dead-letter call). Whole milliseconds.
    ///
    #[cfg(feature = "postgres")]
    pub fn postgres_dead_letter_retention(mut self, retention: std::time::Duration) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.dead_letter_retention = Some(retention);
        self
    }

    /// Trusts these certificates (PEM, one or more) for TLS connections to PostgreSQL
    /// instead of the system's root certificates: typically the certificate authority that
    /// signed the server's certificate.
    ///
    /// TLS is used when the URL says `sslmode=require`; the server's certificate is then
    /// always verified, chain and name (stricter than libpq's `require`, like its
    /// `verify-full`). `sslmode=prefer` (the default) and `disable` connect without TLS.
    /// Unix-socket connections never use TLS.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/ssl/db-ca.pem")?;
    /// let store = reliable_queue::Store::builder()
    ///     .postgres("host=db.internal user=app dbname=jobs sslmode=require")
    ///     .postgres_tls_root_certificates(ca)
    ///     .open()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let pg = self
            .config
            .postgres
            .get_or_insert_with(|| crate::config::PgConfig::new(""));
        pg.tls_roots = Some(pem.into());
        self
    }
}
