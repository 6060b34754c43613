-- One admission decision: check every budget, slot counter and limited tally, then take all or nothing.
-- KEYS: budget keys, then slot keys, then tally keys (haltwire.store.counters.Tally, Streak, Repeat).
-- ARGV: n_budgets, n_tallies, now_ms, slot_ttl_ms, slot_id, then (limit, ttl_ms) per budget, then
-- limit per slot, then four per tally op: kind, a, b, ttl_ms, where kind is
--   't' (a tally: a = amount, b = limit, -1 for none; an amount of 0 only checks, writes nothing),
--   's' (a streak: a = 1 for a hit, 0 otherwise),
--   'r' (a repeat: a = the digest).
-- Every time comes from the caller's clock (now) and every expiry is relative to it: an
-- absolute PEXPIREAT would be read on the Redis server's clock, and a gateway clock behind it
-- (or a test clock) would delete a budget's counter as soon as it is counted: no budget at all.
-- Returns {kind, i, counts..., raws...}: kind 0 when admitted, 1 when budget i refused, 2 when slot
-- counter i refused, 3 when tally i would have gone past its limit; counts are each tally op's
-- count, after it when admitted, as it was otherwise; raws are each tally op's value before it
-- ('' for none), what refund.lua puts back if a later part of the admission refuses (a cluster).
local nb = tonumber(ARGV[1])
local nt = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local id = ARGV[5]
local ns = #KEYS - nb - nt
local t0 = 5 + 2 * nb + ns -- the ARGV index before the first tally op's
local counts = {}
local seen = {}
local raws = {}
for i = 1, nt do
  local raw = redis.call('GET', KEYS[nb + ns + i])
  raws[i] = raw or ''
  if ARGV[t0 + 4 * i - 3] == 'r' then
    if raw then
      local sep = string.find(raw, ':', 1, true)
      seen[i] = string.sub(raw, 1, sep - 1)
      counts[i] = tonumber(string.sub(raw, sep + 1))
    else
      seen[i] = ''
      counts[i] = 0
    end
  else
    counts[i] = tonumber(raw or '0')
  end
end
local function refused(kind, i)
  local out = {kind, i}
  for j = 1, nt do out[j + 2] = counts[j]; out[j + 2 + nt] = raws[j] end
  return out
end
for i = 1, nb do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  if used >= tonumber(ARGV[4 + 2 * i]) then return refused(1, i) end
end
for j = 1, ns do
  local k = KEYS[nb + j]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  if redis.call('ZCARD', k) >= tonumber(ARGV[5 + 2 * nb + j]) then return refused(2, j) end
end
for i = 1, nt do
  if ARGV[t0 + 4 * i - 3] == 't' then
    local limit = tonumber(ARGV[t0 + 4 * i - 1])
    if limit >= 0 and counts[i] + tonumber(ARGV[t0 + 4 * i - 2]) > limit then return refused(3, i) end
  end
end
for i = 1, nb do
  if redis.call('INCR', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[5 + 2 * i]) end
end
for j = 1, ns do
  redis.call('ZADD', KEYS[nb + j], now + ttl, id)
  redis.call('PEXPIRE', KEYS[nb + j], ttl)
end
local out = {0, 0}
for i = 1, nt do
  local key = KEYS[nb + ns + i]
  local kind = ARGV[t0 + 4 * i - 3]
  local a = ARGV[t0 + 4 * i - 2]
  local pttl = ARGV[t0 + 4 * i]
  local count
  if kind == 't' and tonumber(a) == 0 then
    count = counts[i] -- a check only: nothing is written
  elseif kind == 't' then
    count = counts[i] + tonumber(a)
    redis.call('SET', key, count, 'PX', pttl)
  elseif kind == 's' then
    if a == '1' then count = counts[i] + 1 else count = 0 end
    redis.call('SET', key, count, 'PX', pttl)
  else
    if seen[i] == a then count = counts[i] + 1 else count = 1 end
    redis.call('SET', key, a .. ':' .. count, 'PX', pttl)
  end
  out[i + 2] = count
  out[i + 2 + nt] = raws[i]
end
return out
