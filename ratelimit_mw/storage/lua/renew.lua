-- units: time in microseconds. Renews the concurrency slots of one identity (its keys
-- share a hash slot) for requests that run longer than their lease.
-- KEYS[i]: a slot set; ARGV[1]: empty (Redis's clock) or a time (tests only);
-- ARGV[2]: the lease; ARGV[2 + i]: the lease id held in KEYS[i].
-- A lease still running ends a whole lease from now; one that ended, or was given
-- back, stays ended (ZADD XX never brings a member back). Reply: how many renewed.
if not call then bind_globals() end
local now = clock(ARGV[1])
local period = tonumber(ARGV[2])
local ttl_ms = ceil(period / 1000) + 1000
local renewed = 0
for i, key in ipairs(KEYS) do
  local expires = call("ZSCORE", key, ARGV[2 + i])
  if expires and tonumber(expires) > now then
    call("ZADD", key, "XX", fmt(now + period), ARGV[2 + i])
    if call("PTTL", key) < ttl_ms then
      call("PEXPIRE", key, fmt(ttl_ms))
    end
    renewed = renewed + 1
  end
end
return renewed
