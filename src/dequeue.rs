//! Waiting dequeues: the [`Dequeue`] future and the blocking variants.
//!
//! Both register a request in the queue's staging when nothing is visible; the next item to
//! become visible is handed straight to the oldest request and only its waiter is woken. A
//! request that ends early (future dropped, timeout, unwinding) is withdrawn, and an item
//! already handed to it goes back to the front of the queue, or to the next waiter.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::{QueueCore, Request};
use crate::error::Result;
use crate::queue::ReliableConcurrentQueue;
use crate::transaction::Transaction;

/// A registered request that is withdrawn, giving back anything handed to it, when dropped.
#[derive(Debug)]
struct Waiting<'a> {
    core: &'a QueueCore,
    request: Request,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.core.cancel(&mut self.request);
    }
}

/// Future returned by [`ReliableConcurrentQueue::dequeue`].
///
/// Resolves to the next item handed to this transaction. Dropping it before it resolves is
/// safe: see the method's `# Cancel safety`.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Dequeue<'a, T> {
    queue: &'a ReliableConcurrentQueue<T>,
    tx: &'a mut Transaction,
    waiting: Waiting<'a>,
    checked: bool,
}

impl<T> Future for Dequeue<'_, T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        if !this.checked {
            this.queue.check(this.tx)?;
            this.checked = true;
        }
        let waiting = &mut this.waiting;
        match waiting.core.poll_take(&mut waiting.request, cx.waker()) {
            Poll::Ready(entry) => Poll::Ready(this.queue.accept(this.tx, entry)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Wakes a thread parked in a blocking dequeue.
struct Unparker(Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl<T> ReliableConcurrentQueue<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    /// Takes the item at the front of the queue into the transaction, waiting for one to be
    /// committed if none is visible.
    ///
    /// Waiting consumers are served first come, first served: an item that becomes visible is
    /// handed straight to the oldest waiter, and only that waiter is woken. While anyone waits,
    /// [`try_dequeue`](Self::try_dequeue) finds nothing, so it cannot jump the line.
    ///
    /// There is no built-in timeout: wrap the future in `tokio::time::timeout`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe. Dropping the future at any point loses nothing: if an item had already
    /// been handed to it, the item goes back to the front of the queue (or to the next
    /// waiter), and the transaction is left as it was before the call.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue): [`Error::Deserialize`](crate::Error::Deserialize)
    /// (the item stays held by `tx`), [`Error::WrongStore`](crate::Error::WrongStore).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use reliable_queue::Store;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::in_memory()?;
    /// let q = store.queue::<u32>("q")?;
    ///
    /// let producer = {
    ///     let (store, q) = (store.clone(), q.clone());
    ///     tokio::spawn(async move {
    ///         let mut tx = store.begin();
    ///         q.enqueue(&mut tx, 5)?;
    ///         tx.commit_async().await
    ///     })
    /// };
    ///
    /// let mut tx = store.begin();
    /// let item = tokio::time::timeout(Duration::from_secs(10), q.dequeue(&mut tx)).await??;
    /// assert_eq!(item, 5);
    /// tx.commit_async().await?;
    /// producer.await??;
    /// # Ok(()) }
    /// ```
    pub fn dequeue<'a>(&'a self, tx: &'a mut Transaction) -> Dequeue<'a, T> {
        Dequeue {
            queue: self,
            tx,
            waiting: Waiting {
                core: &self.core,
                request: Request::default(),
            },
            checked: false,
        }
    }

    /// Like [`dequeue`](Self::dequeue), for threads outside an async runtime: blocks the
    /// thread until an item is handed to the transaction.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue).
    ///
    /// # Examples
    ///
    /// ```
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q")?;
    /// let consumer = {
    ///     let (store, q) = (store.clone(), q.clone());
    ///     std::thread::spawn(move || {
    ///         let mut tx = store.begin();
    ///         let item = q.blocking_dequeue(&mut tx)?;
    ///         tx.commit()?;
    ///         Ok::<_, reliable_queue::Error>(item)
    ///     })
    /// };
    /// let mut tx = store.begin();
    /// q.enqueue(&mut tx, 9)?;
    /// tx.commit()?;
    /// assert_eq!(consumer.join().unwrap()?, 9);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_dequeue(&self, tx: &mut Transaction) -> Result<T> {
        loop {
            if let Some(item) = self.blocking_wait(tx, None)? {
                return Ok(item);
            }
        }
    }

    /// Like [`blocking_dequeue`](Self::blocking_dequeue), giving up after `timeout`:
    /// `Ok(None)` if no item was handed to the transaction in time.
    ///
    /// # Errors
    ///
    /// As [`try_dequeue`](Self::try_dequeue).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let store = reliable_queue::Store::in_memory()?;
    /// let q = store.queue::<u32>("q")?;
    /// let mut tx = store.begin();
    /// assert_eq!(q.blocking_dequeue_timeout(&mut tx, Duration::from_millis(1))?, None);
    /// # Ok::<(), reliable_queue::Error>(())
    /// ```
    pub fn blocking_dequeue_timeout(
        &self,
        tx: &mut Transaction,
        timeout: Duration,
    ) -> Result<Option<T>> {
        self.blocking_wait(tx, Some(Instant::now() + timeout))
    }

    fn blocking_wait(&self, tx: &mut Transaction, deadline: Option<Instant>) -> Result<Option<T>> {
        self.check(tx)?;
        let waker = Waker::from(Arc::new(Unparker(thread::current())));
        let mut waiting = Waiting {
            core: &self.core,
            request: Request::default(),
        };
        loop {
            if let Poll::Ready(entry) = self.core.poll_take(&mut waiting.request, &waker) {
                return self.accept(tx, entry).map(Some);
            }
            match deadline {
                None => thread::park(),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        // An item handed over at the last moment is ours to take.
                        return match self.core.withdraw(&mut waiting.request) {
                            Some(entry) => self.accept(tx, entry).map(Some),
                            None => Ok(None),
                        };
                    }
                    thread::park_timeout(deadline - now);
                }
            }
        }
    }
}
