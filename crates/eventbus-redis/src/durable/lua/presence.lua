-- Clients attached through one instance: ARGV base, instance, clients, now, expiry
-- (ms). Each field of `:c` is an instance's `"{clients} {expires at}"`: a count stands
-- until refreshed or expired, so an instance that died stops counting; expired fields
-- go. Nothing is written for a consumer that no longer exists.
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
