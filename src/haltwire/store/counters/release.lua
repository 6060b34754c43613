-- Give back the slots one admission took.
-- KEYS: slot keys. ARGV: slot_id. Returns 0.
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 0
