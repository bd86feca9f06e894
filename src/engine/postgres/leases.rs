//! Leases on PostgreSQL, below the calls: the lease statement as the `lease` call and a
//! commit run it, and the burial of expired leases at their maximum attempts (with the
//! dead-letter retention) as the calls and the store's maintenance pass run it.
//!
//! A lease is columns of its row (`attempts`, `leased_until`, `lease_token`); the calls on a
//! lease, `impl Postgres`, are in `lease_calls.rs`.

use std::sync::Arc;

use deadpool_postgres::Object;
use tokio_postgres::Row;

use super::failure::pg;
use super::pool::Pool;
use super::statements::{clock_ms, ms, opt_ms, Sql};
use crate::clock::Clock;
use crate::core::Entry;
use crate::error::Result;
use crate::sync::process::Mutex;

pub(crate) use crate::engine::line::Granted;

/// A row of the lease statement.
fn granted(row: &Row) -> Result<Granted> {
    let read = || -> std::result::Result<Granted, tokio_postgres::Error> {
        let mut entry = Entry::new(
            ms(row.try_get(0)?),
            row.try_get::<_, Vec<u8>>(1)?.into_boxed_slice(),
            ms(row.try_get(5)?),
        );
        entry.set_attempts(u32::try_from(row.try_get::<_, i32>(2)?).unwrap_or(0));
        entry.set_first_attempt(opt_ms(row.try_get(6)?));
        entry.set_last_attempt(opt_ms(row.try_get(7)?));
        entry.set_not_before(ms(row.try_get(8)?));
        entry.set_key(
            row.try_get::<_, Option<Vec<u8>>>(9)?
                .map(Vec::into_boxed_slice),
        );
        Ok(Granted {
            entry,
            token: ms(row.try_get(3)?),
            deadline: ms(row.try_get(4)?),
        })
    };
    read().map_err(|e| pg("lease", e))
}

/// Counts and traces `buried` items of queue `name` moved to the dead letters because their
/// last lease expired (by the lease statement or the maintenance pass).
fn buried_expired(name: &str, buried: i64) {
    crate::metrics::buried(name, true, u64::try_from(buried).unwrap_or(0));
    let span = tracing::debug_span!("dead_letter_moves", queue = name, buried);
    let _entered = span.enter();
    tracing::debug!("items whose last lease expired moved to the dead letters");
}

/// Leases up to `n` rows of `queue` on `client` (in its open transaction, if any).
pub(super) async fn lease_on(
    client: &Object,
    sql: &Sql,
    queue: i32,
    n: i64,
    now: Option<i64>,
    ttl: i64,
) -> Result<Vec<Granted>> {
    let statement = client
        .prepare_cached(&sql.proc.lease)
        .await
        .map_err(|e| pg("lease", e))?;
    let rows = client
        .query(&statement, &[&queue, &n, &now, &ttl])
        .await
        .map_err(|e| pg("lease", e))?;
    if let Some(first) = rows.first() {
        let buried: i64 = first.try_get(10).unwrap_or(0);
        if buried > 0 {
            let name: String = first
                .try_get::<_, Option<String>>(11)
                .ok()
                .flatten()
                .unwrap_or_default();
            buried_expired(&name, buried);
        }
    }
    // A lease of nothing is one row of NULLs (it carries the count above).
    let mut granted = rows
        .iter()
        .filter(|row| matches!(row.try_get::<_, Option<i64>>(0), Ok(Some(_))))
        .map(granted)
        .collect::<Result<Vec<_>>>()?;
    debug_assert!(
        !rows.is_empty() && (granted.len() == rows.len() || (rows.len(), granted.len()) == (1, 0)),
        "the lease statement returns one row per lease, or one row of NULLs"
    );
    debug_assert!(
        usize::try_from(n).is_ok_and(|n| granted.len() <= n),
        "a lease grants at most the leases it asks for"
    );
    // Queue order: readiness, then id (an expired lease kept its place at the head).
    granted.sort_unstable_by_key(|g| (g.entry.not_before(), g.entry.id));
    for g in &mut granted {
        g.entry.set_not_before(0);
    }
    Ok(granted)
}

/// Moves every expired lease of the queue at its maximum attempts to the dead letters,
/// and deletes dead letters past the retention.
pub(super) async fn bury(
    client: &Object,
    sql: &Sql,
    queue: i32,
    now: Option<i64>,
    retention: Option<i64>,
) -> Result<()> {
    let statement = client
        .prepare_cached(&sql.proc.bury)
        .await
        .map_err(|e| pg("bury", e))?;
    let row = client
        .query_one(&statement, &[&queue, &now, &retention])
        .await
        .map_err(|e| pg("bury", e))?;
    let buried: i64 = row.try_get(0).unwrap_or(0);
    if buried > 0 {
        let name: String = row.try_get(2).unwrap_or_default();
        buried_expired(&name, buried);
    }
    Ok(())
}

/// What `fail` did.
#[derive(Debug)]
pub(crate) enum FailOutcome {
    /// The lease had ended: nothing was done.
    Ended,
    /// Due again at this time.
    Retry(u64),
    /// Buried.
    Dead,
}

/// How often each store runs its maintenance pass.
const MAINTENANCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The store's maintenance task: every [`MAINTENANCE`], on each queue the store has opened,
/// moves expired leases at their maximum attempts to the dead letters and applies the
/// dead-letter retention. Runs until the store's runtime stops. Failures are logged and
/// retried at the next pass.
pub(super) async fn maintain(
    pool: Pool,
    sql: Arc<Sql>,
    queues: Arc<Mutex<Vec<i32>>>,
    clock: Option<Clock>,
    retention: Option<i64>,
) {
    loop {
        tokio::time::sleep(MAINTENANCE).await;
        let list = queues.lock().clone();
        let Ok(client) = pool.get().await else {
            continue;
        };
        for queue in list {
            let now = clock.as_ref().map(|c| clock_ms(c.now()));
            if let Err(e) = bury(&client, &sql, queue, now, retention).await {
                tracing::warn!(error = %e, queue, "the maintenance pass failed");
                break;
            }
        }
    }
}
