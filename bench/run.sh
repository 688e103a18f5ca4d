#!/usr/bin/env bash
# make bench: wrk against idemgate and against nginx (a plain reverse proxy)
# in front of the same nginx backend, runs interleaved, ratios printed.
# See docs/benchmarks.md for what each scenario measures.
#
# Everything runs on loopback, on free ports, under a temp dir; every process
# started here is stopped on exit, failure or Ctrl-C. Exit status: 0 when every
# correctness check passed (ratio targets are reported, never asserted), 1 when
# a check failed or a process could not start, 2 when a prerequisite is missing.
#
# Environment (all optional):
#   BENCH_DURATION=8        seconds per measured run
#   BENCH_WARMUP=2          seconds of the warm-up run per target and scenario
#   BENCH_ROUNDS=3          measured A B rounds per scenario
#   BENCH_THREADS=2 BENCH_CONNECTIONS=64   wrk load
#   BENCH_SCENARIOS="1 2 3 4 5"            subset to run
#   BENCH_STEAL_MAX=3       repeat a run whose CPU steal exceeded this percent
#   BENCH_BUDGET=290        seconds for this script; steal repeats are made only
#                           while the planned runs plus the repeats fit in it
#   BENCH_MEMORY=1          also run the store memory benchmark (about a minute;
#                           BENCH_MEMORY_RECORDS=1000000 records per store)
#   BENCH_MICRO=1           also run the Google Benchmark micro-benchmarks
#   BENCH_BUILD_DIR=build/release        where the binaries are
#   BENCH_IDEMGATE=PATH     the idemgate binary (default BUILD_DIR/src/cli/idemgate)
#   BENCH_GATEWAY_CMD=CMD   run CMD instead of "idemgate --config FILE" in the
#                           gateway slot; it sees BENCH_GATEWAY_CONFIG,
#                           BENCH_GATEWAY_PORT, BENCH_BACKEND_PORT, BENCH_TMP.
#                           The value "nginx" puts a second nginx proxy there
#                           (nginx against nginx: proves the harness itself;
#                           idempotency checks are skipped).
#   BENCH_GATEWAY_STDOUT=FILE  where the gateway's stdout goes (default /dev/null)
#   BENCH_KEEP=1            keep the temp dir (logs, configs, wrk output)
#   BENCH_RESULTS=FILE      also write the final table there
#                           (default BUILD_DIR/bench-results.txt)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR=$ROOT/bench

DURATION=${BENCH_DURATION:-8}
WARMUP=${BENCH_WARMUP:-2}
ROUNDS=${BENCH_ROUNDS:-3}
THREADS=${BENCH_THREADS:-2}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
SCENARIOS=${BENCH_SCENARIOS:-"1 2 3 4 5"}
STEAL_MAX=${BENCH_STEAL_MAX:-3}
BUDGET=${BENCH_BUDGET:-290}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/release}
IDEMGATE=${BENCH_IDEMGATE:-$BUILD_DIR/src/cli/idemgate}
GATEWAY_CMD=${BENCH_GATEWAY_CMD:-}
GATEWAY_STDOUT=${BENCH_GATEWAY_STDOUT:-/dev/null}
RESULTS=${BENCH_RESULTS:-$BUILD_DIR/bench-results.txt}
BODY=$BENCH_DIR/wrk/body.json
LUA=$BENCH_DIR/wrk/idem.lua
MAX_STEAL_REPEATS=2

START_TIME=$SECONDS
TMP=""
PIDS=()
FAILURES=()
NOTES=()
GW_LABEL=idemgate

say() { printf '%s\n' "bench: $*"; }
warn() { printf '%s\n' "bench: $*" >&2; }
fail() { FAILURES+=("$*"); warn "CHECK FAILED: $*"; }

# ---------------------------------------------------------------- processes

# Stops one process we started (and its direct children, e.g. nginx workers,
# should the parent need SIGKILL), by pid only.
stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    local children=()
    read -ra children <<<"$(ps -o pid= --ppid "$pid" 2>/dev/null | tr '\n' ' ')"
    kill -KILL "$pid" "${children[@]}" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  return 0
}

forget_pid() {
  local pid=$1 p kept=()
  for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
  PIDS=("${kept[@]}")
  unset "SERVICE_NAME[$pid]" "SERVICE_LOG[$pid]"
}

# Long-running services (nginx, redis, the gateway) by pid, with the log to
# show should one exit while it is needed.
declare -A SERVICE_NAME=() SERVICE_LOG=()
service() { SERVICE_NAME[$1]=$2; SERVICE_LOG[$1]=$3; }

# Fails (with the reason and the log's tail) when a service has exited.
require_alive() {
  local pid
  for pid in "${!SERVICE_NAME[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    local status
    wait "$pid"; status=$?
    fail "${SCENARIO_LABEL:-}${SERVICE_NAME[$pid]} (pid $pid) exited unexpectedly with status $status (log ${SERVICE_LOG[$pid]})"
    tail -n 20 "${SERVICE_LOG[$pid]}" 2>/dev/null | sed 's/^/  /' >&2
    forget_pid "$pid"
    return 1
  done
}

cleanup() {
  local status=$? i
  trap - EXIT INT TERM
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[$i]}"; done
  PIDS=()
  if [ -n "$TMP" ] && [ -d "$TMP" ]; then
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
      say "kept $TMP"
    else
      rm -rf "$TMP"
      [ "$status" = 0 ] || say "logs and configs were under $TMP (removed; BENCH_KEEP=1 keeps them)"
    fi
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'warn "interrupted"; exit 130' INT TERM

# free_port VAR: sets VAR to a TCP port nothing uses on this host now, below
# the kernel's ephemeral range (so outgoing connections cannot hold it) and
# never handed out before in this run.
USED_PORTS=" "
PORT_LO=10000
PORT_HI=$(awk '{ print $1 - 1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
((PORT_HI - PORT_LO >= 1000)) || { PORT_LO=20000; PORT_HI=60000; }
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((PORT_LO + (RANDOM * 32768 + RANDOM) % (PORT_HI - PORT_LO + 1)))
    case $USED_PORTS in *" $p "*) continue ;; esac
    if command -v ss >/dev/null 2>&1; then
      [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] || continue
    elif (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      continue
    fi
    USED_PORTS+="$p "
    printf -v "$1" '%s' "$p"
    return 0
  done
  warn "no free TCP port found"
  return 1
}

# Waits until something accepts TCP connections on 127.0.0.1:PORT while PID
# is alive. Fails when PID exits or after TIMEOUT seconds.
wait_listening() {
  local port=$1 pid=$2 timeout=${3:-10} i
  for ((i = 0; i < timeout * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  return 1
}

line_count() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }

# Waits (up to 3 s) until FILE has at least N lines.
wait_lines() {
  local file=$1 n=$2 i
  for ((i = 0; i < 60; i++)); do
    [ "$(line_count "$file")" -ge "$n" ] && return 0
    sleep 0.05
  done
  return 1
}

render() {  # render TEMPLATE OUT NAME=VALUE...
  local in=$1 out=$2 kv sed_args=()
  shift 2
  for kv in "$@"; do sed_args+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
  sed "${sed_args[@]}" "$in" >"$out"
}

# start_nginx NAME TEMPLATE PORT [NAME=VALUE...]: prefix dir TMP/NAME; sets
# NGINX_PID.
start_nginx() {
  local name=$1 template=$2 port=$3 dir=$TMP/$1
  shift 3
  mkdir -p "$dir/tmp" "$dir/logs"
  render "$template" "$dir/nginx.conf" DIR="$dir" PORT="$port" "$@"
  if ! "$NGINX" -t -q -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/test.log"; then
    warn "nginx ($name) rejected its config:"; cat "$dir/test.log" >&2
    return 1
  fi
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout.log" 2>&1 &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  service "$NGINX_PID" "nginx ($name)" "$dir/error.log"
  if ! wait_listening "$port" "$NGINX_PID" 10; then
    warn "nginx ($name) did not start on port $port:"; tail -n 20 "$dir/error.log" "$dir/stdout.log" >&2
    return 1
  fi
}

# ---------------------------------------------------------------- measuring

# "steal total" jiffies summed over all CPUs, from /proc/stat.
cpu_sample() {
  awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit }' /proc/stat
}

field() {  # field KEY LINE: value of KEY=VALUE in a BENCH_RESULT line
  local key=$1 line=$2
  sed -n "s/.* $key=\([^ ]*\).*/\1/p" <<<" $line"
}

# run_wrk URL SECONDS MODE TAG OUTFILE: runs wrk bounded in time; sets RESULT
# (the BENCH_RESULT line) and STEAL (percent). Returns 1 when wrk produced no
# result.
run_wrk() {
  local url=$1 secs=$2 mode=$3 tag=$4 out=$5 before after pid
  before=$(cpu_sample)
  timeout --kill-after=5 $((secs + 20)) \
    "$WRK" -t "$THREADS" -c "$CONNECTIONS" -d "${secs}s" --timeout 5s -s "$LUA" "$url" \
    -- "$mode" "$tag" "$BODY" >"$out" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait "$pid"
  forget_pid "$pid"
  after=$(cpu_sample)
  STEAL=$(awk -v b="$before" -v a="$after" 'BEGIN {
    split(b, x, " "); split(a, y, " "); dt = y[2] - x[2]
    printf "%.1f", (dt > 0 ? 100 * (y[1] - x[1]) / dt : 0) }')
  RESULT=$(grep -m1 '^BENCH_RESULT' "$out")
  if [ -z "$RESULT" ]; then
    warn "wrk produced no result for $url ($mode):"; tail -n 20 "$out" >&2
    return 1
  fi
}

stats() {  # stats VALUES...: "median min max"
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s %s %s\n", m, v[1], v[NR] }'
}

# ---------------------------------------------------------------- prerequisites

NGINX=$(command -v nginx || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
WRK=$(command -v wrk || true)
REDIS=$(command -v redis-server || true)
[ -z "$REDIS" ] && [ -x /usr/bin/redis-server ] && REDIS=/usr/bin/redis-server

missing=0
[ -n "$NGINX" ] || { warn "nginx not found (Debian package nginx-light; run: make deps)"; missing=1; }
[ -n "$WRK" ] || { warn "wrk not found (Debian package wrk; run: make deps)"; missing=1; }
command -v curl >/dev/null || { warn "curl not found (run: make deps)"; missing=1; }
command -v timeout >/dev/null || { warn "timeout (coreutils) not found"; missing=1; }
[ -r /proc/stat ] || { warn "/proc/stat not readable (Linux only)"; missing=1; }
if [ ! -f "$LUA" ] || [ ! -f "$BODY" ]; then warn "missing $LUA or $BODY"; missing=1; fi
case $GATEWAY_CMD in
  "") [ -x "$IDEMGATE" ] || { warn "idemgate binary not found at $IDEMGATE (run: make build, or set BENCH_IDEMGATE)"; missing=1; } ;;
  nginx) GW_LABEL=nginx-gw ;;
  *) GW_LABEL=gateway ;;
esac
[ "$missing" = 0 ] || exit 2

if [ -z "$REDIS" ] && [[ " $SCENARIOS " == *" 5 "* ]]; then
  NOTES+=("scenario 5 skipped: redis-server not found")
  SCENARIOS=${SCENARIOS//5/}
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/idemgate-bench.XXXXXX") || exit 1
NONCE=$(date +%s)$$

# Idempotency checks only make sense when an idemgate is in the gateway slot.
idem_checks() { [ "$GATEWAY_CMD" != nginx ]; }

# ---------------------------------------------------------------- the machine

LOAD=$(cut -d' ' -f1 /proc/loadavg)
say "$(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), kernel $(uname -r), load $LOAD"
say "wrk: $THREADS threads, $CONNECTIONS connections, ${DURATION}s runs x $ROUNDS rounds (warm-up ${WARMUP}s), 200-byte JSON POST"
if awk -v l="$LOAD" -v n="$(nproc)" 'BEGIN { exit !(l > 0.25 * n) }'; then
  NOTES+=("the machine was busy at start (load $LOAD): figures are noisy")
  warn "machine is busy (1-minute load $LOAD): other work will skew the figures"
fi

# ---------------------------------------------------------------- backend, baseline

free_port BACKEND_PORT && free_port COUNT_PORT && free_port PROXY_PORT || exit 1
start_nginx backend "$BENCH_DIR/nginx/backend.conf.in" "$BACKEND_PORT" COUNT_PORT="$COUNT_PORT" || exit 1
start_nginx nginx-proxy "$BENCH_DIR/nginx/proxy.conf.in" "$PROXY_PORT" BACKEND_PORT="$BACKEND_PORT" || exit 1
KEYS_LOG=$TMP/backend/keys.log
say "backend nginx on :$BACKEND_PORT (counting :$COUNT_PORT), nginx proxy on :$PROXY_PORT"

REDIS_PORT=""
start_redis() {
  free_port REDIS_PORT || return 1
  mkdir -p "$TMP/redis"
  "$REDIS" --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --dir "$TMP/redis" --logfile "$TMP/redis/redis.log" --daemonize no >/dev/null 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  service "$REDIS_PID" redis-server "$TMP/redis/redis.log"
  if ! wait_listening "$REDIS_PORT" "$REDIS_PID" 10; then
    warn "redis-server did not start:"; tail -n 20 "$TMP/redis/redis.log" >&2
    return 1
  fi
  say "redis-server on :$REDIS_PORT"
}

# ---------------------------------------------------------------- the gateway

# gateway_config SCENARIO UPSTREAM_PORT: writes TMP/gw-SCENARIO/idemgate.yaml.
gateway_config() {
  local s=$1 upstream=$2 dir=$TMP/gw-$1 store
  mkdir -p "$dir"
  case $s in
    2) store="store: { kind: memory, max_bytes: 4GiB }" ;;
    5) store="store: { kind: redis, redis: { addresses: [\"127.0.0.1:$REDIS_PORT\"], timeout: 1s } }" ;;
    *) store="store: { kind: embedded, path: \"$dir/store\", sync: false }" ;;
  esac
  render "$BENCH_DIR/idemgate.yaml.in" "$dir/idemgate.yaml" \
    PORT="$GW_PORT" BACKEND_PORT="$upstream" STORE="$store"
  GW_CONFIG=$dir/idemgate.yaml
}

# Matches what idemgate says when a store kind is compiled out.
not_built() { grep -qiE 'redis.*(not (built|compiled|available|supported)|disabled|unsupported|built without|compiled without)|(not built|compiled out|without).*redis' "$1"; }

# start_gateway SCENARIO: sets GW_PID. Returns 1 on failure (reason printed),
# 3 when the scenario's store is not built into idemgate.
start_gateway() {
  local s=$1 dir=$TMP/gw-$1 upstream=$BACKEND_PORT
  free_port GW_PORT || return 1
  # Scenario 3: idemgate talks to the counting backend (see backend.conf.in).
  if [ "$s" = 3 ] && idem_checks; then upstream=$COUNT_PORT; fi
  gateway_config "$s" "$upstream"
  export BENCH_GATEWAY_CONFIG=$GW_CONFIG BENCH_GATEWAY_PORT=$GW_PORT BENCH_BACKEND_PORT=$upstream BENCH_TMP=$TMP
  case $GATEWAY_CMD in
    nginx)
      start_nginx "gw-$s/nginx" "$BENCH_DIR/nginx/proxy.conf.in" "$GW_PORT" \
        BACKEND_PORT="$upstream" || return 1
      GW_PID=$NGINX_PID
      return 0 ;;
    "")
      if ! "$IDEMGATE" check-config "$GW_CONFIG" >"$dir/check.log" 2>&1; then
        if not_built "$dir/check.log"; then return 3; fi
        warn "idemgate check-config rejected the generated config $GW_CONFIG:"
        sed 's/^/  /' "$dir/check.log" >&2
        return 1
      fi
      "$IDEMGATE" --config "$GW_CONFIG" >"$GATEWAY_STDOUT" 2>"$dir/stderr.log" & ;;
    *)
      bash -c "exec $GATEWAY_CMD" >"$GATEWAY_STDOUT" 2>"$dir/stderr.log" & ;;
  esac
  GW_PID=$!
  PIDS+=("$GW_PID")
  service "$GW_PID" "$GW_LABEL" "$dir/stderr.log"
  if ! wait_listening "$GW_PORT" "$GW_PID" 15; then
    if not_built "$dir/stderr.log"; then stop_pid "$GW_PID"; forget_pid "$GW_PID"; return 3; fi
    warn "$GW_LABEL did not start listening on 127.0.0.1:$GW_PORT (config $GW_CONFIG)."
    warn "its stderr:"; tail -n 30 "$dir/stderr.log" | sed 's/^/  /' >&2
    if kill -0 "$GW_PID" 2>/dev/null; then
      warn "(still running, not listening)"
    elif [ -z "$GATEWAY_CMD" ]; then
      warn "running it once more with its output shown:"
      timeout 3 "$IDEMGATE" --config "$GW_CONFIG" 2>&1 | tail -n 30 | sed 's/^/  /' >&2
    fi
    stop_pid "$GW_PID"; forget_pid "$GW_PID"
    return 1
  fi
  # Ready means it proxies: one unkeyed request must come back 2xx.
  local code
  code=$(curl -s -o "$dir/probe.out" -w '%{http_code}' --max-time 5 -X POST \
    -H 'Content-Type: application/json' --data-binary "@$BODY" "http://127.0.0.1:$GW_PORT/bench/probe")
  if [ "${code:0:1}" != 2 ]; then
    warn "$GW_LABEL listens but a plain POST through it answered '$code':"
    head -c 600 "$dir/probe.out" | sed 's/^/  /' >&2; echo >&2
    tail -n 20 "$dir/stderr.log" | sed 's/^/  /' >&2
    stop_pid "$GW_PID"; forget_pid "$GW_PID"
    return 1
  fi
}

stop_gateway() {
  [ -n "${GW_PID:-}" ] || return 0
  stop_pid "$GW_PID"; forget_pid "$GW_PID"
  GW_PID=""
}

# ---------------------------------------------------------------- scenarios

SCN_NAME=([1]="unique keys, embedded store" [2]="unique keys, memory store"
  [3]="replay of one stored key" [4]="no key, optional route"
  [5]="unique keys, redis store")
SCN_MODE=([1]=unique [2]=unique [3]=replay [4]=none [5]=unique)
SCN_TARGET=([1]=0.9 [2]=1.0 [3]=1.8 [4]=1.0 [5]=0.8)
P99_TARGET=1.2
declare -A ROW   # ROW[s,target]: "rps_med rps_min rps_max p50_med p99_med runs" ; ROW[s,status]
PATH_URL=/api/v1/bench

# Checks one measured (or warm-up) run. $1 scenario, $2 target (nginx|gw).
check_run() {
  local s=$1 target=$2 label=$3 requests non2xx errs replayed
  requests=$(field requests "$RESULT"); non2xx=$(field non2xx "$RESULT")
  replayed=$(field replayed "$RESULT")
  errs=$(($(field err_connect "$RESULT") + $(field err_read "$RESULT") + $(field err_write "$RESULT") + $(field err_timeout "$RESULT")))
  local strict=1
  [ "$s" = 5 ] && strict=0
  if [ "$requests" -eq 0 ]; then
    fail "scenario $s, $label: no request completed"
  elif [ "$non2xx" -ne 0 ] || [ "$errs" -ne 0 ]; then
    if [ "$strict" = 1 ]; then
      fail "scenario $s, $label: $non2xx responses >= 300 and $errs socket errors out of $requests"
    else
      NOTES+=("scenario $s, $label: $non2xx responses >= 300 and $errs socket errors out of $requests (reported, not asserted)")
    fi
  fi
  if [ "$target" = gw ] && idem_checks; then
    if [ "${SCN_MODE[$s]}" = replay ] && [ "$replayed" -ne "$requests" ]; then
      fail "scenario $s, $label: only $replayed of $requests responses were replays"
    elif [ "${SCN_MODE[$s]}" != replay ] && [ "$replayed" -ne 0 ]; then
      fail "scenario $s, $label: $replayed responses were replays, expected none"
    fi
  fi
}

# measured_run S TARGET URL ROUND: one run, repeated while steal is too high.
measured_run() {
  local s=$1 target=$2 url=$3 round=$4 attempt label
  label="$([ "$target" = gw ] && echo "$GW_LABEL" || echo nginx) round $round"
  for ((attempt = 0; attempt <= MAX_STEAL_REPEATS; attempt++)); do
    local tag="k${NONCE}s${s}${target}r${round}a${attempt}"
    [ "${SCN_MODE[$s]}" = replay ] && tag=$REPLAY_KEY
    require_alive || return 1
    if ! run_wrk "$url" "$DURATION" "${SCN_MODE[$s]}" "$tag" "$TMP/wrk-s$s-$target-r$round-a$attempt.txt"; then
      require_alive
      fail "scenario $s, $label: wrk failed"
      return 1
    fi
    require_alive || return 1
    if awk -v st="$STEAL" -v max="$STEAL_MAX" 'BEGIN { exit !(st > max) }'; then
      if ((attempt < MAX_STEAL_REPEATS && REPEAT_SECONDS + DURATION <= SLACK)); then
        say "  $label: steal $STEAL% > $STEAL_MAX%, repeating"
        REPEAT_SECONDS=$((REPEAT_SECONDS + DURATION))
        continue
      fi
      NOTES+=("scenario $s, $label: CPU steal $STEAL% (kept: repeat limit or time budget reached)")
    fi
    break
  done
  check_run "$s" "$target" "$label"
  local rps p50 p99
  rps=$(field rps "$RESULT"); p50=$(field p50_us "$RESULT"); p99=$(field p99_us "$RESULT")
  printf 'bench:   %-16s %10.0f req/s  p50 %7.2f ms  p99 %7.2f ms  steal %4s%%  non2xx %s\n' \
    "$label" "$rps" "$(awk -v v="$p50" 'BEGIN { print v / 1000 }')" \
    "$(awk -v v="$p99" 'BEGIN { print v / 1000 }')" "$STEAL" "$(field non2xx "$RESULT")"
  RPS[$target]+="$rps "; P50[$target]+="$p50 "; P99[$target]+="$p99 "
}

# Sends the replay key once (executed), then once more (must be a replay).
prime_replay_key() {
  local s=$1 url=$2 h code
  REPLAY_KEY="replay-${NONCE}"
  for h in first second; do
    code=$(curl -s -D "$TMP/prime-$h.headers" -o "$TMP/prime-$h.body" -w '%{http_code}' --max-time 5 \
      -X POST -H 'Content-Type: application/json' -H "Idempotency-Key: \"$REPLAY_KEY\"" \
      --data-binary "@$BODY" "$url")
    if [ "${code:0:1}" != 2 ]; then
      fail "scenario $s: priming the replay key ($h request) answered $code: $(head -c 300 "$TMP/prime-$h.body" | tr -s "\n\r\t" "   ")"
      return 1
    fi
  done
  if idem_checks && ! grep -qi '^Idempotent-Replayed: *true' "$TMP/prime-second.headers"; then
    fail "scenario $s: the second request with the primed key was not a replay (no Idempotent-Replayed: true)"
    return 1
  fi
}

# run_scenario S: returns 0 when the scenario ran, was skipped or failed
# before any load, 1 when it failed under load (the next one may still run),
# 2 when the benchmark should stop (the gateway cannot start).
run_scenario() {
  local s=$1 rc round
  echo
  say "scenario $s: ${SCN_NAME[$s]}"
  SCENARIO_LABEL="scenario $s: "
  if [ "$s" = 5 ] && [ -z "$REDIS_PORT" ]; then
    start_redis || { fail "scenario 5: redis-server did not start"; ROW[$s,status]=failed; return 0; }
  fi
  local backend_lines
  backend_lines=$(line_count "$KEYS_LOG")
  start_gateway "$s"; rc=$?
  if [ "$rc" = 3 ]; then
    say "scenario $s skipped: $GW_LABEL reports that its redis store is not built:"
    cat "$TMP/gw-$s/check.log" "$TMP/gw-$s/stderr.log" 2>/dev/null | grep -i -m3 redis | sed 's/^/  /'
    NOTES+=("scenario $s skipped: idemgate reports the redis store is not built")
    ROW[$s,status]=skipped
    return 0
  elif [ "$rc" != 0 ]; then
    fail "scenario $s: $GW_LABEL could not be started"
    ROW[$s,status]=failed
    return 2
  fi
  local nginx_url="http://127.0.0.1:$PROXY_PORT$PATH_URL" gw_url="http://127.0.0.1:$GW_PORT$PATH_URL"
  REPLAY_KEY=""
  if [ "${SCN_MODE[$s]}" = replay ]; then
    if idem_checks; then
      # The start-up probe went to the counting backend; from here on it must
      # see exactly one request: the priming one.
      if ! wait_lines "$KEYS_LOG" $((backend_lines + 1)); then
        fail "scenario $s: the counting backend never saw $GW_LABEL's start-up probe"
        stop_gateway; ROW[$s,status]=failed; return 0
      fi
      backend_lines=$(line_count "$KEYS_LOG")
    fi
    prime_replay_key "$s" "$gw_url" || { stop_gateway; ROW[$s,status]=failed; return 0; }
  fi
  # Warm-up, not counted (but a broken run is still reported).
  local target url label ok=1
  for target in nginx gw; do
    url=$([ "$target" = gw ] && echo "$gw_url" || echo "$nginx_url")
    label="$([ "$target" = gw ] && echo "$GW_LABEL" || echo nginx) warm-up"
    local tag="k${NONCE}s${s}${target}w"
    [ "${SCN_MODE[$s]}" = replay ] && tag=$REPLAY_KEY
    if ! run_wrk "$url" "$WARMUP" "${SCN_MODE[$s]}" "$tag" "$TMP/wrk-s$s-$target-warmup.txt"; then
      require_alive
      fail "scenario $s, $label: wrk failed"
      ok=0; break
    fi
    require_alive || { ok=0; break; }
    check_run "$s" "$target" "$label"
  done
  declare -A RPS=() P50=() P99=()
  for ((round = 1; ok && round <= ROUNDS; round++)); do
    measured_run "$s" nginx "$nginx_url" "$round" && measured_run "$s" gw "$gw_url" "$round" || ok=0
  done
  stop_gateway
  if [ "$ok" = 0 ]; then
    ROW[$s,status]=failed
    return 1
  fi
  if [ "${SCN_MODE[$s]}" = replay ] && idem_checks; then
    local executed with_key
    executed=$(tail -n +"$((backend_lines + 1))" "$KEYS_LOG" | wc -l)
    with_key=$(tail -n +"$((backend_lines + 1))" "$KEYS_LOG" | grep -c -- "$REPLAY_KEY")
    if [ "$executed" -ne 1 ]; then
      fail "scenario $s: the backend executed $executed requests from the priming on ($with_key carrying the key), expected exactly 1"
    else
      say "  the backend executed the replayed key exactly once"
      [ "$with_key" = 1 ] || NOTES+=("scenario 3: $GW_LABEL did not forward the key to the backend")
    fi
  fi
  for target in nginx gw; do
    [ -n "${RPS[$target]:-}" ] || continue
    local rps p50 p99
    read -ra rps <<<"${RPS[$target]}"; read -ra p50 <<<"${P50[$target]}"; read -ra p99 <<<"${P99[$target]}"
    ROW[$s,$target]="$(stats "${rps[@]}") $(stats "${p50[@]}" | cut -d' ' -f1) $(stats "${p99[@]}" | cut -d' ' -f1) ${#rps[@]}"
  done
  ROW[$s,status]=measured
}

# Seconds the planned runs take (about 3 s of start-up per scenario); what is
# left of the budget may go to steal repeats.
count=$(wc -w <<<"$SCENARIOS")
SLACK=$((BUDGET - count * (2 * WARMUP + 2 * ROUNDS * DURATION + 3) - (SECONDS - START_TIME)))
REPEAT_SECONDS=0

for s in $SCENARIOS; do
  case $s in 1 | 2 | 3 | 4 | 5) ;; *) warn "unknown scenario '$s' (1..5)"; exit 2 ;; esac
  run_scenario "$s"
  case $? in
    0) ;;
    1) require_alive || break ;;  # go on with the next scenario if the baseline is up
    *) break ;;
  esac
done

# ---------------------------------------------------------------- optional extras

if [ "${BENCH_MEMORY:-0}" = 1 ]; then
  echo
  if [ -x "$BUILD_DIR/bench/store_memory_bench" ]; then
    say "store memory benchmark"
    timeout 300 "$BUILD_DIR/bench/store_memory_bench" --dir "$TMP/memory-bench" \
      --records "${BENCH_MEMORY_RECORDS:-1000000}" ||
      NOTES+=("store_memory_bench failed or timed out")
  else
    NOTES+=("BENCH_MEMORY=1 but $BUILD_DIR/bench/store_memory_bench is not built (stores missing?)")
  fi
fi
if [ "${BENCH_MICRO:-0}" = 1 ]; then
  echo
  if [ -x "$BUILD_DIR/bench/micro_bench" ]; then
    say "micro-benchmarks"
    timeout 120 "$BUILD_DIR/bench/micro_bench" --benchmark_min_time=0.2 ||
      NOTES+=("micro_bench failed or timed out")
  else
    NOTES+=("BENCH_MICRO=1 but $BUILD_DIR/bench/micro_bench is not built (src/core pieces missing?)")
  fi
fi

# ---------------------------------------------------------------- the table

report() {
  local s n g ratio p99r rt pt
  printf '\n%s\n' "idemgate vs nginx, $(nproc) CPUs, wrk -t$THREADS -c$CONNECTIONS, ${DURATION}s x $ROUNDS interleaved runs; req/s median (min-max), latency medians"
  printf '%-33s %-9s %-24s %7s %7s  %-22s %s\n' scenario target "req/s" "p50 ms" "p99 ms" "ratio (target)" "p99 ratio (target <=$P99_TARGET)"
  for s in $SCENARIOS; do
    case ${ROW[$s,status]:-not run} in
      measured) ;;
      *) printf '%-33s %s\n' "$s. ${SCN_NAME[$s]}" "${ROW[$s,status]:-not run}"; continue ;;
    esac
    read -ra n <<<"${ROW[$s,nginx]:-0 0 0 0 0 0}"
    read -ra g <<<"${ROW[$s,gw]:-0 0 0 0 0 0}"
    ratio=$(awk -v a="${g[0]}" -v b="${n[0]}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    p99r=$(awk -v a="${g[4]}" -v b="${n[4]}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    rt=$(awk -v r="$ratio" -v t="${SCN_TARGET[$s]}" 'BEGIN { print ((r >= t) ? "met" : "missed") }')
    pt=$(awk -v r="$p99r" -v t="$P99_TARGET" 'BEGIN { print ((r <= t) ? "met" : "missed") }')
    printf '%-33s %-9s %-24s %7.2f %7.2f\n' "$s. ${SCN_NAME[$s]}" nginx \
      "$(printf '%.0f (%.0f-%.0f)' "${n[0]}" "${n[1]}" "${n[2]}")" \
      "$(awk -v v="${n[3]}" 'BEGIN { print v / 1000 }')" "$(awk -v v="${n[4]}" 'BEGIN { print v / 1000 }')"
    printf '%-33s %-9s %-24s %7.2f %7.2f  %-22s %s\n' "" "$GW_LABEL" \
      "$(printf '%.0f (%.0f-%.0f)' "${g[0]}" "${g[1]}" "${g[2]}")" \
      "$(awk -v v="${g[3]}" 'BEGIN { print v / 1000 }')" "$(awk -v v="${g[4]}" 'BEGIN { print v / 1000 }')" \
      "$ratio (>=${SCN_TARGET[$s]} $rt)" "$p99r ($pt)"
  done
  local note
  for note in "${NOTES[@]}"; do printf 'note: %s\n' "$note"; done
  if [ "${#FAILURES[@]}" -eq 0 ]; then
    printf 'correctness: all checks passed\n'
  else
    printf 'correctness: %d check(s) FAILED\n' "${#FAILURES[@]}"
    for note in "${FAILURES[@]}"; do printf '  - %s\n' "$note"; done
  fi
  printf 'elapsed: %ds\n' "$((SECONDS - START_TIME))"
}

report | tee "$TMP/report.txt"
mkdir -p "$(dirname "$RESULTS")" 2>/dev/null && cp "$TMP/report.txt" "$RESULTS" 2>/dev/null &&
  say "table saved to $RESULTS"
[ "${#FAILURES[@]}" -eq 0 ]
