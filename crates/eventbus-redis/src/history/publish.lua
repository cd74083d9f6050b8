-- Publishes events and keeps those of channels with a history, in order, in one
-- script. KEYS: the set of channels with a history (on a cluster, the shard's: it
-- routes the script to the slot of every key it touches). ARGV: publish command
-- (`PUBLISH`, or `SPUBLISH` on a cluster), history stream key prefix, history hash
-- key prefix (each with the shard's hash tag on a cluster), envelope kind, now ms,
-- then per event: pub/sub channel, envelope without position, event id, event
-- channel, size, max bytes, ttl ms (0: none) and event ms (the order of `bounds`;
-- size 0: the channel keeps no history, the envelope is published as it is). Returns
-- each event's receivers.
local publish, hstream, hmeta, kind, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local out = {}
for j = 6, #ARGV, 8 do
  local msg, channel, size = ARGV[j + 1], ARGV[j + 3], tonumber(ARGV[j + 4])
  if size > 0 then
    local h = kept[channel] or history(channel, hstream .. channel, hmeta .. channel, KEYS[1], ARGV[j + 2], kind)
    msg = retain(h, msg, tonumber(ARGV[j + 7]), size, tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6]), now)
  end
  out[#out + 1] = redis.call(publish, ARGV[j], msg)
end
settle()
return out
