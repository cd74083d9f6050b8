-- Publish a batch (group commit: the publishes that arrived while the previous batch
-- ran): check the consumer-set version, then for each event in order check its
-- idempotency key, store it for every matching consumer and PUBLISH it for
-- ephemeral subscribers.
--
-- KEYS: version. ARGV: known version, window ms, pub/sub channel prefix, history
-- stream key prefix, history hash key prefix, the set of channels with a history,
-- envelope kind of the pub/sub message (`b`/`j`), now ms, then per event: event id, envelope (stored), pub/sub message
-- ('' = the envelope), channel, ordering key ('' = none), idempotency key ('' =
-- none), history size, max bytes, ttl ms and event ms (size 0: the channel keeps no
-- history), number of consumers n, then n (consumer key base, max_pending) pairs. An event of a channel with history is kept in it with its
-- position, and published with it (`history`, `retain`); each channel's hash is read
-- once, and written and its stream trimmed once, after the batch (`settle`).
-- Returns `{'stale', version}` (nothing done), or `{'ok', r1, r2, ...}` with one `r`
-- per event: the receivers of its PUBLISH (integer), or for a repeated idempotency
-- key the original event id (string).
local v = redis.call('GET', KEYS[1]) or '0'
if v ~= ARGV[1] then return {'stale', v} end
local window, pubsub = ARGV[2], ARGV[3]
local hstream, hmeta, hindex, kind, now = ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
local out = {'ok'}
local j = 9
while j <= #ARGV do
  local id, env, msg, channel, key, idem = ARGV[j], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5]
  local size, max_bytes, ttl, ems = tonumber(ARGV[j + 6]), tonumber(ARGV[j + 7]), tonumber(ARGV[j + 8]), tonumber(ARGV[j + 9])
  local first = j + 11
  j = first + 2 * tonumber(ARGV[j + 10])
  if msg == '' then msg = env end
  local prev = false
  if idem ~= '' then
    prev = redis.call('GET', idem)
    if not prev then redis.call('SET', idem, id, 'PX', window) end
  end
  if prev then
    out[#out + 1] = prev
  else
    for i = first, j - 1, 2 do capture(ARGV[i], tonumber(ARGV[i + 1]), id, env, channel, key) end
    if size > 0 then
      local h = kept[channel] or history(channel, hstream .. channel, hmeta .. channel, hindex, id, kind)
      msg = retain(h, msg, ems, size, max_bytes, ttl, now)
    end
    out[#out + 1] = redis.call('PUBLISH', pubsub .. channel, msg)
  end
end
settle()
return out
