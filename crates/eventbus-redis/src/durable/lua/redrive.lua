-- Redrive: ARGV base, now, log maxlen, limit, then event ids (none = the `limit`
-- dead letters kept longest). Each one found in `:v` goes back like a fresh capture
-- (behind a live event of its key, if any), in event-id order (ids are UUIDv7:
-- publish order), with a `Redriven` log line. Returns `{redriven, still kept}`, or
-- `{-1, 0}` when the consumer is gone.
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
