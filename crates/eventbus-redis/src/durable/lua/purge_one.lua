-- Deletes every key of consumer `b`.
local function purge(b)
  for _, key in ipairs(redis.call('HKEYS', b .. ':k')) do redis.call('DEL', b .. ':q:' .. key) end
  redis.call('DEL', b .. ':s', b .. ':d', b .. ':r', b .. ':k', b .. ':l', b .. ':n', b .. ':lock', b .. ':c', b .. ':o')
  redis.call('DEL', b .. ':y', b .. ':v', b .. ':w', b .. ':x', b .. ':f', b .. ':e')
end
