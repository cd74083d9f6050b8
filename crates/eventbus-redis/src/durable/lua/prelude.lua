-- Functions shared by the scripts that deliver, fail, log and redrive events: it stands
-- before ack, fail, requeue, tick, pending and redrive (see `Scripts::new`).
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
    -- Kept in the outbox until its publication is answered (see tick.lua).
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
