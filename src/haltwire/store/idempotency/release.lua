-- Free a key whose call certainly did not happen.
-- KEYS: the record's key. No ARGV. Returns 0.
-- A record with an outcome stays: its call answered, and a retry must get that answer.
if redis.call('HEXISTS', KEYS[1], 'o') == 0 then redis.call('DEL', KEYS[1]) end
return 0
