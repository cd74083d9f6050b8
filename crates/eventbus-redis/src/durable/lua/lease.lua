-- Exclusive consumers' lease: ARGV base, group, instance, ttl ms, want (1 take or
-- renew, 0 give up). Taken only when free and no other instance still holds events
-- in flight (they are released first: by their client's detach, or by a janitor past
-- their ack deadline). Returns 1 while this instance holds it.
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
