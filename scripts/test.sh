#!/usr/bin/env bash
# The whole Ursula test suite, from a fresh clone:
#   0. scripts/check-layers: the server's modules use only modules below them (<1 s)
#   1. cargo build --release --workspace
#   2. cargo test --workspace --release        (unit + integration tests; installs Debian's
#      haproxy for the lane-routing test when it is missing)
#   3. scripts/check-deploy: the Helm chart, container image definition, alert rules and
#      dashboard linted and validated offline, then the release ursula and ursula-indexer
#      run on the chart's rendered configs and must export every metric the dashboard
#      and rules use (installs its tools in $HOME/.cache/ursula-tools when missing)
#   4. npm ci in conformance/                   (only when needed)
#   5. start `ursula server` (disk engine, temp data dir, port 0) and run the official
#      Durable Streams conformance suite against it: once with a log per lane (8 lanes on
#      2 cores), then with the default log per core
#   6. SIGTERM the server; it must exit 0 within 10 s; then scripts/cluster-conformance:
#      the suite through HAProxy in front of three `--cluster` hosts sharing ursula-test-s3,
#      and scripts/cluster-test: URSULA_CLUSTER_CYCLES (default 3) kill / stop / cut cycles
#      on hosts in network namespaces with verifying producers (needs root for ip netns),
#      then 3 kill cycles with URSULA_FAULT_ACK_BEFORE_S3=1, which must fail
#      then scripts/client-tests.sh: the browser telemetry example in headless
#      Chromium, the official TypeScript and Python clients, OTLP/JSON exporters, and
#      log shippers (syslog-ng's http(), Vector's and Fluent Bit's framings)
#   7. crash test: kill -9 / restart cycles (URSULA_CRASH_CYCLES, default 20), then the
#      long-mode crash test: many streams, every write kind, deletes/recreates
#      (URSULA_CRASH_LONG_CYCLES, default 20), then the power-loss test: crash points
#      on a disk that forgets unsynced writes (URSULA_POWER_LOSS_POINTS, default 150)
#   8. short soak: scripts/soak.sh for URSULA_SOAK_SECONDS (default 70; 0 skips): write +
#      fanout + read at once; fails on RSS growth, fd growth, loadgen errors, missed
#      deliveries or write/fanout p99 drift
#   9. fuzz: every cargo-fuzz target for URSULA_FUZZ_SECONDS each (default 20; 0 skips)
#
# Env: CARGO_TARGET_DIR (default $HOME/.cache/ursula-target), URSULA_CRASH_CYCLES,
#      URSULA_CRASH_LONG_CYCLES, URSULA_POWER_LOSS_POINTS, URSULA_SOAK_SECONDS,
#      URSULA_FUZZ_SECONDS, URSULA_CLUSTER_CYCLES.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ursula-target}"
URSULA_CRASH_CYCLES="${URSULA_CRASH_CYCLES:-20}"
URSULA_CRASH_LONG_CYCLES="${URSULA_CRASH_LONG_CYCLES:-20}"
URSULA_POWER_LOSS_POINTS="${URSULA_POWER_LOSS_POINTS:-150}"
URSULA_SOAK_SECONDS="${URSULA_SOAK_SECONDS:-70}"
URSULA_FUZZ_SECONDS="${URSULA_FUZZ_SECONDS:-20}"
URSULA_CLUSTER_CYCLES="${URSULA_CLUSTER_CYCLES:-3}"
URSULA_BIN="$CARGO_TARGET_DIR/release/ursula"

TMP_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/ursula-test.XXXXXX")"
SERVER_PID=""

cleanup() {
    local rc=$?
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP_ROOT"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

STAGE_START=0
banner() {
    STAGE_START=$SECONDS
    printf '\n==================== %s ====================\n' "$*"
}
stage_done() {
    printf -- '---- ok: %s (%ds)\n' "$1" "$((SECONDS - STAGE_START))"
}
die() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}

# ---------------------------------------------------------------------------
banner "0/9 server module layering (scripts/check-layers)"
command -v python3 >/dev/null 2>&1 || die "python3 is not installed: scripts/check-layers needs it"
"$ROOT/scripts/check-layers" || die "a server module uses one declared after it (see above)"
stage_done "layers"

# ---------------------------------------------------------------------------
banner "1/9 cargo build --release --workspace"
cargo build --release --workspace
[[ -x "$URSULA_BIN" ]] || die "server binary not found at $URSULA_BIN"
stage_done "build"

# ---------------------------------------------------------------------------
banner "2/9 cargo test --workspace --release"
# server/tests/haproxy.rs routes through Debian's HAProxy.
if [[ -z "${HAPROXY:-}" ]] && ! command -v haproxy >/dev/null 2>&1 && [[ ! -x /usr/sbin/haproxy ]]; then
    "$ROOT/scripts/apt-install" haproxy || die "could not install haproxy"
    [[ -x /usr/sbin/haproxy ]] || die "apt-get install haproxy did not provide /usr/sbin/haproxy"
fi
cargo test --workspace --release
stage_done "cargo test"

# ---------------------------------------------------------------------------
banner "3/9 deployment checks (scripts/check-deploy)"
# About 15 s with its tools cached, under a minute when it installs them.
"$ROOT/scripts/check-deploy" "$URSULA_BIN" || die "deployment checks failed (see above)"
stage_done "deploy checks"

# ---------------------------------------------------------------------------
banner "4/9 conformance harness dependencies (npm ci)"
command -v node >/dev/null 2>&1 || die "node is not installed: the conformance suite needs Node.js >= 18 and npm (e.g. apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm is not installed: the conformance suite needs Node.js >= 18 and npm"
echo "node $(node --version), npm $(npm --version)"
CONF="$ROOT/conformance"
LOCK_HASH="$(sha256sum "$CONF/package-lock.json" | cut -d' ' -f1)"
STAMP="$CONF/node_modules/.ursula-lock-sha256"
if [[ -d "$CONF/node_modules" && -f "$STAMP" && "$(cat "$STAMP")" == "$LOCK_HASH" ]]; then
    echo "node_modules up to date with package-lock.json; skipping npm ci"
else
    (cd "$CONF" && npm ci --no-audit --no-fund)
    echo "$LOCK_HASH" >"$STAMP"
fi
stage_done "npm ci"

# ---------------------------------------------------------------------------
banner "5/9 conformance suite against ursula (disk engine; a log per lane, then per core)"
SERVER_OUT="$TMP_ROOT/server.stdout"
SERVER_ERR="$TMP_ROOT/server.stderr"

# Start `ursula server` on a new data dir with extra flags; sets SERVER_PID and URL.
start_server() {
    local data_dir
    data_dir="$(mktemp -d "$TMP_ROOT/data.XXXXXX")"
    "$URSULA_BIN" server --listen 127.0.0.1:0 --data-dir "$data_dir" --storage disk \
        --long-poll-timeout-ms 500 "$@" >"$SERVER_OUT" 2>"$SERVER_ERR" &
    SERVER_PID=$!
    URL=""
    for _ in $(seq 1 600); do # up to 60 s for recovery + bind
        line="$(head -n 1 "$SERVER_OUT" 2>/dev/null || true)"
        if [[ "$line" =~ ^ursula\ listening\ on\ (http://[^[:space:]]+)$ ]]; then
            URL="${BASH_REMATCH[1]%/}"
            break
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "--- server stderr ---" >&2
            tail -n 50 "$SERVER_ERR" >&2 || true
            die "ursula server exited before printing its listening line"
        fi
        sleep 0.1
    done
    if [[ -z "$URL" ]]; then
        tail -n 50 "$SERVER_ERR" >&2 || true
        die "ursula server did not print 'ursula listening on http://…' within 60 s (first line: '${line:-}')"
    fi
    echo "server pid $SERVER_PID at $URL ($*)"
}

run_conformance() {
    local rc=0
    # A healthy run takes about a minute; bound it so a wedged server cannot hang CI.
    (cd "$CONF" && CONFORMANCE_TEST_URL="$URL" timeout 900 npx --no-install vitest run) || rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "--- last server stderr lines ---" >&2
        tail -n 30 "$SERVER_ERR" >&2 || true
        die "conformance suite failed (vitest exit $rc)"
    fi
}

# A log per lane: 8 lanes on 2 cores, so each core runs 4 logs.
start_server --cores 2 --logs lane --lanes 8
run_conformance
kill -TERM "$SERVER_PID"
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=""
[[ $server_rc -eq 0 ]] || { tail -n 30 "$SERVER_ERR" >&2 || true; die "ursula server (a log per lane) exited with status $server_rc after SIGTERM"; }

start_server
run_conformance
stage_done "conformance"

# ---------------------------------------------------------------------------
banner "6/9 graceful shutdown (SIGTERM, exit 0 within 10 s)"
kill -TERM "$SERVER_PID"
exited=""
for _ in $(seq 1 100); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        exited=1
        break
    fi
    sleep 0.1
done
if [[ -z "$exited" ]]; then
    die "ursula server still running 10 s after SIGTERM"
fi
server_rc=0
wait "$SERVER_PID" || server_rc=$?
SERVER_PID=""
[[ $server_rc -eq 0 ]] || { tail -n 30 "$SERVER_ERR" >&2 || true; die "ursula server exited with status $server_rc after SIGTERM"; }
echo "server exited 0"
stage_done "shutdown"

echo "--- conformance through HAProxy in front of three cluster hosts (scripts/cluster-conformance)"
BIN_DIR="$CARGO_TARGET_DIR/release" OUT="$TMP_ROOT/cluster-conformance" \
    "$ROOT/scripts/cluster-conformance" ||
    { tail -n 30 "$TMP_ROOT"/cluster-conformance/host*.log >&2 || true; die "conformance through a cluster failed"; }
stage_done "cluster conformance"

echo "--- fault cycles on three cluster hosts in network namespaces (scripts/cluster-test)"
OUT="$TMP_ROOT/cluster-test" "$ROOT/scripts/cluster-test" "$URSULA_CLUSTER_CYCLES" ||
    die "scripts/cluster-test: acknowledged data lost or the cluster did not recover (logs above)"
# The checker must see a loss: with hosts that acknowledge before their WAL objects are in
# S3, killing them loses acknowledged appends.
URSULA_FAULT_ACK_BEFORE_S3=1 FAULTS=kill OUT="$TMP_ROOT/cluster-test-unsafe" \
    "$ROOT/scripts/cluster-test" 3 >"$TMP_ROOT/cluster-test-unsafe.log" 2>&1 || true
if ! tail -n 1 "$TMP_ROOT/cluster-test-unsafe.log" | grep -Eq ' [1-9][0-9]* acknowledged bytes lost'; then
    tail -n 5 "$TMP_ROOT/cluster-test-unsafe.log" >&2
    die "scripts/cluster-test saw no loss with URSULA_FAULT_ACK_BEFORE_S3=1: its checker cannot see one"
fi
tail -n 1 "$TMP_ROOT/cluster-test-unsafe.log"
stage_done "cluster fault cycles"

# ---------------------------------------------------------------------------
banner "client tests: the browser example in headless Chromium, TS/Python clients, OTel, shippers"
# Needs the release ursula and ursula-indexer from stage 1; installs Debian chromium and
# syslog-ng, npm ci (tests/clients) and a pinned Python venv when missing.
"$ROOT/scripts/client-tests.sh"
stage_done "client tests"

# ---------------------------------------------------------------------------
banner "7/9 crash test: $URSULA_CRASH_CYCLES kill -9 / restart cycles"
URSULA_CRASH_CYCLES="$URSULA_CRASH_CYCLES" \
    cargo test --release -p ursula-server --test crash -- --nocapture
# About 2-3 s per cycle: ~1 min at the default 20.
URSULA_CRASH_LONG_CYCLES="$URSULA_CRASH_LONG_CYCLES" \
    cargo test --release -p ursula-server --test crash_long -- --nocapture
# Power cuts (a FUSE disk that forgets unsynced writes): about 0.5-1 s per crash point,
# 2-3 min at the default 150; bounded at 15 min.
timeout --kill-after=10 900 "$ROOT/scripts/power-loss" "$URSULA_POWER_LOSS_POINTS" ||
    die "power-loss test failed"
stage_done "crash test"

# ---------------------------------------------------------------------------
banner "8/9 soak: write + fanout + read for ${URSULA_SOAK_SECONDS}s"
if [[ "$URSULA_SOAK_SECONDS" -gt 0 ]]; then
    # soak.sh runs its own server; the bound covers setup, the 30 s fd settle and a margin.
    timeout --kill-after=10 $((URSULA_SOAK_SECONDS + 120)) \
        "$ROOT/scripts/soak.sh" --seconds "$URSULA_SOAK_SECONDS" || die "soak failed"
else
    echo "skipped (URSULA_SOAK_SECONDS=0)"
fi
stage_done "soak"

# ---------------------------------------------------------------------------
banner "9/9 fuzz: each target for ${URSULA_FUZZ_SECONDS}s"
if [[ "$URSULA_FUZZ_SECONDS" -gt 0 ]]; then
    # fuzz.sh builds in its own target dir: fuzz builds use sanitizer flags.
    "$ROOT/scripts/fuzz.sh" "$URSULA_FUZZ_SECONDS"
else
    echo "skipped (URSULA_FUZZ_SECONDS=0)"
fi
stage_done "fuzz"

printf '\nALL STAGES PASSED\n'
