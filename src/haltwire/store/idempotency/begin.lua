-- Check and claim one idempotency key, atomically across gateways.
-- KEYS: the record's key. ARGV: fingerprint, ttl_ms.
-- Returns {0} fresh, {1, outcome} recorded, {2} in flight, {3} conflict.
-- The TTL is relative (PEXPIRE), so the gateway's and Redis's clocks need not agree.
local v = redis.call('HMGET', KEYS[1], 'f', 'o')
if not v[1] then
  redis.call('HSET', KEYS[1], 'f', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {0}
end
if v[1] ~= ARGV[1] then return {3} end
if v[2] then return {1, v[2]} end
return {2}
