-- Record the outcome of a claimed key; the record keeps its expiry.
-- KEYS: the record's key. ARGV: outcome. Returns 0.
-- Only an existing record is completed: HSET on an expired key would create one without a TTL.
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'o', ARGV[1]) end
return 0
