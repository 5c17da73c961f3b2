-- wrk script: HEAD requests spread over N streams. wrk only skips the (absent) body of a
-- HEAD response when HEAD is its global method, so set that rather than per request.
local streams = tonumber(os.getenv("STREAMS") or "100")
local counter = 0
wrk.method = "HEAD"

request = function()
  counter = counter + 1
  return wrk.format(nil, "/v1/stream/bench-" .. (counter % streams))
end
