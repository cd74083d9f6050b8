-- Pause or resume: KEYS consumers hash, paused hash, version; ARGV name, paused
-- (1/0), now, notify channel. Every instance reloads on the notice. Returns 0 for an
-- unknown consumer, else 1.
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
