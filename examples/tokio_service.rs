//! A small tokio service that keeps its work in a durable queue.
//!
//! The service listens on `127.0.0.1` (a free port) and speaks a line protocol:
//!
//! ```text
//! SUBMIT <id> <text>   ->  OK                 the order is durable when the client reads OK
//! TAKE                 ->  ORDER <id> <text>  an order, removed from the queue for good
//!                      ->  EMPTY              nothing to hand out right now
//! ```
//!
//! Each request runs in its own short transaction inside the handler: `try_dequeue` (a
//! handler never waits for work to appear) and `commit().await` (the runtime's threads are
//! not blocked while the log is flushed). Clients in the same program submit and take orders
//! concurrently; at the end the program checks that every order was handed out exactly once.
//!
//! ```text
//! cargo run --release --example tokio_service
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reliable_queue::{ReliableConcurrentQueue, Store};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn Error + Send + Sync>;

const SUBMITTERS: u64 = 4;
const ORDERS_PER_SUBMITTER: u64 = 250;
const WORKERS: usize = 3;

#[derive(Serialize, Deserialize, Debug)]
struct Order {
    id: u64,
    text: String,
}

/// What the service shares between connections.
struct Service {
    store: Store,
    orders: ReliableConcurrentQueue<Order>,
    submitted: AtomicU64,
    handed_out: AtomicU64,
    empty: AtomicU64,
}

impl Service {
    /// Handles one request line and writes the response to `out`.
    async fn handle<W>(&self, line: &str, out: &mut W) -> Result<(), BoxError>
    where
        W: AsyncWrite + Unpin,
    {
        let mut words = line.splitn(3, ' ');
        match (words.next(), words.next(), words.next()) {
            (Some("SUBMIT"), Some(id), Some(text)) => {
                let Ok(id) = id.parse() else {
                    out.write_all(b"ERR bad id\n").await?;
                    return Ok(());
                };
                let mut tx = self.store.begin();
                self.orders.enqueue(
                    &mut tx,
                    Order {
                        id,
                        text: text.to_owned(),
                    },
                )?;
                // On disk before the client hears OK.
                tx.commit().await?;
                self.submitted.fetch_add(1, Ordering::Relaxed);
                out.write_all(b"OK\n").await?;
            }
            (Some("TAKE"), None, None) => {
                let mut tx = self.store.begin();
                match self.orders.try_dequeue(&mut tx).await? {
                    Some(order) => {
                        // Reply first, commit second: if the reply cannot be written, `?`
                        // drops `tx`, which aborts it and puts the order back for someone
                        // else. (A crash between the reply and the commit would hand the
                        // order out again: at-least-once.)
                        out.write_all(format!("ORDER {} {}\n", order.id, order.text).as_bytes())
                            .await?;
                        out.flush().await?;
                        tx.commit().await?;
                        self.handed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        self.empty.fetch_add(1, Ordering::Relaxed);
                        out.write_all(b"EMPTY\n").await?;
                    }
                }
            }
            _ => out.write_all(b"ERR bad request\n").await?,
        }
        Ok(())
    }
}

/// Serves one connection until the client closes it.
async fn serve(service: Arc<Service>, stream: TcpStream) -> Result<(), BoxError> {
    stream.set_nodelay(true)?;
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    while let Some(line) = lines.next_line().await? {
        service.handle(&line, &mut writer).await?;
    }
    Ok(())
}

/// A client connection: sends one request line, reads one response line.
struct Client {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Result<Client, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        Ok(Client {
            lines: BufReader::new(reader).lines(),
            writer,
        })
    }

    async fn call(&mut self, request: &str) -> Result<String, BoxError> {
        self.writer
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        self.lines
            .next_line()
            .await?
            .ok_or_else(|| "the service closed the connection".into())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("store"))?;
    let service = Arc::new(Service {
        orders: store.queue("orders").await?,
        store,
        submitted: AtomicU64::new(0),
        handed_out: AtomicU64::new(0),
        empty: AtomicU64::new(0),
    });

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("service listening on {addr}");
    let server = {
        let service = service.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        eprintln!("accept failed: {e}");
                        continue;
                    }
                };
                let service = service.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(service, stream).await {
                        eprintln!("connection failed: {e}");
                    }
                });
            }
        })
    };

    let start = Instant::now();
    let submitting = Arc::new(AtomicBool::new(true));

    // Submitters: each sends its orders one request at a time.
    let mut submitters = Vec::new();
    for s in 0..SUBMITTERS {
        submitters.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await?;
            for n in 0..ORDERS_PER_SUBMITTER {
                let id = s * ORDERS_PER_SUBMITTER + n;
                let reply = client
                    .call(&format!("SUBMIT {id} order {n} of client {s}"))
                    .await?;
                if reply != "OK" {
                    return Err(format!("SUBMIT {id}: {reply}").into());
                }
            }
            Ok::<(), BoxError>(())
        }));
    }

    // Workers: take orders until the submitters are done and the service has none left.
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let submitting = submitting.clone();
        workers.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await?;
            let mut taken = Vec::new();
            loop {
                let still_submitting = submitting.load(Ordering::Acquire);
                let reply = client.call("TAKE").await?;
                if let Some(rest) = reply.strip_prefix("ORDER ") {
                    let id = rest.split(' ').next().unwrap_or_default();
                    taken.push(id.parse::<u64>()?);
                } else if reply == "EMPTY" {
                    if !still_submitting {
                        return Ok::<_, BoxError>(taken);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                } else {
                    return Err(format!("TAKE: {reply}").into());
                }
            }
        }));
    }

    for submitter in submitters {
        submitter.await??;
    }
    submitting.store(false, Ordering::Release);
    let mut times_taken: BTreeMap<u64, usize> = BTreeMap::new();
    let mut per_worker = Vec::new();
    for worker in workers {
        let taken = worker.await??;
        per_worker.push(taken.len());
        for id in taken {
            *times_taken.entry(id).or_default() += 1;
        }
    }
    let elapsed = start.elapsed();
    server.abort();

    let expected = SUBMITTERS * ORDERS_PER_SUBMITTER;
    let missing = (0..expected)
        .filter(|id| !times_taken.contains_key(id))
        .count();
    let duplicated = times_taken.values().filter(|&&n| n > 1).count();
    let submitted = service.submitted.load(Ordering::Relaxed);
    let handed_out = service.handed_out.load(Ordering::Relaxed);
    let left = service.orders.count().await?;
    // Close the store: its final flush's outcome is reported here (dropping it only logs it).
    service.store.clone().close().await?;

    println!("{SUBMITTERS} submitters and {WORKERS} workers, one connection each, {elapsed:.2?}:");
    println!("  SUBMIT requests committed     {submitted}");
    println!("  TAKE requests served          {handed_out} (per worker: {per_worker:?})");
    println!(
        "  TAKE requests found no order  {}",
        service.empty.load(Ordering::Relaxed)
    );
    println!("  orders never handed out       {missing}");
    println!("  orders handed out twice       {duplicated}");
    println!("  orders left in the queue      {left}");
    if submitted == expected
        && handed_out == expected
        && missing == 0
        && duplicated == 0
        && left == 0
    {
        println!("every order was handed out exactly once");
        Ok(())
    } else {
        Err("the orders do not add up".into())
    }
}
