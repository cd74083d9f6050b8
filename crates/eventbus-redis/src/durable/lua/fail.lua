-- Fail (nack, term, deadline, disconnect): ARGV base, group, now, log maxlen, owner,
-- max_attempts, initial_ms, multiplier, max_ms, backoff kind, then (stream id, reason, delay ms or
-- -1 for the backoff, term 1/0, first delivery ms) quintuples. Entries no longer
-- pending for `owner` are skipped (another instance already handled them).
-- Returns `{next due ms or '', dead letters {envelope, attempts, failures}...}`.
local b, g, now, maxlen, owner = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local cfg = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])}
local out = {dead = {}, log = {}}
for j = 11, #ARGV, 5 do
  local sid = ARGV[j]
  local mine = redis.call('XPENDING', b .. ':s', g, sid, sid, 1, owner)
  if mine[1] then
    fail_one(b, g, sid, ARGV[j + 1], tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), ARGV[j + 4], now, cfg, maxlen, out)
  end
end
log_flush(b, out, maxlen)
local reply = {out.next and tostring(out.next) or ''}
for _, d in ipairs(out.dead) do reply[#reply + 1] = d end
return reply
