//! The Redis engine's Lua code: each call that changes the store is one function of a
//! library (Redis 7's functions), which Redis runs atomically (no other command runs
//! meanwhile). The client loads the library (`FUNCTION LOAD`) when the server answers that a
//! function is missing (a new server, or one whose functions were flushed) and calls by
//! `FCALL`. A function's code is compiled once, at load, with the helpers it shares with the
//! others; a script sent by `EVALSHA` would define those helpers again on every call. The
//! library and its functions are named after the digest of their code, so that builds with
//! other code keep theirs on a shared server.
//!
//! Every function gets the store's catalog key as its one key and, as `ARGV[1..3]`, the
//! store's key prefix (`rq:{<namespace>}:`), the time (ms since the epoch: a store's injected
//! clock; `0` for the server's clock) and the calling store's name in wake-ups; its own
//! arguments follow. Every key a function touches has the prefix's hash tag, so it lives in
//! the catalog key's slot (one slot of a Redis Cluster, which is what lets a transaction
//! across queues stay one atomic call there).
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
//!   - `<p>tx:<t>` (below), when an open transaction holds it;
//!   - `<p>q:<q>:delayed`: sorted set of the ids not due yet, scored by their due time;
//!   - `<p>q:<q>:leased`: sorted set of the leased ids (a lease's token is its item's id),
//!     scored by the lease's deadline;
//! - `<p>q:<q>:keys`: hash, deduplication key → id, and `<p>q:<q>:keyof` the other way, for
//!   the items with a key;
//! - `<p>q:<q>:dead`: hash, id → record of the dead letters; `<p>q:<q>:deadwhy`: id →
//!   reason; `<p>q:<q>:deadids`: their ids, in a sorted set scored by id (for pages);
//! - `<p>q:<q>:damaged`: list of ids whose record was missing when a dequeue reached them;
//! - `<p>tx:<t>`: list of `<q>:<id>`, what transaction `t` holds, in the order taken; an
//!   item is in one such list or in its queue's structures, never both. A token is 64 random
//!   bits in hex, made by the client before its first dequeue, so that a dequeue whose answer
//!   is lost (its future dropped, the connection cut) is still the transaction's to give back;
//! - `<p>holds`: sorted set of the tokens of the transactions that hold items, scored by the
//!   time their hold ends (the first reclaim after it gives the items back);
//!   `<p>held`: hash, queue number → how many of its items transactions hold (for stats);
//! - `<p>wake`: the channel on which a change names each queue that got visible items
//!   (`<q>:<store>`, so that a store that woke its own waiters skips its own message; `<q>:`
//!   when every store's waiters are to look).
//!
//! Writes that a script makes before a command fails are not undone by Redis: each script
//! checks what can fail (a record, a hold, a lease) before its first write. Only keys of the
//! wrong type (tampered with) can stop one half way; the call then fails with `Error::Redis`.

use std::sync::Arc;

use redis::aio::ConnectionManager;

use crate::clock::Clock;

/// A record, as the scripts read and rewrite it: a version byte (2), the enqueue time, the
/// first and the latest attempt's time (ms, big-endian u64 each), the attempts (big-endian
/// u32), then the enveloped item ([`super::record`]).
pub(super) const RECORD: usize = 1 + 8 + 8 + 8 + 4;

/// Shared by the scripts: the time, keys, records, policies, and what falls due (held
/// items whose hold ended, leases whose deadline passed, delayed items).
const COMMON: &str = r#"
-- Set by `begin` as each call starts: its arguments, the prefix, the time, the calling store.
local ARGV, p, NOW, FROM
-- Writes put off to the call's end (`finish`), where each is one command per key however
-- many of the calls of a batch made it: the held counts, the wake-ups, a commit's records
-- of consumed items, the end of its hold (its list, its entry in `<p>holds`), a take's
-- entry there, and the plain enqueues (records and ready lists; `reclaim` writes a queue's
-- before anything reads its ready list). Nothing in a call reads what it put off: a
-- transaction has one call at a time, and the keys put off are its own or only counted.
-- Also the queues `reclaim` looked at in this call, which it does not look at again.
local LATER
local function begin(args)
  LATER = {
    held = {}, heldq = {}, wakes = {}, wakeq = {}, gone = {}, goneq = {}, del = {},
    zrem = {}, zadd = {}, runs = {}, runq = {}, reclaimed = {}
  }
  ARGV = args
  p = args[1]
  NOW = tonumber(args[2])
  if NOW == 0 then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  FROM = args[3]
end
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
local function publish(m)
  if not LATER.wakes[m] then LATER.wakes[m] = true; LATER.wakeq[#LATER.wakeq + 1] = m end
end
local function wake(q) publish(q .. ':' .. FROM) end
local function wake_every_store(q) publish(q .. ':') end
-- `n` more (or fewer) of queue q's items are held.
local function held_add(q, n)
  local h = LATER.held
  if not h[q] then h[q] = 0; LATER.heldq[#LATER.heldq + 1] = q end
  h[q] = h[q] + n
end
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
-- `cmd key v1 v2 ...` for the values of `list`, a thousand at a time (Lua's unpack takes a
-- few thousand values at most; an even number keeps field-value pairs together).
local CHUNK = 1000
local function multi(cmd, key, list)
  for i = 1, #list, CHUNK do
    redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
-- HMGET of `fields` in hash `key`: the values in order, false for a missing one.
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
-- The list put off for queue q in `map` (LATER's), made and q noted in `order` the first
-- time.
local function listed(map, order, q)
  local l = map[q]
  if not l then l = {}; map[q] = l; order[#order + 1] = q end
  return l
end
-- Item `id` (record `rec`) goes to the tail of queue q, with the other plain enqueues of
-- the call (see LATER): id, record, id, record, ...
local function add_run(q, id, rec)
  local r = listed(LATER.runs, LATER.runq, q)
  r[#r + 1] = id
  r[#r + 1] = rec
end
-- Writes queue q's plain enqueues put off so far.
local function flush(q)
  local r = LATER.runs[q]
  if r then
    LATER.runs[q] = nil
    local ids = {}
    for i = 1, #r, 2 do ids[#ids + 1] = r[i] end
    multi('HSET', qkey(q, 'items'), r)
    multi('RPUSH', qkey(q, 'ready'), ids)
  end
end
-- The writes put off (LATER), at the end of a call.
local function finish()
  local l = LATER
  for _, q in ipairs(l.runq) do flush(q) end
  for _, q in ipairs(l.goneq) do multi('HDEL', qkey(q, 'items'), l.gone[q]) end
  for _, q in ipairs(l.heldq) do
    if l.held[q] ~= 0 then redis.call('HINCRBY', p .. 'held', q, l.held[q]) end
  end
  for i = 1, #l.del, CHUNK do redis.call('DEL', unpack(l.del, i, math.min(i + CHUNK - 1, #l.del))) end
  multi('ZREM', p .. 'holds', l.zrem)
  multi('ZADD', p .. 'holds', l.zadd)
  for _, m in ipairs(l.wakeq) do redis.call('PUBLISH', p .. 'wake', m) end
end
-- Puts the ids in `ids` back at the head of queue q's ready list, lowest id first.
local function to_head(q, ids)
  table.sort(ids, function(a, b) return tonumber(a) > tonumber(b) end)
  multi('LPUSH', qkey(q, 'ready'), ids)
end
-- `<q>:<id>` entries of a transaction's list, by queue: the queues in first-seen order and
-- each one's ids.
local function by_queue(entries)
  local ids, order = {}, {}
  for _, e in ipairs(entries) do
    local q, id = string.match(e, '^(%d+):(%d+)$')
    if q then
      if not ids[q] then ids[q] = {}; order[#order + 1] = q end
      local list = ids[q]
      list[#list + 1] = id
    end
  end
  return order, ids
end
-- Gives back what `token` holds, at the head of its queues, and wakes the stores waiting
-- on those queues (`everyone`: this one too); returns the queues' numbers.
local function give_back(token, everyone)
  local tx = p .. 'tx:' .. token
  local order, ids = by_queue(redis.call('LRANGE', tx, 0, -1))
  for _, q in ipairs(order) do
    to_head(q, ids[q])
    held_add(q, -#ids[q])
    if everyone then wake_every_store(q) else wake(q) end
  end
  redis.call('DEL', tx)
  redis.call('ZREM', p .. 'holds', token)
  return order
end
-- The items of transactions whose hold ended by NOW go back (at most 100 transactions a
-- call).
local function reclaim_holds()
  if LATER.reclaimed[''] then return end
  LATER.reclaimed[''] = true
  local ended = redis.call('ZRANGEBYSCORE', p .. 'holds', '-inf', NOW, 'LIMIT', 0, 100)
  for _, t in ipairs(ended) do give_back(t, true) end
end
-- Held items whose hold ended (of every queue), leases of queue q whose deadline passed
-- (back at the head, or to the dead letters at their last attempt) and its delayed items
-- that fell due (to the tail, in due order), by NOW; at most 1000 of each a call. Wakes
-- every store's waiters if any came.
local function reclaim(q)
  flush(q)
  reclaim_holds()
  if LATER.reclaimed[q] then return end
  LATER.reclaimed[q] = true
  local came = false
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
/// ms from now) and which holds `ARGV[9]` items already. Returns `{hold end, status, id,
/// record, ...}`; status is `ok`, `expired` (the transaction's hold ended: nothing taken) or
/// `missing:<id>` (that id had no record: set aside, the take ends there).
pub(super) const TAKE: &str = r#"
local q, n, token, hold = ARGV[4], tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
reclaim(q)
local ends = tonumber(ARGV[8])
if ends == 0 then
  ends = NOW + hold
elseif ends <= NOW then
  return {ends, 'expired'}
end
-- Its items were given back (another store's clock ran ahead of this one's): over.
if ARGV[9] ~= '0' and not redis.call('ZSCORE', p .. 'holds', token) then
  return {ends, 'expired'}
end
local out = {ends, 'ok'}
local ready = qkey(q, 'ready')
local ids = redis.call('LPOP', ready, n)
if not ids then return out end
local recs = hmget(qkey(q, 'items'), ids)
local entries = {}
for i, id in ipairs(ids) do
  local rec = recs[i]
  if not rec then
    redis.call('RPUSH', qkey(q, 'damaged'), id)
    out[2] = 'missing:' .. id
    local rest = {}
    for j = #ids, i + 1, -1 do rest[#rest + 1] = ids[j] end
    multi('LPUSH', ready, rest)
    break
  end
  entries[#entries + 1] = q .. ':' .. id
  out[#out + 1] = id
  out[#out + 1] = rec
end
if #entries > 0 then
  multi('RPUSH', p .. 'tx:' .. token, entries)
  LATER.zadd[#LATER.zadd + 1] = ends
  LATER.zadd[#LATER.zadd + 1] = token
  held_add(q, #entries)
end
return out
"#;

/// Gives back what transaction `ARGV[4]` holds (an abort, a dropped transaction, its
/// deadline), or with ids after it only those of them (a dequeue whose caller never read its
/// answer: the take put them at the tail of the transaction's list); returns the numbers of
/// the queues that got items back.
pub(super) const GIVE_BACK: &str = r#"
if #ARGV == 4 then return give_back(ARGV[4], false) end
local token, tx = ARGV[4], p .. 'tx:' .. ARGV[4]
local wanted = {}
for i = 5, #ARGV do wanted[ARGV[i]] = true end
local back, queues = {}, {}
for _, e in ipairs(redis.call('LRANGE', tx, 0, -1)) do
  local q, id = string.match(e, '^(%d+):(%d+)$')
  if q and wanted[id] then
    redis.call('LREM', tx, 1, e)
    if not back[q] then back[q] = {}; queues[#queues + 1] = q end
    table.insert(back[q], id)
  end
end
for _, q in ipairs(queues) do
  to_head(q, back[q])
  held_add(q, -#back[q])
  wake(q)
end
if redis.call('EXISTS', tx) == 0 then redis.call('ZREM', p .. 'holds', token) end
return queues
"#;

/// Commits transaction `ARGV[4]` (its token; empty: it took nothing), which holds `ARGV[5]`
/// items: every item it holds is consumed; then the `ARGV[6]` changes that follow, five
/// arguments each (a kind, the queue, three more), in order:
///
/// - `e`, q, record: an enqueue at the tail;
/// - `f`, q, record, due (ms; `+<ms>`: that long after now), key (empty: none): an enqueue
///   due then, or at once for a due time not after now; with a key, a no-op when an item of
///   the queue has it;
/// - `a`, q, token: an acknowledged lease, consumed;
/// - `i`, q, record, due, reason: an imported item (its attempts and times in its record),
///   with a reason a dead letter.
///
/// New items get the next ids, in order. Then, if `ARGV[7 + 5 * n]` names a queue, up to
/// `ARGV[8 + 5 * n]` of its items are leased for `ARGV[9 + 5 * n]` ms.
///
/// Returns `{'ok', deadline, token, record, ...}` (the leases), `{'expired'}` when the
/// transaction's hold ended (its items were given back, or are now), `{'lease', token}` when
/// an acknowledged lease is not running: then nothing applies, and what the transaction held
/// is given back.
pub(super) const COMMIT: &str = r#"
local token, expect, m = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local tx = p .. 'tx:' .. token
local held = {}
if token ~= '' then
  held = redis.call('LRANGE', tx, 0, -1)
  if #held ~= expect then
    give_back(token, false)
    return {'expired'}
  end
  if #held > 0 then
    local score = redis.call('ZSCORE', p .. 'holds', token)
    if not score or tonumber(score) <= NOW then
      give_back(token, false)
      return {'expired'}
    end
  end
end
for i = 0, m - 1 do
  local at = 7 + 5 * i
  if ARGV[at] == 'a' and not running(ARGV[at + 1], ARGV[at + 2]) then
    if #held > 0 then give_back(token, false) end
    return {'lease', ARGV[at + 2]}
  end
end
if #held > 0 then
  local order, ids = by_queue(held)
  for _, q in ipairs(order) do
    if redis.call('EXISTS', qkey(q, 'keyof')) == 1 then
      for _, id in ipairs(ids[q]) do free_key(q, id) end
    end
    local gone = listed(LATER.gone, LATER.goneq, q)
    for _, id in ipairs(ids[q]) do gone[#gone + 1] = id end
    held_add(q, -#ids[q])
  end
  LATER.del[#LATER.del + 1] = tx
  LATER.zrem[#LATER.zrem + 1] = token
end
local function due_of(s)
  if string.sub(s, 1, 1) == '+' then return NOW + tonumber(string.sub(s, 2)) end
  return tonumber(s)
end
-- The new items' ids, given out in order from one INCRBY.
local fresh = 0
for i = 0, m - 1 do
  if ARGV[7 + 5 * i] ~= 'a' then fresh = fresh + 1 end
end
local id = 0
if fresh > 0 then id = redis.call('INCRBY', p .. 'seq', fresh) - fresh end
local woken, order = {}, {}
local function came(q)
  if not woken[q] then woken[q] = true; order[#order + 1] = q end
end
-- Plain enqueues are put off (add_run): written together when the queue's ready list is
-- next written another way, or at the end.
for i = 0, m - 1 do
  local at = 7 + 5 * i
  local kind, q = ARGV[at], ARGV[at + 1]
  if kind ~= 'a' then id = id + 1 end
  if kind == 'e' then
    add_run(q, id, ARGV[at + 2])
    came(q)
  elseif kind == 'f' then
    local key = ARGV[at + 4]
    if key == '' or redis.call('HEXISTS', qkey(q, 'keys'), key) == 0 then
      redis.call('HSET', qkey(q, 'items'), id, ARGV[at + 2])
      if key ~= '' then
        redis.call('HSET', qkey(q, 'keys'), key, id)
        redis.call('HSET', qkey(q, 'keyof'), id, key)
      end
      local due = due_of(ARGV[at + 3])
      if due > NOW then
        redis.call('ZADD', qkey(q, 'delayed'), due, id)
      else
        flush(q)
        redis.call('RPUSH', qkey(q, 'ready'), id)
        came(q)
      end
    end
  elseif kind == 'a' then
    redis.call('ZREM', qkey(q, 'leased'), ARGV[at + 2])
    consume(q, ARGV[at + 2])
  elseif kind == 'i' then
    local reason = ARGV[at + 4]
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
        flush(q)
        redis.call('RPUSH', qkey(q, 'ready'), id)
        came(q)
      end
    end
  end
end
local out = {'ok', 0}
local lq = ARGV[7 + 5 * m]
if lq and lq ~= '' then
  reclaim(lq)
  out[2] = NOW + tonumber(ARGV[9 + 5 * m])
  local missing = lease(lq, tonumber(ARGV[8 + 5 * m]), tonumber(ARGV[9 + 5 * m]), out)
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
  redis.call('ZCARD', qkey(q, 'leased')), tonumber(redis.call('HGET', p .. 'held', q) or '0'),
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

/// Takes back the items of transactions whose hold ended, and what fell due in each queue
/// of `ARGV[4..]`.
pub(super) const RECLAIM: &str = r#"
reclaim_holds()
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

/// Runs the calls `ARGV[5..]` of other functions, `ARGV[4]` of them, one after the other at
/// one time, with their writes put off to the end of all (see `LATER`): each is the
/// function's name (as in `BODIES`), the number of its own arguments and those arguments.
/// Returns the answer of each, in order, or in its place the error that stopped it (what it
/// wrote before that stays written, as for a call of its own).
pub(super) const BATCH: &str = r#"
local outer, at, out = ARGV, 5, {}
for i = 1, tonumber(outer[4]) do
  local body, k = BODIES[outer[at]], tonumber(outer[at + 1])
  local sub = {outer[1], outer[2], outer[3]}
  for j = 1, k do sub[3 + j] = outer[at + 1 + j] end
  at = at + 2 + k
  ARGV = sub
  local ok, r = pcall(body)
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r
  else
    out[i] = {err = 'ERR ' .. tostring(r)}
  end
end
ARGV = outer
return out
"#;

/// The library as loaded: the constants this build gives it, the shared part, then each
/// function of `functions` (a name and its body) as `BODIES[name]`, registered as
/// `rq_<digest>_<name>` which runs it between `begin` and `finish` (`finish` also after an
/// error, which then stops the call: what the body wrote or put off before it stays, as
/// each of its commands would have); and the digest. The digest is of everything but the
/// names, which it is part of.
fn library(functions: &[(&str, &str)], default_policy: &str, expired: &str) -> (String, String) {
    let mut shared = format!(
        "local DEFAULT_POLICY = '{default_policy}'\nlocal EXPIRED = '{}'\n\
         local MAX_ATTEMPTS = {}\n",
        expired.replace('\\', "\\\\").replace('\'', "\\'"),
        crate::processing::MAX_ATTEMPTS
    );
    shared.push_str(COMMON);
    let mut digested = shared.clone();
    for (name, own) in functions {
        digested.push_str(&format!("-- {name}\n{own}\n"));
    }
    let digest = redis::Script::new(&digested).get_hash()[..16].to_owned();
    let mut code = format!("#!lua name=rq_{digest}\n{shared}local BODIES = {{}}\n");
    for (name, own) in functions {
        code.push_str(&format!("BODIES['{name}'] = function()\n{own}\nend\n"));
    }
    for (name, _) in functions {
        code.push_str(&format!(
            "redis.register_function('rq_{digest}_{name}', function(_, args)\n\
             begin(args)\nlocal ok, r = pcall(BODIES['{name}'])\nfinish()\n\
             if not ok then error(r, 0) end\nreturn r\nend)\n"
        ));
    }
    (code, digest)
}

/// `Scripts`: each function of the library under its name, the field and the function's
/// name alike, with its body's constant above.
macro_rules! functions {
    ($($name:ident: $body:ident),* $(,)?) => {
        /// The functions of the library, loaded when a server lacks them.
        pub(super) struct Scripts {
            $(pub(super) $name: Script,)*
        }

        impl Scripts {
            /// The library with `default_policy` (as the store keeps policies) for queues
            /// without one, and `expired` as the reason of an expired lease's burial.
            pub(super) fn new(default_policy: &str, expired: &str) -> Scripts {
                let functions = [$((stringify!($name), $body)),*];
                let (code, digest) = library(&functions, default_policy, expired);
                let code: Arc<str> = code.into();
                Scripts {
                    $($name: Script::new(&code, &digest, stringify!($name)),)*
                }
            }
        }
    };
}

functions! {
    queue: QUEUE,
    take: TAKE,
    give_back: GIVE_BACK,
    commit: COMMIT,
    count: COUNT,
    stats: STATS,
    reclaim: RECLAIM,
    browse: BROWSE,
    lease: LEASE,
    unlease: UNLEASE,
    drop_lease: DROP_LEASE,
    fail: FAIL,
    release: RELEASE,
    extend: EXTEND,
    set_policy: SET_POLICY,
    next_due: NEXT_DUE,
    dead_letters: DEAD_LETTERS,
    dead_work: DEAD_WORK,
    batch: BATCH,
}

/// What calls a store's functions: its connection, its catalog key (every function's one
/// key), the functions, and what every call passes first (`ARGV[1..3]`: the prefix, the time,
/// the store's name).
pub(super) struct Caller {
    pub(super) conn: ConnectionManager,
    pub(super) key: Arc<str>,
    pub(super) prefix: Arc<str>,
    pub(super) instance: Arc<str>,
    pub(super) clock: Clock,
    pub(super) scripts: Scripts,
}

impl Caller {
    /// A call of function `which`, its first three arguments given.
    pub(super) fn call(&self, which: fn(&Scripts) -> &Script) -> Invocation<'_> {
        let mut call = which(&self.scripts).key(&self.key);
        call.arg(&*self.prefix).arg(self.now()).arg(&*self.instance);
        call
    }

    /// The time the functions take (`ARGV[2]`): an injected clock's, else 0 (the
    /// server's).
    fn now(&self) -> u64 {
        if self.clock.is_manual() {
            self.clock.now()
        } else {
            0
        }
    }
}

/// One function of the library, as the engine calls it.
pub(super) struct Script {
    library: Arc<str>,
    name: &'static str,
    function: String,
}

/// A call of a [`Script`] being put together: `FCALL <function> 1 <key> <args...>`.
pub(super) struct Invocation<'a> {
    script: &'a Script,
    cmd: redis::Cmd,
}

impl Script {
    /// Function `name` of the library whose code is `library` and digest `digest`.
    fn new(library: &Arc<str>, digest: &str, name: &'static str) -> Script {
        Script {
            library: Arc::clone(library),
            name,
            function: format!("rq_{digest}_{name}"),
        }
    }

    /// Its name in the library's `BODIES` (as `batch` calls it).
    pub(super) fn name(&self) -> &'static str {
        self.name
    }

    /// A call with `key` as its one key.
    fn key(&self, key: &str) -> Invocation<'_> {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.function).arg(1).arg(key);
        Invocation { script: self, cmd }
    }
}

impl Invocation<'_> {
    /// One more argument.
    pub(super) fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Calls the function; when the server has no such function, loads the library and calls
    /// again.
    pub(super) async fn invoke_async<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::aio::ConnectionManager,
    ) -> redis::RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if missing_function(&e) => {
                let () = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&*self.script.library)
                    .query_async(conn)
                    .await?;
                self.cmd.query_async(conn).await
            }
            done => done,
        }
    }
}

/// Whether the server answered that the function called is not loaded.
fn missing_function(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_)) && e.to_string().contains("Function not found")
}
