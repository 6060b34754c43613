-- Give back what admit.lua took in one part of an admission whose later part refused (or failed).
-- KEYS: budget keys, then slot keys, then tally keys, as given to admit.lua.
-- ARGV: n_budgets, n_tallies, slot_id, then three per tally op: kind, a, b, where kind is
--   't' (a = the amount added: taken back, never below 0),
--   's' or 'r' (a = the value admit.lua wrote, b = the value before it, '' for none: put back
--   only if the key still holds a, so a later call's count is never undone).
-- Every key keeps its expiry. Returns 0.
local nb = tonumber(ARGV[1])
local nt = tonumber(ARGV[2])
local id = ARGV[3]
local ns = #KEYS - nb - nt
for i = 1, nb do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  if used > 0 then redis.call('DECR', KEYS[i]) end
end
for j = 1, ns do redis.call('ZREM', KEYS[nb + j], id) end
for i = 1, nt do
  local key = KEYS[nb + ns + i]
  local kind = ARGV[1 + 3 * i]
  local a = ARGV[2 + 3 * i]
  local b = ARGV[3 + 3 * i]
  if kind == 't' then
    local now = tonumber(redis.call('GET', key) or '0')
    local back = math.min(now, tonumber(a))
    if back > 0 then redis.call('DECRBY', key, back) end
  elseif redis.call('GET', key) == a then
    if b == '' then redis.call('DEL', key) else redis.call('SET', key, b, 'KEEPTTL') end
  end
end
return 0
