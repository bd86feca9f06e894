//! The Redis engine's Lua scripts: each call that changes the store is one script, which
//! Redis runs atomically (no other command runs meanwhile). Loaded once and run by `EVALSHA`;
//! the client loads a script again when the server answers `NOSCRIPT` (a restarted server).
//!
//! Every script gets the store's catalog key as `KEYS[1]` and, as `ARGV[1..3]`, the store's
//! key prefix (`rq:{<namespace>}:`), the time (ms since the epoch: a store's injected clock;
//! `0` for the server's clock) and the calling store's name in wake-ups; its own arguments
//! follow. Every key a script touches has the prefix's hash tag, so it lives in the catalog
//! key's slot (one slot of a Redis Cluster, which is what lets a transaction across queues
//! stay one atomic script there).
//!
//! The keys, with `<p>` the prefix, `<q>` a queue's number and `<t>` a transaction's token:
//!
//! - `<p>queues`: hash, queue name → number; `<p>names`: hash, number → name;
//!   `<p>policy`: hash, number → retry policy (`max attempts,initial ms,max ms,jitter ‰`);
//! - `<p>seq`, `<p>qseq`: the last item id and queue number given out;
//! - `<p>version`: the key layout's version;
//! - `<p>q:<q>:items`: hash, id → record (see [`RECORD`]) of every item of the queue that is
//!   not a dead letter; where the id is:
//!   - `<p>q:<q>:ready`: list of the visible ids, head first;
//!   - `<p>q:<q>:held`: sorted set of the ids held by open transactions, scored by the time
//!     their hold ends; `<p>q:<q>:holder`: hash, id → the holder's token;
//!   - `<p>q:<q>:delayed`: sorted set of the ids not due yet, scored by their due time;
//!   - `<p>q:<q>:leased`: sorted set of the leased ids (a lease's token is its item's id),
//!     scored by the lease's deadline;
//! - `<p>q:<q>:keys`: hash, deduplication key → id, and `<p>q:<q>:keyof` the other way, for
//!   the items with a key;
//! - `<p>q:<q>:dead`: hash, id → record of the dead letters; `<p>q:<q>:deadwhy`: id →
//!   reason; `<p>q:<q>:deadids`: their ids, in a sorted set scored by id (for pages);
//! - `<p>q:<q>:damaged`: list of ids whose record was missing when a dequeue reached them;
//! - `<p>tx:<t>`: list of `<q>:<id>`, what transaction `t` holds (expires after its hold).
//!   A token is 64 random bits in hex, made by the client before its first dequeue, so that
//!   a dequeue whose answer is lost (its future dropped, the connection cut) is still the
//!   transaction's to give back;
//! - `<p>wake`: the channel on which a change names each queue that got visible items
//!   (`<q>:<store>`, so that a store that woke its own waiters skips its own message; `<q>:`
//!   when every store's waiters are to look).
//!
//! Writes that a script makes before a command fails are not undone by Redis: each script
//! checks what can fail (a record, a holder, a lease) before its first write. Only keys of the
//! wrong type (tampered with) can stop one half way; the call then fails with `Error::Redis`.

/// A record, as the scripts read and rewrite it: a version byte (2), the enqueue time, the
/// first and the latest attempt's time (ms, big-endian u64 each), the attempts (big-endian
/// u32), then the enveloped item ([`super::record`]).
pub(super) const RECORD: usize = 1 + 8 + 8 + 8 + 4;

/// Shared by the scripts: the time, keys, records, policies, and what falls due (held
/// items whose hold ended, leases whose deadline passed, delayed items).
const COMMON: &str = r#"
local p = ARGV[1]
local NOW = tonumber(ARGV[2])
if NOW == 0 then
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local FROM = ARGV[3]
local function qkey(q, what) return p .. 'q:' .. q .. ':' .. what end
local function rd_u(s, pos, n)
  local v = 0
  for i = pos, pos + n - 1 do v = v * 256 + string.byte(s, i) end
  return v
end
local function wr_u(v, n)
  local t = {}
  for i = n, 1, -1 do t[i] = string.char(v % 256); v = math.floor(v / 256) end
  return table.concat(t)
end
local function valid(rec) return #rec >= 29 and string.byte(rec, 1) == 2 end
local function attempts_of(rec) return rd_u(rec, 26, 4) end
local function with_attempts(rec, a) return string.sub(rec, 1, 25) .. wr_u(a, 4) .. string.sub(rec, 30) end
-- The record with one more attempt counted, at NOW; and the attempt's number.
local function counted(rec)
  local a = math.min(attempts_of(rec) + 1, MAX_ATTEMPTS)
  local first = rd_u(rec, 10, 8)
  if first == 0 then first = NOW end
  return string.sub(rec, 1, 9) .. wr_u(first, 8) .. wr_u(NOW, 8) .. wr_u(a, 4) .. string.sub(rec, 30), a
end
local function policy(q)
  local s = redis.call('HGET', p .. 'policy', q)
  local m, i, x, j = string.match(s or '', '^(%d+),(%d+),(%d+),(%d+)$')
  if not m then m, i, x, j = string.match(DEFAULT_POLICY, '^(%d+),(%d+),(%d+),(%d+)$') end
  return tonumber(m), tonumber(i), tonumber(x), tonumber(j)
end
local function wake(q) redis.call('PUBLISH', p .. 'wake', q .. ':' .. FROM) end
local function wake_every_store(q) redis.call('PUBLISH', p .. 'wake', q .. ':') end
local function new_id() return redis.call('INCR', p .. 'seq') end
-- The key of item `id`, if it has one, is free again.
local function free_key(q, id)
  local k = redis.call('HGET', qkey(q, 'keyof'), id)
  if k then
    redis.call('HDEL', qkey(q, 'keyof'), id)
    if redis.call('HGET', qkey(q, 'keys'), k) == tostring(id) then
      redis.call('HDEL', qkey(q, 'keys'), k)
    end
  end
end
-- Item `old` takes id `new` (a new version: leased, retried), its key with it; returns
-- its record.
local function rekey(q, old, new, rec)
  redis.call('HDEL', qkey(q, 'items'), old)
  redis.call('HSET', qkey(q, 'items'), new, rec)
  local k = redis.call('HGET', qkey(q, 'keyof'), old)
  if k then
    redis.call('HDEL', qkey(q, 'keyof'), old)
    redis.call('HSET', qkey(q, 'keyof'), new, k)
    redis.call('HSET', qkey(q, 'keys'), k, new)
  end
end
-- Item `id` (its record `rec`) is gone from the queue: consumed.
local function consume(q, id)
  free_key(q, id)
  redis.call('HDEL', qkey(q, 'items'), id)
end
-- Item `id` to the dead letters with `reason`, under a new id.
local function bury(q, id, rec, reason)
  consume(q, id)
  local d = new_id()
  redis.call('HSET', qkey(q, 'dead'), d, rec)
  redis.call('HSET', qkey(q, 'deadwhy'), d, reason)
  redis.call('ZADD', qkey(q, 'deadids'), d, d)
end
-- Puts the ids in `ids` back at the head of queue q's ready list, lowest id first.
local function to_head(q, ids)
  table.sort(ids, function(a, b) return tonumber(a) > tonumber(b) end)
  for _, id in ipairs(ids) do redis.call('LPUSH', qkey(q, 'ready'), id) end
end
-- Held items whose hold ended, leases whose deadline passed (back at the head, or to the
-- dead letters at their last attempt) and delayed items that fell due (to the tail, in due
-- order), by NOW; at most 1000 of each a call. Wakes every store's waiters if any came.
local function reclaim(q)
  local came = false
  local ids = redis.call('ZRANGEBYSCORE', qkey(q, 'held'), '-inf', NOW, 'LIMIT', 0, 1000)
  if #ids > 0 then
    for _, id in ipairs(ids) do
      redis.call('ZREM', qkey(q, 'held'), id)
      redis.call('HDEL', qkey(q, 'holder'), id)
    end
    to_head(q, ids)
    came = true
  end
  local ended = redis.call('ZRANGEBYSCORE', qkey(q, 'leased'), '-inf', NOW, 'LIMIT', 0, 1000)
  if #ended > 0 then
    local max = policy(q)
    local back = {}
    for _, t in ipairs(ended) do
      redis.call('ZREM', qkey(q, 'leased'), t)
      local rec = redis.call('HGET', qkey(q, 'items'), t)
      if rec and valid(rec) and attempts_of(rec) >= max then
        bury(q, t, rec, EXPIRED)
      elseif rec then
        back[#back + 1] = t
      end
    end
    if #back > 0 then to_head(q, back); came = true end
  end
  local due = redis.call('ZRANGEBYSCORE', qkey(q, 'delayed'), '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, 1000)
  if #due > 0 then
    local items = {}
    for i = 1, #due, 2 do items[#items + 1] = {tonumber(due[i + 1]), tonumber(due[i]), due[i]} end
    table.sort(items, function(a, b)
      if a[1] ~= b[1] then return a[1] < b[1] end
      return a[2] < b[2]
    end)
    for _, it in ipairs(items) do
      redis.call('ZREM', qkey(q, 'delayed'), it[3])
      redis.call('RPUSH', qkey(q, 'ready'), it[3])
    end
    came = true
  end
  if came then wake_every_store(q) end
end
-- Gives back what `token` still holds (each item whose holder it still is), at the head of
-- its queue, and wakes the stores waiting on those queues; returns the queues' numbers.
local function give_back(token)
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
    for _, id in ipairs(by_queue[q]) do
      redis.call('ZREM', qkey(q, 'held'), id)
      redis.call('HDEL', qkey(q, 'holder'), id)
    end
    to_head(q, by_queue[q])
    wake(q)
  end
  redis.call('DEL', tx)
  return order
end
-- Leases up to n items at the head of queue q for ttl ms: each gets a new id (its token),
-- its attempt counted. Appends {token, record} pairs to `out`; a missing record ends it
-- (set aside), and its id is returned.
local function lease(q, n, ttl, out)
  local deadline = NOW + ttl
  for _ = 1, n do
    local id = redis.call('LINDEX', qkey(q, 'ready'), 0)
    if not id then break end
    local rec = redis.call('HGET', qkey(q, 'items'), id)
    redis.call('LPOP', qkey(q, 'ready'))
    if not rec or not valid(rec) then
      redis.call('RPUSH', qkey(q, 'damaged'), id)
      return id
    end
    local token = new_id()
    local leased = counted(rec)
    rekey(q, id, token, leased)
    redis.call('ZADD', qkey(q, 'leased'), deadline, token)
    out[#out + 1] = token
    out[#out + 1] = leased
  end
  return false
end
-- Is lease `token` of queue q running?
local function running(q, token)
  local d = redis.call('ZSCORE', qkey(q, 'leased'), token)
  return d and tonumber(d) > NOW
end
"#;

/// Finds queue `ARGV[4]` (a name) or adds it with the default policy; returns `{number,
/// policy}`.
pub(super) const QUEUE: &str = r#"
local name = ARGV[4]
local q = redis.call('HGET', p .. 'queues', name)
if not q then
  q = redis.call('INCR', p .. 'qseq')
  redis.call('HSET', p .. 'queues', name, q)
  redis.call('HSET', p .. 'names', q, name)
  redis.call('HSETNX', p .. 'policy', q, DEFAULT_POLICY)
end
return {tonumber(q), redis.call('HGET', p .. 'policy', q) or DEFAULT_POLICY}
"#;

/// Takes up to `ARGV[5]` items at the head of queue `ARGV[4]` into transaction `ARGV[6]` (its
/// token, made by the client), whose hold ends at `ARGV[8]` (0 for its first take: `ARGV[7]`
/// ms from now). Returns `{hold end, status, id, record, ...}`; status is `ok`, `expired` (the
/// transaction's hold ended: nothing taken) or `missing:<id>` (that id had no record: set
/// aside, the take ends there).
pub(super) const TAKE: &str = r#"
local q, n, token, hold = ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
reclaim(q)
local ends = tonumber(ARGV[8])
if ends == 0 then
  ends = NOW + hold
elseif ends <= NOW then
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
    out[2] = 'missing:' .. id
    break
  end
  redis.call('ZADD', qkey(q, 'held'), ends, id)
  redis.call('HSET', qkey(q, 'holder'), id, token)
  redis.call('RPUSH', tx, q .. ':' .. id)
  out[#out + 1] = id
  out[#out + 1] = rec
end
-- Relative: the server's clock runs the expiry, and NOW may be a store's injected clock.
if #out > 2 then redis.call('PEXPIRE', tx, math.max(ends - NOW, 0) + 600000) end
return out
"#;

/// Gives back what transaction `ARGV[4]` still holds (an abort, a dropped transaction, its
/// deadline), or with ids after it only those of them (a dequeue whose caller never read its
/// answer: the take put them at the tail of the transaction's list); returns the numbers of
/// the queues that got items back.
pub(super) const GIVE_BACK: &str = r#"
if #ARGV == 4 then return give_back(ARGV[4]) end
local token, tx = ARGV[4], p .. 'tx:' .. ARGV[4]
local wanted = {}
for i = 5, #ARGV do wanted[ARGV[i]] = true end
local back, queues = {}, {}
for _, e in ipairs(redis.call('LRANGE', tx, 0, -1)) do
  local q, id = string.match(e, '^(%d+):(%d+)$')
  if q and wanted[id] and redis.call('HGET', qkey(q, 'holder'), id) == token then
    redis.call('ZREM', qkey(q, 'held'), id)
    redis.call('HDEL', qkey(q, 'holder'), id)
    redis.call('LREM', tx, 1, e)
    if not back[q] then back[q] = {}; queues[#queues + 1] = q end
    table.insert(back[q], id)
  end
end
for _, q in ipairs(queues) do to_head(q, back[q]); wake(q) end
return queues
"#;

/// Commits transaction `ARGV[4]` (its token; empty: it took nothing): every item it holds is
/// consumed; then the `ARGV[5]` changes that follow, five arguments each (a kind, the queue,
/// three more), in order:
///
/// - `e`, q, record: an enqueue at the tail;
/// - `f`, q, record, due (ms; `+<ms>`: that long after now), key (empty: none): an enqueue
///   due then, or at once for a due time not after now; with a key, a no-op when an item of
///   the queue has it;
/// - `a`, q, token: an acknowledged lease, consumed;
/// - `i`, q, record, due, reason: an imported item (its attempts and times in its record),
///   with a reason a dead letter.
///
/// New items get the next ids, in order. Then, if `ARGV[6 + 5 * n]` names a queue, up to
/// `ARGV[7 + 5 * n]` of its items are leased for `ARGV[8 + 5 * n]` ms.
///
/// Returns `{'ok', deadline, token, record, ...}` (the leases), `{'expired'}` when an item the
/// transaction took is no longer held by it or its hold ended, `{'lease', token}` when an
/// acknowledged lease is not running: then nothing applies, and what the transaction held is
/// given back.
pub(super) const COMMIT: &str = r#"
local token, m = ARGV[4], tonumber(ARGV[5])
local taken = {}
if token ~= '' then
  local held = redis.call('LRANGE', p .. 'tx:' .. token, 0, -1)
  for _, e in ipairs(held) do
    local q, id = string.match(e, '^(%d+):(%d+)$')
    local score = q and redis.call('ZSCORE', qkey(q, 'held'), id)
    if not score or tonumber(score) <= NOW
        or redis.call('HGET', qkey(q, 'holder'), id) ~= token then
      give_back(token)
      return {'expired'}
    end
    taken[#taken + 1] = {q, id}
  end
end
for i = 0, m - 1 do
  local at = 6 + 5 * i
  if ARGV[at] == 'a' and not running(ARGV[at + 1], ARGV[at + 2]) then
    if token ~= '' then give_back(token) end
    return {'lease', ARGV[at + 2]}
  end
end
for _, t in ipairs(taken) do
  redis.call('ZREM', qkey(t[1], 'held'), t[2])
  redis.call('HDEL', qkey(t[1], 'holder'), t[2])
  consume(t[1], t[2])
end
if token ~= '' then redis.call('DEL', p .. 'tx:' .. token) end
local function due_of(s)
  if string.sub(s, 1, 1) == '+' then return NOW + tonumber(string.sub(s, 2)) end
  return tonumber(s)
end
local woken, order = {}, {}
local function came(q)
  if not woken[q] then woken[q] = true; order[#order + 1] = q end
end
for i = 0, m - 1 do
  local at = 6 + 5 * i
  local kind, q = ARGV[at], ARGV[at + 1]
  if kind == 'e' then
    local id = new_id()
    redis.call('HSET', qkey(q, 'items'), id, ARGV[at + 2])
    redis.call('RPUSH', qkey(q, 'ready'), id)
    came(q)
  elseif kind == 'f' then
    local key = ARGV[at + 4]
    if key == '' or redis.call('HEXISTS', qkey(q, 'keys'), key) == 0 then
      local id = new_id()
      redis.call('HSET', qkey(q, 'items'), id, ARGV[at + 2])
      if key ~= '' then
        redis.call('HSET', qkey(q, 'keys'), key, id)
        redis.call('HSET', qkey(q, 'keyof'), id, key)
      end
      local due = due_of(ARGV[at + 3])
      if due > NOW then
        redis.call('ZADD', qkey(q, 'delayed'), due, id)
      else
        redis.call('RPUSH', qkey(q, 'ready'), id)
        came(q)
      end
    end
  elseif kind == 'a' then
    redis.call('ZREM', qkey(q, 'leased'), ARGV[at + 2])
    consume(q, ARGV[at + 2])
  elseif kind == 'i' then
    local id, reason = new_id(), ARGV[at + 4]
    if reason ~= '' then
      redis.call('HSET', qkey(q, 'dead'), id, ARGV[at + 2])
      redis.call('HSET', qkey(q, 'deadwhy'), id, reason)
      redis.call('ZADD', qkey(q, 'deadids'), id, id)
    else
      redis.call('HSET', qkey(q, 'items'), id, ARGV[at + 2])
      local due = tonumber(ARGV[at + 3])
      if due > NOW then
        redis.call('ZADD', qkey(q, 'delayed'), due, id)
      else
        redis.call('RPUSH', qkey(q, 'ready'), id)
        came(q)
      end
    end
  end
end
local out = {'ok', 0}
local lq = ARGV[6 + 5 * m]
if lq and lq ~= '' then
  reclaim(lq)
  out[2] = NOW + tonumber(ARGV[8 + 5 * m])
  local missing = lease(lq, tonumber(ARGV[7 + 5 * m]), tonumber(ARGV[8 + 5 * m]), out)
  if missing then out[1] = 'missing:' .. missing end
end
for _, q in ipairs(order) do wake(q) end
return out
"#;

/// Leases up to `ARGV[5]` items of queue `ARGV[4]` for `ARGV[6]` ms: `{status, deadline,
/// token, record, ...}`, status `ok` or `missing:<id>`.
pub(super) const LEASE: &str = r#"
local q = ARGV[4]
reclaim(q)
local out = {'ok', NOW + tonumber(ARGV[6])}
local missing = lease(q, tonumber(ARGV[5]), tonumber(ARGV[6]), out)
if missing then out[1] = 'missing:' .. missing end
return out
"#;

/// Gives back the leases `ARGV[5..]` of queue `ARGV[4]` that were handed to nobody (their
/// items did not decode): at the head, their attempts not counted.
pub(super) const UNLEASE: &str = r#"
local q = ARGV[4]
local back = {}
for i = 5, #ARGV do
  local t = ARGV[i]
  if redis.call('ZREM', qkey(q, 'leased'), t) == 1 then
    local rec = redis.call('HGET', qkey(q, 'items'), t)
    if rec and valid(rec) then
      redis.call('HSET', qkey(q, 'items'), t, with_attempts(rec, math.max(attempts_of(rec) - 1, 0)))
      back[#back + 1] = t
    end
  end
end
if #back > 0 then to_head(q, back); wake_every_store(q) end
return #back
"#;

/// Gives back lease `ARGV[5]` of queue `ARGV[4]` at the head (a dropped lease: its attempt
/// stays counted). Returns 1, or 0 when the lease was not running.
pub(super) const DROP_LEASE: &str = r#"
local q, t = ARGV[4], ARGV[5]
if redis.call('ZREM', qkey(q, 'leased'), t) == 0 then return 0 end
to_head(q, {t})
wake_every_store(q)
return 1
"#;

/// Settles lease `ARGV[5]` of queue `ARGV[4]` as failed with reason `ARGV[6]`: due again
/// after the queue's backoff, or to the dead letters at its last attempt. Returns
/// `{'retry', due}`, `{'dead'}` or `{'ended'}` (the lease was not running).
pub(super) const FAIL: &str = r#"
local q, t, reason = ARGV[4], ARGV[5], ARGV[6]
if not running(q, t) then return {'ended'} end
local rec = redis.call('HGET', qkey(q, 'items'), t)
if not rec or not valid(rec) then return {'ended'} end
redis.call('ZREM', qkey(q, 'leased'), t)
local a = attempts_of(rec)
local max, initial, cap, jitter = policy(q)
if a >= max then
  bury(q, t, rec, reason)
  return {'dead'}
end
local base = math.min(initial * math.pow(2, math.min(a - 1, 62)), cap)
local spread = math.floor(base * jitter / 1000)
local wait = base
if spread > 0 then
  local h = tonumber(string.sub(redis.sha1hex(t .. ':' .. a), 1, 12), 16)
  wait = base - spread + (h % (2 * spread + 1))
end
local due = NOW + wait
local id = new_id()
rekey(q, t, id, rec)
redis.call('ZADD', qkey(q, 'delayed'), due, id)
return {'retry', due}
"#;

/// Settles lease `ARGV[5]` of queue `ARGV[4]` by giving its item back, due after `ARGV[6]`
/// ms (at the head for 0), its attempts kept. Returns 1, or 0 when the lease was not running.
pub(super) const RELEASE: &str = r#"
local q, t, delay = ARGV[4], ARGV[5], tonumber(ARGV[6])
if not running(q, t) then return 0 end
redis.call('ZREM', qkey(q, 'leased'), t)
if delay == 0 then
  to_head(q, {t})
  wake(q)
else
  local rec = redis.call('HGET', qkey(q, 'items'), t)
  local id = new_id()
  rekey(q, t, id, rec)
  redis.call('ZADD', qkey(q, 'delayed'), NOW + delay, id)
end
return 1
"#;

/// Moves the deadline of lease `ARGV[5]` of queue `ARGV[4]` to `ARGV[6]` ms from now: the new
/// deadline, or -1 when the lease was not running.
pub(super) const EXTEND: &str = r#"
local q, t = ARGV[4], ARGV[5]
if not running(q, t) then return -1 end
local deadline = NOW + tonumber(ARGV[6])
redis.call('ZADD', qkey(q, 'leased'), deadline, t)
return deadline
"#;

/// The visible items of queue `ARGV[4]`.
pub(super) const COUNT: &str = r#"
local q = ARGV[4]
reclaim(q)
return redis.call('LLEN', qkey(q, 'ready'))
"#;

/// Queue `ARGV[4]`'s figures: `{visible, delayed, leased, held, dead, head record or false,
/// policy}`.
pub(super) const STATS: &str = r#"
local q = ARGV[4]
reclaim(q)
local head = redis.call('LINDEX', qkey(q, 'ready'), 0)
local rec = false
if head then rec = redis.call('HGET', qkey(q, 'items'), head) end
return {
  redis.call('LLEN', qkey(q, 'ready')), redis.call('ZCARD', qkey(q, 'delayed')),
  redis.call('ZCARD', qkey(q, 'leased')), redis.call('ZCARD', qkey(q, 'held')),
  redis.call('ZCARD', qkey(q, 'deadids')), rec,
  redis.call('HGET', p .. 'policy', q) or DEFAULT_POLICY
}
"#;

/// Sets queue `ARGV[4]`'s retry policy to `ARGV[5]`.
pub(super) const SET_POLICY: &str = r#"
redis.call('HSET', p .. 'policy', ARGV[4], ARGV[5])
return 1
"#;

/// Milliseconds until queue `ARGV[4]`'s next delayed item or lease falls due (-1: none).
pub(super) const NEXT_DUE: &str = r#"
local q = ARGV[4]
local best = -1
for _, what in ipairs({'delayed', 'leased'}) do
  local first = redis.call('ZRANGE', qkey(q, what), 0, 0, 'WITHSCORES')
  if first[2] then
    local left = math.max(tonumber(first[2]) - NOW, 0)
    if best < 0 or left < best then best = left end
  end
end
return best
"#;

/// Takes back what fell due in each queue of `ARGV[4..]`.
pub(super) const RECLAIM: &str = r#"
for i = 4, #ARGV do reclaim(ARGV[i]) end
return 1
"#;

/// Up to `ARGV[6]` items of queue `ARGV[4]` with an id above `ARGV[5]`, in id order:
/// `{id, record, state, time, ...}`, state 0 visible, 1 delayed (time: due), 2 leased (time:
/// deadline). Items held by open transactions are not listed (as on the embedded engines). Reads the queue's ids whole: a page costs the queue's length.
pub(super) const BROWSE: &str = r#"
local q, after, limit = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
reclaim(q)
local ids = {}
for _, id in ipairs(redis.call('LRANGE', qkey(q, 'ready'), 0, -1)) do
  if tonumber(id) > after then ids[#ids + 1] = {tonumber(id), 0, 0} end
end
for i, what in ipairs({'delayed', 'leased'}) do
  local all = redis.call('ZRANGE', qkey(q, what), 0, -1, 'WITHSCORES')
  for k = 1, #all, 2 do
    if tonumber(all[k]) > after then ids[#ids + 1] = {tonumber(all[k]), i, tonumber(all[k + 1])} end
  end
end
table.sort(ids, function(a, b) return a[1] < b[1] end)
local out = {}
for i = 1, math.min(limit, #ids) do
  local rec = redis.call('HGET', qkey(q, 'items'), ids[i][1])
  if rec then
    out[#out + 1] = ids[i][1]; out[#out + 1] = rec
    out[#out + 1] = ids[i][2]; out[#out + 1] = ids[i][3]
  end
end
return out
"#;

/// Up to `ARGV[6]` dead letters of queue `ARGV[4]` with an id above `ARGV[5]`, oldest
/// first: `{id, record, reason, ...}`.
pub(super) const DEAD_LETTERS: &str = r#"
local q, after, limit = ARGV[4], ARGV[5], tonumber(ARGV[6])
local ids = redis.call('ZRANGEBYSCORE', qkey(q, 'deadids'), '(' .. after, '+inf', 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', qkey(q, 'dead'), id) or ''
  out[#out + 1] = redis.call('HGET', qkey(q, 'deadwhy'), id) or ''
end
return out
"#;

/// Replays (to the tail, under new ids; with `ARGV[5]` = 1 their attempts reset) or, with
/// `ARGV[6]` = 1, purges dead letters of queue `ARGV[4]`: all (`ARGV[7]` = `all`), the
/// first `ARGV[8]` (`first`), or the ids `ARGV[8..]` (`ids`). Returns `{'ok', how many}`, or
/// `{'missing', id}` for an id that is not a dead letter (then nothing is done).
pub(super) const DEAD_WORK: &str = r#"
local q, reset, purge, mode = ARGV[4], ARGV[5] == '1', ARGV[6] == '1', ARGV[7]
local ids
if mode == 'all' then
  ids = redis.call('ZRANGE', qkey(q, 'deadids'), 0, -1)
elseif mode == 'first' then
  ids = redis.call('ZRANGE', qkey(q, 'deadids'), 0, tonumber(ARGV[8]) - 1)
else
  ids = {}
  for i = 8, #ARGV do
    if redis.call('HEXISTS', qkey(q, 'dead'), ARGV[i]) == 0 then return {'missing', ARGV[i]} end
    ids[#ids + 1] = ARGV[i]
  end
end
for _, d in ipairs(ids) do
  local rec = redis.call('HGET', qkey(q, 'dead'), d)
  redis.call('HDEL', qkey(q, 'dead'), d)
  redis.call('HDEL', qkey(q, 'deadwhy'), d)
  redis.call('ZREM', qkey(q, 'deadids'), d)
  if not purge and rec then
    if reset and valid(rec) then rec = with_attempts(rec, 0) end
    local id = new_id()
    redis.call('HSET', qkey(q, 'items'), id, rec)
    redis.call('RPUSH', qkey(q, 'ready'), id)
  end
end
if not purge and #ids > 0 then wake_every_store(q) end
return {'ok', #ids}
"#;

/// A script as sent: the shared part (with the constants this build gives it), then its own.
pub(super) fn source(own: &str, default_policy: &str, expired: &str) -> String {
    let mut s = String::with_capacity(COMMON.len() + own.len() + 128);
    s.push_str(&format!(
        "local DEFAULT_POLICY = '{default_policy}'\nlocal EXPIRED = '{}'\n\
         local MAX_ATTEMPTS = {}\n",
        expired.replace('\\', "\\\\").replace('\'', "\\'"),
        crate::processing::MAX_ATTEMPTS
    ));
    s.push_str(COMMON);
    s.push_str(own);
    s
}
