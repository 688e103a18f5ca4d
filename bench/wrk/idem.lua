-- wrk script for bench/run.sh: POSTs a 200-byte JSON body and reports
-- machine-readable results from done().
--
--   wrk ... -s idem.lua URL -- MODE TAG BODY_FILE
--
-- MODE unique  every request carries a new Idempotency-Key "TAG-<thread>-<n>"
--              (an sf-string), from a per-thread counter
--      replay  every request carries the same key "TAG"
--      none    no Idempotency-Key header
--
-- BODY_FILE holds the JSON request body (bench/wrk/body.json, 200 bytes); the
-- harness primes the replay key with curl from the same file, so both send
-- identical bytes and therefore the same fingerprint.
--
-- Every response with status >= 300 is counted as "bad"; responses carrying
-- an "Idempotent-Replayed: true" header are counted as "replayed". done()
-- prints one line starting with "BENCH_RESULT" followed by key=value pairs.

local thread_seq = 0
local threads = {}

function setup(thread)
  thread_seq = thread_seq + 1
  thread:set("thread_id", thread_seq)
  table.insert(threads, thread)
end

local prefix, suffix
local counter = 0
local make_request
bad = 0
replayed = 0

function init(args)
  local mode = args[1] or "unique"
  local tag = args[2] or "bench"
  local body_file = args[3] or "body.json"
  local f = assert(io.open(body_file, "rb"))
  local body = f:read("*a")
  f:close()
  local host = wrk.host
  if wrk.port then host = host .. ":" .. wrk.port end
  local head = "POST " .. wrk.path .. " HTTP/1.1\r\n" ..
               "Host: " .. host .. "\r\n" ..
               "Content-Type: application/json\r\n" ..
               "Content-Length: " .. #body .. "\r\n"
  if mode == "unique" then
    prefix = head .. 'Idempotency-Key: "' .. tag .. "-" .. thread_id .. "-"
    suffix = '"\r\n\r\n' .. body
    make_request = function()
      counter = counter + 1
      return prefix .. counter .. suffix
    end
  elseif mode == "replay" then
    local req = head .. 'Idempotency-Key: "' .. tag .. '"\r\n\r\n' .. body
    make_request = function() return req end
  elseif mode == "none" then
    local req = head .. "\r\n" .. body
    make_request = function() return req end
  else
    error("unknown mode " .. mode .. " (want unique, replay or none)")
  end
end

-- Defined at top level so that wrk sees a dynamic request() in every mode
-- (wrk decides static vs dynamic before init() runs).
function request()
  return make_request()
end

function response(status, headers, _)
  if status >= 300 then
    bad = bad + 1
  end
  local r = headers["Idempotent-Replayed"] or headers["idempotent-replayed"]
  if r == "true" then
    replayed = replayed + 1
  end
end

function done(summary, latency, _)
  local total_bad, total_replayed = 0, 0
  for _, t in ipairs(threads) do
    total_bad = total_bad + (t:get("bad") or 0)
    total_replayed = total_replayed + (t:get("replayed") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d " ..
    "max_us=%d non2xx=%d replayed=%d err_connect=%d err_read=%d err_write=%d " ..
    "err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency.max,
    total_bad, total_replayed, e.connect, e.read, e.write, e.status, e.timeout))
end
