-- Janitor: ARGV base, group, now, log maxlen, instance, lock ms, min idle ms (the ack
-- deadline), batch, oldest log id to keep, max_attempts, initial_ms, multiplier,
-- max_ms, backoff kind, outbox grace ms. Under a lock that expires, reclaims entries idle past the
-- ack deadline (held by an instance that died) as failed attempts, hands back for
-- publication the dead letters left in the outbox longer than the grace (their
-- publisher died or failed; restamped so that one janitor takes them at a time),
-- trims the log by age and forgets idle, empty group members; moves due retries
-- back. Returns `{next due or '', more (1/0), dead letters...}`.
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
