-- One page of ListPending: ARGV base, group, now, ack deadline ms, limit, token. The
-- live stream first, in stream order (`s:{last stream id}`), then the events waiting
-- off it by event id (`r:{last event id}`). Returns `{next token or '', rows...}`,
-- each row `{envelope, attempt, next delivery ms or '', failures JSON, state}` with
-- state 1 ready, 2 delayed, 3 in flight, 4 blocked by its ordering key.
local b, g, now, ackdl, limit, token = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local rows = {}
local phase, after = string.sub(token, 1, 1), string.sub(token, 3)
if token == '' then phase, after = 's', '' end
if phase == 's' then
  local start = '-'
  if after ~= '' then start = '(' .. after end
  local entries = redis.call('XRANGE', b .. ':s', start, '+', 'COUNT', limit)
  local last = ''
  for _, e in ipairs(entries) do
    local sid, f = e[1], fields(e[2])
    local failed = tonumber(f.a) or 0
    local p = redis.call('XPENDING', b .. ':s', g, sid, sid, 1)
    if p[1] then
      rows[#rows + 1] = {f.e, tostring(failed + 1), tostring(now - tonumber(p[1][3]) + ackdl), f.x or '[]', 3}
    else
      rows[#rows + 1] = {f.e, tostring(failed), '', f.x or '[]', 1}
    end
    last = sid
  end
  if #entries == limit then return {'s:' .. last, unpack(rows)} end
  after = ''
end
local start = '-'
if after ~= '' then start = '(' .. after end
local room = limit - #rows
local ids = redis.call('ZRANGEBYLEX', b .. ':y', start, '+', 'LIMIT', 0, room)
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', b .. ':r', id)
  if rec then
    local r = cmsgpack.unpack(rec)
    local due = redis.call('ZSCORE', b .. ':d', id)
    local x = r[7]
    if x == nil or x == '' then x = '[]' end
    if due then
      rows[#rows + 1] = {r[1], tostring(r[5]), tostring(due), x, 2}
    else
      rows[#rows + 1] = {r[1], tostring(r[5]), '', x, 4}
    end
  end
end
local next = ''
if #ids == room then next = 'r:' .. ids[#ids] end
return {next, unpack(rows)}
