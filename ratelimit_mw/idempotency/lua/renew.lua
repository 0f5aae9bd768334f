-- Extend the lease of a key still being handled. Times in milliseconds.
-- KEYS[1] record; ARGV[1] lease token, ARGV[2] lease ttl ms.
-- Reply: 1 when extended; 0 when not in flight with this token (stored, released, lost).
local record = redis.call("HMGET", KEYS[1], "state", "token")
if record[1] == "in_flight" and record[2] == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return 1
end
return 0
