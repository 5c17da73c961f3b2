#!/usr/bin/env bash
# Real clients against real processes: the browser example and the published clients:
#   1. the browser telemetry example (examples/browser-telemetry) in headless Chromium
#   2. the official TypeScript client @durable-streams/client
#   3. the Python client durable-streams (PyPI)
#   4. an OpenTelemetry OTLP/HTTP JSON trace exporter + an indexer match=overlap query
#   5. log shippers: the OpenTelemetry JS and Python OTLP JSON exporters, compressed, into
#      daily streams their bucket creates on first append; syslog-ng's http() destination
#      posting NDJSON batches; Vector's and Fluent Bit's HTTP framings sent as they send them
#
# It builds nothing: it uses $CARGO_TARGET_DIR/release/{ursula,ursula-indexer}
# (CARGO_TARGET_DIR defaults to $HOME/.cache/ursula-target). It installs what it needs:
# Debian's chromium, syslog-ng-core and syslog-ng-mod-http (apt-get, as root or through
# sudo) when missing, the npm packages of tests/clients/package-lock.json (npm ci), and the
# pinned Python clients in a venv under $URSULA_CLIENT_CACHE (default
# $HOME/.cache/ursula-clients).
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
# Debian packages: chromium for the browser test, syslog-ng with its http() module.
SYSLOG_NG=/usr/sbin/syslog-ng
APT=()
[[ -x "$CHROMIUM" ]] || APT+=(chromium)
if [[ ! -x "$SYSLOG_NG" ]] || ! dpkg -s syslog-ng-mod-http >/dev/null 2>&1; then
    APT+=(syslog-ng-core syslog-ng-mod-http)
fi
if [[ ${#APT[@]} -gt 0 ]]; then
    "$ROOT/scripts/apt-install" "${APT[@]}" || die "could not install ${APT[*]}"
    [[ -x "$CHROMIUM" ]] || die "apt-get install chromium did not provide $CHROMIUM"
    [[ -x "$SYSLOG_NG" ]] || die "apt-get install syslog-ng-core did not provide $SYSLOG_NG"
fi
echo "$("$CHROMIUM" --version 2>/dev/null || echo "chromium at $CHROMIUM")"
"$SYSLOG_NG" --version | head -n1

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

# ---------------------------------------------------------------------------------------
step "OpenTelemetry JS exporters (gzip) into daily streams created on first append"
(cd "$CLIENTS" && timeout 60 node otel-daily.test.mjs) || die "OpenTelemetry daily-stream test failed"
step_ok "OpenTelemetry JS daily streams"

step "Python OTLP JSON exporters (gzip, deflate) into daily streams created on first append"
(cd "$CLIENTS" && timeout 60 "$VENV/bin/python" otel_json_test.py) || die "Python OTLP JSON exporter test failed"
step_ok "Python OTLP JSON exporters"

step "syslog-ng http() destination posting NDJSON batches"
curl -sf -X PUT "$URSULA_URL/syslog" -H 'content-type: application/json' \
    -d '{"auto_create":{"content_type":"application/json"}}' >/dev/null || die "PUT /syslog"
SYSLOG_LINES=600
# Lines its JSON template must escape: quotes, a backslash, a tab, non-ASCII.
for i in $(seq 0 $((SYSLOG_LINES - 1))); do
    printf 'event %04d user="ana\\%d"\tpath=/cart/%d caf\xc3\xa9\n' "$i" "$((i % 7))" "$i"
done >"$TMP/syslog-in.log"
APPENDS_BEFORE="$(curl -sf "$URSULA_URL/__ursula/metrics" |
    awk '/^ursula_http_requests_total\{/ && /route="stream"/ && /method="POST"/ { n += $NF } END { print n + 0 }')"
cat >"$TMP/syslog-ng.conf" <<CONF
@version: 3.38
options { stats-freq(0); };
source s_file { file("$TMP/syslog-in.log" follow-freq(0.1) flags(no-parse)); };
destination d_ursula {
    http(
        url("$URSULA_URL/syslog/app")
        method("POST")
        headers("Content-Type: application/x-ndjson")
        body("\$(format-json --scope none message=\$MSG program=shipper)")
        delimiter("\n")
        batch-lines(100)
        batch-timeout(200)
        workers(1)
    );
};
log { source(s_file); destination(d_ursula); };
CONF
"$SYSLOG_NG" -F --no-caps -f "$TMP/syslog-ng.conf" -R "$TMP/syslog-ng.persist" -p "$TMP/syslog-ng.pid" \
    -c "$TMP/syslog-ng.ctl" >"$TMP/syslog-ng.out" 2>"$TMP/syslog-ng.err" &
SYSLOG_PID=$!
PIDS+=("$SYSLOG_PID")
(cd "$CLIENTS" && STREAM_URL="$URSULA_URL/syslog/app" INPUT_FILE="$TMP/syslog-in.log" LINES="$SYSLOG_LINES" \
    APPENDS_BEFORE="$APPENDS_BEFORE" timeout 60 node syslog-ng.test.mjs) || die "syslog-ng test failed"
kill -TERM "$SYSLOG_PID"
wait "$SYSLOG_PID" || die "syslog-ng did not stop cleanly: $(tail -n 5 "$TMP/syslog-ng.err")"
unset 'PIDS[-1]'
step_ok "syslog-ng"

step "Vector's and Fluent Bit's HTTP framings"
"$ROOT/tests/clients/shipper-framings.sh" "$URSULA_URL" || die "shipper framing test failed"
step_ok "shipper framings"

# The services must still be alive after all of that, and stop cleanly.
for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "a service (pid $pid) died during the tests"
done
printf '\nCLIENT TESTS PASSED (artifacts in %s)\n' "$ARTIFACTS"
