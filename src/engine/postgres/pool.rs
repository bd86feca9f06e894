//! Connecting: the client's settings from the store's URL (keepalives, the server's idle
//! timeout, the connect bound over every host) and the pool of connections made within that
//! bound, with the errors of a connection that could not be made.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, PoolError, RecyclingMethod, TimeoutType};
use tokio::runtime::Handle;
use tokio_postgres::NoTls;

use super::failure::pg;
use super::tls::Tls;
use crate::config::PgConfig;
use crate::error::{Error, Result};

/// How long a call waits for a pooled connection when every one is in use.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// How long one connection attempt to one host may take, TCP connect, TLS and the
/// server's startup included, when the URL sets no `connect_timeout`: a port that accepts
/// connections but never answers as PostgreSQL would otherwise hold the caller for ever.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's settings for `config`'s URL, and the connect bound: how long a new
/// connection may take, every host of the URL tried.
pub(super) fn client_config(config: &PgConfig) -> Result<(tokio_postgres::Config, Duration)> {
    let mut pg_config =
        tokio_postgres::Config::from_str(&config.url).map_err(|_| Error::InvalidConfig {
            setting: "postgres_url",
            expected: "a PostgreSQL connection URL or key-value string (libpq syntax)",
        })?;
    // A peer that vanished (a partitioned or powered-off machine) is noticed by TCP
    // keepalives instead of after the kernel's two hours (ignored on Unix sockets).
    pg_config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
    if let Some(timeout) = config.idle_transaction_timeout {
        let ms = timeout.as_millis().max(1);
        let options = format!(
            "{} -c idle_in_transaction_session_timeout={ms}",
            pg_config.get_options().unwrap_or("")
        );
        pg_config.options(options.trim());
    }
    // libpq's `connect_timeout` bounds a whole attempt on each host; tokio-postgres's
    // only its TCP connect. Each host gets its timeout for the TCP connect, and every
    // connection the whole of them for its startup.
    let per_host = pg_config
        .get_connect_timeout()
        .copied()
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    pg_config.connect_timeout(per_host);
    let hosts = pg_config
        .get_hosts()
        .len()
        .max(pg_config.get_hostaddrs().len())
        .max(1);
    // Saturating on purpose: the bound is "every host tried", which `saturating_mul` caps at
    // `Duration::MAX`; more than `u32::MAX` hosts (a URL of gigabytes) would wait as long.
    let connect_bound = per_host.saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX));
    Ok((pg_config, connect_bound))
}

/// The store's pooled connections, with where they go (named in the errors of a
/// connection that could not be made).
#[derive(Clone)]
pub(super) struct Pool {
    inner: deadpool_postgres::Pool,
    /// The hosts and ports of the URL, for people.
    target: Arc<str>,
    /// How long a new connection may take, all hosts tried.
    bound: Duration,
}

impl Pool {
    /// The pool of up to `size` connections to `pg_config`'s server, each made within
    /// `bound` (see [`client_config`]), its tasks on the runtime of `rt`.
    pub(super) fn new(
        rt: &Handle,
        pg_config: &tokio_postgres::Config,
        tls: &Tls,
        size: usize,
        bound: Duration,
    ) -> Result<Pool> {
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls {
            Tls::Off => Manager::from_config(pg_config.clone(), NoTls, manager_config),
            Tls::On(tls) => Manager::from_config(pg_config.clone(), tls.clone(), manager_config),
        };
        let _in_runtime = rt.enter();
        // A call that finds every connection busy (held by open transactions) waits at
        // most this long for one, then fails with `Error::Postgres`: never a hang. A new
        // connection gets `bound` for all of its hosts, startup included.
        let inner = deadpool_postgres::Pool::builder(manager)
            .max_size(size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(bound))
            .build()
            .map_err(|e| pg("connect", e))?;
        Ok(Pool {
            inner,
            target: Arc::from(target_of(pg_config)),
            bound,
        })
    }

    /// A connection: an idle one, or a new one made within the connect bound.
    pub(super) async fn get(&self) -> std::result::Result<Object, ConnectFailed> {
        self.inner.get().await.map_err(|e| match e {
            PoolError::Timeout(TimeoutType::Create) => ConnectFailed::NoAnswer {
                target: Arc::clone(&self.target),
                after: self.bound,
            },
            PoolError::Backend(source) => ConnectFailed::Refused {
                target: Arc::clone(&self.target),
                source,
            },
            other => ConnectFailed::Pool(other),
        })
    }

    pub(super) fn close(&self) {
        self.inner.close();
    }
}

/// Why the store got no connection.
#[derive(Debug)]
pub(super) enum ConnectFailed {
    /// Nothing answered as PostgreSQL within the connect bound: a silent or foreign
    /// listener, or a host that drops packets.
    NoAnswer { target: Arc<str>, after: Duration },
    /// The connection was refused or failed (by the network, TLS or the server).
    Refused {
        target: Arc<str>,
        source: tokio_postgres::Error,
    },
    /// The pool's own failure (every connection busy past the wait, or closed).
    Pool(PoolError),
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectFailed::NoAnswer { target, after } => write!(
                f,
                "no answer as PostgreSQL from {target} within {} ms (is it a PostgreSQL \
                 server? the URL's connect_timeout sets the wait per host)",
                after.as_millis()
            ),
            ConnectFailed::Refused { target, .. } => {
                write!(f, "could not connect to {target}")
            }
            ConnectFailed::Pool(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectFailed::NoAnswer { .. } => None,
            ConnectFailed::Refused { source, .. } => Some(source),
            ConnectFailed::Pool(e) => e.source(),
        }
    }
}

/// The hosts and ports a connection string names, for people: `db1:5432,db2:5433`, or a
/// socket directory and port.
fn target_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            tokio_postgres::config::Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(dir) => {
                format!("{}/.s.PGSQL.{}", dir.display(), port(i))
            }
        })
        .collect();
    if !hosts.is_empty() {
        return hosts.join(",");
    }
    let addresses: Vec<String> = config
        .get_hostaddrs()
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{addr}:{}", port(i)))
        .collect();
    if addresses.is_empty() {
        // tokio-postgres refuses to connect without a host: never what a connection used.
        "(no host)".to_owned()
    } else {
        addresses.join(",")
    }
}
