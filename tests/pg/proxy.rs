//! A proxy in front of the test server that cuts a connection at a chosen point of the
//! PostgreSQL protocol: just before relaying the server's reply that completes a command
//! (`CommandComplete` with a given tag: the server has done it, the client never hears so),
//! or just before forwarding a client's message that carries a given text (the server never
//! sees it). Everything else is relayed byte for byte.
//!
//! The proxy listens on `127.0.0.1` (an ephemeral port) and connects to the server the way
//! [`PgServer::url`] says (its Unix socket, or TCP). Its URL is the server's with the host
//! and port replaced and TLS off. A cut is armed with [`CutProxy::arm`] and fires once, on
//! the first connection that reaches the point; [`CutProxy::fired`] counts the cuts made.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::PgServer;

/// Where a connection is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Instead of relaying the server's `CommandComplete` whose tag starts with this
    /// (`"INSERT"`, `"COMMIT"`): the command completed on the server.
    Reply(&'static str),
    /// Instead of forwarding the client's message that contains this text (a simple query
    /// `"COMMIT"`): the server never gets it.
    Request(&'static str),
}

/// See the module's documentation. Stops accepting when dropped; connections already made
/// go on until either side closes them.
#[derive(Debug)]
pub struct CutProxy {
    url: String,
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    armed: Mutex<Option<Cut>>,
    fired: AtomicUsize,
    stop: AtomicBool,
}

impl Shared {
    /// Takes the armed cut if `matches` says this message is its point.
    fn fire(&self, matches: impl Fn(Cut) -> bool) -> bool {
        let mut armed = self.armed.lock().unwrap();
        match *armed {
            Some(cut) if matches(cut) => {
                *armed = None;
                self.fired.fetch_add(1, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }
}

/// The server's end of one relayed connection.
enum Upstream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Upstream {
    fn try_clone(&self) -> std::io::Result<Upstream> {
        Ok(match self {
            Upstream::Unix(s) => Upstream::Unix(s.try_clone()?),
            Upstream::Tcp(s) => Upstream::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Upstream::Unix(s) => s.shutdown(Shutdown::Both),
            Upstream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Upstream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Upstream::Unix(s) => s.read(buf),
            Upstream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Upstream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Upstream::Unix(s) => s.write(buf),
            Upstream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Upstream::Unix(s) => s.flush(),
            Upstream::Tcp(s) => s.flush(),
        }
    }
}

impl CutProxy {
    /// Starts a proxy in front of `server`. Panics if it cannot listen.
    pub fn start(server: &PgServer) -> CutProxy {
        let config = tokio_postgres::Config::from_str(server.url()).expect("the server's URL");
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = config
            .get_hosts()
            .first()
            .cloned()
            .expect("the server's URL names a host");
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
        let local = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared::default());
        {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if shared.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let upstream = match &host {
                        tokio_postgres::config::Host::Unix(dir) => {
                            UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                                .map(Upstream::Unix)
                        }
                        tokio_postgres::config::Host::Tcp(name) => {
                            TcpStream::connect((name.as_str(), port)).map(Upstream::Tcp)
                        }
                    };
                    let Ok(upstream) = upstream else { continue };
                    relay(client, upstream, Arc::clone(&shared));
                }
            });
        }
        let mut url = format!("host=127.0.0.1 port={local} sslmode=disable");
        if let Some(user) = config.get_user() {
            url.push_str(&format!(" user='{user}'"));
        }
        if let Some(db) = config.get_dbname() {
            url.push_str(&format!(" dbname='{db}'"));
        }
        if let Some(password) = config.get_password() {
            let password = String::from_utf8_lossy(password).replace('\'', "\\'");
            url.push_str(&format!(" password='{password}'"));
        }
        CutProxy {
            url,
            port: local,
            shared,
        }
    }

    /// The connection string of the proxy (key-value form).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Cuts the first connection that reaches `cut` from now on.
    pub fn arm(&self, cut: Cut) {
        *self.shared.armed.lock().unwrap() = Some(cut);
    }

    /// Cuts made so far.
    pub fn fired(&self) -> usize {
        self.shared.fired.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Relays one connection in both directions on two threads, parsing each direction into
/// protocol messages to find the armed cut.
fn relay(client: TcpStream, upstream: Upstream, shared: Arc<Shared>) {
    let (Ok(client_reader), Ok(upstream_reader)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let (Ok(client_closer), Ok(upstream_closer)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let closers = Arc::new(Mutex::new(Some((client_closer, upstream_closer))));
    let cut = {
        let closers = Arc::clone(&closers);
        move || {
            if let Some((client, upstream)) = closers.lock().unwrap().take() {
                let _ = client.shutdown(Shutdown::Both);
                upstream.shutdown();
            }
        }
    };
    {
        let (shared, cut) = (Arc::clone(&shared), cut.clone());
        std::thread::spawn(move || {
            // The client's first message (startup) has no type byte.
            pump(client_reader, upstream, true, &cut, |kind, body| {
                kind != b'\0'
                    && shared.fire(|c| match c {
                        Cut::Request(text) => contains(body, text.as_bytes()),
                        Cut::Reply(_) => false,
                    })
            });
            cut();
        });
    }
    std::thread::spawn(move || {
        pump(upstream_reader, client, false, &cut, |kind, body| {
            kind == b'C'
                && shared.fire(|c| match c {
                    Cut::Reply(tag) => body.starts_with(tag.as_bytes()),
                    Cut::Request(_) => false,
                })
        });
        cut();
    });
}

/// Copies whole messages from `from` to `to` until either fails or `cuts(type, body)` says
/// to cut before one (the type is `\0` for the untyped startup message).
fn pump(
    mut from: impl Read,
    mut to: impl Write,
    startup: bool,
    cut: &dyn Fn(),
    cuts: impl Fn(u8, &[u8]) -> bool,
) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut untyped = startup;
    loop {
        // Every whole message in the buffer, in order.
        loop {
            let header = if untyped { 4 } else { 5 };
            if buffer.len() < header {
                break;
            }
            let at = header - 4;
            let len =
                u32::from_be_bytes([buffer[at], buffer[at + 1], buffer[at + 2], buffer[at + 3]]);
            let total = at + len as usize;
            if buffer.len() < total {
                break;
            }
            let kind = if untyped { b'\0' } else { buffer[0] };
            if cuts(kind, &buffer[header..total]) {
                cut();
                return;
            }
            if to.write_all(&buffer[..total]).is_err() {
                return;
            }
            buffer.drain(..total);
            untyped = false;
        }
        match from.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
