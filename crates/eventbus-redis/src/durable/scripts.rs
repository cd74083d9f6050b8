//! The Lua scripts: every change to a consumer's state is one atomic script, so any
//! instance may run any step and two instances racing on one event cannot both win.
//!
//! Stream entry fields: `e` the event envelope, `k` ordering key (absent = none), and
//! for an event appended again after a failure `a` (failed attempts so far), `f`
//! (first delivery, ms) and `x` (failures, JSON `[{"at_ms":…,"reason":…}]`). The event
//! id and channel are read from the envelope (`meta` in the prelude): every field costs
//! on each read, and only the rare failure paths need them here. A record in `:r` is `cmsgpack({e, c, k, i, a, f, x})`
//! (`k`, `f`, `x` empty when unset). A terminal-log entry holds the lines (each the JSON
//! of a `LogEntry`) of one script: one line in field `j` (the only format before lines
//! were packed, and still the only one written while `P:durable:log_format` is not `2`,
//! so that instances of the earlier release keep reading the log during a rolling
//! upgrade), or `c` their count and `m` the lines joined by '\n'; `:n` field `logged`
//! counts the lines (absent: a log of `j` entries only).

use redis::Script;

/// Functions shared by the scripts below.
const PRELUDE: &str = r#"
local function varint(s, pos)
  local n, scale = 0, 1
  while true do
    local c = string.byte(s, pos)
    if c == nil then return nil, pos end
    pos = pos + 1
    n = n + (c % 128) * scale
    if c < 128 then return n, pos end
    scale = scale * 128
  end
end

-- Event id and channel of an envelope: 4 magic bytes, then the protobuf Event, whose
-- fields 1 (id) and 2 (channel) come first.
local function meta(env)
  local pos, id, channel = 5, '', ''
  while true do
    local tag, len
    tag, pos = varint(env, pos)
    if tag ~= 10 and tag ~= 18 then break end
    len, pos = varint(env, pos)
    if len == nil then break end
    local v = string.sub(env, pos, pos + len - 1)
    pos = pos + len
    if tag == 10 then id = v else channel = v end
  end
  return id, channel
end

local function fields(arr)
  local t = {}
  for j = 1, #arr, 2 do t[arr[j]] = arr[j + 1] end
  return t
end

local function append(b, r)
  local args = {b .. ':s', '*', 'e', r[1]}
  if r[3] ~= '' then
    args[#args + 1] = 'k'; args[#args + 1] = r[3]
  end
  if tonumber(r[5]) > 0 then
    args[#args + 1] = 'a'; args[#args + 1] = tostring(r[5])
    args[#args + 1] = 'f'; args[#args + 1] = tostring(r[6])
    args[#args + 1] = 'x'; args[#args + 1] = r[7]
  end
  redis.call('XADD', unpack(args))
end

-- The event holding `key` is done: the next one waiting on the key goes live.
local function release_key(b, key, id)
  if key == nil or key == '' then return end
  if redis.call('HGET', b .. ':k', key) ~= id then return end
  local nxt = redis.call('LPOP', b .. ':q:' .. key)
  if not nxt then
    redis.call('HDEL', b .. ':k', key)
    return
  end
  redis.call('HSET', b .. ':k', key, nxt)
  local rec = redis.call('HGET', b .. ':r', nxt)
  redis.call('HDEL', b .. ':r', nxt)
  redis.call('ZREM', b .. ':y', nxt)
  if rec then append(b, cmsgpack.unpack(rec)) end
end

-- Waits (for its retry, or behind its key) off the stream: record `rec` in `:r`, id
-- in `:y` (every member scored 0: ListPending pages it by id).
local function hold(b, id, rec)
  redis.call('HSET', b .. ':r', id, rec)
  redis.call('ZADD', b .. ':y', 0, id)
end

-- Keeps a dead-lettered event for RedriveDeadLetters: record {envelope, ordering key,
-- attempts, channel} in `:v`, id in `:w` scored by when; the oldest beyond `maxlen` go.
local function keep_dead(b, id, env, key, attempts, channel, now, maxlen)
  redis.call('HSET', b .. ':v', id, cmsgpack.pack({env, key or '', attempts, channel}))
  redis.call('ZADD', b .. ':w', now, id)
  local over = redis.call('ZCARD', b .. ':w') - tonumber(maxlen)
  if over > 0 then
    local gone = redis.call('ZPOPMIN', b .. ':w', over)
    for j = 1, #gone, 2 do redis.call('HDEL', b .. ':v', gone[j]) end
  end
end

-- One terminal-log line: the JSON of a `LogEntry` (what the reader parses). `failures`
-- is JSON text already; built by hand because cjson turns [] into {}.
local function log_line(id, channel, status, attempts, first, now, failures)
  local f = tonumber(first)
  if failures == nil or failures == '' then failures = '[]' end
  return '{"event_id":' .. cjson.encode(id) .. ',"channel":' .. cjson.encode(channel) ..
    ',"status":"' .. status .. '","attempts":' .. string.format('%d', attempts) ..
    ',"first_delivered_ms":' .. (f and string.format('%d', f) or 'null') ..
    ',"finished_ms":' .. string.format('%d', now) .. ',"failures":' .. failures .. '}'
end

-- Stream ids "ms-seq": a < b.
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end

-- The id right after `id`: XTRIM MINID of it drops `id` and everything before.
local function id_next(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

-- Lines held by a log entry (its fields): `c` for a pack (`m`), else one (`j`).
local function entry_lines(f)
  for j = 1, #f, 2 do
    if f[j] == 'c' then return tonumber(f[j + 1]) or 1 end
  end
  return 1
end

-- Lines in the terminal log, kept in `:n` field `logged` by every write and trim. A log
-- written before lines were counted holds one line per entry.
local function log_count(b)
  local n = redis.call('HGET', b .. ':n', 'logged')
  if n then return tonumber(n) end
  return redis.call('XLEN', b .. ':l')
end

-- Drops whole entries from the head of the log: with `minid` (age) those before it,
-- else (count) the oldest while more than `keep` of the `total` lines stay, but never
-- `last` (the entry just written). At most `budget` entries. Returns the lines left
-- and whether the budget ran out.
local function log_trim(b, total, keep, minid, last, budget)
  local l = b .. ':l'
  local upto = '+'
  if minid then upto = '(' .. minid end
  local cut, dropped, stop = nil, 0, false
  while not stop and dropped < budget do
    local start = '-'
    if cut then start = '(' .. cut end
    local rows = redis.call('XRANGE', l, start, upto, 'COUNT', math.min(16, budget - dropped))
    if #rows == 0 then
      if not minid then total = 0 end
      break
    end
    for _, r in ipairs(rows) do
      local lines = entry_lines(r[2])
      if r[1] == last then
        -- Counted more than there are (written by an older version): now exact.
        total = math.min(total, lines)
        stop = true
        break
      end
      if not minid and total <= keep then stop = true; break end
      total = total - lines
      cut = r[1]
      dropped = dropped + 1
    end
  end
  if cut then redis.call('XTRIM', l, 'MINID', id_next(cut)) end
  if total < 0 then total = 0 end
  return total, dropped >= budget
end

-- Whether several lines may share a log entry: only once the fleet's log format
-- (`P:durable:log_format`, the script's KEYS[1]) is 2, i.e. every instance reads packed
-- entries. Until then one line per entry, which every release reads.
local function log_packed()
  return KEYS[1] ~= nil and redis.call('GET', KEYS[1]) == '2'
end

-- Appends `n` lines (`text`: joined by '\n'): packed (see log_packed) as one entry,
-- `c` the count and `m` the lines, else one entry per line, `j` the line (the format of
-- every entry before lines were packed). Past `maxlen` lines (with some slack, so that
-- trims come in batches) the oldest entries go.
local function log_write(b, text, n, maxlen)
  if n == 0 then return end
  local total, last = log_count(b) + n, nil
  if n == 1 then
    last = redis.call('XADD', b .. ':l', '*', 'j', text)
  elseif log_packed() then
    last = redis.call('XADD', b .. ':l', '*', 'c', n, 'm', text)
  else
    for line in string.gmatch(text, '[^\n]+') do
      last = redis.call('XADD', b .. ':l', '*', 'j', line)
    end
  end
  maxlen = tonumber(maxlen)
  if total > maxlen + math.floor(maxlen / 16) then
    total = log_trim(b, total, maxlen, nil, last, 1000000)
  end
  redis.call('HSET', b .. ':n', 'logged', total)
end

-- Lines collected by a script (`out.log`), written as one entry.
local function log_flush(b, out, maxlen)
  if #out.log > 0 then log_write(b, table.concat(out.log, '\n'), #out.log, maxlen) end
end

-- One failed attempt of stream entry `sid`: back later with backoff, or dead-lettered.
-- cfg = {max_attempts, initial_ms, multiplier, max_ms, kind (0 exponential, 1 linear)}.
-- Appends to out.dead / out.next.
-- A dead letter is recorded in the outbox `:o` (event id -> {envelope, attempts,
-- failures, stamp ms}) and handed back for publication as {envelope, attempts,
-- failures, event id}.
local function fail_one(b, g, sid, reason, delay, term, first, now, cfg, maxlen, out)
  local e = redis.call('XRANGE', b .. ':s', sid, sid)
  redis.call('XACK', b .. ':s', g, sid)
  if not e[1] then return end
  redis.call('XDEL', b .. ':s', sid)
  local f = fields(e[1][2])
  local id, channel = meta(f.e)
  local attempts = (tonumber(f.a) or 0) + 1
  local failures = cjson.decode(f.x or '[]')
  failures[#failures + 1] = {at_ms = now, reason = reason}
  local x = cjson.encode(failures)
  if f.f and f.f ~= '' then first = f.f end
  if term == 1 or (cfg[1] > 0 and attempts >= cfg[1]) then
    out.log[#out.log + 1] = log_line(id, channel, 'DeadLettered', attempts, first, now, x)
    redis.call('HINCRBY', b .. ':n', 'dead_lettered', 1)
    keep_dead(b, id, f.e, f.k, attempts, channel, now, maxlen)
    release_key(b, f.k, id)
    -- Kept in the outbox until its publication is answered (see TICK).
    redis.call('HSET', b .. ':o', id, cmsgpack.pack({f.e, attempts, x, now}))
    out.dead[#out.dead + 1] = {f.e, tostring(attempts), x, id}
    return
  end
  if delay < 0 and cfg[5] == 1 then
    delay = math.min(cfg[4], cfg[2] * attempts)
  elseif delay < 0 then
    delay = math.min(cfg[4], cfg[2] * (cfg[3] ^ (attempts - 1)))
  end
  local due = now + math.floor(delay)
  hold(b, id, cmsgpack.pack({f.e, channel, f.k or '', id, attempts, first, x}))
  redis.call('ZADD', b .. ':d', due, id)
  if out.next == nil or due < out.next then out.next = due end
end

-- Due retries go back on the stream.
local function move_due(b, now, count)
  local ids = redis.call('ZRANGEBYSCORE', b .. ':d', '-inf', now, 'LIMIT', 0, count)
  for _, id in ipairs(ids) do
    redis.call('ZREM', b .. ':d', id)
    local rec = redis.call('HGET', b .. ':r', id)
    redis.call('HDEL', b .. ':r', id)
    redis.call('ZREM', b .. ':y', id)
    if rec then append(b, cmsgpack.unpack(rec)) end
  end
  if #ids > 0 then redis.call('HINCRBY', b .. ':n', 'redelivered', #ids) end
  return #ids
end

local function next_due(b)
  local first = redis.call('ZRANGE', b .. ':d', 0, 0, 'WITHSCORES')
  if first[2] then return first[2] end
  return ''
end
"#;

/// Stores one published event for consumer `b` (`max`: its max_pending, 0 = no
/// limit). A consumer holding max_pending unfinished events takes no more: the capture
/// is dropped for it and counted (`:n` dropped). An event whose ordering key has a live
/// event waits behind it.
const CAPTURE_ONE: &str = r#"
local function capture(b, max, id, env, channel, key)
  if max > 0 and redis.call('XLEN', b .. ':s') + redis.call('HLEN', b .. ':r') >= max then
    redis.call('HINCRBY', b .. ':n', 'dropped', 1)
  elseif key ~= '' and redis.call('HSETNX', b .. ':k', key, id) == 0 then
    redis.call('HSET', b .. ':r', id, cmsgpack.pack({env, channel, key, id, 0, '', ''}))
    redis.call('ZADD', b .. ':y', 0, id)
    redis.call('RPUSH', b .. ':q:' .. key, id)
  elseif key ~= '' then
    redis.call('XADD', b .. ':s', '*', 'e', env, 'k', key)
  else
    redis.call('XADD', b .. ':s', '*', 'e', env)
  end
end
"#;

/// Publish a batch (group commit: the publishes that arrived while the previous batch
/// ran): check the consumer-set version, then for each event in order check its
/// idempotency key, store it for every matching consumer and PUBLISH it for
/// ephemeral subscribers.
///
/// KEYS: version. ARGV: known version, window ms, pub/sub channel prefix, history
/// stream key prefix, history hash key prefix, the set of channels with a history,
/// envelope kind of the pub/sub message (`b`/`j`), now ms, then per event: event id, envelope (stored), pub/sub message
/// ('' = the envelope), channel, ordering key ('' = none), idempotency key ('' =
/// none), history size, max bytes, ttl ms and event ms (size 0: the channel keeps no
/// history), number of consumers n, then n (consumer key base, max_pending) pairs. An event of a channel with history is kept in it with its
/// position, and published with it (`retain`).
/// Returns `{'stale', version}` (nothing done), or `{'ok', r1, r2, ...}` with one `r`
/// per event: the receivers of its PUBLISH (integer), or for a repeated idempotency
/// key the original event id (string).
const PUBLISH: &str = r#"
local v = redis.call('GET', KEYS[1]) or '0'
if v ~= ARGV[1] then return {'stale', v} end
local window, pubsub = ARGV[2], ARGV[3]
local hstream, hmeta, hindex, kind, now = ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
local out = {'ok'}
local j = 9
while j <= #ARGV do
  local id, env, msg, channel, key, idem = ARGV[j], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5]
  local size, max_bytes, ttl, ems = tonumber(ARGV[j + 6]), tonumber(ARGV[j + 7]), tonumber(ARGV[j + 8]), tonumber(ARGV[j + 9])
  local first = j + 11
  j = first + 2 * tonumber(ARGV[j + 10])
  if msg == '' then msg = env end
  local prev = false
  if idem ~= '' then
    prev = redis.call('GET', idem)
    if not prev then redis.call('SET', idem, id, 'PX', window) end
  end
  if prev then
    out[#out + 1] = prev
  else
    for i = first, j - 1, 2 do capture(ARGV[i], tonumber(ARGV[i + 1]), id, env, channel, key) end
    if size > 0 then
      msg = retain(hstream .. channel, hmeta .. channel, hindex, channel, msg, kind, id, ems, size, max_bytes, ttl, now)
    end
    out[#out + 1] = redis.call('PUBLISH', pubsub .. channel, msg)
  end
end
return out
"#;

/// A batch for one consumer on a Redis Cluster, where each consumer's keys are in a
/// slot of their own: KEYS its stream (which routes the script to that slot); ARGV
/// key base, max_pending, now, idempotency window ms, then (event id, envelope,
/// channel, ordering key, once) per event, in publish order. An event with `once` 1
/// (it has an idempotency key) is stored only if its id is not in `:e` (the ids stored
/// within the window), so that the retry of a publish that reached only some consumers
/// stores it for the others and nothing twice. Returns 0 (nothing stored) when the
/// consumer is gone, else 1.
const CAPTURE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local b, max, now, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local seen = false
for j = 5, #ARGV, 5 do
  local id = ARGV[j]
  if ARGV[j + 4] ~= '1' then
    capture(b, max, id, ARGV[j + 1], ARGV[j + 2], ARGV[j + 3])
  elseif not redis.call('ZSCORE', b .. ':e', id) then
    redis.call('ZADD', b .. ':e', now, id)
    seen = true
    capture(b, max, id, ARGV[j + 1], ARGV[j + 2], ARGV[j + 3])
  end
end
if seen then redis.call('ZREMRANGEBYSCORE', b .. ':e', '-inf', now - window) end
return 1
"#;

/// Ack: ARGV base, group, log maxlen, now, the terminal-log lines of the acks with a
/// stream id (joined by '\n', in their order; the acking instance knows the entries, so
/// the script does not read them back), the newest of their stream ids, then (stream
/// id, event id, ordering key) triples. A stream id of '' is a late ack: it completes an event waiting for its
/// retry (its log line is built here from the retry record). The lines are logged as
/// one entry. Returns how many events completed.
///
/// One XACK takes every stream id. When it acknowledges them all (the usual case),
/// each was pending and completes. Otherwise some had already left the pending list
/// (reclaimed past their deadline, say): a delivered entry stays on the stream exactly
/// as long as it is pending, so the ones still on the stream are the ones this XACK
/// took, and the others are looked up among the retries as late acks (and their lines
/// left out).
///
/// The acked entries leave the stream by one XTRIM MINID up to the oldest entry still
/// pending (everything before it was delivered, and a delivered entry that is not
/// pending is finished): acks come mostly in stream order, so that takes nearly all of
/// them; the rest (acked ahead of an older one still in flight) by XDEL.
const ACK: &str = r#"
local b, g, maxlen, now, lines, newest = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local s, d, r = b .. ':s', b .. ':d', b .. ':r'
local sids = {}
for j = 7, #ARGV, 3 do
  if ARGV[j] ~= '' then sids[#sids + 1] = ARGV[j] end
end
local took = 0
for i = 1, #sids, 512 do
  took = took + redis.call('XACK', s, g, unpack(sids, i, math.min(i + 511, #sids)))
end
local all = took == #sids
local done = 0
local acked = {}
local out = {log = {}}
local held, kept = 0, nil
if not all then kept = {} end
for j = 7, #ARGV, 3 do
  local sid, id, key = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  if sid ~= '' then held = held + 1 end
  if sid ~= '' and (all or redis.call('XRANGE', s, sid, sid)[1]) then
    acked[#acked + 1] = sid
    if kept then kept[held] = true end
    if key ~= '' then release_key(b, key, id) end
    done = done + 1
  elseif redis.call('ZREM', d, id) == 1 then
    local rec = redis.call('HGET', r, id)
    redis.call('HDEL', r, id)
    redis.call('ZREM', b .. ':y', id)
    if rec then
      local e = cmsgpack.unpack(rec)
      out.log[#out.log + 1] = log_line(e[4], e[2], 'Completed', e[5], e[6], now, e[7])
      release_key(b, e[3], e[4])
      done = done + 1
    end
  end
end
-- The lines of the acks taken here, then those of the late acks.
local text, n = lines, #acked
if kept then
  local mine, i = {}, 0
  for line in string.gmatch(lines, '[^\n]+') do
    i = i + 1
    if kept[i] then mine[#mine + 1] = line end
  end
  text = table.concat(mine, '\n')
end
if #out.log > 0 then
  if n > 0 then text = text .. '\n' end
  text = text .. table.concat(out.log, '\n')
  n = n + #out.log
end
log_write(b, text, n, maxlen)
if #acked > 0 then
  local upto, rest = nil, acked
  if string.match(newest, '^%d+-%d+$') then
    upto = id_next(newest)
    local oldest = redis.call('XPENDING', s, g, '-', '+', 1)
    if oldest[1] and id_less(oldest[1][1], upto) then
      upto = oldest[1][1]
      rest = {}
      for _, sid in ipairs(acked) do
        if not id_less(sid, upto) then rest[#rest + 1] = sid end
      end
    else
      rest = {}
    end
    redis.call('XTRIM', s, 'MINID', upto)
  end
  for i = 1, #rest, 512 do
    redis.call('XDEL', s, unpack(rest, i, math.min(i + 511, #rest)))
  end
end
if done > 0 then redis.call('HINCRBY', b .. ':n', 'acked', done) end
return done
"#;

/// Fail (nack, term, deadline, disconnect): ARGV base, group, now, log maxlen, owner,
/// max_attempts, initial_ms, multiplier, max_ms, backoff kind, then (stream id, reason, delay ms or
/// -1 for the backoff, term 1/0, first delivery ms) quintuples. Entries no longer
/// pending for `owner` are skipped (another instance already handled them).
/// Returns `{next due ms or '', dead letters {envelope, attempts, failures}...}`.
const FAIL: &str = r#"
local b, g, now, maxlen, owner = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local cfg = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])}
local out = {dead = {}, log = {}}
for j = 11, #ARGV, 5 do
  local sid = ARGV[j]
  local mine = redis.call('XPENDING', b .. ':s', g, sid, sid, 1, owner)
  if mine[1] then
    fail_one(b, g, sid, ARGV[j + 1], tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), ARGV[j + 4], now, cfg, maxlen, out)
  end
end
log_flush(b, out, maxlen)
local reply = {out.next and tostring(out.next) or ''}
for _, d in ipairs(out.dead) do reply[#reply + 1] = d end
return reply
"#;

/// Put entries back on the stream without counting an attempt (read but never handed
/// to a client): ARGV base, group, owner, stream ids...
const REQUEUE: &str = r#"
local b, g, owner = ARGV[1], ARGV[2], ARGV[3]
for j = 4, #ARGV do
  local sid = ARGV[j]
  local mine = redis.call('XPENDING', b .. ':s', g, sid, sid, 1, owner)
  local e = redis.call('XRANGE', b .. ':s', sid, sid)
  if mine[1] and e[1] then
    redis.call('XACK', b .. ':s', g, sid)
    redis.call('XDEL', b .. ':s', sid)
    local f = fields(e[1][2])
    append(b, {f.e, '', f.k or '', '', tonumber(f.a) or 0, f.f or '', f.x or '[]'})
  end
end
return 0
"#;

/// Janitor: ARGV base, group, now, log maxlen, instance, lock ms, min idle ms (the ack
/// deadline), batch, oldest log id to keep, max_attempts, initial_ms, multiplier,
/// max_ms, backoff kind, outbox grace ms. Under a lock that expires, reclaims entries idle past the
/// ack deadline (held by an instance that died) as failed attempts, hands back for
/// publication the dead letters left in the outbox longer than the grace (their
/// publisher died or failed; restamped so that one janitor takes them at a time),
/// trims the log by age and forgets idle, empty group members; moves due retries
/// back. Returns `{next due or '', more (1/0), dead letters...}`.
const TICK: &str = r#"
local b, g, now, maxlen = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local cfg = {tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])}
local batch = tonumber(ARGV[8])
local out = {dead = {}, log = {}}
local more = 0
if redis.call('SET', b .. ':lock', ARGV[5], 'NX', 'PX', ARGV[6]) then
  local claimed = redis.call('XAUTOCLAIM', b .. ':s', g, '~janitor', ARGV[7], '0-0', 'COUNT', batch, 'JUSTID')
  for _, sid in ipairs(claimed[2]) do
    fail_one(b, g, sid, 'ack deadline exceeded', -1, 0, tostring(now - tonumber(ARGV[7])), now, cfg, maxlen, out)
  end
  if claimed[1] ~= '0-0' then more = 1 end
  local stale = now - tonumber(ARGV[15])
  local cursor, seen = '0', {}
  repeat
    local page = redis.call('HSCAN', b .. ':o', cursor, 'COUNT', batch)
    cursor = page[1]
    for j = 1, #page[2], 2 do
      local id, rec = page[2][j], cmsgpack.unpack(page[2][j + 1])
      if #out.dead < batch and not seen[id] and tonumber(rec[4]) <= stale then
        seen[id] = true
        rec[4] = now
        redis.call('HSET', b .. ':o', id, cmsgpack.pack(rec))
        out.dead[#out.dead + 1] = {rec[1], tostring(rec[2]), rec[3], id}
      end
    end
  until cursor == '0' or #out.dead >= batch
  log_flush(b, out, maxlen)
  -- The log by age: whole entries older than ARGV[9], a batch at a time.
  local aged = redis.call('XRANGE', b .. ':l', '-', '(' .. ARGV[9], 'COUNT', 1)
  if aged[1] then
    local total, cut = log_trim(b, log_count(b), 0, ARGV[9], nil, batch)
    redis.call('HSET', b .. ':n', 'logged', total)
    if cut then more = 1 end
  end
  -- Dead letters kept for redrive past the log's age go too.
  local oldest = tonumber(string.match(ARGV[9], '^(%d+)'))
  local expired = redis.call('ZRANGEBYSCORE', b .. ':w', '-inf', '(' .. oldest, 'LIMIT', 0, batch)
  for _, id in ipairs(expired) do
    redis.call('ZREM', b .. ':w', id)
    redis.call('HDEL', b .. ':v', id)
  end
  -- Group members of instances gone for good (every restart is a new instance) would
  -- pile up: drop those holding nothing and unseen for an hour.
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', b .. ':s', g)) do
    local info = fields(c)
    if info.pending == 0 and info.idle > 3600000 and info.name ~= ARGV[5] then
      redis.call('XGROUP', 'DELCONSUMER', b .. ':s', g, info.name)
    end
  end
end
if move_due(b, now, batch) == batch then more = 1 end
local nd = next_due(b)
if out.next and (nd == '' or out.next < tonumber(nd)) then nd = tostring(out.next) end
local reply = {nd, more}
for _, d in ipairs(out.dead) do reply[#reply + 1] = d end
return reply
"#;

/// Create or replace a definition: KEYS consumers hash, version, log format; ARGV
/// name, config JSON, key base, group, notify channel, replace (1/0), make the stream
/// here (1; 0 on a cluster, where it is in another slot: see `INIT`). Returns
/// `{'exists', json}` when a definition exists and `replace` is 0, else `{'ok',
/// version, new}` (`new` 1 when there was no definition). The first definition ever
/// made (no version yet: a fresh Redis, no instance of an earlier release around it)
/// sets the log format to packed.
const DEFINE: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[3], '2', 'NX') end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and ARGV[6] ~= '1' then return {'exists', cur} end
if cur == ARGV[2] then return {'ok', redis.call('GET', KEYS[2]) or '0', '0'} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
-- BUSYGROUP (the stream and group survive a replaced definition) is fine.
if ARGV[7] == '1' then redis.pcall('XGROUP', 'CREATE', ARGV[3] .. ':s', ARGV[4], '0', 'MKSTREAM') end
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[5], v)
return {'ok', tostring(v), cur and '0' or '1'}
"#;

/// Deletes every key of consumer `b`.
const PURGE_ONE: &str = r#"
local function purge(b)
  for _, key in ipairs(redis.call('HKEYS', b .. ':k')) do redis.call('DEL', b .. ':q:' .. key) end
  redis.call('DEL', b .. ':s', b .. ':d', b .. ':r', b .. ':k', b .. ':l', b .. ':n', b .. ':lock', b .. ':c', b .. ':o')
  redis.call('DEL', b .. ':y', b .. ':v', b .. ':w', b .. ':x', b .. ':f', b .. ':e')
end
"#;

/// Delete a consumer: KEYS consumers hash, version, paused hash; ARGV name, key base,
/// notify channel, delete its keys here (1; 0 on a cluster, where they are in another
/// slot: see `PURGE`). Returns 0 when there was no such consumer.
const DELETE: &str = r#"
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == '1' then purge(ARGV[2]) end
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], v)
return 1
"#;

/// A consumer's keys on a cluster, in its own slot. `INIT` (KEYS stream, log format;
/// ARGV group) makes its stream and group and says its log may be packed (a cluster
/// has no instance of a release that reads one line per entry only); `PURGE` (KEYS
/// stream; ARGV key base) deletes them all.
const INIT: &str = r#"
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
redis.call('SET', KEYS[2], '2')
return 1
"#;
const PURGE: &str = r#"
purge(ARGV[1])
return 1
"#;

/// Clients attached through one instance: ARGV base, instance, clients, now, expiry
/// (ms). Each field of `:c` is an instance's `"{clients} {expires at}"`: a count stands
/// until refreshed or expired, so an instance that died stops counting; expired fields
/// go. Nothing is written for a consumer that no longer exists.
const PRESENCE: &str = r#"
local b, now = ARGV[1], tonumber(ARGV[4])
local key = b .. ':c'
if redis.call('EXISTS', b .. ':s') == 0 then return 0 end
if ARGV[3] == '0' then
  redis.call('HDEL', key, ARGV[2])
else
  redis.call('HSET', key, ARGV[2], ARGV[3] .. ' ' .. ARGV[5])
  redis.call('PEXPIREAT', key, ARGV[5])
end
local all = redis.call('HGETALL', key)
for j = 1, #all, 2 do
  local expires = tonumber(string.match(all[j + 1], ' (%d+)$'))
  if expires == nil or expires < now then redis.call('HDEL', key, all[j]) end
end
return 1
"#;

/// Redrive: ARGV base, now, log maxlen, limit, then event ids (none = the `limit`
/// dead letters kept longest). Each one found in `:v` goes back like a fresh capture
/// (behind a live event of its key, if any), in event-id order (ids are UUIDv7:
/// publish order), with a `Redriven` log line. Returns `{redriven, still kept}`, or
/// `{-1, 0}` when the consumer is gone.
const REDRIVE: &str = r#"
local b, now, maxlen, limit = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', b .. ':s') == 0 then return {-1, 0} end
local ids = {}
if #ARGV > 4 then
  for j = 5, #ARGV do ids[#ids + 1] = ARGV[j] end
else
  ids = redis.call('ZRANGE', b .. ':w', 0, limit - 1)
end
table.sort(ids)
local done, lines = 0, {}
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', b .. ':v', id)
  if rec then
    redis.call('HDEL', b .. ':v', id)
    redis.call('ZREM', b .. ':w', id)
    local r = cmsgpack.unpack(rec)
    local env, key, attempts, channel = r[1], r[2], r[3], r[4]
    capture(b, 0, id, env, channel, key)
    lines[#lines + 1] = log_line(id, channel, 'Redriven', attempts, nil, now, '[]')
    done = done + 1
  end
end
log_write(b, table.concat(lines, '\n'), #lines, maxlen)
if done > 0 then redis.call('HINCRBY', b .. ':n', 'redriven', done) end
return {done, redis.call('ZCARD', b .. ':w')}
"#;

/// One page of ListPending: ARGV base, group, now, ack deadline ms, limit, token. The
/// live stream first, in stream order (`s:{last stream id}`), then the events waiting
/// off it by event id (`r:{last event id}`). Returns `{next token or '', rows...}`,
/// each row `{envelope, attempt, next delivery ms or '', failures JSON, state}` with
/// state 1 ready, 2 delayed, 3 in flight, 4 blocked by its ordering key.
const PENDING: &str = r#"
local b, g, now, ackdl, limit, token = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local rows = {}
local phase, after = string.sub(token, 1, 1), string.sub(token, 3)
if token == '' then phase, after = 's', '' end
if phase == 's' then
  local start = '-'
  if after ~= '' then start = '(' .. after end
  local entries = redis.call('XRANGE', b .. ':s', start, '+', 'COUNT', limit)
  local last = ''
  for _, e in ipairs(entries) do
    local sid, f = e[1], fields(e[2])
    local failed = tonumber(f.a) or 0
    local p = redis.call('XPENDING', b .. ':s', g, sid, sid, 1)
    if p[1] then
      rows[#rows + 1] = {f.e, tostring(failed + 1), tostring(now - tonumber(p[1][3]) + ackdl), f.x or '[]', 3}
    else
      rows[#rows + 1] = {f.e, tostring(failed), '', f.x or '[]', 1}
    end
    last = sid
  end
  if #entries == limit then return {'s:' .. last, unpack(rows)} end
  phase, after = 'r', ''
end
local start = '-'
if after ~= '' then start = '(' .. after end
local room = limit - #rows
local ids = redis.call('ZRANGEBYLEX', b .. ':y', start, '+', 'LIMIT', 0, room)
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', b .. ':r', id)
  if rec then
    local r = cmsgpack.unpack(rec)
    local due = redis.call('ZSCORE', b .. ':d', id)
    local x = r[7]
    if x == nil or x == '' then x = '[]' end
    if due then
      rows[#rows + 1] = {r[1], tostring(r[5]), tostring(due), x, 2}
    else
      rows[#rows + 1] = {r[1], tostring(r[5]), '', x, 4}
    end
  end
end
local next = ''
if #ids == room then next = 'r:' .. ids[#ids] end
return {next, unpack(rows)}
"#;

/// Pause or resume: KEYS consumers hash, paused hash, version; ARGV name, paused
/// (1/0), now, notify channel. Every instance reloads on the notice. Returns 0 for an
/// unknown consumer, else 1.
const PAUSE: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local changed
if ARGV[2] == '1' then
  changed = redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3])
else
  changed = redis.call('HDEL', KEYS[2], ARGV[1])
end
if changed == 1 then
  local v = redis.call('INCR', KEYS[3])
  redis.call('PUBLISH', ARGV[4], v)
end
return 1
"#;

/// Exclusive consumers' lease: ARGV base, group, instance, ttl ms, want (1 take or
/// renew, 0 give up). Taken only when free and no other instance still holds events
/// in flight (they are released first: by their client's detach, or by a janitor past
/// their ack deadline). Returns 1 while this instance holds it.
const LEASE: &str = r#"
local b, g, me, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local key = b .. ':x'
local cur = redis.call('GET', key)
if ARGV[5] == '0' then
  if cur == me then redis.call('DEL', key) end
  return 0
end
if cur == me then
  redis.call('PEXPIRE', key, ttl)
  return 1
end
if cur or redis.call('EXISTS', b .. ':s') == 0 then return 0 end
local summary = redis.call('XPENDING', b .. ':s', g)
if summary[4] then
  for _, c in ipairs(summary[4]) do
    if c[1] ~= me and tonumber(c[2]) > 0 then return 0 end
  end
end
redis.call('SET', key, me, 'PX', ttl)
return 1
"#;

/// The scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) publish: Script,
    pub(crate) capture: Script,
    pub(crate) ack: Script,
    pub(crate) fail: Script,
    pub(crate) requeue: Script,
    pub(crate) tick: Script,
    pub(crate) define: Script,
    pub(crate) delete: Script,
    pub(crate) init: Script,
    pub(crate) purge: Script,
    pub(crate) presence: Script,
    pub(crate) redrive: Script,
    pub(crate) pending: Script,
    pub(crate) pause: Script,
    pub(crate) lease: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Self {
            publish: Script::new(&format!("{CAPTURE_ONE}\n{}\n{PUBLISH}", crate::history::RETAIN)),
            capture: Script::new(&format!("{CAPTURE_ONE}\n{CAPTURE}")),
            ack: with_prelude(ACK),
            fail: with_prelude(FAIL),
            requeue: with_prelude(REQUEUE),
            tick: with_prelude(TICK),
            define: Script::new(DEFINE),
            delete: Script::new(&format!("{PURGE_ONE}\n{DELETE}")),
            init: Script::new(INIT),
            purge: Script::new(&format!("{PURGE_ONE}\n{PURGE}")),
            presence: Script::new(PRESENCE),
            redrive: with_prelude(&format!("{CAPTURE_ONE}\n{REDRIVE}")),
            pending: with_prelude(PENDING),
            pause: Script::new(PAUSE),
            lease: Script::new(LEASE),
        }
    }
}
