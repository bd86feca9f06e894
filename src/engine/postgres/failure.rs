//! How the client's failures become the crate's [`Error`]: a statement or a connection that
//! failed during an operation, and a commit whose outcome may be unknown.

use std::sync::Arc;

use crate::error::Error;

/// A PostgreSQL failure during `operation`.
pub(super) fn pg(
    operation: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Postgres {
        operation,
        source: Arc::new(e),
    }
}

/// A failed `COMMIT`: without an answer from the server (the connection went away) the
/// outcome is unknown; with one, it did not commit.
pub(super) fn commit_error(e: tokio_postgres::Error) -> Error {
    if e.is_closed() || e.code().is_none() {
        Error::CommitOutcomeUnknown {
            source: Arc::new(e),
        }
    } else {
        pg("commit", e)
    }
}
