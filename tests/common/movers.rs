//! Worker processes for the server engines' kill tests: this test binary, started again with
//! a variable naming the store, moves items between queues `a` and `b` until it is killed;
//! the parent counts the commits the workers report and kills and replaces them.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use reliable_queue::{ReliableConcurrentQueue, Result, Store};

/// The seed a worker was started with (its variable `seed_var`; 0 without it).
pub fn seed(seed_var: &str) -> u64 {
    std::env::var(seed_var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What a worker does with a call that fails.
#[derive(Clone, Copy)]
pub enum OnFailure {
    /// Panics: the server is meant to stay up.
    Panic,
    /// Leaves the call's transaction behind and goes on (the server is down, or restarting).
    GoOn,
}

/// A worker's loop: moves 1 to 4 items from one of `queues` (at random) to the other in a
/// transaction it commits, aborts or drops at random (from `seed`), and prints a line for each
/// acknowledged commit, until it is killed.
pub fn move_forever(
    store: &Store,
    queues: &[ReliableConcurrentQueue<u64>; 2],
    seed: u64,
    failures: OnFailure,
) -> ! {
    fn done<T>(result: Result<T>, failures: OnFailure) -> Option<T> {
        match (result, failures) {
            (Ok(value), _) => Some(value),
            (Err(e), OnFailure::Panic) => panic!("worker: {e}"),
            (Err(_), OnFailure::GoOn) => None,
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = std::io::stdout();
    loop {
        let from = rng.gen_range(0..2);
        let mut tx = store.begin();
        let mut taken = Vec::new();
        for _ in 0..rng.gen_range(1..=4) {
            match done(queues[from].blocking_try_dequeue(&mut tx), failures).flatten() {
                Some(item) => taken.push(item),
                None => break,
            }
        }
        for item in &taken {
            queues[1 - from].enqueue(&mut tx, item).unwrap();
        }
        match rng.gen_range(0..16) {
            0 => drop(done(tx.blocking_abort(), failures)),
            1 => drop(tx),
            _ => {
                if done(tx.blocking_commit(), failures).is_some() {
                    writeln!(out, "c").unwrap();
                    out.flush().unwrap();
                }
            }
        }
    }
}

/// The parent's side: worker processes, and the commits they report.
pub struct Workers {
    children: Vec<Child>,
    /// The store's variable and its value, the seed's variable.
    env: (String, String, String),
    commits: mpsc::Sender<()>,
    reported: mpsc::Receiver<()>,
}

impl Workers {
    /// Starts `n` workers (seeds 0..n) with `url_var` set to `url`.
    pub fn start(n: u64, url_var: &str, url: &str, seed_var: &str) -> Workers {
        let (commits, reported) = mpsc::channel();
        let mut workers = Workers {
            children: Vec::new(),
            env: (url_var.to_owned(), url.to_owned(), seed_var.to_owned()),
            commits,
            reported,
        };
        workers.children = (0..n).map(|seed| workers.spawn(seed)).collect();
        workers
    }

    fn spawn(&self, seed: u64) -> Child {
        let (url_var, url, seed_var) = &self.env;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(url_var, url)
            .env(seed_var, seed.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker");
        let stdout = child.stdout.take().unwrap();
        let commits = self.commits.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if line.is_err() || commits.send(()).is_err() {
                    return;
                }
            }
        });
        child
    }

    /// Waits for `n` more commits (each within a minute).
    pub fn wait_commits(&self, n: u32) {
        for _ in 0..n {
            self.reported
                .recv_timeout(Duration::from_secs(60))
                .expect("the workers commit");
        }
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Kills worker `victim` with SIGKILL and waits for it.
    pub fn kill(&mut self, victim: usize) {
        self.children[victim].kill().unwrap();
        self.children[victim].wait().unwrap();
    }

    /// Starts a new worker with `seed` in the place of `victim`, killed before.
    pub fn replace(&mut self, victim: usize, seed: u64) {
        self.children[victim] = self.spawn(seed);
    }

    /// Kills every worker and waits for them.
    pub fn kill_all(mut self) {
        for victim in 0..self.children.len() {
            self.kill(victim);
        }
    }
}
