//! loom models of the processing layer's lease table (`proc.rs`), under `--cfg
//! reliable_queue_loom`, beside the core's own models (`core/loom_models.rs`):
//!
//! ```text
//! RUSTFLAGS="--cfg reliable_queue_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_
//! ```

use std::collections::VecDeque;
use std::sync::Arc;

use loom::thread;

use crate::core::{Entry, QueueCore};

fn queue_with(ids: &[u64]) -> Arc<QueueCore> {
    let ready: VecDeque<Entry> = ids
        .iter()
        .map(|&id| Entry::new(id, Box::new([0]), 0))
        .collect();
    crate::core::QueueTable::default().add(|index| QueueCore::new(0, index, "q".into(), ready))
}

/// A lease (token 7, deadline 10) with its item, on a queue of its own.
fn leased_item() -> (Arc<crate::engine::proc::Proc>, Arc<QueueCore>) {
    use crate::engine::proc::{Leased, Proc};
    let core = queue_with(&[]);
    let proc = Arc::new(Proc::new(core.clone(), crate::RetryPolicy::default()));
    let entry = Entry::new(7, Box::new([0]), 0);
    let watch = proc.insert_lease(
        7,
        Leased {
            entry,
            deadline: 10,
        },
    );
    assert_eq!(watch, Some(10), "the first deadline is watched");
    (proc, core)
}

/// An ack (a settlement at time 5, before the deadline) racing the expiry timer (at time
/// 10): exactly one of them ends the lease; the item is then completed, or back in its
/// queue, never both and never neither.
#[test]
fn expiry_racing_an_ack_settles_the_lease_once() {
    loom::model(|| {
        let (proc, core) = leased_item();
        let acker = {
            let proc = proc.clone();
            thread::spawn(move || proc.claim(7, 5).is_some())
        };
        let expired = proc.expire_due(10).0.pop();
        if let Some(leased) = expired.as_ref() {
            core.restore(std::iter::once(leased.entry.clone()));
        }
        let acked = acker.join().unwrap();
        assert!(
            acked != expired.is_some(),
            "exactly one of ack and expiry wins"
        );
        assert_eq!(core.count(), u64::from(expired.is_some()));
        assert_eq!(proc.leased(), 0);
    });
}

/// An extension (at time 5, to deadline 20) racing the expiry timer (at time 10): either the
/// extension wins and the lease runs on, or the expiry wins, the item is back and the
/// extension fails.
#[test]
fn expiry_racing_an_extension_is_one_or_the_other() {
    loom::model(|| {
        let (proc, core) = leased_item();
        let extender = {
            let proc = proc.clone();
            thread::spawn(move || proc.extend(7, 5, 20).is_some())
        };
        let expired = proc.expire_due(10).0.pop();
        if let Some(leased) = expired.as_ref() {
            core.restore(std::iter::once(leased.entry.clone()));
        }
        let extended = extender.join().unwrap();
        assert!(
            extended != expired.is_some(),
            "exactly one of extension and expiry wins"
        );
        assert_eq!(proc.leased(), u64::from(extended));
        assert_eq!(core.count(), u64::from(!extended));
    });
}
