//! A primary and a synchronous standby, for the failover test (`tests/suite/postgres_failover.rs`).
//!
//! Two nodes, `a` and `b`, each in a directory of its own under one temporary directory,
//! listening on a TCP port of 127.0.0.1 chosen free (a multi-host URL names both) and on a
//! Unix socket in the node's directory. Node `a` is `initdb`ed and started as the primary
//! with `synchronous_standby_names = '*'` in its `postgresql.conf`, which every copy of it
//! inherits, as a configuration shared by the nodes of a real pair would be; node `b` is a
//! `pg_basebackup -R` of it, started as its standby. `synchronous_commit` is on (the default):
//! a commit returns once the standby has flushed it. `fsync` is off, as on the harness's
//! single server: the test kills processes, never the machine, so what was written survives in
//! the kernel's page cache; what the test proves rests on the synchronous standby, not on the
//! primary's disk.
//!
//! What an operator's tool does, one step each: [`Pair::kill_primary`] (SIGKILL to the
//! postmaster and every child, as a machine that dies), [`Pair::promote`] (clears
//! `synchronous_standby_names` on the standby, whose commits would otherwise wait for a standby
//! it does not have, then `pg_ctl promote`), and [`Pair::rebuild_standby`] (the old primary
//! made again from the new one with `pg_basebackup -R` in a fresh data directory, started, made
//! the synchronous standby of the new primary, and caught up).
//!
//! `wal_retrieve_retry_interval` is 100 ms rather than 5 s: a standby whose primary has died
//! retries streaming at that interval, and PostgreSQL 15 serves a promote requested during the
//! wait only at its end (5.1 s from `pg_ctl promote` to the first commit, seen in 5 of 10
//! failovers at the default).
//!
//! Each node's own settings (its port and socket directory) live in `node.conf` in its
//! directory, outside the data directory, which `postgresql.conf` includes by a relative path:
//! a copy made by `pg_basebackup` keeps the settings of the node it is made for, not those of
//! the node it is copied from.
//!
//! As root the servers run as `nobody`, like the harness's single server; a watchdog stops
//! them and removes the directory when the pair is dropped or the test process dies.

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{
    block_on, conf_quote, connect, find_bin_dir, postgres_required, running_as_root, temp_base,
    unprivileged_user, Process, Skip, REQUIRE_VAR, SUPERUSER,
};

/// How long a step of the pair (a start, a promote, a base backup, a standby catching up) may
/// take before the test fails.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// A primary and its synchronous standby on 127.0.0.1 (see the module's documentation).
#[derive(Debug)]
pub struct Pair {
    bin_dir: PathBuf,
    /// The unprivileged `(uid, gid)` the servers run as, when the tests run as root.
    run_as: Option<(u32, u32)>,
    nodes: [Node; 2],
    /// Which of `nodes` is the primary now.
    primary: usize,
    /// Closed on drop (or when the process dies): the watchdog then stops both servers and
    /// removes the directory.
    watchdog: Option<(ChildStdin, Child)>,
    /// Removed after the servers have stopped: the last field, dropped last.
    dir: tempfile::TempDir,
}

/// One node of the pair.
#[derive(Debug)]
struct Node {
    name: &'static str,
    port: u16,
    /// The node's directory: `node.conf`, the socket directory, the log, the data directory.
    home: PathBuf,
    /// The data directory in use: `data-<n>`, a new one for each rebuild.
    data_dir: PathBuf,
    /// Data directories made for this node so far.
    generation: u32,
    log_file: PathBuf,
}

impl Node {
    /// A key-value connection string for `dbname` on this node alone, as superuser, over TCP.
    fn url(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname={dbname}",
            self.port
        )
    }

    fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
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

/// Two ports of 127.0.0.1 free now, below the kernel's ephemeral range. A port the kernel
/// hands out (`bind` to port 0) is in that range, where any client connection of the tests
/// may take it as its local port between the check and the server's start (or while a
/// killed node's port waits for its rebuilt node): the server then fails to start. Below
/// the range only a process that asks for the port by number gets it.
fn free_ports() -> [u16; 2] {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // From a start that differs between test processes, so that two pairs rarely try the
    // same ports first.
    let span = low.saturating_sub(1024).max(1);
    let start = 1024 + u16::try_from(std::process::id() % u32::from(span)).unwrap_or(0);
    let mut found = Vec::new();
    let mut held = Vec::new();
    for offset in 0..span {
        let port = 1024 + (start - 1024 + offset) % span;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            found.push(port);
            held.push(listener);
            if found.len() == 2 {
                return [found[0], found[1]];
            }
        }
    }
    panic!("no two free ports of 127.0.0.1 below {low}")
}

impl Pair {
    /// Starts the pair, or says why it cannot ([`Skip`]: no server binaries, or no
    /// `pg_basebackup`; a panic instead with `RQ_TEST_REQUIRE_POSTGRES=1`). Returns once the
    /// standby streams from the primary as its synchronous standby. Panics when a step fails,
    /// with its output and the server log's tail.
    pub fn start() -> Result<Pair, Skip> {
        let found = find_bin_dir().and_then(|bin_dir| {
            if bin_dir.join("pg_basebackup").is_file() {
                Ok(bin_dir)
            } else {
                Err(Skip {
                    reason: format!(
                        "no pg_basebackup beside initdb in {} (Debian: apt-get install \
                         postgresql-15)",
                        bin_dir.display()
                    ),
                })
            }
        });
        let bin_dir = match found {
            Ok(bin_dir) => bin_dir,
            Err(skip) if postgres_required() => {
                panic!("{skip} ({REQUIRE_VAR}=1 makes a missing PostgreSQL a failure)")
            }
            Err(skip) => return Err(skip),
        };
        let run_as = running_as_root().then(unprivileged_user);
        let dir = tempfile::Builder::new()
            .prefix("rq-pair-")
            .tempdir_in(temp_base(run_as.is_some()))
            .unwrap_or_else(|e| panic!("creating a temporary directory for PostgreSQL: {e}"));
        if run_as.is_some() {
            // The unprivileged servers must get through the directory tempfile made 0700.
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
                .expect("make the temporary directory traversable");
        }
        let ports = free_ports();
        let nodes = [("a", ports[0]), ("b", ports[1])].map(|(name, port)| {
            let home = dir.path().join(name);
            let sock = home.join("sock");
            fs::create_dir_all(&sock).expect("create a node's directories");
            let log_file = home.join("server.log");
            fs::write(&log_file, "").expect("create a node's log");
            fs::write(
                home.join("node.conf"),
                format!(
                    "# This node's own settings, kept out of its data directory.\n\
                     listen_addresses = '127.0.0.1'\n\
                     port = {port}\n\
                     unix_socket_directories = '{}'\n",
                    conf_quote(&sock)
                ),
            )
            .expect("write a node's settings");
            if let Some((uid, gid)) = run_as {
                for path in [&home, &sock, &log_file] {
                    chown(path, Some(uid), Some(gid))
                        .unwrap_or_else(|e| panic!("chown {} to {uid}:{gid}: {e}", path.display()));
                }
            }
            Node {
                name,
                port,
                data_dir: home.join("data-0"),
                home,
                generation: 0,
                log_file,
            }
        });
        let mut pair = Pair {
            bin_dir,
            run_as,
            nodes,
            primary: 0,
            watchdog: None,
            dir,
        };
        pair.watchdog = Some(pair.watchdog());

        let a = &pair.nodes[0];
        let initdb = pair
            .command("initdb")
            .arg("-D")
            .arg(&a.data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"])
            .output();
        pair.check(0, "initdb", initdb);
        // Shared by every copy (see the module's documentation); `node.conf` last, so that
        // the node's own settings win.
        let conf = a.data_dir.join("postgresql.conf");
        let mut text =
            fs::read_to_string(&conf).unwrap_or_else(|e| panic!("reading {}: {e}", conf.display()));
        text.push_str(
            "\n# Added by the reliable-queue test harness (a primary and a synchronous standby).\n\
             fsync = off\n\
             synchronous_commit = on\n\
             synchronous_standby_names = '*'\n\
             wal_level = replica\n\
             max_wal_senders = 8\n\
             hot_standby = on\n\
             wal_retrieve_retry_interval = '100ms'\n\
             include_if_exists = '../node.conf'\n",
        );
        fs::write(&conf, text).unwrap_or_else(|e| panic!("writing {}: {e}", conf.display()));
        pair.start_node(0);
        pair.base_backup(1);
        pair.start_node(1);
        pair.wait_for_sync_standby();
        Ok(pair)
    }

    /// The multi-host URL of the pair for `dbname`, as superuser: both nodes, the session on
    /// whichever accepts writes (`target_session_attrs=read-write`). `extra` is appended to
    /// the query (`&application_name=x`, or empty).
    pub fn url(&self, dbname: &str, extra: &str) -> String {
        format!(
            "postgresql://{SUPERUSER}@127.0.0.1:{},127.0.0.1:{}/{dbname}\
             ?target_session_attrs=read-write{extra}",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// A connection string for `dbname` on the primary alone.
    pub fn primary_url(&self, dbname: &str) -> String {
        self.nodes[self.primary].url(dbname)
    }

    /// A connection string for `dbname` on the standby alone, without
    /// `target_session_attrs`: a session there is read-only.
    pub fn standby_url(&self, dbname: &str) -> String {
        self.nodes[1 - self.primary].url(dbname)
    }

    /// The names of the primary and the standby now (`a`, `b`), for messages.
    pub fn roles(&self) -> (&'static str, &'static str) {
        (
            self.nodes[self.primary].name,
            self.nodes[1 - self.primary].name,
        )
    }

    /// Creates the database `name` on the primary (the standby gets it by replication).
    pub fn create_database(&self, name: &str) {
        let url = self.primary_url("postgres");
        block_on(async {
            connect(&url)
                .await
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .await
                .unwrap_or_else(|e| panic!("creating the database {name:?}: {e:?}"));
        });
    }

    /// Kills the primary as a machine that dies: SIGKILL to its postmaster and every child
    /// at once, none left to finish anything. Returns once all are gone (exited; a zombie
    /// not reaped yet counts as gone), with how many processes were killed.
    pub fn kill_primary(&self) -> usize {
        let node = &self.nodes[self.primary];
        let pid = node.postmaster_pid().unwrap_or_else(|| {
            panic!(
                "kill_primary: node {} has no postmaster.pid\n--- server log, last lines\n{}",
                node.name,
                node.log_tail()
            )
        });
        let postmaster = Process::of(pid).unwrap_or_else(|| {
            panic!(
                "kill_primary: the postmaster {pid} of node {} is not running\n\
                 --- server log, last lines\n{}",
                node.name,
                node.log_tail()
            )
        });
        let mut processes = Process::children_of(pid);
        processes.push(postmaster);
        // std has no kill(2) for another process without `unsafe`; kill(1) does it.
        let kill = Command::new("kill")
            .args(["-s", "KILL"])
            .args(processes.iter().map(|p| p.pid.to_string()))
            .output();
        // A child that exited between the listing and the kill makes kill(1) fail for it
        // alone; what matters is that every one is gone below.
        if let Err(e) = kill {
            panic!("kill_primary: kill(1) could not be run: {e}");
        }
        let deadline = Instant::now() + STEP_DEADLINE;
        for process in &processes {
            while process.alive() {
                assert!(
                    Instant::now() < deadline,
                    "kill_primary: process {} ({}) of node {} is still alive after {:?}",
                    process.pid,
                    process.comm,
                    node.name,
                    STEP_DEADLINE
                );
                // A polling interval, bounded by the deadline above.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        processes.len()
    }

    /// Makes the standby the primary, as an operator's tool does once the primary is dead:
    /// clears its `synchronous_standby_names` (a promoted node keeps the setting, and its
    /// commits would wait for a standby that is not there), then `pg_ctl promote`, which
    /// returns once it accepts writes.
    pub fn promote(&mut self) {
        let standby = 1 - self.primary;
        let url = self.nodes[standby].url("postgres");
        block_on(async {
            let admin = connect(&url).await;
            admin
                .batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''")
                .await
                .expect("clear synchronous_standby_names on the standby");
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .expect("reload the standby's settings");
        });
        let node = &self.nodes[standby];
        let promote = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&node.data_dir)
            .args(["-w", "-t", "60", "promote"])
            .output();
        self.check(standby, "pg_ctl promote", promote);
        self.primary = standby;
    }

    /// Makes the old primary, killed, the new primary's synchronous standby: a fresh data
    /// directory from `pg_basebackup -R`, started, named a synchronous standby on the
    /// primary, and caught up with everything the primary committed before it was.
    pub fn rebuild_standby(&mut self) {
        let standby = 1 - self.primary;
        let old = self.nodes[standby].data_dir.clone();
        assert!(
            self.nodes[standby]
                .postmaster_pid()
                .and_then(Process::of)
                .is_none(),
            "rebuild_standby: node {} is still running",
            self.nodes[standby].name
        );
        fs::remove_dir_all(&old)
            .unwrap_or_else(|e| panic!("removing the old data directory {}: {e}", old.display()));
        // The killed postmaster's socket and its lock file stay behind (a machine that dies
        // leaves them too; a rebuilt machine starts without them). The lock file names the
        // dead postmaster's pid, which by now may be another process's (pids wrap around):
        // the new server would take the lock for held and refuse to start.
        let sock = self.nodes[standby].home.join("sock");
        let port = self.nodes[standby].port;
        for file in [format!(".s.PGSQL.{port}"), format!(".s.PGSQL.{port}.lock")] {
            match fs::remove_file(sock.join(&file)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    panic!("removing the dead server's {file}: {e}")
                }
                _ => {}
            }
        }
        let node = &mut self.nodes[standby];
        node.generation += 1;
        node.data_dir = node.home.join(format!("data-{}", node.generation));
        self.base_backup(standby);
        self.start_node(standby);
        let url = self.primary_url("postgres");
        block_on(async {
            let admin = connect(&url).await;
            for statement in [
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "SELECT pg_reload_conf()",
            ] {
                admin
                    .batch_execute(statement)
                    .await
                    .unwrap_or_else(|e| panic!("{statement} on the primary: {e:?}"));
            }
        });
        self.wait_for_sync_standby();
    }

    /// Waits until the standby has replayed everything the primary had written when called
    /// (a synchronous commit waits for the standby's flush, not its replay): what was
    /// committed before is visible there.
    pub fn wait_for_replay(&self) {
        let primary = self.primary_url("postgres");
        let standby = self.standby_url("postgres");
        block_on(async {
            let target: String = connect(&primary)
                .await
                .query_one("SELECT pg_current_wal_lsn()::text", &[])
                .await
                .expect("read the primary's WAL position")
                .get(0);
            let standby = connect(&standby).await;
            let deadline = Instant::now() + STEP_DEADLINE;
            loop {
                let replayed: Option<bool> = standby
                    .query_one(
                        "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                        &[&target],
                    )
                    .await
                    .expect("read the standby's replay position")
                    .get(0);
                if replayed == Some(true) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "the standby did not replay up to {target} within {STEP_DEADLINE:?}"
                );
                // A polling interval, bounded by the deadline above.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
    }

    /// Waits until the primary's standby streams as its synchronous standby and has flushed
    /// the primary's WAL up to where it was once it did: from then on every acknowledged
    /// commit is on both nodes, also those acknowledged while the primary had no
    /// synchronous standby. (The view shows the standby as synchronous as soon as the
    /// reading session has reloaded the setting, which may be a moment before the committing
    /// sessions wait for it; any commit of that moment is flushed on the standby by the time
    /// a later commit that waited has returned, as WAL is flushed in order.)
    fn wait_for_sync_standby(&self) {
        let url = self.primary_url("postgres");
        let deadline = Instant::now() + STEP_DEADLINE;
        block_on(async {
            let admin = connect(&url).await;
            let mut target: Option<String> = None;
            loop {
                let row = admin
                    .query_opt(
                        "SELECT sync_state = 'sync' AND state = 'streaming', \
                                flush_lsn::text, pg_current_wal_lsn()::text \
                         FROM pg_stat_replication LIMIT 1",
                        &[],
                    )
                    .await
                    .expect("read pg_stat_replication");
                if let Some(row) = row {
                    let sync: Option<bool> = row.get(0);
                    if sync == Some(true) {
                        let current: String = row.get(2);
                        let target = target.get_or_insert(current);
                        let caught_up = admin
                            .query_one(
                                "SELECT flush_lsn >= $1::text::pg_lsn FROM pg_stat_replication \
                                 WHERE sync_state = 'sync' LIMIT 1",
                                &[&*target],
                            )
                            .await
                            .ok()
                            .and_then(|r| r.get::<_, Option<bool>>(0));
                        if caught_up == Some(true) {
                            return;
                        }
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "the standby of node {} did not become its synchronous standby, caught \
                     up, within {STEP_DEADLINE:?}\n--- standby log, last lines\n{}",
                    self.nodes[self.primary].name,
                    self.nodes[1 - self.primary].log_tail()
                );
                // A polling interval, bounded by the deadline above.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }

    /// `pg_basebackup -R` of the primary into `node`'s data directory (which must not exist).
    fn base_backup(&self, node: usize) {
        let primary = &self.nodes[self.primary];
        let backup = self
            .command("pg_basebackup")
            .arg("-D")
            .arg(&self.nodes[node].data_dir)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args([
                "-U",
                SUPERUSER,
                "-X",
                "stream",
                "-c",
                "fast",
                "-R",
                "--no-sync",
            ])
            .output();
        self.check(node, "pg_basebackup", backup);
    }

    /// `pg_ctl start -w`: returns once the node accepts connections.
    fn start_node(&self, node: usize) {
        let n = &self.nodes[node];
        let start = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&n.data_dir)
            .arg("-l")
            .arg(&n.log_file)
            .args(["-w", "-t", "60", "start"])
            .output();
        self.check(node, "pg_ctl start", start);
    }

    /// A command of the server's binaries, run as the user the servers run as, from the
    /// temporary directory (the unprivileged user may not be able to read the current one).
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Panics with the command's output and `node`'s log tail unless it succeeded.
    fn check(&self, node: usize, what: &str, output: std::io::Result<Output>) {
        let Some(failure) = super::command_failure(what, output) else {
            return;
        };
        let node = &self.nodes[node];
        panic!(
            "node {} of the PostgreSQL pair: {failure}\n--- server log ({}), last lines\n{}",
            node.name,
            node.log_file.display(),
            node.log_tail()
        );
    }

    /// Starts the watchdog: a shell, as the tests' own user, that waits for its standard
    /// input to close, then stops every server of the pair (SIGQUIT: an immediate shutdown)
    /// and removes the directory.
    fn watchdog(&self) -> (ChildStdin, Child) {
        const SCRIPT: &str = "cat >/dev/null; \
             for f in \"$1\"/*/data-*/postmaster.pid; do \
               pid=$(head -n 1 \"$f\" 2>/dev/null); \
               if [ -n \"$pid\" ] && kill -QUIT \"$pid\" 2>/dev/null; then \
                 n=0; while kill -0 \"$pid\" 2>/dev/null && [ $n -lt 600 ]; do \
                   sleep 0.1; n=$((n + 1)); done; \
               fi; \
             done; \
             rm -rf \"$1\"";
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("rq-pair-watchdog")
            .arg(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the PostgreSQL pair's watchdog: {e}"));
        let stdin = child.stdin.take().expect("the watchdog's standard input");
        (stdin, child)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for node in &self.nodes {
            if node.postmaster_pid().and_then(Process::of).is_some() {
                let _ = self
                    .command("pg_ctl")
                    .arg("-D")
                    .arg(&node.data_dir)
                    .args(["-m", "immediate", "-w", "-t", "60", "stop"])
                    .output();
            }
        }
        if let Some((stdin, mut watchdog)) = self.watchdog.take() {
            // Its cue: it removes the directory (and stops a server still running).
            drop(stdin);
            let _ = watchdog.wait();
        }
    }
}
