-- Put entries back on the stream without counting an attempt (read but never handed
-- to a client): ARGV base, group, owner, stream ids...
local b, g, owner = ARGV[1], ARGV[2], ARGV[3]
for j = 4, #ARGV do
  local sid = ARGV[j]
  local mine = redis.call('XPENDING', b .. ':s', g, sid, sid, 1, owner)
  local e = redis.call('XRANGE', b .. ':s', sid, sid)
  if mine[1] and e[1] then
    redis.call('XACK', b .. ':s', g, sid)
    redis.call('XDEL', b .. ':s', sid)
    local f = fields(e[1][2])
    append(b, {f.e, '', f.k or '', '', tonumber(f.a) or 0, f.f or '', f.x or '[]'})
  end
end
return 0
