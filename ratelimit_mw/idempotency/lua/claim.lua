-- Claim an idempotency key. Times in milliseconds; the record is one hash.
-- KEYS[1] record; ARGV[1] request fingerprint, ARGV[2] lease token, ARGV[3] lease ttl ms.
-- Reply: {"claimed"} | {"in_flight"} | {"mismatch"} | {"done", status, headers, body}.
local record = redis.call("HMGET", KEYS[1], "state", "fp")
local state, fp = record[1], record[2]
if not state then
  redis.call("HSET", KEYS[1], "state", "in_flight", "fp", ARGV[1], "token", ARGV[2])
  redis.call("PEXPIRE", KEYS[1], ARGV[3])
  return {"claimed"}
end
if fp ~= ARGV[1] then
  return {"mismatch"}
end
if state == "in_flight" then
  return {"in_flight"}
end
local stored = redis.call("HMGET", KEYS[1], "status", "headers", "body")
return {"done", stored[1], stored[2], stored[3]}
