//! The Redis engine's commit and its processing-layer calls (`impl Redis`): leases and their
//! settlements, counts, stats, browse, dead letters and retry policies; each one script.

use std::sync::Arc;

use redis::Value;

use super::{
    bytes, damaged, entry_of, fresh_record, int, lost_in_flight, policy_of, policy_text, record,
    text, token_arg, Redis, RedisSlot,
};
use crate::clock::known_time;
use crate::core::{Entry, QueueCore};
use crate::engine::line::{BoxFuture, Granted, Host, Waiters};
use crate::engine::proc::DeadSlot;
use crate::error::{Error, Result};
use crate::processing::{ItemState, QueueStats, Replay, RetryPolicy};

/// What a commit does beside its plain enqueues and the items it holds.
#[derive(Debug)]
pub(crate) enum Change {
    /// An enqueue due `delay` ms after the commit, or at `at` (ms) when `delay` is 0; with
    /// `key`, a no-op when an item of the queue has that key.
    Fresh {
        queue: Arc<QueueCore>,
        entry: Entry,
        delay: u64,
        key: Option<Box<[u8]>>,
    },
    /// An acknowledged lease.
    Ack { queue: Arc<QueueCore>, token: u64 },
    /// An imported item (its attempts and times kept); with `reason`, a dead letter.
    Import {
        queue: Arc<QueueCore>,
        entry: Entry,
        reason: Option<String>,
    },
}

/// How a failed lease was settled.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The lease had ended: nothing was done.
    Ended,
    /// Due again at this time.
    Retry(u64),
    /// Buried.
    Dead,
}

/// The `{status, deadline, token, record, ...}` answer of a lease (or a commit that leases)
/// read into grants; a status `missing:<id>` is reported after the grants before it.
fn grants(operation: &'static str, core: &QueueCore, parts: &[Value]) -> Result<Vec<Granted>> {
    let bad = || damaged(operation, "the script's answer is malformed".into());
    let (status, deadline) = match parts {
        [s, d, ..] => (text(s), int(d).unwrap_or(0)),
        [s] => (text(s), 0),
        [] => return Err(bad()),
    };
    let mut granted = Vec::with_capacity(parts.len().saturating_sub(2) / 2);
    for pair in parts.get(2..).unwrap_or_default().chunks(2) {
        let [token, rec] = pair else {
            return Err(bad());
        };
        let token = int(token).ok_or_else(bad)?;
        let entry = entry_of(token, bytes(rec).ok_or_else(bad)?)
            .map_err(|what| damaged(operation, format!("queue {:?}: {what}", core.name())))?;
        granted.push(Granted {
            entry,
            token,
            deadline,
        });
    }
    match status.and_then(|s| s.strip_prefix("missing:")) {
        Some(id) if granted.is_empty() => Err(damaged(
            operation,
            format!(
                "queue {:?}: item {id} had no readable record; its id was set aside in the \
                 queue's damaged list",
                core.name()
            ),
        )),
        _ => Ok(granted),
    }
}

impl Redis {
    /// Commits the transaction of `slot` with `enqueues` and `changes`, and with `lease =
    /// (queue, n, ttl)` leases up to `n` items of that queue in the same script: all of it, or
    /// nothing.
    pub(crate) async fn commit(
        &self,
        slot: RedisSlot,
        enqueues: Vec<(Arc<QueueCore>, Box<[u8]>)>,
        changes: Vec<Change>,
        lease: Option<(&QueueCore, usize, u64)>,
    ) -> Result<Vec<Granted>> {
        let mut slot = slot;
        // A failed dequeue: nothing applies, and the slot's drop gives the items back.
        slot.check()?;
        // What a dequeue took for a caller that never read its answer goes back first.
        self.settle_pending(&mut slot).await?;
        let now = self.caller.clock.now();
        let count = enqueues.len() + changes.len();
        let mut args = Vec::with_capacity(5 + 5 * count);
        args.push(token_arg(slot.token));
        args.push(slot.held.to_string().into_bytes());
        args.push(count.to_string().into_bytes());
        let mut woken = Vec::with_capacity(enqueues.len());
        let mut push = |kind: &str, q: i32, a: Vec<u8>, b: Vec<u8>, c: Vec<u8>| {
            args.push(kind.as_bytes().to_vec());
            args.push(q.to_string().into_bytes());
            args.extend([a, b, c]);
        };
        let numbered = |core: &QueueCore| self.number(core);
        for (core, item) in &enqueues {
            let q = numbered(core)?;
            woken.push(q);
            push("e", q, fresh_record(item, now), Vec::new(), Vec::new());
        }
        for change in &changes {
            match change {
                Change::Fresh {
                    queue,
                    entry,
                    delay,
                    key,
                } => {
                    let due = match delay {
                        0 => entry.not_before().to_string(),
                        d => format!("+{d}"),
                    };
                    let rec = fresh_record(&entry.bytes, now);
                    let key = key.as_deref().unwrap_or_default().to_vec();
                    push("f", numbered(queue)?, rec, due.into_bytes(), key);
                }
                Change::Ack { queue, token } => {
                    let token = token.to_string().into_bytes();
                    push("a", numbered(queue)?, token, Vec::new(), Vec::new());
                }
                Change::Import {
                    queue,
                    entry,
                    reason,
                } => {
                    let reason = reason.as_deref().unwrap_or_default().as_bytes().to_vec();
                    let due = entry.not_before().to_string().into_bytes();
                    push("i", numbered(queue)?, record(entry), due, reason);
                }
            }
        }
        if let Some((core, n, ttl)) = lease {
            args.push(self.number(core)?.to_string().into_bytes());
            args.push(n.min(1 << 30).to_string().into_bytes());
            args.push(ttl.to_string().into_bytes());
        }
        let got = match self
            .batcher
            .call(&self.calls, |s| &s.commit, args, super::ignore)
            .await
            .and_then(|got| got.map_err(|e| super::fail("commit", e)))
        {
            Ok(got) => got,
            // The script may have run, and the answer been lost: the items are given back if
            // it did not (fenced by the token, this does nothing if it did).
            Err(Error::Redis { source, .. }) if lost_in_flight(&source) => {
                drop(slot);
                return Err(Error::CommitOutcomeUnknown { source });
            }
            Err(e) => {
                drop(slot);
                return Err(e);
            }
        };
        let token = slot.disarm();
        self.returner.open.lock().remove(&token);
        let Value::Array(parts) = got else {
            return Err(damaged(
                "commit",
                "the commit script's answer is malformed".into(),
            ));
        };
        match parts.first().and_then(text) {
            Some("expired") => Err(Error::TransactionExpired),
            Some("lease") => Err(Error::LeaseExpired {
                queue: changes
                    .iter()
                    .find_map(|c| match c {
                        Change::Ack { queue, token }
                            if Some(*token) == parts.get(1).and_then(int) =>
                        {
                            Some(queue.name().to_owned())
                        }
                        _ => None,
                    })
                    .unwrap_or_default(),
                token: parts.get(1).and_then(int).unwrap_or(0),
            }),
            Some(s) if s == "ok" || s.starts_with("missing:") => {
                // This store's waiters at once, one per item; the other stores' through the
                // wake channel.
                self.waiters.notify(woken);
                match lease {
                    Some((core, _, _)) => grants("commit", core, &parts),
                    None => Ok(Vec::new()),
                }
            }
            _ => Err(damaged(
                "commit",
                "the commit script's answer is malformed".into(),
            )),
        }
    }

    /// Items visible in `core`'s queue now.
    pub(crate) async fn count(&self, core: &QueueCore) -> Result<u64> {
        let q = self.number(core)?;
        let got = self
            .script(
                "count",
                |s| &s.count,
                vec![q.to_string().into_bytes()],
                super::ignore,
            )
            .await?;
        int(&got).ok_or_else(|| damaged("count", "the count script's answer is malformed".into()))
    }

    /// `core`'s queue's figures, and its retry policy as the server has it.
    pub(crate) async fn stats(&self, core: &QueueCore) -> Result<(QueueStats, RetryPolicy)> {
        let q = self.number(core)?;
        let got = self
            .script(
                "stats",
                |s| &s.stats,
                vec![q.to_string().into_bytes()],
                super::ignore,
            )
            .await?;
        let bad = || damaged("stats", "the stats script's answer is malformed".into());
        let Value::Array(parts) = got else {
            return Err(bad());
        };
        let [visible, delayed, leased, held, dead, head, policy] = parts.as_slice() else {
            return Err(bad());
        };
        let head_at = bytes(head)
            .and_then(|rec| entry_of(0, rec).ok())
            .map_or(0, |e| e.enqueued_at);
        let stats = QueueStats {
            visible: int(visible).ok_or_else(bad)?,
            delayed: int(delayed).ok_or_else(bad)?,
            leased: int(leased).ok_or_else(bad)?,
            held: int(held).ok_or_else(bad)?,
            dead: int(dead).ok_or_else(bad)?,
            front_enqueued_at: known_time(head_at),
        };
        Ok((
            stats,
            text(policy).map_or_else(RetryPolicy::default, policy_of),
        ))
    }

    /// Up to `limit` items of `core`'s queue with an id above `after`, in id order, with
    /// their state (items held by open transactions are not listed).
    pub(crate) async fn browse(
        &self,
        core: &QueueCore,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<(Entry, ItemState)>> {
        let q = self.number(core)?;
        let args = vec![
            q.to_string().into_bytes(),
            after.unwrap_or(0).to_string().into_bytes(),
            limit.min(1 << 30).to_string().into_bytes(),
        ];
        let got = self
            .script("browse", |s| &s.browse, args, super::ignore)
            .await?;
        let bad = || damaged("browse", "the browse script's answer is malformed".into());
        let Value::Array(parts) = got else {
            return Err(bad());
        };
        let mut found = Vec::with_capacity(parts.len() / 4);
        for four in parts.chunks(4) {
            let [id, rec, state, time] = four else {
                return Err(bad());
            };
            let id = int(id).ok_or_else(bad)?;
            let entry =
                entry_of(id, bytes(rec).ok_or_else(bad)?).map_err(|w| damaged("browse", w))?;
            let until = crate::clock::system_time(int(time).unwrap_or(0));
            let state = match int(state) {
                Some(1) => ItemState::Delayed { until },
                Some(2) => ItemState::Leased {
                    until,
                    attempt: entry.attempts(),
                },
                _ => ItemState::Ready,
            };
            found.push((entry, state));
        }
        Ok(found)
    }

    /// Runs a script on lease `token` of `core`'s queue with `more` arguments.
    async fn on_lease(
        &self,
        operation: &'static str,
        which: fn(&super::Scripts) -> &super::scripts::Script,
        core: &QueueCore,
        token: u64,
        more: Vec<Vec<u8>>,
    ) -> Result<Value> {
        let mut args = vec![
            self.number(core)?.to_string().into_bytes(),
            token.to_string().into_bytes(),
        ];
        args.extend(more);
        self.script(operation, which, args, super::ignore).await
    }

    /// Settles lease `token` as failed with `reason`.
    pub(crate) async fn fail(&self, core: &QueueCore, token: u64, reason: &str) -> Result<Failed> {
        let reason = crate::engine::proc::cut_reason(reason).into_bytes();
        let got = self
            .on_lease("fail", |s| &s.fail, core, token, vec![reason])
            .await?;
        let Value::Array(parts) = got else {
            return Err(damaged(
                "fail",
                "the fail script's answer is malformed".into(),
            ));
        };
        Ok(match parts.first().and_then(text) {
            Some("retry") => Failed::Retry(parts.get(1).and_then(int).unwrap_or(0)),
            Some("dead") => Failed::Dead,
            _ => Failed::Ended,
        })
    }

    /// Gives lease `token`'s item back, due after `delay` ms (at the head for 0); false if
    /// the lease was not running.
    pub(crate) async fn release(&self, core: &QueueCore, token: u64, delay: u64) -> Result<bool> {
        let delay = delay.to_string().into_bytes();
        let got = self
            .on_lease("release", |s| &s.release, core, token, vec![delay])
            .await?;
        Ok(int(&got) == Some(1))
    }

    /// Moves lease `token`'s deadline to `ttl` ms from now: the new deadline, `None` if the
    /// lease was not running.
    pub(crate) async fn extend(
        &self,
        core: &QueueCore,
        token: u64,
        ttl: u64,
    ) -> Result<Option<u64>> {
        let ttl = ttl.to_string().into_bytes();
        let got = self
            .on_lease("extend", |s| &s.extend, core, token, vec![ttl])
            .await?;
        Ok(int(&got))
    }

    /// Gives lease `token` back at once, in the background (its `Lease` was dropped).
    pub(crate) fn drop_lease(&self, core: &QueueCore, token: u64) {
        let Ok(q) = self.number(core) else {
            return;
        };
        let returner = Arc::clone(&self.returner);
        self.rt.spawn(async move {
            let mut conn = returner.caller.conn.clone();
            let dropped: redis::RedisResult<Value> = returner
                .caller
                .call(|s| &s.drop_lease)
                .arg(q)
                .arg(token)
                .invoke_async(&mut conn)
                .await;
            if let Err(e) = dropped {
                tracing::warn!(error = %e, "could not give a dropped lease back; it comes back at its deadline");
            }
        });
    }

    /// Sets `core`'s queue's retry policy.
    pub(crate) async fn set_policy(&self, core: &QueueCore, policy: RetryPolicy) -> Result<()> {
        let args = vec![
            self.number(core)?.to_string().into_bytes(),
            policy_text(policy).into_bytes(),
        ];
        self.script("set_policy", |s| &s.set_policy, args, super::ignore)
            .await
            .map(drop)
    }

    /// Up to `limit` dead letters of `core`'s queue whose id is above `after`, oldest first.
    pub(crate) async fn dead_letters(
        &self,
        core: &QueueCore,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<DeadSlot>> {
        let args = vec![
            self.number(core)?.to_string().into_bytes(),
            after.unwrap_or(0).to_string().into_bytes(),
            limit.min(1 << 30).to_string().into_bytes(),
        ];
        let got = self
            .script("dead_letters", |s| &s.dead_letters, args, super::ignore)
            .await?;
        let bad = || damaged("dead_letters", "the script's answer is malformed".into());
        let Value::Array(parts) = got else {
            return Err(bad());
        };
        let mut slots = Vec::with_capacity(parts.len() / 3);
        for three in parts.chunks(3) {
            let [id, rec, reason] = three else {
                return Err(bad());
            };
            let id = int(id).ok_or_else(bad)?;
            let entry = entry_of(id, bytes(rec).ok_or_else(bad)?)
                .map_err(|w| damaged("dead_letters", w))?;
            slots.push(DeadSlot {
                entry,
                reason: text(reason).unwrap_or_default().to_owned(),
                has_bytes: true,
            });
        }
        Ok(slots)
    }

    /// Replays (with `reset`, attempts back to 0) or with `purge` deletes the dead letters
    /// `which` of `core`'s queue; how many.
    pub(crate) async fn dead_work(
        &self,
        core: &QueueCore,
        which: Replay,
        reset: bool,
        purge: bool,
    ) -> Result<usize> {
        let flag = |b: bool| if b { b"1".to_vec() } else { b"0".to_vec() };
        let mut args = vec![
            self.number(core)?.to_string().into_bytes(),
            flag(reset),
            flag(purge),
        ];
        match which {
            Replay::All => args.push(b"all".to_vec()),
            Replay::First(n) => {
                args.push(b"first".to_vec());
                args.push(n.min(1 << 30).to_string().into_bytes());
            }
            Replay::Ids(ids) => {
                args.push(b"ids".to_vec());
                args.extend(ids.iter().map(|id| id.to_string().into_bytes()));
            }
        }
        let got = self
            .script("dead_letters", |s| &s.dead_work, args, super::ignore)
            .await?;
        let Value::Array(parts) = got else {
            return Err(damaged(
                "dead_letters",
                "the script's answer is malformed".into(),
            ));
        };
        match (parts.first().and_then(text), parts.get(1).and_then(int)) {
            (Some("ok"), Some(n)) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            (Some("missing"), Some(id)) => Err(Error::NotDeadLetter {
                queue: core.name().to_owned(),
                id,
            }),
            _ => Err(damaged(
                "dead_letters",
                "the script's answer is malformed".into(),
            )),
        }
    }

    /// Leases up to `n` visible items of `core`'s queue for `ttl` ms.
    async fn lease_now(
        &self,
        core: &QueueCore,
        n: usize,
        ttl: u64,
        waiter: Option<u64>,
    ) -> Result<Vec<Granted>> {
        let q = self.number(core)?;
        let args = vec![
            q.to_string().into_bytes(),
            n.min(1 << 30).to_string().into_bytes(),
            ttl.to_string().into_bytes(),
        ];
        let waiters: Arc<Waiters> = Arc::clone(&self.waiters);
        let got = self
            .script(
                "lease",
                |s| &s.lease,
                args,
                move |got| {
                    if let Some(ticket) = waiter {
                        let took = matches!(got, Ok(Value::Array(parts)) if parts.len() > 2);
                        waiters.looked(q, ticket, took);
                    }
                },
            )
            .await?;
        let Value::Array(parts) = got else {
            return Err(damaged(
                "lease",
                "the lease script's answer is malformed".into(),
            ));
        };
        grants("lease", core, &parts)
    }

    /// Leases up to `n` visible items of `core`'s queue for `ttl` ms (a commit that leases
    /// and has nothing else to do).
    pub(crate) async fn lease_for(
        &self,
        core: &QueueCore,
        n: usize,
        ttl: u64,
    ) -> Result<Vec<Granted>> {
        self.lease_now(core, n, ttl, None).await
    }

    /// Gives back leases handed to nobody, their attempts not counted.
    async fn unlease_now(&self, core: &QueueCore, tokens: Vec<u64>) -> Result<()> {
        let mut args = vec![self.number(core)?.to_string().into_bytes()];
        args.extend(tokens.iter().map(|t| t.to_string().into_bytes()));
        self.script("lease", |s| &s.unlease, args, super::ignore)
            .await
            .map(drop)
    }

    /// Milliseconds until `core`'s queue's next delayed item or lease falls due.
    async fn next_due_now(&self, core: &QueueCore) -> Result<Option<u64>> {
        let q = self.number(core)?;
        let got = self
            .script(
                "dequeue",
                |s| &s.next_due,
                vec![q.to_string().into_bytes()],
                super::ignore,
            )
            .await?;
        Ok(int(&got))
    }
}

impl Host for Redis {
    fn line(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    fn key(&self, core: &QueueCore) -> Result<i32> {
        self.number(core)
    }

    fn poll_interval(&self) -> std::time::Duration {
        self.poll_interval
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    fn next_due<'a>(&'a self, core: &'a QueueCore) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(self.next_due_now(core))
    }

    fn lease<'a>(
        &'a self,
        core: &'a QueueCore,
        n: usize,
        ttl: u64,
        waiter: Option<u64>,
    ) -> BoxFuture<'a, Result<Vec<Granted>>> {
        Box::pin(self.lease_now(core, n, ttl, waiter))
    }

    fn unlease<'a>(&'a self, core: &'a QueueCore, tokens: Vec<u64>) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.unlease_now(core, tokens))
    }
}
