-- One call's tripwire counts (haltwire.store.counters.Tally, Streak, Repeat), atomically.
-- KEYS: one key per op. ARGV: four per op: kind, a, b, ttl_ms, where kind is
--   't' (a tally: a = amount, b = limit, -1 for none),
--   's' (a streak: a = 1 for a hit, 0 otherwise),
--   'r' (a repeat: a = the digest).
-- First every limited tally is checked; if one would go past its limit nothing is written and
-- {i, counts...} is returned (i its 1-based index, the counts as they were). Else every op is
-- applied and {0, counts...} returned (each op's count after it). Expiries are relative (PEXPIRE),
-- so the gateway's clock, not the server's, decides them (as in admit.lua).
local n = #KEYS
local counts = {}
local seen = {}
for i = 1, n do
  local kind = ARGV[4 * i - 3]
  local raw = redis.call('GET', KEYS[i])
  if kind == 'r' then
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
for i = 1, n do
  if ARGV[4 * i - 3] == 't' then
    local limit = tonumber(ARGV[4 * i - 1])
    if limit >= 0 and counts[i] + tonumber(ARGV[4 * i - 2]) > limit then
      local out = {i}
      for j = 1, n do out[j + 1] = counts[j] end
      return out
    end
  end
end
local out = {0}
for i = 1, n do
  local kind = ARGV[4 * i - 3]
  local a = ARGV[4 * i - 2]
  local ttl = ARGV[4 * i]
  local count
  if kind == 't' then
    count = counts[i] + tonumber(a)
    redis.call('SET', KEYS[i], count, 'PX', ttl)
  elseif kind == 's' then
    if a == '1' then count = counts[i] + 1 else count = 0 end
    redis.call('SET', KEYS[i], count, 'PX', ttl)
  else
    if seen[i] == a then count = counts[i] + 1 else count = 1 end
    redis.call('SET', KEYS[i], a .. ':' .. count, 'PX', ttl)
  end
  out[i + 1] = count
end
return out
