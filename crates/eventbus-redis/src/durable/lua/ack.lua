-- Ack: ARGV base, group, log maxlen, now, the terminal-log lines of the acks with a
-- stream id (joined by '\n', in their order; the acking instance knows the entries, so
-- the script does not read them back), the newest of their stream ids, then (stream
-- id, event id, ordering key) triples. A stream id of '' is a late ack: it completes an event waiting for its
-- retry (its log line is built here from the retry record). The lines are logged as
-- one entry. Returns how many events completed.
--
-- One XACK takes every stream id. When it acknowledges them all (the usual case),
-- each was pending and completes. Otherwise some had already left the pending list
-- (reclaimed past their deadline, say): a delivered entry stays on the stream exactly
-- as long as it is pending, so the ones still on the stream are the ones this XACK
-- took, and the others are looked up among the retries as late acks (and their lines
-- left out).
--
-- The acked entries leave the stream by one XTRIM MINID up to the oldest entry still
-- pending (everything before it was delivered, and a delivered entry that is not
-- pending is finished): acks come mostly in stream order, so that takes nearly all of
-- them; the rest (acked ahead of an older one still in flight) by XDEL.
local b, g, maxlen, now, lines, newest = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]
local s, d, r = b .. ':s', b .. ':d', b .. ':r'
local sids = {}
for j = 7, #ARGV, 3 do
  if ARGV[j] ~= '' then sids[#sids + 1] = ARGV[j] end
end
local took = 0
for i = 1, #sids, 512 do
  took = took + redis.call('XACK', s, g, unpack(sids, i, math.min(i + 511, #sids)))
end
local all = took == #sids
local done = 0
local acked = {}
local out = {log = {}}
local held, kept = 0, nil
if not all then kept = {} end
for j = 7, #ARGV, 3 do
  local sid, id, key = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  if sid ~= '' then held = held + 1 end
  if sid ~= '' and (all or redis.call('XRANGE', s, sid, sid)[1]) then
    acked[#acked + 1] = sid
    if kept then kept[held] = true end
    if key ~= '' then release_key(b, key, id) end
    done = done + 1
  elseif redis.call('ZREM', d, id) == 1 then
    local rec = redis.call('HGET', r, id)
    redis.call('HDEL', r, id)
    redis.call('ZREM', b .. ':y', id)
    if rec then
      local e = cmsgpack.unpack(rec)
      out.log[#out.log + 1] = log_line(e[4], e[2], 'Completed', e[5], e[6], now, e[7])
      release_key(b, e[3], e[4])
      done = done + 1
    end
  end
end
-- The lines of the acks taken here, then those of the late acks.
local text, n = lines, #acked
if kept then
  local mine, i = {}, 0
  for line in string.gmatch(lines, '[^\n]+') do
    i = i + 1
    if kept[i] then mine[#mine + 1] = line end
  end
  text = table.concat(mine, '\n')
end
if #out.log > 0 then
  if n > 0 then text = text .. '\n' end
  text = text .. table.concat(out.log, '\n')
  n = n + #out.log
end
log_write(b, text, n, maxlen)
if #acked > 0 then
  local rest = acked
  if string.match(newest, '^%d+-%d+$') then
    local upto = id_next(newest)
    local oldest = redis.call('XPENDING', s, g, '-', '+', 1)
    if oldest[1] and id_less(oldest[1][1], upto) then
      upto = oldest[1][1]
      rest = {}
      for _, sid in ipairs(acked) do
        if not id_less(sid, upto) then rest[#rest + 1] = sid end
      end
    else
      rest = {}
    end
    redis.call('XTRIM', s, 'MINID', upto)
  end
  for i = 1, #rest, 512 do
    redis.call('XDEL', s, unpack(rest, i, math.min(i + 511, #rest)))
  end
end
if done > 0 then redis.call('HINCRBY', b .. ':n', 'acked', done) end
return done
