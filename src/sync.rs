//! The one module that chooses synchronisation primitives.
//!
//! The in-memory core (`crate::core`) takes its locks and atomics from here. Built with
//! `--cfg reliable_queue_loom`, they are loom's, so the `loom-tests` crate can model-check the
//! core without switching any dependency to loom. Everything under [`process`] is never
//! switched: it serves the parts of the crate that loom does not model (the committer thread,
//! the registry of open directories, the engines' flags and counters).

#[cfg(not(reliable_queue_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

    /// A mutex whose `lock` cannot fail (parking_lot's, here).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }
}

#[cfg(reliable_queue_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

    /// loom's mutex behind the same infallible `lock` as the normal build.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // A poisoned lock means a model thread panicked; the model reports that panic.
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }
}

pub(crate) use imp::{AtomicU64, Mutex, MutexGuard, Ordering};

/// Primitives for the parts of the crate that loom does not model.
pub(crate) mod process {
    pub(crate) use parking_lot::{Condvar, Mutex};
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
}
