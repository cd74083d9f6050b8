-- Delete a consumer: KEYS consumers hash, version, paused hash; ARGV name, key base,
-- notify channel, delete its keys here (1; 0 on a cluster, where they are in another
-- slot: see purge.lua). Returns 0 when there was no such consumer.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == '1' then purge(ARGV[2]) end
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], v)
return 1
