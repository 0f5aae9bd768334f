-- Store the finished response of a claimed key. Times in milliseconds.
-- KEYS[1] record; ARGV[1] lease token, ARGV[2] fingerprint, ARGV[3] ttl ms,
-- ARGV[4] status, ARGV[5] headers (JSON), ARGV[6] body.
-- Reply: 1 when stored (now or by an earlier call with this token that seemed to fail);
-- 0 when another request holds the key now (our lease ran out).
local record = redis.call("HMGET", KEYS[1], "state", "token")
if record[1] and record[2] ~= ARGV[1] then
  return 0
end
if record[1] == "done" then
  return 1
end
-- Absent means our lease expired and nobody claimed since: the response still counts.
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "state", "done", "fp", ARGV[2], "token", ARGV[1],
  "status", ARGV[4], "headers", ARGV[5], "body", ARGV[6])
redis.call("PEXPIRE", KEYS[1], ARGV[3])
return 1
