-- One admission decision: check every budget and slot counter, then take all or nothing.
-- KEYS: budget keys, then slot keys.
-- ARGV: n_budgets, now_ms, slot_ttl_ms, slot_id, then (limit, ttl_ms) per budget, then limit per slot.
-- Every time comes from the caller's clock (now) and every expiry is relative to it: an
-- absolute PEXPIREAT would be read on the Redis server's clock, and a gateway clock behind it
-- (or a test clock) would delete a budget's counter as soon as it is counted: no budget at all.
-- Returns {0, 0} when admitted, {1, i} when budget i refused, {2, j} when slot counter j refused.
local nb = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local id = ARGV[4]
local ns = #KEYS - nb
for i = 1, nb do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  if used >= tonumber(ARGV[3 + 2 * i]) then return {1, i} end
end
for j = 1, ns do
  local k = KEYS[nb + j]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  if redis.call('ZCARD', k) >= tonumber(ARGV[4 + 2 * nb + j]) then return {2, j} end
end
for i = 1, nb do
  if redis.call('INCR', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[4 + 2 * i]) end
end
for j = 1, ns do
  redis.call('ZADD', KEYS[nb + j], now + ttl, id)
  redis.call('PEXPIRE', KEYS[nb + j], ttl)
end
return {0, 0}
