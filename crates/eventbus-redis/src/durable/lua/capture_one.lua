-- Stores one published event for consumer `b` (`max`: its max_pending, 0 = no
-- limit). A consumer holding max_pending unfinished events takes no more: the capture
-- is dropped for it and counted (`:n` dropped). An event whose ordering key has a live
-- event waits behind it.
local function capture(b, max, id, env, channel, key)
  if max > 0 and redis.call('XLEN', b .. ':s') + redis.call('HLEN', b .. ':r') >= max then
    redis.call('HINCRBY', b .. ':n', 'dropped', 1)
  elseif key ~= '' and redis.call('HSETNX', b .. ':k', key, id) == 0 then
    redis.call('HSET', b .. ':r', id, cmsgpack.pack({env, channel, key, id, 0, '', ''}))
    redis.call('ZADD', b .. ':y', 0, id)
    redis.call('RPUSH', b .. ':q:' .. key, id)
  elseif key ~= '' then
    redis.call('XADD', b .. ':s', '*', 'e', env, 'k', key)
  else
    redis.call('XADD', b .. ':s', '*', 'e', env)
  end
end
