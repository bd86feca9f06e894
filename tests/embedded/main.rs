//! The behaviour tests of the embedded engines' insides that run under libtest's own harness
//! (`#[test]`), one module per behaviour, in one test binary: sled's log and files (compaction,
//! rollback, damage, decoding, the format 1 fixture, private files), crashes under `kill -9`,
//! tokio's cooperative budget, and the model-based test.
//!
//! One binary rather than one per file because each binary instantiates and optimises the
//! crate's generic code again, and links on its own: ARCHITECTURE.md, "Test binaries". Run one
//! module with a filter: `cargo test --release --test embedded -- crash::`. The tests that start
//! this binary again as a child (`crash`, `damage`) select their test by its full name
//! (`crash::...`, with `--exact`).

#[path = "../common/mod.rs"]
mod common;

mod compaction;
mod coop;
mod crash;
mod damage;
mod decoder_fuzz;
mod fixture_format_1;
mod model;
mod private;
mod rollback;
