-- Create or replace a definition: KEYS consumers hash, version, log format; ARGV
-- name, config JSON, key base, group, notify channel, replace (1/0), make the stream
-- here (1; 0 on a cluster, where it is in another slot: see init.lua). Returns
-- `{'exists', json}` when a definition exists and `replace` is 0, else `{'ok',
-- version, new}` (`new` 1 when there was no definition). The first definition ever
-- made (no version yet: a fresh Redis, no instance of an earlier release around it)
-- sets the log format to packed.
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
