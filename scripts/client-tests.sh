#!/usr/bin/env bash
# Real clients against real processes: the browser example and the published clients:
#   1. the browser telemetry example (examples/browser-telemetry) in headless Chromium
#   2. the official TypeScript client @durable-streams/client
#   3. the Python client durable-streams (PyPI)
#   4. an OpenTelemetry OTLP/HTTP JSON trace exporter + an indexer match=overlap query
#
# It builds nothing: it uses $CARGO_TARGET_DIR/release/{ursula,ursula-indexer}
# (CARGO_TARGET_DIR defaults to $HOME/.cache/ursula-target). It installs what it needs:
# Debian's chromium (apt-get, as root or through sudo) when /usr/bin/chromium is missing,
# the npm packages of tests/clients/package-lock.json (npm ci), and the pinned Python
# client in a venv under $URSULA_CLIENT_CACHE (default $HOME/.cache/ursula-clients).
# Everything listens on 127.0.0.1 ports chosen by the kernel; all processes it starts are
# stopped on exit. The screenshot is kept in $URSULA_ARTIFACT_DIR (default
# $CARGO_TARGET_DIR/client-test-artifacts).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ursula-target}"
URSULA_BIN="$CARGO_TARGET_DIR/release/ursula"
INDEXER_BIN="$CARGO_TARGET_DIR/release/ursula-indexer"
CACHE="${URSULA_CLIENT_CACHE:-$HOME/.cache/ursula-clients}"
ARTIFACTS="${URSULA_ARTIFACT_DIR:-$CARGO_TARGET_DIR/client-test-artifacts}"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
CLIENTS="$ROOT/tests/clients"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/ursula-clients.XXXXXX")"
PIDS=()
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        for log in "$TMP"/*.err; do
            [[ -s "$log" ]] || continue
            echo "--- last lines of $(basename "$log") ---" >&2
            tail -n 20 "$log" >&2 || true
        done
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}
step_start=0
step() {
    step_start=$SECONDS
    printf '\n---- %s\n' "$*"
}
step_ok() {
    printf -- '---- ok: %s (%ds)\n' "$1" "$((SECONDS - step_start))"
}

[[ -x "$URSULA_BIN" ]] || die "$URSULA_BIN not found: run cargo build --release -p ursula-server first"
[[ -x "$INDEXER_BIN" ]] || die "$INDEXER_BIN not found: run cargo build --release -p ursula-indexer first"
command -v node >/dev/null || die "node is not installed (Node.js >= 18 with npm)"
command -v python3 >/dev/null || die "python3 is not installed"

# ---------------------------------------------------------------------------------------
step "dependencies"
if [[ ! -x "$CHROMIUM" ]]; then
    echo "installing Debian chromium"
    if [[ $(id -u) -eq 0 ]]; then
        SUDO=()
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        die "$CHROMIUM is missing and this user can neither run apt-get as root nor sudo without a password"
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    [[ -x "$CHROMIUM" ]] || die "apt-get install chromium did not provide $CHROMIUM"
fi
echo "$("$CHROMIUM" --version 2>/dev/null || echo "chromium at $CHROMIUM")"

LOCK_HASH="$(sha256sum "$CLIENTS/package-lock.json" | cut -d' ' -f1)"
STAMP="$CLIENTS/node_modules/.ursula-lock-sha256"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$LOCK_HASH" ]]; then
    echo "tests/clients/node_modules up to date"
else
    (cd "$CLIENTS" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$LOCK_HASH" >"$STAMP"
fi

VENV="$CACHE/venv"
REQ_HASH="$(sha256sum "$CLIENTS/requirements.txt" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$VENV/.ursula-req-sha256" && "$(cat "$VENV/.ursula-req-sha256")" == "$REQ_HASH" ]]; then
    echo "python venv up to date ($VENV)"
else
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$CLIENTS/requirements.txt"
    echo "$REQ_HASH" >"$VENV/.ursula-req-sha256"
fi
step_ok "dependencies"

# ---------------------------------------------------------------------------------------
# start NAME PATTERN CMD...: runs CMD in the background and waits for PATTERN (a line on
# its stdout that ends in the URL it serves) ; sets $URL.
start() {
    local name="$1" pattern="$2"
    shift 2
    "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    local pid=$!
    PIDS+=("$pid")
    URL=""
    for _ in $(seq 1 300); do
        local line
        line="$(grep -m1 -E "$pattern" "$TMP/$name.out" 2>/dev/null || true)"
        if [[ -n "$line" ]]; then
            URL="${line##* }"
            URL="${URL%/}"
            echo "$name (pid $pid) at $URL"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || die "$name exited before it was listening"
        sleep 0.1
    done
    die "$name did not start listening within 30 s"
}

step "start ursula, ursula-indexer and the example gateway"
mkdir -p "$TMP/data" "$TMP/index" "$ARTIFACTS"
# SSE connections end after 1.5 s, so the browser's live tail has to resume from its last
# control offset during the test (MIN_SSE_CONNECTIONS below).
printf 'sse_max_connection_ms = 1500\n' >"$TMP/ursula.toml"
start ursula '^ursula listening on http://' \
    "$URSULA_BIN" server --config "$TMP/ursula.toml" --listen 127.0.0.1:0 --data-dir "$TMP/data" \
    --storage disk --long-poll-timeout-ms 1000
URSULA_URL="$URL"
start indexer '^ursula-indexer listening on http://' \
    "$INDEXER_BIN" --listen 127.0.0.1:0 --store-dir "$TMP/index" --commit-interval-ms 500 --poll-interval-ms 50
INDEXER_URL="$URL"
start gateway '^gateway listening on http://' \
    node "$ROOT/examples/browser-telemetry/gateway.mjs" --listen 127.0.0.1:0 --ursula "$URSULA_URL" --indexer "$INDEXER_URL"
GATEWAY_URL="$URL"
export URSULA_URL INDEXER_URL GATEWAY_URL CHROMIUM
step_ok "services"

# ---------------------------------------------------------------------------------------
step "browser telemetry example in headless Chromium"
(cd "$CLIENTS" && ARTIFACT_DIR="$ARTIFACTS" MIN_SSE_CONNECTIONS=2 timeout 180 node browser-telemetry.test.mjs) ||
    die "browser telemetry test failed"
step_ok "browser"

step "@durable-streams/client (TypeScript)"
(cd "$CLIENTS" && timeout 120 node ts-client.test.mjs) || die "TypeScript client test failed"
step_ok "TypeScript client"

step "durable-streams (Python)"
(cd "$CLIENTS" && timeout 120 "$VENV/bin/python" python_client_test.py) || die "Python client test failed"
step_ok "Python client"

step "OpenTelemetry OTLP/JSON exporter + indexer match=overlap"
(cd "$CLIENTS" && timeout 120 node otel.test.mjs) || die "OpenTelemetry test failed"
step_ok "OpenTelemetry"

# The services must still be alive after all of that, and stop cleanly.
for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "a service (pid $pid) died during the tests"
done
printf '\nCLIENT TESTS PASSED (artifacts in %s)\n' "$ARTIFACTS"
