//! The behaviour tests that run under the suite's own harness (libtest-mimic, `harness = false`),
//! one module per behaviour, in one test binary: the conformance suite, whose cases run on
//! every engine (`tests/common/engines.rs`), and the PostgreSQL-only tests, which share the
//! binary's PostgreSQL server or take a cluster of their own (`tests/pg/mod.rs`).
//!
//! One binary rather than one per file because each binary instantiates and optimises the
//! crate's generic code again, and links on its own: ARCHITECTURE.md, "Test binaries". Every
//! trial is named after its module: `<module>::<case>::<engine>` for a case of the conformance
//! suite, `<module>::<test>` for one run once. Run one module with a filter:
//! `cargo test --release --features postgres --test suite -- waiting::`. The tests that start
//! this binary again as a child to run one test (`messages`, `misuse`, `restart`) select it by
//! that full name, with `--exact`; the others start it with a variable that [`main`] checks
//! first.

#[path = "../common/mod.rs"]
mod common;

mod async_send_sync;
mod bad_input;
mod close;
mod leak;
mod limits;
mod messages;
mod misuse;
mod postgres;
mod postgres_edges;
mod postgres_failover;
mod postgres_faults;
mod postgres_ops;
mod postgres_server;
mod postgres_tls;
mod processing;
mod rcq_cases;
#[cfg(feature = "redis")]
mod redis;
mod restart;
mod stress;
mod transactions;
mod waiting;

use std::process::ExitCode;

/// A module of the suite: its name (the first part of its trials' names) and its cases.
macro_rules! module {
    ($module:ident) => {
        (stringify!($module), $module::cases())
    };
}

fn main() -> ExitCode {
    // This binary started again by one of its tests, for something other than a test run.
    postgres_server::exit_child_if_asked();
    #[cfg(feature = "postgres")]
    for (var, worker) in [
        postgres::WORKER,
        postgres_failover::WORKER,
        postgres_ops::WORKER,
    ] {
        if let Ok(url) = std::env::var(var) {
            worker(&url);
            return ExitCode::SUCCESS;
        }
    }
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var(redis::WORKER.0) {
        (redis::WORKER.1)(&url);
        return ExitCode::SUCCESS;
    }
    common::engines::main(vec![
        module!(async_send_sync),
        module!(bad_input),
        module!(close),
        module!(leak),
        module!(limits),
        module!(messages),
        module!(misuse),
        #[cfg(feature = "postgres")]
        module!(postgres),
        #[cfg(feature = "postgres")]
        module!(postgres_edges),
        #[cfg(feature = "postgres")]
        module!(postgres_failover),
        #[cfg(feature = "postgres")]
        module!(postgres_faults),
        #[cfg(feature = "postgres")]
        module!(postgres_ops),
        module!(postgres_server),
        #[cfg(feature = "postgres")]
        module!(postgres_tls),
        module!(processing),
        module!(rcq_cases),
        #[cfg(feature = "redis")]
        module!(redis),
        module!(restart),
        module!(stress),
        module!(transactions),
        module!(waiting),
    ])
}
