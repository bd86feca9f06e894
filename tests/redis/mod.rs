//! The Redis test harness: a private `redis-server` for a test binary, or the server
//! `RQ_TEST_REDIS_URL` names.
//!
//! - `RQ_TEST_REDIS_URL` set (a `redis://` or `redis+unix://` URL): the tests use that server,
//!   each store in a namespace of its own (`<binary>_<n>`, whose keys an earlier run left are
//!   deleted first).
//! - Otherwise the harness starts Debian's `redis-server` (looked for on `PATH`, then in
//!   `/usr/bin`) on a Unix socket in a temporary directory, with `appendonly yes` and
//!   `appendfsync always` (every acknowledged write on disk), and stops it at the end.
//! - With neither, the Redis tests are reported as ignored with the reason, and a banner
//!   says so; with `RQ_TEST_REQUIRE_REDIS=1` (CI sets it) a missing server is a failure.
//!
//! The server runs under a watchdog shell that kills it when the test process's end closes
//! the watchdog's standard input, however the process ends: no test leaves a server running.

#![allow(dead_code, unreachable_pub)] // each test binary and bench uses a part

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// Names an existing server for the tests.
pub const URL_VAR: &str = "RQ_TEST_REDIS_URL";
/// `1` makes a missing server a failure.
pub const REQUIRE_VAR: &str = "RQ_TEST_REQUIRE_REDIS";

/// Why there is no server: no `redis-server` and no `RQ_TEST_REDIS_URL`.
pub const MISSING: &str = "redis-server not found: install Debian's redis-server package, \
                           or point RQ_TEST_REDIS_URL at a server";

/// A Redis server for tests.
pub struct RedisServer {
    url: String,
    own: Option<Own>,
}

/// A server this harness started.
struct Own {
    binary: PathBuf,
    socket: PathBuf,
    /// The running server's pid and its watchdog (whose stdin's end kills it).
    running: Mutex<Option<(u32, ChildStdin, Child)>>,
    /// Removed (with the data) after the server has stopped: the last field, dropped last.
    dir: tempfile::TempDir,
}

fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

impl RedisServer {
    /// Starts a private server, or uses the one `RQ_TEST_REDIS_URL` names; `Err` with the
    /// reason when there is neither (a panic with `RQ_TEST_REQUIRE_REDIS=1`).
    pub fn start() -> Result<RedisServer, String> {
        if let Ok(url) = std::env::var(URL_VAR) {
            return Ok(RedisServer { url, own: None });
        }
        Self::start_own()
    }

    /// Starts a private server whatever `RQ_TEST_REDIS_URL` says: for a test that kills or
    /// restarts its server.
    pub fn start_own() -> Result<RedisServer, String> {
        let Some(binary) = find_binary() else {
            if required() {
                panic!("{MISSING} ({REQUIRE_VAR}=1 makes a missing Redis a failure)");
            }
            return Err(MISSING.to_owned());
        };
        let dir = tempfile::Builder::new()
            .prefix("rq-redis-")
            .tempdir()
            .expect("a temporary directory for the Redis server");
        let socket = dir.path().join("redis.sock");
        let own = Own {
            binary,
            socket: socket.clone(),
            running: Mutex::new(None),
            dir,
        };
        own.launch();
        Ok(RedisServer {
            url: format!("redis+unix://{}", socket.display()),
            own: Some(own),
        })
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this harness started the server (else `RQ_TEST_REDIS_URL` names it).
    pub fn started_here(&self) -> bool {
        self.own.is_some()
    }

    /// The data directory (the append-only file is under it).
    pub fn data_dir(&self) -> Option<&Path> {
        self.own.as_ref().map(|o| o.dir.path())
    }

    /// Kills the server with SIGKILL and waits until it no longer answers. Panics on a server
    /// this harness did not start.
    pub fn kill_9(&self) {
        let own = self.own.as_ref().expect("a server this harness started");
        let (pid, stdin, mut watchdog) = own.running.lock().unwrap().take().expect("running");
        let status = Command::new("kill").args(["-9", &pid.to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -9 {pid}");
        // The watchdog reaps it and ends when its stdin closes.
        drop(stdin);
        let _ = watchdog.wait();
        assert!(
            ping(&own.socket).is_err(),
            "the killed server still answers"
        );
    }

    /// Starts the server again on the same data (it replays its append-only file) and waits
    /// until it answers.
    pub fn restart(&self) {
        let own = self.own.as_ref().expect("a server this harness started");
        assert!(own.running.lock().unwrap().is_none(), "kill it first");
        own.launch();
    }

    /// Runs one command on the server (a test's own look at the keys).
    pub fn command(&self, args: &[&[u8]]) -> Reply {
        let socket = match &self.own {
            Some(own) => own.socket.clone(),
            None => PathBuf::from(
                self.url
                    .strip_prefix("redis+unix://")
                    .or_else(|| self.url.strip_prefix("unix://"))
                    .expect("RQ_TEST_REDIS_URL names a Unix socket for the tests' own commands"),
            ),
        };
        let mut stream = UnixStream::connect(&socket).expect("connect to the Redis server");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        stream.write_all(&out).unwrap();
        read_reply(&mut BufReader::new(stream))
    }

    /// The text of `INFO <section>` (empty if the server answers something else).
    fn info(&self, section: &str) -> String {
        match self.command(&[b"INFO", section.as_bytes()]) {
            Reply::Bulk(Some(info)) => String::from_utf8_lossy(&info).into_owned(),
            _ => String::new(),
        }
    }

    /// Clients connected now (`INFO clients`), the one asking among them.
    pub fn connected_clients(&self) -> u64 {
        self.info("clients")
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// CPU seconds the server has used (`INFO cpu`: its threads, user and system).
    pub fn cpu_seconds(&self) -> f64 {
        self.info("cpu")
            .lines()
            .filter_map(|l| {
                let (k, v) = l.trim().split_once(':')?;
                matches!(k, "used_cpu_sys" | "used_cpu_user").then(|| v.parse::<f64>().ok())?
            })
            .sum()
    }

    /// `FCALL`'s calls and µs so far (`INFO commandstats`); `None` before the first.
    pub fn fcall_stats(&self) -> Option<(u64, u64)> {
        let info = self.info("commandstats");
        let line = info.lines().find(|l| l.starts_with("cmdstat_fcall:"))?;
        let field = |name: &str| {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        };
        Some((field("calls")?, field("usec")?))
    }
}

/// A reply of the server, as far as the tests read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

fn read_reply(r: &mut impl BufRead) -> Reply {
    let mut line = String::new();
    r.read_line(&mut line).expect("a reply");
    let line = line.trim_end();
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(rest.parse().unwrap()),
        "$" => {
            let n: i64 = rest.parse().unwrap();
            if n < 0 {
                return Reply::Bulk(None);
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf).unwrap();
            buf.truncate(n as usize);
            Reply::Bulk(Some(buf))
        }
        "*" => {
            let n: i64 = rest.parse().unwrap();
            Reply::Array((0..n.max(0)).map(|_| read_reply(r)).collect())
        }
        other => panic!("unexpected reply kind {other:?}"),
    }
}

/// PING over the socket.
fn ping(socket: &Path) -> std::io::Result<()> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.starts_with("+PONG") {
        Ok(())
    } else {
        Err(std::io::Error::other(line))
    }
}

impl Own {
    /// Starts the server under its watchdog and waits until it answers.
    fn launch(&self) {
        let dir = self.dir.path();
        let _ = std::fs::remove_file(&self.socket);
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(r#""$@" & pid=$!; echo $pid; read _; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null"#)
            .arg("sh")
            .arg(&self.binary)
            .args(["--port", "0", "--unixsocket"])
            .arg(&self.socket)
            .args(["--unixsocketperm", "700", "--dir"])
            .arg(dir)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
                // The log on standard output, after the watchdog's line: read below.
                "--logfile",
                "",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-server");
        let mut out = BufReader::new(watchdog.stdout.take().unwrap());
        let mut pid = String::new();
        out.read_line(&mut pid).expect("the server's pid");
        let pid: u32 = pid.trim().parse().expect("a pid");
        let stdin = watchdog.stdin.take().unwrap();
        *self.running.lock().unwrap() = Some((pid, stdin, watchdog));
        // Waits for the server to say it is ready (after it loaded its append-only file); an
        // end of its output first means it exited.
        let mut log = String::new();
        loop {
            let mut line = String::new();
            match out.read_line(&mut line) {
                Ok(0) | Err(_) => panic!("redis-server exited before it was ready:\n{log}"),
                Ok(_)
                    if line
                        .to_ascii_lowercase()
                        .contains("ready to accept connections") =>
                {
                    break
                }
                Ok(_) => log.push_str(&line),
            }
        }
        assert!(ping(&self.socket).is_ok(), "redis-server is ready: {log}");
        // The rest of its log is drained into a file, so that the pipe never fills.
        let mut file = std::fs::File::create(dir.join("redis.log")).expect("the server's log");
        std::thread::spawn(move || std::io::copy(&mut out, &mut file));
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Some((_, stdin, mut watchdog)) = self.running.lock().unwrap().take() {
            drop(stdin);
            let _ = watchdog.wait();
        }
    }
}
