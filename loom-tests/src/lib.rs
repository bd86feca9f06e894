//! loom models of reliable-queue's core live in `tests/`; this crate has no code of its own.
