//! Delivery: acks, failures and retries, the janitor's round, clients' presence and
//! an exclusive consumer's lease.

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
pub(super) const ACK: &str = r#"
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
pub(super) const FAIL: &str = r#"
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
pub(super) const REQUEUE: &str = r#"
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
pub(super) const TICK: &str = r#"
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

/// Clients attached through one instance: ARGV base, instance, clients, now, expiry
/// (ms). Each field of `:c` is an instance's `"{clients} {expires at}"`: a count stands
/// until refreshed or expired, so an instance that died stops counting; expired fields
/// go. Nothing is written for a consumer that no longer exists.
pub(super) const PRESENCE: &str = r#"
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

/// Exclusive consumers' lease: ARGV base, group, instance, ttl ms, want (1 take or
/// renew, 0 give up). Taken only when free and no other instance still holds events
/// in flight (they are released first: by their client's detach, or by a janitor past
/// their ack deadline). Returns 1 while this instance holds it.
pub(super) const LEASE: &str = r#"
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
