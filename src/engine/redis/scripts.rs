//! The Redis engine's Lua scripts: each call that changes the store is one script, which
//! Redis runs atomically (no other command runs meanwhile). Loaded once and run by `EVALSHA`;
//! the client loads a script again when the server answers `NOSCRIPT` (a restarted server).
//!
//! Every script gets the store's key prefix as `ARGV[1]` (`rq:{<namespace>}:`) and the
//! store's catalog key as `KEYS[1]`: every key a script touches has the prefix's hash tag, so
//! it lives in the catalog key's slot (one slot of a Redis Cluster, which is what lets a
//! transaction across queues stay one atomic script there).
//!
//! The keys, with `<p>` the prefix, `<q>` a queue's number and `<t>` a transaction's token:
//!
//! - `<p>queues`: hash, queue name → number; `<p>names`: hash, number → name;
//! - `<p>seq`, `<p>qseq`: the last item id and queue number given out;
//! - `<p>version`: the key layout's version;
//! - `<p>q:<q>:ready`: list of the ids of the visible items, head first;
//! - `<p>q:<q>:items`: hash, id → record (the item with its times, as `record.rs` encodes it);
//! - `<p>q:<q>:held`: sorted set of the ids held by open transactions, scored by the time
//!   (server ms) their hold ends; `<p>q:<q>:holder`: hash, id → the holder's token;
//! - `<p>q:<q>:damaged`: list of ids whose record was missing when a dequeue reached them;
//! - `<p>tx:<t>`: list of `<q>:<id>`, what transaction `t` holds (expires after its hold).
//!   A token is 64 random bits in hex, made by the client before its first dequeue, so that
//!   a dequeue whose answer is lost (its future dropped, the connection cut) is still the
//!   transaction's to give back;
//! - `<p>wake`: the channel on which commits name the queues that got items (`<q>:<store>`,
//!   so that the committing store skips its own: it woke its waiters already), and gives-back
//!   the queues whose items came back (`<q>`).
//!
//! Writes that a script makes before a command fails are not undone by Redis: each script
//! checks what can fail (a record, a holder) before its first write. Only keys of the wrong
//! type (tampered with) can stop one half way; the call then fails with `Error::Redis`.

/// Shared by the scripts: the server's time in ms, and taking back held items whose hold
/// ended.
const COMMON: &str = r#"
local p = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function qkey(q, what) return p .. 'q:' .. q .. ':' .. what end
-- Puts the held ids in `ids` (of queue q) back at the head of its ready list, lowest id
-- first; returns how many.
local function put_back(q, ids)
  table.sort(ids, function(a, b) return tonumber(a) > tonumber(b) end)
  for _, id in ipairs(ids) do
    redis.call('ZREM', qkey(q, 'held'), id)
    redis.call('HDEL', qkey(q, 'holder'), id)
    redis.call('LPUSH', qkey(q, 'ready'), id)
  end
  return #ids
end
-- Takes back the items of queue q whose hold ended by `now` (at most 1000 a call).
local function reclaim(q, now)
  local ids = redis.call('ZRANGEBYSCORE', qkey(q, 'held'), '-inf', now, 'LIMIT', 0, 1000)
  if #ids == 0 then return 0 end
  put_back(q, ids)
  redis.call('PUBLISH', p .. 'wake', q)
  return #ids
end
"#;

/// Finds queue `ARGV[2]` (a name) or adds it; returns its number.
pub(super) const QUEUE: &str = r#"
local name = ARGV[2]
local q = redis.call('HGET', p .. 'queues', name)
if q then return tonumber(q) end
q = redis.call('INCR', p .. 'qseq')
redis.call('HSET', p .. 'queues', name, q)
redis.call('HSET', p .. 'names', q, name)
return q
"#;

/// Takes up to `ARGV[3]` items at the head of queue `ARGV[2]` into transaction `ARGV[4]` (its
/// token, made by the client), whose hold ends at `ARGV[6]` (server ms; 0 for its first take:
/// `ARGV[5]` ms from now). Returns `{hold end, status, id, record, id, record, ...}`; status
/// is `ok`, `expired` (the transaction's hold ended: nothing taken) or `missing:<id>` (that
/// id had no record: set aside, the take ends there).
pub(super) const TAKE: &str = r#"
local q, n, token, hold = ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local now = now_ms()
reclaim(q, now)
local ends = tonumber(ARGV[6])
if ends == 0 then
  ends = now + hold
elseif ends <= now then
  return {ends, 'expired'}
end
local out = {ends, 'ok'}
local ready, items, tx = qkey(q, 'ready'), qkey(q, 'items'), p .. 'tx:' .. token
for _ = 1, n do
  local id = redis.call('LINDEX', ready, 0)
  if not id then break end
  local rec = redis.call('HGET', items, id)
  redis.call('LPOP', ready)
  if not rec then
    redis.call('RPUSH', qkey(q, 'damaged'), id)
    out[3] = 'missing:' .. id
    break
  end
  redis.call('ZADD', qkey(q, 'held'), ends, id)
  redis.call('HSET', qkey(q, 'holder'), id, token)
  redis.call('RPUSH', tx, q .. ':' .. id)
  out[#out + 1] = id
  out[#out + 1] = rec
end
if #out > 2 then redis.call('PEXPIREAT', tx, ends + 600000) end
return out
"#;

/// Gives back what `token` still holds (each item whose holder it still is), at the head of
/// its queue in the order taken, and tells the stores waiting on those queues (as `from`,
/// which woke its own); returns the queues' numbers.
const GIVE_BACK_FN: &str = r#"
local function give_back(token, from)
  local tx = p .. 'tx:' .. token
  local held = redis.call('LRANGE', tx, 0, -1)
  local by_queue, order = {}, {}
  for _, e in ipairs(held) do
    local q, id = string.match(e, '^(%d+):(%d+)$')
    if q and redis.call('HGET', qkey(q, 'holder'), id) == token then
      if not by_queue[q] then by_queue[q] = {}; order[#order + 1] = q end
      table.insert(by_queue[q], id)
    end
  end
  for _, q in ipairs(order) do
    put_back(q, by_queue[q])
    redis.call('PUBLISH', p .. 'wake', q .. ':' .. from)
  end
  redis.call('DEL', tx)
  return order
end
"#;

/// [`GIVE_BACK_FN`] as a call of its own (an abort, a dropped transaction, its deadline) of
/// transaction `ARGV[2]` of store `ARGV[3]`.
pub(super) const GIVE_BACK: &str = r#"
return give_back(ARGV[2], ARGV[3])
"#;

/// Commits transaction `ARGV[2]` (its token; empty: it took nothing) of store `ARGV[3]` (its
/// name in the wake-ups): every item it holds is deleted, and the `ARGV[4]` enqueues that
/// follow (queue number, record; in order) get the next ids at the tails of their queues. Returns `{'ok', first id}`, or `{'expired'}` when an item it
/// took is no longer held by it or its hold ended: then nothing applies, and what it still
/// held is given back.
pub(super) const COMMIT: &str = r#"
local token, from, m = ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = now_ms()
local taken = {}
if token ~= '' then
  local held = redis.call('LRANGE', p .. 'tx:' .. token, 0, -1)
  for _, e in ipairs(held) do
    local q, id = string.match(e, '^(%d+):(%d+)$')
    local score = q and redis.call('ZSCORE', qkey(q, 'held'), id)
    if not score or tonumber(score) <= now
        or redis.call('HGET', qkey(q, 'holder'), id) ~= token then
      give_back(token, from)
      return {'expired'}
    end
    taken[#taken + 1] = {q, id}
  end
  for _, t in ipairs(taken) do
    redis.call('ZREM', qkey(t[1], 'held'), t[2])
    redis.call('HDEL', qkey(t[1], 'holder'), t[2])
    redis.call('HDEL', qkey(t[1], 'items'), t[2])
  end
  redis.call('DEL', p .. 'tx:' .. token)
end
local first = 0
if m > 0 then
  local last = redis.call('INCRBY', p .. 'seq', m)
  first = last - m + 1
  local woken, order = {}, {}
  for i = 0, m - 1 do
    local q, rec = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
    redis.call('HSET', qkey(q, 'items'), first + i, rec)
    redis.call('RPUSH', qkey(q, 'ready'), first + i)
    if not woken[q] then woken[q] = true; order[#order + 1] = q end
  end
  for _, q in ipairs(order) do redis.call('PUBLISH', p .. 'wake', q .. ':' .. from) end
end
return {'ok', first}
"#;

/// The visible items of queue `ARGV[2]` (after taking back those whose hold ended).
pub(super) const COUNT: &str = r#"
local q = ARGV[2]
reclaim(q, now_ms())
return redis.call('LLEN', qkey(q, 'ready'))
"#;

/// Queue `ARGV[2]`'s figures: `{visible, held, head record or false}`.
pub(super) const STATS: &str = r#"
local q = ARGV[2]
reclaim(q, now_ms())
local head = redis.call('LINDEX', qkey(q, 'ready'), 0)
local rec = false
if head then rec = redis.call('HGET', qkey(q, 'items'), head) end
return {redis.call('LLEN', qkey(q, 'ready')), redis.call('ZCARD', qkey(q, 'held')), rec}
"#;

/// Takes back the items whose hold ended in each queue of `ARGV[2..]`; returns how many.
pub(super) const RECLAIM: &str = r#"
local now, n = now_ms(), 0
for i = 2, #ARGV do n = n + reclaim(ARGV[i], now) end
return n
"#;

/// Up to `ARGV[4]` items of queue `ARGV[2]` with an id above `ARGV[3]`, in id order:
/// `{id, record, held (0/1), ...}`. Reads the ready list and the held set whole: a page of a
/// queue costs its length (as on the embedded engines' browse).
pub(super) const BROWSE: &str = r#"
local q, after, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local ids = {}
for _, id in ipairs(redis.call('LRANGE', qkey(q, 'ready'), 0, -1)) do
  if tonumber(id) > after then ids[#ids + 1] = {tonumber(id), 0} end
end
for _, id in ipairs(redis.call('ZRANGE', qkey(q, 'held'), 0, -1)) do
  if tonumber(id) > after then ids[#ids + 1] = {tonumber(id), 1} end
end
table.sort(ids, function(a, b) return a[1] < b[1] end)
local out = {}
for i = 1, math.min(limit, #ids) do
  local rec = redis.call('HGET', qkey(q, 'items'), ids[i][1])
  if rec then
    out[#out + 1] = ids[i][1]; out[#out + 1] = rec; out[#out + 1] = ids[i][2]
  end
end
return out
"#;

/// A script as sent: the shared part, then its own.
pub(super) fn source(own: &str) -> String {
    let mut s = String::with_capacity(COMMON.len() + GIVE_BACK_FN.len() + own.len());
    s.push_str(COMMON);
    s.push_str(GIVE_BACK_FN);
    s.push_str(own);
    s
}
