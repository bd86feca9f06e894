//! Where `stats`, `browse` and `dead-letters` read and act: a store rq opened (`--store`,
//! `--postgres`), or a running service's dashboard (`--url`), through its JSON API. The rows
//! are the dashboard's own types, so both print the same.

use std::time::{Duration, SystemTime};

use reliable_queue::{Decoders, RawItem, ReliableConcurrentQueue, Replay, Store};
use reliable_queue_web::rows::{segment, DeadRow, ItemRow, MAX_PAGE};
use reliable_queue_web::QueueRow;
use serde::de::DeserializeOwned;

use crate::common::Res;
use crate::export;

/// A dashboard's JSON API: its URL (the path it is mounted at) and the admin token, if any.
#[derive(Debug)]
pub(crate) struct Remote {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Remote {
    /// The dashboard at `url` (`http://host:port[/path]`).
    pub(crate) fn new(url: &str, token: Option<String>) -> Res<Remote> {
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(format!("--url takes http://host:port[/path], not {url:?}").into());
        }
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build();
        Ok(Remote {
            base: url.trim_end_matches('/').to_owned(),
            token: token.filter(|t| !t.is_empty()),
            agent,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/{path}", self.base)
    }

    /// What the dashboard answered, or why it did not.
    fn answer<T: DeserializeOwned>(&self, result: Result<ureq::Response, ureq::Error>) -> Res<T> {
        match result {
            Ok(response) => Ok(response.into_json()?),
            Err(ureq::Error::Status(code, response)) => {
                let said = response
                    .into_json::<serde_json::Value>()
                    .ok()
                    .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                    .unwrap_or_default();
                Err(format!("the dashboard at {} answered {code}: {said}", self.base).into())
            }
            Err(e) => Err(format!("the dashboard at {} did not answer: {e}", self.base).into()),
        }
    }

    fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Res<T> {
        let mut request = self.agent.get(&self.url(path));
        for (k, v) in query {
            request = request.query(k, v);
        }
        self.answer(request.call())
    }

    fn post<T: DeserializeOwned>(&self, path: &str, body: serde_json::Value) -> Res<T> {
        let Some(token) = &self.token else {
            return Err(
                "acting through a dashboard needs its admin token: set RQ_ADMIN_TOKEN".into(),
            );
        };
        let request = self
            .agent
            .post(&self.url(path))
            .set("Authorization", &format!("Bearer {token}"));
        self.answer(request.send_json(body))
    }
}

/// Where the commands read.
#[derive(Debug)]
pub(crate) enum Source<'a> {
    /// A store rq opened.
    Store(&'a Store),
    /// A running service's dashboard.
    Url(&'a Remote),
}

/// A queue's handle, its items as their encoded bytes. Only queues the store has: opening
/// one by name would make it.
pub(crate) fn raw_queue(store: &Store, name: &str) -> Res<ReliableConcurrentQueue<RawItem>> {
    if !store.blocking_list_queues()?.iter().any(|q| q == name) {
        return Err(format!("no queue {name:?} in this store").into());
    }
    Ok(store.blocking_queue::<RawItem>(name)?)
}

fn replay_body(which: &Replay, reset_attempts: Option<bool>) -> serde_json::Value {
    let mut body = match which {
        Replay::Ids(ids) => serde_json::json!({ "ids": ids }),
        Replay::First(n) => serde_json::json!({ "first": n }),
        _ => serde_json::json!({ "all": true }),
    };
    if let Some(reset) = reset_attempts {
        body["reset_attempts"] = serde_json::Value::Bool(reset);
    }
    body
}

impl Source<'_> {
    /// A row per queue, but the queues of import bookkeeping unless `all`; and how many of
    /// those were left out.
    pub(crate) fn stats_rows(&self, all: bool) -> Res<(Vec<QueueRow>, usize)> {
        let rows: Vec<QueueRow> = match self {
            Source::Store(store) => {
                let now = SystemTime::now();
                let mut rows = Vec::new();
                for name in store.blocking_list_queues()? {
                    let q = store.blocking_queue::<RawItem>(&name)?;
                    let stats = q.blocking_stats()?;
                    rows.push(QueueRow::new(name, &stats, now));
                }
                rows
            }
            Source::Url(remote) => remote.get("stats", &[])?,
        };
        let total = rows.len();
        let rows: Vec<QueueRow> = rows
            .into_iter()
            .filter(|r| all || !r.queue.starts_with(export::MARKER_PREFIX))
            .collect();
        let hidden = total - rows.len();
        Ok((rows, hidden))
    }

    /// Up to `limit` items of `queue` after `after`, only those in `state` if given.
    pub(crate) fn items(
        &self,
        queue: &str,
        mut after: Option<u64>,
        limit: usize,
        state: Option<&str>,
    ) -> Res<Vec<ItemRow>> {
        let mut rows = Vec::new();
        match self {
            Source::Store(store) => {
                let q = raw_queue(store, queue)?;
                let decoders = Decoders::new();
                while rows.len() < limit {
                    let page = q.blocking_browse(after, MAX_PAGE)?;
                    let Some(last) = page.last() else { break };
                    after = Some(last.id);
                    for item in &page {
                        let row = ItemRow::new(queue, item, &decoders);
                        if state.is_some_and(|s| s != row.state) {
                            continue;
                        }
                        rows.push(row);
                        if rows.len() == limit {
                            break;
                        }
                    }
                }
            }
            Source::Url(remote) => {
                while rows.len() < limit {
                    let mut query = vec![("limit", (limit - rows.len()).min(MAX_PAGE).to_string())];
                    if let Some(a) = after {
                        query.push(("after", a.to_string()));
                    }
                    if let Some(s) = state {
                        query.push(("state", s.to_owned()));
                    }
                    let page: reliable_queue_web::rows::ItemPage =
                        remote.get(&format!("queues/{}/items", segment(queue)), &query)?;
                    rows.extend(page.items);
                    match page.next_after {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                rows.truncate(limit);
            }
        }
        Ok(rows)
    }

    /// Up to `limit` dead letters of `queue` after `after`.
    pub(crate) fn dead(
        &self,
        queue: &str,
        mut after: Option<u64>,
        limit: usize,
    ) -> Res<Vec<DeadRow>> {
        let mut rows = Vec::new();
        while rows.len() < limit {
            let want = (limit - rows.len()).min(MAX_PAGE);
            let page: Vec<DeadRow> = match self {
                Source::Store(store) => {
                    let q = raw_queue(store, queue)?;
                    let decoders = Decoders::new();
                    q.blocking_dead_letters(after, want)?
                        .iter()
                        .map(|d| DeadRow::new(queue, d, &decoders))
                        .collect()
                }
                Source::Url(remote) => {
                    let mut query = vec![("limit", want.to_string())];
                    if let Some(a) = after {
                        query.push(("after", a.to_string()));
                    }
                    remote.get(&format!("queues/{}/dead-letters", segment(queue)), &query)?
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            let short = page.len() < want;
            rows.extend(page);
            if short {
                break;
            }
        }
        Ok(rows)
    }

    /// How many dead letters `queue` has.
    pub(crate) fn dead_count(&self, queue: &str) -> Res<u64> {
        match self {
            Source::Store(store) => Ok(raw_queue(store, queue)?.blocking_stats()?.dead),
            Source::Url(_) => {
                let (rows, _) = self.stats_rows(true)?;
                rows.iter()
                    .find(|r| r.queue == queue)
                    .map(|r| r.dead)
                    .ok_or_else(|| format!("no queue {queue:?} in this store").into())
            }
        }
    }

    /// Replays `which` dead letters of `queue`; how many.
    pub(crate) fn replay(&self, queue: &str, which: Replay, reset_attempts: bool) -> Res<usize> {
        match self {
            Source::Store(store) => {
                Ok(raw_queue(store, queue)?.blocking_replay(which, reset_attempts)?)
            }
            Source::Url(remote) => {
                let answer: serde_json::Value = remote.post(
                    &format!("queues/{}/dead-letters/replay", segment(queue)),
                    replay_body(&which, Some(reset_attempts)),
                )?;
                Ok(count_in(&answer, "replayed"))
            }
        }
    }

    /// Purges `which` dead letters of `queue`; how many.
    pub(crate) fn purge(&self, queue: &str, which: Replay) -> Res<usize> {
        match self {
            Source::Store(store) => Ok(raw_queue(store, queue)?.blocking_purge(which)?),
            Source::Url(remote) => {
                let answer: serde_json::Value = remote.post(
                    &format!("queues/{}/dead-letters/purge", segment(queue)),
                    replay_body(&which, None),
                )?;
                Ok(count_in(&answer, "purged"))
            }
        }
    }
}

fn count_in(answer: &serde_json::Value, key: &str) -> usize {
    answer
        .get(key)
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn queue_names_are_one_path_segment() {
        assert_eq!(super::segment("jobs"), "jobs");
        assert_eq!(super::segment("a/b c?"), "a%2Fb%20c%3F");
        assert_eq!(super::segment("é"), "%C3%A9");
    }
}
