-- A batch for one consumer on a Redis Cluster, where each consumer's keys are in a
-- slot of their own: KEYS its stream (which routes the script to that slot); ARGV
-- key base, max_pending, now, idempotency window ms, then (event id, envelope,
-- channel, ordering key, once) per event, in publish order. An event with `once` 1
-- (it has an idempotency key) is stored only if its id is not in `:e` (the ids stored
-- within the window), so that the retry of a publish that reached only some consumers
-- stores it for the others and nothing twice. Returns 0 (nothing stored) when the
-- consumer is gone, else 1.
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
