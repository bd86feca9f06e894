//! A private PostgreSQL server for the tests that need a real one.
//!
//! The suite's test binary (`tests/suite/`) includes this module through `tests/common/` and
//! lists its PostgreSQL-only tests as cases (`engines::Case::postgres`), which its `main` runs
//! against one server it starts for the binary, the one its `postgres` engine uses. Another
//! test binary (`harness = false` in `Cargo.toml`: rq's `cli_postgres`) includes this module
//! with `#[path]` and hands its tests to [`run_suite`], which parses the usual test arguments,
//! starts one server, runs every test against it (each may take its own database with
//! [`PgServer::create_database`]) and stops the server at the end.
//!
//! Where the server comes from:
//!
//! - `RQ_TEST_POSTGRES_URL` set (a tokio-postgres connection string, key-value or URL form, for a
//!   superuser): that server is used as it is; nothing is started or stopped.
//! - Otherwise the harness `initdb`s a cluster in a fresh temporary directory and starts it with
//!   `pg_ctl`, listening on a Unix socket only, superuser `rq`, `trust` authentication. The
//!   binaries are looked for in `RQ_TEST_POSTGRES_BIN_DIR` when that is set (a testing override:
//!   point it at a directory without them to see the skip), else in the highest version of
//!   `/usr/lib/postgresql/*/bin` (where Debian installs them), else on `PATH`. PostgreSQL refuses
//!   to run as root: when the tests run as root, the server runs as `nobody`.
//! - No binaries found: every test is reported as ignored and a banner on stderr says why, so
//!   `cargo test` stays green on a machine without PostgreSQL but says so. With
//!   `RQ_TEST_REQUIRE_POSTGRES=1` (CI sets it) a missing server is a failure instead.
//!
//! Everything else that goes wrong (initdb or pg_ctl failing, a query failing) is a panic carrying
//! the command's output and the tail of the server log.
//!
//! A test that kills or restarts the server ([`PgServer::kill_9`], [`PgServer::restart`]) must
//! not do it to the server the other tests of its binary share: the suite's `main`
//! (`tests/common/engines.rs`) gives such a test ([`Needs::OwnCluster`]) a cluster of its own, started for
//! it alone and stopped after it. Those tests need a server this harness starts: with
//! `RQ_TEST_POSTGRES_URL` set they are reported as ignored, with the reason, and a banner on
//! stderr says so.
//!
//! [`pair::Pair`] (`pair.rs`) starts a primary and a synchronous standby from the same
//! binaries, for the failover test (`engines::Case::postgres_pair`): it kills, promotes and
//! rebuilds its nodes, so it too runs only on servers this harness starts.
#![allow(dead_code, unreachable_pub)]

use std::fmt;
use std::fs;
use std::future::Future;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};

pub mod pair;
pub mod proxy;

/// What went wrong with a server command `what` (its status and output), or `None` if it
/// succeeded.
fn command_failure(what: &str, output: std::io::Result<Output>) -> Option<String> {
    match output {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "{what} failed ({}):\n--- stderr\n{}\n--- stdout\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end(),
            String::from_utf8_lossy(&output.stdout).trim_end()
        )),
        Err(e) => Some(format!("{what} could not be run: {e}")),
    }
}

/// The connection string of an existing server to use instead of starting one.
pub const URL_VAR: &str = "RQ_TEST_POSTGRES_URL";
/// `1`: a missing PostgreSQL is a failure, not a skip.
pub const REQUIRE_VAR: &str = "RQ_TEST_REQUIRE_POSTGRES";
/// The directory holding `initdb` and `pg_ctl`, instead of looking for them.
pub const BIN_DIR_VAR: &str = "RQ_TEST_POSTGRES_BIN_DIR";

/// The superuser the harness's cluster is created with.
pub const SUPERUSER: &str = "rq";
/// The port of the harness's server: only the name of its socket file, in a private directory.
const PORT: u16 = 5432;
/// The longest Unix socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

const MISSING_ADVICE: &str = "install them with `apt-get install postgresql`, \
                              or point RQ_TEST_POSTGRES_URL at a server";

/// Why the PostgreSQL tests cannot run here: no server to run them against.
#[derive(Debug, Clone)]
pub struct Skip {
    /// What is missing and how to provide it, for a person to read.
    pub reason: String,
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// A PostgreSQL server for the tests: one this harness started (and stops on drop), or the one
/// `RQ_TEST_POSTGRES_URL` names.
#[derive(Debug)]
pub struct PgServer {
    url: String,
    /// `None` when the server is an existing one from `RQ_TEST_POSTGRES_URL`.
    cluster: Option<Cluster>,
}

/// A cluster this harness created and started.
#[derive(Debug)]
struct Cluster {
    pg_ctl: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    /// The unprivileged `(uid, gid)` the server runs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
    /// The standard input of the cluster's watchdog, a shell that waits for it to close
    /// and then stops the server (SIGQUIT: an immediate shutdown) and removes the directory.
    /// It closes when the cluster is dropped, and also when the test process ends without
    /// dropping it (`std::process::exit`, a panic that aborts, SIGKILL): no test leaves a
    /// server running.
    watchdog: Option<(std::process::ChildStdin, std::process::Child)>,
    /// Removed (with the data) after the server has stopped: the last field, dropped last.
    dir: tempfile::TempDir,
}

impl PgServer {
    /// Starts a private server, or uses the one `RQ_TEST_POSTGRES_URL` names.
    ///
    /// Returns [`Skip`] when there are no server binaries, unless `RQ_TEST_REQUIRE_POSTGRES=1`,
    /// which makes that a panic. Panics when the server binaries are there but fail.
    pub fn start() -> Result<PgServer, Skip> {
        match Self::try_start() {
            Err(skip) if postgres_required() => {
                panic!("{skip} ({REQUIRE_VAR}=1 makes a missing PostgreSQL a failure)")
            }
            result => result,
        }
    }

    /// Starts a private cluster of the caller's own, whatever `RQ_TEST_POSTGRES_URL` says: for
    /// a test that kills or restarts its server. [`Skip`] and panics as [`start`](Self::start).
    pub fn start_cluster() -> Result<PgServer, Skip> {
        match find_bin_dir() {
            Ok(bin_dir) => Ok(Cluster::start(&bin_dir)),
            Err(skip) if postgres_required() => {
                panic!("{skip} ({REQUIRE_VAR}=1 makes a missing PostgreSQL a failure)")
            }
            Err(skip) => Err(skip),
        }
    }

    fn try_start() -> Result<PgServer, Skip> {
        if let Some(url) = external_url() {
            return Ok(PgServer { url, cluster: None });
        }
        let bin_dir = find_bin_dir()?;
        Ok(Cluster::start(&bin_dir))
    }

    /// The connection string of the server's `postgres` database, as superuser, in
    /// tokio-postgres's key-value form when this harness started the server (for example
    /// `host='/tmp/rq-pg-x/sock' port=5432 user='rq' dbname='postgres'`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A store on this server, in `schema`.
    #[cfg(feature = "postgres")]
    pub fn store(&self, schema: &str) -> reliable_queue::Store {
        reliable_queue::Store::builder()
            .postgres(self.url())
            .postgres_schema(schema)
            .open()
            .expect("connect to the test server")
    }

    /// Whether this harness started the server (rather than using `RQ_TEST_POSTGRES_URL`).
    pub fn started_here(&self) -> bool {
        self.cluster.is_some()
    }

    /// The data directory of the server this harness started.
    pub fn data_dir(&self) -> Option<&Path> {
        self.cluster.as_ref().map(|c| c.data_dir.as_path())
    }

    /// The unprivileged uid the server runs as when this harness started it as root
    /// (`None`: it runs as the tests' own user, or was not started here).
    pub fn run_as_uid(&self) -> Option<u32> {
        self.cluster
            .as_ref()
            .and_then(|c| c.run_as)
            .map(|(uid, _)| uid)
    }

    /// Creates the database `name` and returns the connection string for it.
    ///
    /// `name` is ASCII letters, digits and `_` (it is used as given, case included). On a server
    /// from `RQ_TEST_POSTGRES_URL`, a database of that name left by an earlier run is dropped
    /// first; on the harness's own server it must not exist yet. Panics on failure.
    pub fn create_database(&self, name: &str) -> String {
        assert!(
            !name.is_empty()
                && name.len() <= 63
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !matches!(name, "postgres" | "template0" | "template1"),
            "create_database({name:?}): want 1 to 63 ASCII letters, digits or `_`, \
             and not a database PostgreSQL relies on"
        );
        let drop_first = !self.started_here();
        block_on(async {
            let client = connect(&self.url).await;
            if drop_first {
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
                    .await
                    .unwrap_or_else(|e| panic!("dropping the leftover database {name:?}: {e:?}"));
            }
            client
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .await
                .unwrap_or_else(|e| panic!("creating the database {name:?}: {e:?}"));
        });
        with_dbname(&self.url, name)
    }
}

/// What [`PgServer::kill_9`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Killed {
    /// The postmaster's pid, `None` when there was no `postmaster.pid` to read it from and the
    /// server was stopped with `pg_ctl stop -m immediate` instead.
    pub postmaster: Option<u32>,
    /// The postmaster's child processes (backends, auxiliary processes) seen just before the
    /// kill, all waited for.
    pub children: usize,
}

/// How long [`PgServer::kill_9`] and [`PgServer::restart`] wait for the server's processes.
const KILL_RESTART_DEADLINE: Duration = Duration::from_secs(60);

impl PgServer {
    /// The server's postmaster, from the first line of `<data_dir>/postmaster.pid` (`None`:
    /// not started here, or no such file: not running).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let cluster = self.cluster.as_ref()?;
        let text = fs::read_to_string(cluster.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Kills the server the hard way: `SIGKILL` to the postmaster, which leaves its backends to
    /// notice its death and exit by themselves, and PostgreSQL to run crash recovery at the
    /// next start. Returns once the postmaster and every child it had are gone (exited; a
    /// zombie not yet reaped counts as gone), or panics after a minute. Without a
    /// `postmaster.pid` (which should not happen to a running server) it falls back to
    /// `pg_ctl stop -m immediate`.
    ///
    /// Panics on a server this harness did not start (`RQ_TEST_POSTGRES_URL`).
    pub fn kill_9(&self) -> Killed {
        let cluster = self.own_cluster("kill_9");
        let Some(pid) = self.postmaster_pid() else {
            let stop = cluster
                .command(&cluster.pg_ctl)
                .arg("-D")
                .arg(&cluster.data_dir)
                .args(["-m", "immediate", "-w", "-t", "60", "stop"])
                .output();
            cluster.check_ran("pg_ctl stop -m immediate", stop);
            return Killed {
                postmaster: None,
                children: 0,
            };
        };
        let postmaster = Process::of(pid).unwrap_or_else(|| {
            panic!(
                "kill_9: the postmaster {pid} of postmaster.pid is not running\n\
                 --- server log, last lines\n{}",
                cluster.log_tail()
            )
        });
        let children = Process::children_of(pid);
        // std has no kill(2) for another process without `unsafe`; kill(1) does it.
        let kill = Command::new("kill")
            .args(["-s", "KILL", &pid.to_string()])
            .output();
        cluster.check_ran("kill -s KILL <postmaster>", kill);
        let deadline = Instant::now() + KILL_RESTART_DEADLINE;
        for process in std::iter::once(&postmaster).chain(&children) {
            while process.alive() {
                assert!(
                    Instant::now() < deadline,
                    "kill_9: process {} ({}) of the killed server is still alive after {:?}",
                    process.pid,
                    process.comm,
                    KILL_RESTART_DEADLINE
                );
                // A polling interval, bounded by the deadline above.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Killed {
            postmaster: Some(pid),
            children: children.len(),
        }
    }

    /// Starts the server again after [`kill_9`](Self::kill_9) (or a stop): `pg_ctl start -w`,
    /// which returns once crash recovery is done and the server accepts connections. Same
    /// data directory, socket and settings, so [`url`](Self::url) is unchanged.
    ///
    /// The lock files a killed postmaster leaves (`postmaster.pid`, the socket's `.lock`) are
    /// removed first when the postmaster they name is dead: PostgreSQL does that itself once
    /// the dead process is reaped, but takes a zombie not yet reaped (PID 1 of a container may
    /// be slow to reap) for a live server. A start refused because a backend of the killed
    /// server (forked after `kill_9` looked) still holds the shared memory is tried again, for
    /// up to a minute; then it panics with pg_ctl's output and the server log.
    ///
    /// Panics on a server this harness did not start (`RQ_TEST_POSTGRES_URL`), and on one
    /// that is running.
    pub fn restart(&self) {
        let cluster = self.own_cluster("restart");
        if let Some(pid) = self
            .postmaster_pid()
            .filter(|&pid| Process::of(pid).is_some())
        {
            panic!("restart: the server is running (postmaster {pid}); kill_9 it first");
        }
        let deadline = Instant::now() + KILL_RESTART_DEADLINE;
        loop {
            // The lock files of the data directory and of the socket, stale once the
            // postmaster they name has exited.
            for lock in [
                cluster.data_dir.join("postmaster.pid"),
                cluster
                    .dir
                    .path()
                    .join("sock")
                    .join(format!(".s.PGSQL.{PORT}.lock")),
            ] {
                let pid = fs::read_to_string(&lock)
                    .ok()
                    .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok());
                if pid.is_some_and(|pid| Process::of(pid).is_none()) {
                    let _ = fs::remove_file(&lock);
                }
            }
            let start = cluster
                .command(&cluster.pg_ctl)
                .arg("-D")
                .arg(&cluster.data_dir)
                .arg("-l")
                .arg(&cluster.log_file)
                .args(["-w", "-t", "60", "start"])
                .output();
            match start {
                Ok(output) if output.status.success() => return,
                Ok(output) if Instant::now() < deadline => {
                    let log = cluster.log_tail();
                    eprintln!(
                        "    restart: pg_ctl start failed ({}), trying again: {}; the server \
                         log ends with: {}",
                        output.status,
                        String::from_utf8_lossy(&output.stderr).trim_end(),
                        log.lines().last().unwrap_or_default()
                    );
                    // A backoff between attempts, bounded by the deadline.
                    std::thread::sleep(Duration::from_millis(100));
                }
                failed => {
                    cluster.check("pg_ctl start (restart)", failed, true);
                    unreachable!("check panics on a failed start");
                }
            }
        }
    }

    fn own_cluster(&self, what: &str) -> &Cluster {
        self.cluster.as_ref().unwrap_or_else(|| {
            panic!(
                "{what}: the server is an existing one ({URL_VAR}), not one this harness \
                 started: run the test with Needs::OwnCluster"
            )
        })
    }
}

/// A process seen in `/proc`: its pid and start time (which tell it from a later process that
/// reuses the pid) and its name.
#[derive(Debug)]
struct Process {
    pid: u32,
    start_time: u64,
    comm: String,
}

impl Process {
    /// The process `pid` if it is alive (not exited, not a zombie).
    fn of(pid: u32) -> Option<Process> {
        let (process, _) = Self::read(pid)?;
        process.alive().then_some(process)
    }

    /// `pid`'s `/proc/<pid>/stat`: the process and its parent, `None` when it is gone.
    fn read(pid: u32) -> Option<(Process, u32)> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ... starttime(22) ...": comm may hold anything but the last ')'.
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let comm = stat.get(open + 1..close)?.to_owned();
        let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
        // fields[0] is field 3 (state): field n is fields[n - 3].
        let ppid = fields.get(1)?.parse().ok()?;
        let start_time = fields.get(19)?.parse().ok()?;
        Some((
            Process {
                pid,
                start_time,
                comm,
            },
            ppid,
        ))
    }

    /// The living children of `parent`.
    fn children_of(parent: u32) -> Vec<Process> {
        fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(Self::read)
            .filter(|(process, ppid)| *ppid == parent && process.alive())
            .map(|(process, _)| process)
            .collect()
    }

    /// Still running: in `/proc`, the same process (start time), and not a zombie.
    fn alive(&self) -> bool {
        let Ok(stat) = fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let Some(after) = stat.rfind(')').and_then(|close| stat.get(close + 1..)) else {
            return false;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        let state = fields.first().copied().unwrap_or("X");
        let same = fields
            .get(19)
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| t == self.start_time);
        same && !matches!(state, "Z" | "X" | "x")
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(cluster) = &self.cluster {
            // Not after a `kill_9` that no `restart` followed (a failed test): nothing to stop.
            let dead = Path::new("/proc/self").exists()
                && self.postmaster_pid().and_then(Process::of).is_none();
            if !dead {
                cluster.stop();
            }
        }
        if let Some((stdin, mut watchdog)) = self.cluster.as_mut().and_then(|c| c.watchdog.take()) {
            // Its cue: it removes the directory (and would stop a server still running).
            drop(stdin);
            let _ = watchdog.wait();
        }
    }
}

impl Cluster {
    /// `initdb` a cluster in a fresh temporary directory and start it; panics on failure.
    fn start(bin_dir: &Path) -> PgServer {
        let run_as = if running_as_root() {
            Some(unprivileged_user())
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("rq-pg-")
            .tempdir_in(temp_base(run_as.is_some()))
            .unwrap_or_else(|e| panic!("creating a temporary directory for PostgreSQL: {e}"));
        let data_dir = dir.path().join("data");
        let socket_dir = dir.path().join("sock");
        let log_file = dir.path().join("server.log");
        fs::create_dir(&data_dir).expect("create the data directory");
        fs::create_dir(&socket_dir).expect("create the socket directory");
        fs::write(&log_file, "").expect("create the server log");
        if let Some((uid, gid)) = run_as {
            // The unprivileged server must get through the directory tempfile made 0700, and
            // own what it writes.
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
                .expect("make the temporary directory traversable");
            for path in [&data_dir, &socket_dir, &log_file] {
                chown(path, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {} to {uid}:{gid}: {e}", path.display()));
            }
        }
        let mut cluster = Cluster {
            pg_ctl: bin_dir.join("pg_ctl"),
            data_dir,
            log_file,
            run_as,
            watchdog: None,
            dir,
        };
        cluster.watchdog = Some(cluster.watchdog());

        let initdb = cluster
            .command(&bin_dir.join("initdb"))
            .arg("-D")
            .arg(&cluster.data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8"])
            // Independent of the locales this machine has.
            .args(["--locale=C", "--no-sync"])
            .output();
        cluster.check("initdb", initdb, false);

        // Settings in the configuration file rather than on pg_ctl's command line, which goes
        // through a shell. The socket directory is private, so the port cannot collide.
        let settings = format!(
            "\n# Added by the reliable-queue test harness.\n\
             listen_addresses = ''\n\
             unix_socket_directories = '{}'\n\
             port = {PORT}\n\
             fsync = off\n\
             full_page_writes = off\n",
            conf_quote(&socket_dir)
        );
        let conf = cluster.data_dir.join("postgresql.conf");
        let mut text =
            fs::read_to_string(&conf).unwrap_or_else(|e| panic!("reading {}: {e}", conf.display()));
        text.push_str(&settings);
        fs::write(&conf, text).unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));

        let socket_file = socket_dir.join(format!(".s.PGSQL.{PORT}"));
        assert!(
            socket_file.as_os_str().len() <= MAX_SOCKET_PATH,
            "the server's socket path {} is longer than the {MAX_SOCKET_PATH} bytes Unix allows: \
             set TMPDIR to a shorter directory",
            socket_file.display()
        );

        // `-w`: pg_ctl returns once the server accepts connections (or has failed).
        let start = cluster
            .command(&cluster.pg_ctl)
            .arg("-D")
            .arg(&cluster.data_dir)
            .arg("-l")
            .arg(&cluster.log_file)
            .args(["-w", "-t", "120", "start"])
            .output();
        cluster.check("pg_ctl start", start, true);

        let url = format!(
            "host='{}' port={PORT} user='{SUPERUSER}' dbname='postgres'",
            kv_quote(&socket_dir.to_string_lossy())
        );
        PgServer {
            url,
            cluster: Some(cluster),
        }
    }

    /// Starts the watchdog (see [`Cluster::watchdog`]'s field) and returns its standard
    /// input. It runs as the tests' own user, which may signal the server and remove the
    /// directory.
    fn watchdog(&self) -> (std::process::ChildStdin, std::process::Child) {
        const SCRIPT: &str = "cat >/dev/null; \
             pid=$(head -n 1 \"$1/postmaster.pid\" 2>/dev/null); \
             if [ -n \"$pid\" ] && kill -QUIT \"$pid\" 2>/dev/null; then \
               n=0; while kill -0 \"$pid\" 2>/dev/null && [ $n -lt 600 ]; do \
                 sleep 0.1; n=$((n + 1)); done; \
             fi; \
             rm -rf \"$2\"";
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("rq-pg-watchdog")
            .arg(&self.data_dir)
            .arg(self.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the test server's watchdog: {e}"));
        let stdin = child.stdin.take().expect("the watchdog's standard input");
        (stdin, child)
    }

    /// A command run as the user the server runs as, from the temporary directory (the
    /// unprivileged user may not be able to read the current one).
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.run_as {
            // std drops the supplementary groups when it switches from root.
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Panics with the command's output and the server log's tail unless it succeeded. A failed
    /// start may leave a server running (pg_ctl timed out): `stop_on_failure` stops it first.
    fn check(&self, what: &str, output: std::io::Result<Output>, stop_on_failure: bool) {
        let Some(failure) = command_failure(what, output) else {
            return;
        };
        if stop_on_failure {
            let _ = self
                .command(&self.pg_ctl)
                .arg("-D")
                .arg(&self.data_dir)
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
        panic!(
            "starting the test PostgreSQL server: {failure}\n--- server log ({}), last lines\n{}",
            self.log_file.display(),
            self.log_tail()
        );
    }

    /// Panics with the command's output and the server log's tail unless it succeeded (for
    /// commands on a running server, not its start).
    fn check_ran(&self, what: &str, output: std::io::Result<Output>) {
        let Some(failure) = command_failure(what, output) else {
            return;
        };
        panic!(
            "{failure}\n--- server log ({}), last lines\n{}",
            self.log_file.display(),
            self.log_tail()
        );
    }

    /// Stops the server, waiting until it has exited. Reports a failure without panicking: this
    /// runs in `drop`.
    fn stop(&self) {
        let stop = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "120", "stop"])
            .output();
        let failure = match stop {
            Ok(output) if output.status.success() => return,
            Ok(output) => format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            ),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "==> stopping the test PostgreSQL server ({}) failed: {failure}\n\
             --- server log, last lines\n{}",
            self.data_dir.display(),
            self.log_tail()
        );
    }

    fn log_tail(&self) -> String {
        match fs::read_to_string(&self.log_file) {
            Ok(log) => {
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            }
            Err(e) => format!("(cannot read it: {e})"),
        }
    }
}

/// A test of the suite: it gets the shared server, or its own cluster ([`Needs`]).
pub type TestFn = fn(&PgServer);

/// What server a PostgreSQL test of the suite runs against (`tests/common/engines.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The server the suite's tests share (this harness's, or `RQ_TEST_POSTGRES_URL`'s).
    SharedServer,
    /// A cluster of the test's own, which it may kill and restart: started by this harness
    /// for that test alone (whatever `RQ_TEST_POSTGRES_URL` says) and stopped after it, so
    /// that such tests run side by side with the others. With `RQ_TEST_POSTGRES_URL` set the
    /// test is reported as ignored, with the reason: a server this harness did not start is
    /// not its to kill, and the binaries may not even be on this machine.
    OwnCluster,
}

/// Why an [`Needs::OwnCluster`] test does not run against `RQ_TEST_POSTGRES_URL`'s server.
pub const OWN_CLUSTER_SKIP: &str = "kills and restarts its server, so needs a cluster this \
                                harness starts; RQ_TEST_POSTGRES_URL names an existing server";

/// Runs `tests` as a libtest-style suite against one [`PgServer`] and returns the exit code for
/// `main` (the suite's binary runs its PostgreSQL tests with `tests/common/engines.rs`
/// instead, beside the conformance suite, with [`Needs`]).
///
/// Takes the usual test arguments (a name filter, `--exact`, `--skip`, `--list`, `--ignored`,
/// `--test-threads`, ...). The server is started once, only when some test is going to run, and
/// shared by the tests, which run on several threads; a panicking test fails. When there is no
/// server ([`Skip`]), every test is reported as ignored and a banner on stderr says why.
pub fn run_suite(tests: Vec<(&'static str, TestFn)>) -> ExitCode {
    run_server_suite("PostgreSQL", PgServer::start, tests)
}

/// A named test of a server harness `S`.
pub type ServerTest<S> = (&'static str, fn(&S));

/// [`run_suite`] for any server harness: `kind` names the server in the banners, `start`
/// starts it (or says why it cannot).
pub fn run_server_suite<S: Send + Sync + 'static, E: fmt::Display>(
    kind: &'static str,
    start: impl FnOnce() -> Result<S, E>,
    tests: Vec<ServerTest<S>>,
) -> ExitCode {
    let mut args = Arguments::from_args();
    // Filled in before the trials run; the trials only read it.
    let server: Arc<OnceLock<S>> = Arc::new(OnceLock::new());
    let mut trials: Vec<Trial> = tests
        .into_iter()
        .map(|(name, test)| {
            let server = Arc::clone(&server);
            Trial::test(name, move || {
                let server = server
                    .get()
                    .ok_or_else(|| Failed::from(format!("no {kind} server was started")))?;
                test(server);
                Ok(())
            })
        })
        .collect();

    let will_run = trials
        .iter()
        .any(|t| !args.is_filtered_out(t) && !args.is_ignored(t));
    let mut skipped = None;
    if !args.list && will_run {
        match start() {
            Ok(started) => {
                if server.set(started).is_err() {
                    unreachable!("the server is set once");
                }
            }
            Err(skip) => {
                eprintln!("\n==> {kind} tests SKIPPED: {skip}\n");
                trials = trials
                    .into_iter()
                    .map(|t| t.with_ignored_flag(true))
                    .collect();
                // Without a server even `--ignored`/`--include-ignored` cannot run them.
                args.ignored = false;
                args.include_ignored = false;
                skipped = Some(skip.to_string());
            }
        }
    }

    let conclusion = libtest_mimic::run(&args, trials);

    if let Some(skip) = skipped {
        // Again after the summary, where it is seen.
        eprintln!("==> {kind} tests SKIPPED: {skip}\n");
    }
    // The trials, and their references to the server, are gone: this stops it.
    match Arc::into_inner(server) {
        Some(server) => drop(server),
        None => eprintln!("==> the test {kind} server is still referenced: not stopped"),
    }
    conclusion.exit_code()
}

/// The runtime the PostgreSQL benches drive their clients on: multi-thread, two workers
/// (the machine's cores), with IO and timers.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Turns on what the harness turns off for speed (`fsync`, `full_page_writes`) and
/// `synchronous_commit`, for figures of the durable configuration a user runs (a bench's),
/// and checks that a new session sees them. Panics on failure.
pub async fn make_durable(url: &str) {
    let admin = connect(url).await;
    for statement in [
        "ALTER SYSTEM SET fsync = on",
        "ALTER SYSTEM SET full_page_writes = on",
        "ALTER SYSTEM SET synchronous_commit = on",
        "SELECT pg_reload_conf()",
    ] {
        admin
            .batch_execute(statement)
            .await
            .expect("make the bench server durable");
    }
    let check = connect(url).await;
    for setting in ["fsync", "synchronous_commit"] {
        let row = check
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap_or_else(|e| panic!("SHOW {setting}: {e}"));
        assert_eq!(row.get::<_, String>(0), "on", "{setting} on the server");
    }
}

/// Runs `future` to completion on a current-thread tokio runtime (with IO and timers), the way a
/// test drives tokio-postgres.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime")
        .block_on(future)
}

/// Connects to `url` and spawns the connection's task on the current tokio runtime; panics
/// when the connection fails.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to PostgreSQL at {url:?}: {e:?}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("PostgreSQL connection error: {e}");
        }
    });
    client
}

/// The watch locks of `schema`'s listeners on the server at `url` (see `LockKeys` in the
/// engine: FNV-1a of the schema's name, the top bits cleared, then bit 30 set): one per queue
/// some store has consumers waiting on. Panics when the query fails.
pub fn watched_queues(url: &str, schema: &str) -> i64 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in schema.bytes() {
        hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let key = i64::from((hash & 0x3fff_ffff) | 0x4000_0000);
    block_on(async {
        connect(url)
            .await
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND classid::int8 = $1 AND objsubid = 2 AND granted",
                &[&key],
            )
            .await
            .unwrap_or_else(|e| panic!("reading the watch locks of {schema:?}: {e:?}"))
            .get(0)
    })
}

/// `RQ_TEST_POSTGRES_URL`, when set to something.
pub fn external_url() -> Option<String> {
    std::env::var(URL_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
}

fn postgres_required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The directory holding `initdb` and `pg_ctl`: `RQ_TEST_POSTGRES_BIN_DIR`, else the highest
/// version under `/usr/lib/postgresql/*/bin`, else `PATH`.
fn find_bin_dir() -> Result<PathBuf, Skip> {
    if let Some(dir) = std::env::var_os(BIN_DIR_VAR) {
        let dir = PathBuf::from(dir);
        return if has_server_binaries(&dir) {
            Ok(dir)
        } else {
            Err(Skip {
                reason: format!(
                    "PostgreSQL server binaries not found (looked in {BIN_DIR_VAR}={}): \
                     {MISSING_ADVICE}",
                    dir.display()
                ),
            })
        };
    }
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for entry in fs::read_dir("/usr/lib/postgresql").into_iter().flatten() {
        let Ok(entry) = entry else { continue };
        // "15", or "9.6" for the old ones.
        let Some(version) = entry.file_name().to_str().and_then(|name| {
            name.split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
        }) else {
            continue;
        };
        let bin = entry.path().join("bin");
        if has_server_binaries(&bin) && best.as_ref().is_none_or(|(v, _)| version > *v) {
            best = Some((version, bin));
        }
    }
    if let Some((_, bin)) = best {
        return Ok(bin);
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|dir| has_server_binaries(dir)) {
            return Ok(dir);
        }
    }
    Err(Skip {
        reason: format!(
            "PostgreSQL server binaries not found (looked in /usr/lib/postgresql/*/bin and PATH): \
             {MISSING_ADVICE}"
        ),
    })
}

fn has_server_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl"].iter().all(|name| {
        fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

fn running_as_root() -> bool {
    // /proc/self belongs to the process's effective uid.
    if let Ok(meta) = fs::metadata("/proc/self") {
        return meta.uid() == 0;
    }
    let out = Command::new("id")
        .arg("-u")
        .output()
        .unwrap_or_else(|e| panic!("cannot tell whether the tests run as root: `id -u`: {e}"));
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// `nobody`'s uid and gid, from /etc/passwd.
fn unprivileged_user() -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd")
        .unwrap_or_else(|e| panic!("reading /etc/passwd to find the user `nobody`: {e}"));
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields[..] {
                ["nobody", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        })
        .expect(
            "the tests run as root, which PostgreSQL refuses, and there is no user `nobody` \
             in /etc/passwd to run it as",
        )
}

/// Where to make the temporary directory: the usual one, unless the server's unprivileged user
/// could not get to it (as root) or its socket path would be too long; then `/tmp`.
fn temp_base(for_other_user: bool) -> PathBuf {
    let base = std::env::temp_dir();
    let traversable = !for_other_user
        || base
            .ancestors()
            .all(|dir| fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    // "/rq-pg-XXXXXX/sock/.s.PGSQL.5432" is 32 bytes.
    if traversable && base.as_os_str().len() + 32 <= MAX_SOCKET_PATH {
        base
    } else {
        PathBuf::from("/tmp")
    }
}

/// `path` as a single-quoted postgresql.conf value's contents.
fn conf_quote(path: &Path) -> String {
    path.to_string_lossy().replace('\'', "''")
}

/// `value` as a single-quoted key-value connection string value's contents.
fn kv_quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

/// `url` pointed at the database `dbname` (a name [`PgServer::create_database`] accepts).
fn with_dbname(url: &str, dbname: &str) -> String {
    let url = url.trim();
    for scheme in ["postgres://", "postgresql://"] {
        if let Some(rest) = url.strip_prefix(scheme) {
            // scheme, authority (up to the first '/' or '?'), then the path, then a query.
            let (before_query, query) = match rest.find('?') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let authority = before_query.split('/').next().unwrap_or_default();
            return format!("{scheme}{authority}/{dbname}{query}");
        }
    }
    // Key-value form: the last of repeated keys wins.
    format!("{url} dbname='{dbname}'")
}
