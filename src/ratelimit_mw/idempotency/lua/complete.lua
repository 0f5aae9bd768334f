-- Store the finished response of a claimed key. Times in milliseconds.
-- KEYS[1] record; ARGV[1] lease token, ARGV[2] fingerprint, ARGV[3] ttl ms,
-- ARGV[4] status, ARGV[5] headers (JSON), ARGV[6] body.
-- Reply: 1 when stored; 0 when another request holds the key now (our lease ran out).
local record = redis.call("HMGET", KEYS[1], "state", "token")
if record[1] and (record[1] ~= "in_flight" or record[2] ~= ARGV[1]) then
  return 0
end
-- Absent means our lease expired and nobody claimed since: the response still counts.
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "state", "done", "fp", ARGV[2], "status", ARGV[4],
  "headers", ARGV[5], "body", ARGV[6])
redis.call("PEXPIRE", KEYS[1], ARGV[3])
return 1
