-- wrk script: 256-byte appends spread round-robin over N streams of the compat surface.
-- Usage: wrk -s scripts/wrk/append.lua <url>   (create the streams first, see scripts/bench-sanity)
local streams = tonumber(os.getenv("STREAMS") or "100")
local body = string.rep("x", tonumber(os.getenv("PAYLOAD") or "256"))
local counter = 0

request = function()
  counter = counter + 1
  local path = "/v1/stream/bench-" .. (counter % streams)
  return wrk.format("POST", path, { ["Content-Type"] = "application/octet-stream" }, body)
end
