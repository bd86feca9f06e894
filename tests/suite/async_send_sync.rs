//! Compile-time checks of the auto traits of the public handles and futures.
//!
//! These tests pass by compiling: each `require_*` call fails the build if a type loses an
//! auto trait it promises. The one runtime test builds real values so the checks also cover
//! the futures returned by the async calls (`queue`, `try_dequeue`, `dequeue`, `count`,
//! `commit`, `abort`, `flush`, `unfence`, `close`) as the compiler infers them, on every
//! engine of the conformance suite (`tests/common/engines.rs`).

use crate::common;
use crate::engine_case;

use std::future::Future;

use common::engines::Engine;
use reliable_queue::{
    Builder, Dequeue, Durability, Error, ReliableConcurrentQueue, SetAsideRecord, Store,
    Transaction,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn require_send<T: Send>(_: &T) {}
fn require_sync<T: Sync>(_: &T) {}
fn require_unpin<T: Unpin>(_: &T) {}
fn require_static<T: 'static>(_: &T) {}
fn require_send_future<F: Future + Send>(_: &F) {}

/// The same checks on types alone, for every item type the queue accepts.
#[allow(dead_code)]
fn handles_of_any_item_type<T>()
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    fn send_sync<X: Send + Sync + 'static>() {}
    fn send<X: Send + 'static>() {}
    fn send_unpin<X: Send + Unpin>() {}

    send_sync::<Store>();
    send_sync::<ReliableConcurrentQueue<T>>();
    send_sync::<Builder>();
    send_sync::<Error>();
    send_sync::<Durability>();
    send_sync::<SetAsideRecord>();
    send::<Transaction>();
    send_unpin::<Dequeue<'static, T>>();
}

/// `Error` can travel in `Box<dyn Error + Send + Sync>` (anyhow, `?` in spawned tasks).
#[allow(dead_code)]
fn error_is_boxable(e: Error) -> Box<dyn std::error::Error + Send + Sync + 'static> {
    Box::new(e)
}

/// The futures are `Send` for any item type, so they can be awaited in `tokio::spawn`.
#[allow(dead_code)]
fn futures_of_any_item_type<T>(queue: &ReliableConcurrentQueue<T>, store: &Store)
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    let mut tx = store.begin();
    let dequeue = queue.dequeue(&mut tx);
    require_send_future(&dequeue);
    require_unpin(&dequeue);
    drop(dequeue);
    {
        let try_dequeue = queue.try_dequeue(&mut tx);
        require_send_future(&try_dequeue);
    }
    require_send_future(&queue.count());
    require_send_future(&store.queue::<T>("other"));
    require_send_future(&store.flush());
    require_send_future(&store.unfence("other"));
    require_send_future(&store.clone().close());
    require_send_future(&store.begin().abort());
    require_send_future(&tx.commit());
}

fn handles_and_futures_are_send(engine: &'static Engine) {
    let at = engine.store();
    let store = at.store.clone();
    let queue = store.blocking_queue::<String>("q").expect("open the queue");
    let builder = Store::builder();
    let error = Error::Closed;

    require_send(&store);
    require_sync(&store);
    require_static(&store);
    require_send(&queue);
    require_sync(&queue);
    require_static(&queue);
    require_send(&builder);
    require_sync(&builder);
    require_send(&error);
    require_sync(&error);
    require_static(&error);

    let mut tx = store.begin();
    require_send(&tx);
    require_sync(&tx);
    {
        let dequeue = queue.dequeue(&mut tx);
        require_send_future(&dequeue);
        require_unpin(&dequeue);
    }
    {
        let try_dequeue = queue.try_dequeue(&mut tx);
        require_send_future(&try_dequeue);
    }
    // None of these futures is polled: creating them does nothing, dropping them is safe.
    let count = queue.count();
    require_send_future(&count);
    drop(count);
    let open = store.queue::<u64>("other");
    require_send_future(&open);
    drop(open);
    let flush = store.flush();
    require_send_future(&flush);
    drop(flush);
    let unfence = store.unfence("q");
    require_send_future(&unfence);
    drop(unfence);
    let close = store.clone().close();
    require_send_future(&close);
    require_static(&close);
    // Never polled: the store stays open.
    drop(close);
    let abort = store.begin().abort();
    require_send_future(&abort);
    drop(abort);
    let commit = tx.commit();
    require_send_future(&commit);
    require_static(&commit);
    // Never polled: dropping it aborts the (empty) transaction.
    drop(commit);
    // The unpolled futures changed nothing: the store is open, the queue was not created.
    assert_eq!(store.queue_names(), ["q"]);
    assert_eq!(queue.blocking_count().expect("count"), 0);
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<common::engines::Case> {
    vec![engine_case!(handles_and_futures_are_send)]
}
