//! Capture: storing published events for the consumers they match (one Redis, or
//! one consumer's slot on a cluster).

/// Stores one published event for consumer `b` (`max`: its max_pending, 0 = no
/// limit). A consumer holding max_pending unfinished events takes no more: the capture
/// is dropped for it and counted (`:n` dropped). An event whose ordering key has a live
/// event waits behind it.
pub(super) const CAPTURE_ONE: &str = r#"
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
"#;

/// Publish a batch (group commit: the publishes that arrived while the previous batch
/// ran): check the consumer-set version, then for each event in order check its
/// idempotency key, store it for every matching consumer and PUBLISH it for
/// ephemeral subscribers.
///
/// KEYS: version. ARGV: known version, window ms, pub/sub channel prefix, history
/// stream key prefix, history hash key prefix, the set of channels with a history,
/// envelope kind of the pub/sub message (`b`/`j`), now ms, then per event: event id, envelope (stored), pub/sub message
/// ('' = the envelope), channel, ordering key ('' = none), idempotency key ('' =
/// none), history size, max bytes, ttl ms and event ms (size 0: the channel keeps no
/// history), number of consumers n, then n (consumer key base, max_pending) pairs. An event of a channel with history is kept in it with its
/// position, and published with it (`history`, `retain`); each channel's hash is read
/// once, and written and its stream trimmed once, after the batch (`settle`).
/// Returns `{'stale', version}` (nothing done), or `{'ok', r1, r2, ...}` with one `r`
/// per event: the receivers of its PUBLISH (integer), or for a repeated idempotency
/// key the original event id (string).
pub(super) const PUBLISH: &str = r#"
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
"#;

/// A batch for one consumer on a Redis Cluster, where each consumer's keys are in a
/// slot of their own: KEYS its stream (which routes the script to that slot); ARGV
/// key base, max_pending, now, idempotency window ms, then (event id, envelope,
/// channel, ordering key, once) per event, in publish order. An event with `once` 1
/// (it has an idempotency key) is stored only if its id is not in `:e` (the ids stored
/// within the window), so that the retry of a publish that reached only some consumers
/// stores it for the others and nothing twice. Returns 0 (nothing stored) when the
/// consumer is gone, else 1.
pub(super) const CAPTURE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local b, max, now, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local seen = false
for j = 5, #ARGV, 5 do
  local id = ARGV[j]
  if ARGV[j + 4] ~= '1' then
    capture(b, max, id, ARGV[j + 1], ARGV[j + 2], ARGV[j + 3])
  elseif not redis.call('ZSCORE', b .. ':e', id) then
    redis.call('ZADD', b .. ':e', now, id)
    seen = true
    capture(b, max, id, ARGV[j + 1], ARGV[j + 2], ARGV[j + 3])
  end
end
if seen then redis.call('ZREMRANGEBYSCORE', b .. ':e', '-inf', now - window) end
return 1
"#;
