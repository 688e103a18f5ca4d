#!/usr/bin/env bash
# Starts the demo backend and idemgate with examples/quickstart.yaml, prints a
# few curl commands to try, and runs until Ctrl-C, then stops both.
# Called by `make run` after the release build; BUILD_DIR overrides where the
# binaries are looked for (default build/release).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD_DIR="${BUILD_DIR:-$ROOT/build/release}"
CONFIG="$ROOT/examples/quickstart.yaml"
# The addresses in examples/quickstart.yaml.
GATEWAY_PORT=8080
ADMIN_PORT=9090
BACKEND_PORT=9001

die() {
  echo "run-quickstart: $*" >&2
  exit 1
}

find_binary() {
  local name="$1" default="$2"
  if [ -x "$default" ]; then
    echo "$default"
    return
  fi
  find "$BUILD_DIR" -type f -name "$name" -perm -u+x 2>/dev/null | head -n 1 || true
}

IDEMGATE="${IDEMGATE_BIN:-$(find_binary idemgate "$BUILD_DIR/src/cli/idemgate")}"
DEMO="${DEMO_BACKEND_BIN:-$(find_binary demo_backend "$BUILD_DIR/examples/demo_backend")}"
IDEMCTL="${IDEMCTL_BIN:-$(find_binary idemctl "$BUILD_DIR/src/cli/idemctl")}"
if [ -z "$IDEMGATE" ] || [ ! -x "$IDEMGATE" ]; then
  die "no idemgate binary under $BUILD_DIR; run 'make build' first"
fi
if [ -z "$DEMO" ] || [ ! -x "$DEMO" ]; then
  die "no demo_backend binary under $BUILD_DIR; run 'make build' first"
fi
command -v curl >/dev/null || die "curl is needed (scripts/install-deps.sh installs it)"

port_in_use() {
  # Something accepting connections on 127.0.0.1:$1.
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
for entry in "$GATEWAY_PORT:idemgate" "$ADMIN_PORT:idemgate admin" "$BACKEND_PORT:demo backend"; do
  port="${entry%%:*}"
  if port_in_use "$port"; then
    die "port $port (${entry#*:}) is already taken on 127.0.0.1; stop whatever listens there (ss -ltnp 'sport = :$port') or change examples/quickstart.yaml"
  fi
done

"$IDEMGATE" check-config "$CONFIG" >/dev/null || die "$CONFIG does not validate (see above)"

RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/idemgate-quickstart.XXXXXX")"
LOG="$RUN_DIR/idemgate.log"
DEMO_PID=""
GATEWAY_PID=""

# shellcheck disable=SC2317  # called from the traps
stop_all() {
  trap - INT TERM EXIT
  local pid
  for pid in $GATEWAY_PID $DEMO_PID; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $GATEWAY_PID $DEMO_PID; do
    for _ in $(seq 1 150); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo
  echo "run-quickstart: stopped (idemgate log kept in $LOG)"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# The backend prints each payment it executes: a replay never shows up there.
"$DEMO" --port "$BACKEND_PORT" &
DEMO_PID=$!

# Relative store paths in the config resolve against the repository root.
"$IDEMGATE" --config "$CONFIG" --ready-file "$RUN_DIR/ready" >"$LOG" 2>&1 &
GATEWAY_PID=$!

wait_until() {
  local what="$1" pid="$2" check="$3"
  for _ in $(seq 1 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
      [ "$what" = idemgate ] && tail -n 20 "$LOG" >&2
      die "$what exited during start-up"
    fi
    if eval "$check"; then return 0; fi
    sleep 0.1
  done
  die "$what did not become ready within 15s"
}
wait_until "demo backend" "$DEMO_PID" "curl -fs -o /dev/null http://127.0.0.1:$BACKEND_PORT/healthz"
wait_until idemgate "$GATEWAY_PID" "[ -s '$RUN_DIR/ready' ]"
wait_until idemgate "$GATEWAY_PID" "curl -s -o /dev/null http://127.0.0.1:$GATEWAY_PORT/healthz"

# A fresh key per run: the embedded store remembers keys across restarts.
KEY="order-$(date +%s)-$RANDOM"
URL="http://127.0.0.1:$GATEWAY_PORT/api/v1/payments"
cat <<EOF

idemgate is listening on 127.0.0.1:$GATEWAY_PORT (admin on 127.0.0.1:$ADMIN_PORT),
in front of the demo backend on 127.0.0.1:$BACKEND_PORT.
idemgate's JSON log: tail -f $LOG

Try, from another terminal:

  # 1. A payment with a key: 201, "execution": 1
  curl -si -X POST $URL -H 'Idempotency-Key: "$KEY"' -H 'Content-Type: application/json' -d '{"amount": 1000, "currency": "EUR"}'

  # 2. The same request again: the stored response is replayed (same "execution",
  #    Idempotent-Replayed: true) and the backend does not run it again
  curl -si -X POST $URL -H 'Idempotency-Key: "$KEY"' -H 'Content-Type: application/json' -d '{"amount": 1000, "currency": "EUR"}'

  # 3. The same key with a different body: 422 key-reused
  curl -si -X POST $URL -H 'Idempotency-Key: "$KEY"' -H 'Content-Type: application/json' -d '{"amount": 9999, "currency": "EUR"}'

  # 4. No key on a route that requires one: 400 missing-key
  curl -si -X POST $URL -H 'Content-Type: application/json' -d '{"amount": 1000, "currency": "EUR"}'

  # 5. Recovery: fetch the stored outcome of that key without repeating the write
  curl -si $URL/by-idempotency-key/$KEY

  # 6. What the gateway counted: hits, misses, conflicts per route
  curl -s http://127.0.0.1:$ADMIN_PORT/admin/stats

  # 7. The client: retries under one key, parks what still fails (docs/client.md)
  $IDEMCTL send -i -k "$KEY-cli" -H 'Content-Type: application/json' -d '{"amount": 5, "currency": "EUR"}' $URL
  $IDEMCTL dlq list

Press Ctrl-C to stop both.

EOF

# Runs until Ctrl-C (the traps stop both) or until one of them exits.
set +e
wait -n "$DEMO_PID" "$GATEWAY_PID"
status=$?
set -e
if kill -0 "$GATEWAY_PID" 2>/dev/null; then
  echo "run-quickstart: the demo backend exited ($status)" >&2
else
  echo "run-quickstart: idemgate exited ($status); last log lines:" >&2
  tail -n 20 "$LOG" >&2
fi
exit 1
