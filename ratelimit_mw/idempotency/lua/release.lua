-- Give up a claimed key without storing anything (the handler failed or streamed).
-- KEYS[1] record; ARGV[1] lease token. Reply: 1 when released, 0 when not ours (any more).
local record = redis.call("HMGET", KEYS[1], "state", "token")
if record[1] == "in_flight" and record[2] == ARGV[1] then
  redis.call("DEL", KEYS[1])
  return 1
end
return 0
