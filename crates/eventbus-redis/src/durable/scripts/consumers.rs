//! Consumers: definitions, deletion, pause, redrive and the pending list.

/// Create or replace a definition: KEYS consumers hash, version, log format; ARGV
/// name, config JSON, key base, group, notify channel, replace (1/0), make the stream
/// here (1; 0 on a cluster, where it is in another slot: see `INIT`). Returns
/// `{'exists', json}` when a definition exists and `replace` is 0, else `{'ok',
/// version, new}` (`new` 1 when there was no definition). The first definition ever
/// made (no version yet: a fresh Redis, no instance of an earlier release around it)
/// sets the log format to packed.
pub(super) const DEFINE: &str = r#"
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
pub(super) const PURGE_ONE: &str = r#"
local function purge(b)
  for _, key in ipairs(redis.call('HKEYS', b .. ':k')) do redis.call('DEL', b .. ':q:' .. key) end
  redis.call('DEL', b .. ':s', b .. ':d', b .. ':r', b .. ':k', b .. ':l', b .. ':n', b .. ':lock', b .. ':c', b .. ':o')
  redis.call('DEL', b .. ':y', b .. ':v', b .. ':w', b .. ':x', b .. ':f', b .. ':e')
end
"#;

/// Delete a consumer: KEYS consumers hash, version, paused hash; ARGV name, key base,
/// notify channel, delete its keys here (1; 0 on a cluster, where they are in another
/// slot: see `PURGE`). Returns 0 when there was no such consumer.
pub(super) const DELETE: &str = r#"
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
pub(super) const INIT: &str = r#"
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
redis.call('SET', KEYS[2], '2')
return 1
"#;

pub(super) const PURGE: &str = r#"
purge(ARGV[1])
return 1
"#;

/// Redrive: ARGV base, now, log maxlen, limit, then event ids (none = the `limit`
/// dead letters kept longest). Each one found in `:v` goes back like a fresh capture
/// (behind a live event of its key, if any), in event-id order (ids are UUIDv7:
/// publish order), with a `Redriven` log line. Returns `{redriven, still kept}`, or
/// `{-1, 0}` when the consumer is gone.
pub(super) const REDRIVE: &str = r#"
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
pub(super) const PENDING: &str = r#"
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
pub(super) const PAUSE: &str = r#"
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
