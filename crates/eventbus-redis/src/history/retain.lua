-- The Lua functions that keep events in their channels' histories.
-- `history(channel, stream, meta, index, epoch, kind)` opens a channel's history for
-- the script's run (kept in `kept`, by channel): it reads its hash once, and a new
-- history (first publish, or Redis lost the keys) is named `epoch`, the id of the
-- event that makes it, and added to the set `index`, where recoveries by time find
-- the channels of a pattern. `retain(h, msg, event_ms, size, max_bytes, ttl_ms,
-- now_ms)` gives the event the channel's next offset, appends `msg` (the envelope,
-- `kind` `b` binary or `j` JSON) with its position to the stream, and returns the
-- envelope with the position, to PUBLISH. `settle()`, called once at the end of the
-- script, writes each channel's hash and trims its stream to its bounds: to `size`
-- entries, or fewer when `max_bytes` holds fewer of the newest envelope's size (the
-- byte bound reckons every entry at the newest one's size), and by age (`MINID`) with
-- a ttl. So a script carrying many events of a channel (a batch of publishes) pays
-- one `XADD` an event, and the hash and the trim once.
local char, floor = string.char, math.floor
local function varint(n)
  if n < 128 then return char(n) end
  if n < 16384 then return char(n % 128 + 128, floor(n / 128)) end
  if n < 2097152 then return char(n % 128 + 128, floor(n / 128) % 128 + 128, floor(n / 16384)) end
  local out = ''
  while n >= 128 do
    out = out .. char(n % 128 + 128)
    n = floor(n / 128)
  end
  return out .. char(n)
end
local kept, kept_order = {}, {}
local function history(channel, stream, meta, index, epoch, kind)
  local h = {stream = stream, meta = meta, epoch = epoch, offset = 0, last_ms = 0, json = kind == 'j'}
  local was = redis.call('HMGET', meta, 'epoch', 'offset', 'last_ms')
  if was[1] then
    h.epoch, h.offset, h.last_ms = was[1], tonumber(was[2]), tonumber(was[3])
  else
    redis.call('DEL', stream)
    redis.call('SADD', index, channel)
  end
  if not h.json then h.tag = '\10' .. varint(#h.epoch) .. h.epoch .. '\16' end
  kept[channel] = h
  kept_order[#kept_order + 1] = h
  return h
end
local function retain(h, msg, event_ms, size, max_bytes, ttl, now)
  local offset = h.offset + 1
  h.offset = offset
  if h.json then
    msg = string.sub(msg, 1, -2) .. ',"position":{"epoch":"' .. h.epoch .. '","offset":' .. string.format('%d', offset) .. '}}'
  else
    local n = varint(offset)
    msg = msg .. '\66' .. varint(#h.tag + #n) .. h.tag .. n
  end
  local ms = event_ms
  if ms < h.last_ms then ms = h.last_ms end
  h.last_ms, h.size, h.max_bytes, h.len, h.ttl, h.now = ms, size, max_bytes, #msg, ttl, now
  redis.call('XADD', h.stream, string.format('%d-%d', ms, offset), 'e', msg)
  return msg
end
local function settle()
  for _, h in ipairs(kept_order) do
    redis.call('HSET', h.meta, 'epoch', h.epoch, 'offset', string.format('%d', h.offset), 'last_ms', string.format('%d', h.last_ms))
    redis.call('XTRIM', h.stream, 'MAXLEN', math.max(1, math.min(h.size, floor(h.max_bytes / h.len))))
    if h.ttl > 0 then redis.call('XTRIM', h.stream, 'MINID', string.format('%d', math.min(h.now - h.ttl, h.last_ms))) end
  end
end
