#!/usr/bin/env bash
# Ursula against its peers and ceilings, side by side, in one run on this machine
# (method and current results: docs/benchmarks.md).
#
#   scripts/bench-compare.sh [--quick] [--out DIR] [--only SCENARIOS] [--report-only]
#
# Starts, one at a time on 127.0.0.1, and drives with ursula-loadgen on the compat surface:
#   ursula        our release server, disk engine, fsync'd acks (temp data dir), all cores
#   ursula-1core  the same with --cores 1 (what a second core adds, or costs)
#   ds-0.1.5      durable-streams 0.1.5 from crates.io, default `wal` durability
#   ref-0.3.7     @durable-streams/server 0.3.7 from npm, file-backed store
#   hello         a minimal monoio HTTP server that stores nothing (small-request ceiling)
#   hello-1core   the same on one core (what a second core gives a server with no work)
#   hello-streams a minimal in-memory streams server (the read, replay and fanout ceiling)
# and measures, in the same run, raw loopback TCP throughput and `dd oflag=direct` disk
# bandwidth. Peers are installed (pinned) into $PEERS_DIR on first use.
#
# Scenarios: write-100, write-500, write-2000 (256 B appends, one writer per stream),
# gateway-100 (256 B appends over a pool of 100 connections, each writing all 100 streams in
# turn, as a gateway or collector does), gateway-100-paced (the same at a fixed offered load,
# PACED_RATE appends/s, default 30000, below every server's capacity here: CPU per append at
# one load, where saturation would let the faster server batch more), batch
# (JSON arrays of 512 x 2 KiB events, 1 MiB per request, MB/s against the disk), batch-small
# (arrays of 100 x 200 B events, events/s), read, replay (1000 clients x 200 x 1 KiB),
# fanout (1000 SSE subscribers, 50 events/s), gateway-batch-small (batch-small's requests over
# a pool of 16 connections sharing 100 streams).
# --quick shortens every window and shrinks replay/fanout, for a smoke run.
#
# Output: a table of raw numbers and ratios (ursula / each peer) on stdout and in
# DIR/summary.md, every loadgen JSON report, and latency charts (DIR/*.svg). Beside
# throughput and latency it reports each server's CPU time per operation (user + system,
# all threads, from /proc/PID/stat over the measured window).
# A run first removes DIR's reports of the scenarios it runs, so its summary never mixes in
# a server that an earlier run into the same DIR measured and this one did not.
# --report-only rebuilds the charts and the summary from the reports already in DIR.
#
# Env: CARGO_TARGET_DIR, PEERS_DIR (default ~/.cache/ursula-peers), DURATION, WARMUP,
#      SERVERS (default "ursula ursula-1core ds-0.1.5 ref-0.3.7 hello hello-streams";
#      hello-1core runs only when named), SERVER_CPUS and CLIENT_CPUS (CPU lists such as
#      "0,1" and "2,3": every server runs inside the first under `taskset`, the load
#      generator pins to the second, so on a host with CPUs to spare neither takes the
#      other's; unset, both share every CPU), PACED_RATE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ursula-target}"
PEERS_DIR="${PEERS_DIR:-$HOME/.cache/ursula-peers}"
BIN="$CARGO_TARGET_DIR/release"

QUICK=""
REPORT_ONLY=""
OUT=""
ONLY=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --report-only) REPORT_ONLY=1 ;;
    --out) OUT="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    -h | --help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

if [[ -n "$QUICK" ]]; then
    DURATION="${DURATION:-2s}" WARMUP="${WARMUP:-1s}"
    REPLAY_CLIENTS=50 FANOUT_SUBS=100 READ_PREFILL=8m DD_MIB=128 NET_SECS=1
else
    DURATION="${DURATION:-10s}" WARMUP="${WARMUP:-2s}"
    REPLAY_CLIENTS=1000 FANOUT_SUBS=1000 READ_PREFILL=64m DD_MIB=1024 NET_SECS=5
fi
PACED_RATE="${PACED_RATE:-30000}"
SCENARIOS="${ONLY:-write-100 gateway-100 gateway-100-paced write-500 write-2000 batch batch-small gateway-batch-small read replay fanout}"
SERVERS="${SERVERS:-ursula ursula-1core ds-0.1.5 ref-0.3.7 hello hello-streams}"
ALL_SERVERS="ursula ursula-1core ds-0.1.5 ref-0.3.7 hello hello-1core hello-streams"
SERVER_CPUS="${SERVER_CPUS:-}"
CLIENT_CPUS="${CLIENT_CPUS:-}"
PIN=()
if [[ -n "$SERVER_CPUS" ]]; then
    command -v taskset >/dev/null || { echo "SERVER_CPUS needs taskset (util-linux)" >&2; exit 2; }
    PIN=(taskset -c "$SERVER_CPUS")
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ursula-compare.XXXXXX")"
OUT="${OUT:-$WORK/out}"
mkdir -p "$OUT"
PID=""
cleanup() {
    local rc=$?
    if [[ -n "$PID" ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        sleep 0.5
        kill -KILL "$PID" 2>/dev/null || true
    fi
    rm -rf "$WORK/data"
    exit "$rc"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*" >&2; }

# ---------------------------------------------------------------------------------------
if [[ -z "$REPORT_ONLY" ]]; then
say "building release binaries"
cargo build --release -p ursula-server -p ursula-loadgen -p ursula-benches --bins >&2

say "installing pinned peers into $PEERS_DIR (first run only)"
DS_BIN="$PEERS_DIR/durable-streams-0.1.5/bin/durable-streams-server"
REF_DIR="$PEERS_DIR/ref-0.3.7"
# Only the peers this run starts are installed.
if [[ " $SERVERS " == *" ds-0.1.5 "* && ! -x "$DS_BIN" ]]; then
    cargo install durable-streams --version 0.1.5 --locked \
        --root "$PEERS_DIR/durable-streams-0.1.5" >&2
fi
if [[ " $SERVERS " == *" ref-0.3.7 "* && ! -d "$REF_DIR/node_modules/@durable-streams/server" ]]; then
    mkdir -p "$REF_DIR"
    (cd "$REF_DIR" && npm install --no-audit --no-fund @durable-streams/server@0.3.7 >&2)
fi
mkdir -p "$REF_DIR"
cat >"$REF_DIR/start.mjs" <<'EOF'
// The package has no CLI: start its server with the file-backed store.
import { DurableStreamTestServer } from "@durable-streams/server";
const [port, dataDir] = process.argv.slice(2);
const server = new DurableStreamTestServer({ port: Number(port), host: "127.0.0.1", dataDir, longPollTimeout: 500 });
await server.start();
console.log(`ref listening on http://127.0.0.1:${port}`);
EOF
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() { # url
    for _ in $(seq 1 300); do
        if curl -s -o /dev/null "$1/" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "server at $1 did not answer" >&2
    return 1
}

URL=""
start_server() { # name
    URL=""
    rm -rf "$WORK/data" && mkdir -p "$WORK/data"
    local log="$OUT/$1.server.log" port
    case "$1" in
    ursula | ursula-1core)
        local cores=()
        [[ "$1" == ursula-1core ]] && cores=(--cores 1)
        "${PIN[@]}" "$BIN/ursula" server --listen 127.0.0.1:0 --data-dir "$WORK/data" --storage disk \
            --long-poll-timeout-ms 500 "${cores[@]}" >"$WORK/stdout" 2>"$log" &
        PID=$!
        for _ in $(seq 1 300); do
            URL="$(sed -n 's/^ursula listening on \(http:[^ ]*\)$/\1/p' "$WORK/stdout" | head -n1)"
            [[ -n "$URL" ]] && break
            sleep 0.1
        done ;;
    hello | hello-1core | hello-streams)
        local bin="hello-monoio" cores=()
        [[ "$1" == hello-streams ]] && bin="hello-streams"
        [[ "$1" == hello-1core ]] && cores=(1)
        "${PIN[@]}" "$BIN/$bin" 127.0.0.1:0 "${cores[@]}" >"$WORK/stdout" 2>"$log" &
        PID=$!
        for _ in $(seq 1 300); do
            URL="$(sed -n "s/^$bin listening on \(http:[^ ]*\)\$/\1/p" "$WORK/stdout" | head -n1)"
            [[ -n "$URL" ]] && break
            sleep 0.1
        done ;;
    ds-0.1.5)
        port="$(free_port)"
        "${PIN[@]}" "$DS_BIN" --host 127.0.0.1 --port "$port" --data-dir "$WORK/data" \
            --long-poll-timeout-ms 500 >"$log" 2>&1 &
        PID=$!
        URL="http://127.0.0.1:$port" ;;
    ref-0.3.7)
        port="$(free_port)"
        (cd "$REF_DIR" && exec "${PIN[@]}" node start.mjs "$port" "$WORK/data") >"$log" 2>&1 &
        PID=$!
        URL="http://127.0.0.1:$port" ;;
    esac
    [[ -n "$URL" ]] || { tail "$log" >&2; return 1; }
    wait_http "$URL"
}

stop_server() {
    [[ -n "$PID" ]] || return 0
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=""
}

loadgen() { # server scenario
    local server="$1" scenario="$2" args=()
    local common=(--target "$URL" --surface compat --duration "$DURATION" --warmup "$WARMUP"
        --json "$OUT/$server.$scenario.json" --prefix "cmp$RANDOM")
    [[ -n "$CLIENT_CPUS" ]] && common+=(--cpus "$CLIENT_CPUS")
    case "$scenario" in
    write-*) args=(write --streams "${scenario#write-}" --payload 256) ;;
    gateway-*-paced)
        local n="${scenario#gateway-}"
        n="${n%-paced}"
        args=(write --spread --connections "$n" --streams "$n" --payload 256 --rate "$PACED_RATE") ;;
    gateway-*[0-9])
        args=(write --spread --connections "${scenario#gateway-}" --streams "${scenario#gateway-}"
            --payload 256) ;;
    gateway-batch-small)
        args=(batch --spread --connections 16 --streams 100 --events 100 --event-size 200) ;;
    batch) args=(batch --connections 16 --events 512 --event-size 2k) ;;
    batch-small) args=(batch --connections 16 --events 100 --event-size 200) ;;
    read) args=(read --streams 4 --prefill "$READ_PREFILL" --append-size 1m) ;;
    replay)
        # The reference server appends at ~100-1000/s here, so pre-filling 1000 x 200 events
        # would take most of an hour; it replays with fewer clients (an easier load), which
        # the summary labels.
        local clients="$REPLAY_CLIENTS"
        [[ "$server" == ref-* ]] && clients=$((REPLAY_CLIENTS < 100 ? REPLAY_CLIENTS : 100))
        args=(replay --clients "$clients" --events 200 --event-size 1k) ;;
    fanout) args=(fanout --subscribers "$FANOUT_SUBS" --rate 50) ;;
    esac
    say "$server: $scenario"
    "$BIN/ursula-loadgen" "${args[@]}" "${common[@]}" >"$OUT/$server.$scenario.txt" 2>&1 &
    local lg=$!
    # Server CPU over the measured window only (set-up and warm-up excluded). Scenarios
    # that set up for long (read, replay) start their window late, so this is for the
    # windowed write scenarios.
    rm -f "$OUT/$server.$scenario.cpu"
    if [[ "$scenario" =~ ^(write-|gateway-|batch) ]]; then
        sleep "$(secs "$WARMUP")"
        # Beside the server's CPU, the whole host's busy time: the load generator shares
        # the same cores (it reports its own CPU), and a saturated host caps every server.
        local c0 c1 h0 h1
        c0="$(cpu_ticks "$PID")" h0="$(host_ticks)"
        sleep "$(secs "$DURATION")"
        c1="$(cpu_ticks "$PID")" h1="$(host_ticks)"
        if [[ -n "$c0" && -n "$c1" ]]; then
            echo "$c0 $c1 $(getconf CLK_TCK) $h0 $h1" >"$OUT/$server.$scenario.cpu"
        fi
    fi
    if ! wait "$lg"; then
        echo "  (failed; see $OUT/$server.$scenario.txt)" >&2
    fi
    grep -E '^(ops|latency|errors)' "$OUT/$server.$scenario.txt" >&2 || true
}

secs() { # 10s | 500ms | 2m | 1.5  ->  seconds for sleep
    case "$1" in
    *ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *m) awk -v v="${1%m}" 'BEGIN { print v * 60 }' ;;
    *) echo "$1" ;;
    esac
}

cpu_ticks() { # pid -> utime + stime of all its threads, in clock ticks
    # The command name (field 2) may hold spaces; count fields after its closing paren.
    sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }'
}

host_ticks() { # -> "busy total" clock ticks of all CPUs since boot (/proc/stat)
    awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6 "," t }' /proc/stat
}

# ---------------------------------------------------------------------------------------
if [[ -z "$REPORT_ONLY" ]]; then
for scenario in $SCENARIOS; do
    rm -f "$OUT"/*."$scenario".json "$OUT"/*."$scenario".txt "$OUT"/*."$scenario".cpu
done

say "physical limits"
DD_FILE="$WORK/dd.img"
# dd prints "<bytes> bytes ... copied, <secs> s, <rate> <unit>"; recompute MB/s from bytes/secs.
DD_MBS="$(dd if=/dev/zero of="$DD_FILE" bs=1M count="$DD_MIB" oflag=direct conv=fdatasync 2>&1 |
    awk '/copied/ { print $1 / $(NF-3) / 1e6 }')"
rm -f "$DD_FILE"
NET_MBS="$("$BIN/loopback-tcp" "$NET_SECS" 2 | awk '{ print $3 }')"
echo "dd oflag=direct: $DD_MBS MB/s; loopback TCP (2 connections): $NET_MBS MB/s" >&2
printf '{"dd_mb_per_sec": %s, "loopback_mb_per_sec": %s, "server_cpus": "%s", "client_cpus": "%s"}\n' \
    "$DD_MBS" "$NET_MBS" "$SERVER_CPUS" "$CLIENT_CPUS" >"$OUT/physical.json"

for server in $SERVERS; do
    start_server "$server"
    for scenario in $SCENARIOS; do
        # Each ceiling runs only what it can serve: hello answers writes and stores nothing;
        # hello-streams stores in memory and serves the reading scenarios.
        if [[ "$server" =~ ^hello(-1core)?$ && ! "$scenario" =~ ^(write|gateway)-[0-9] ]]; then
            continue
        fi
        if [[ "$server" == hello-streams && ! "$scenario" =~ ^(read|replay|fanout)$ ]]; then
            continue
        fi
        loadgen "$server" "$scenario"
    done
    stop_server
done
fi

# ---------------------------------------------------------------------------------------
for scenario in $SCENARIOS; do
    reports=()
    for server in $ALL_SERVERS; do
        [[ -s "$OUT/$server.$scenario.json" ]] && reports+=("$server=$OUT/$server.$scenario.json")
    done
    [[ ${#reports[@]} -gt 0 ]] &&
        "$BIN/ursula-loadgen" chart --out "$OUT/$scenario.svg" --title "$scenario latency (compat surface)" "${reports[@]}"
done

python3 - "$OUT" "$SCENARIOS" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
out, scenarios = sys.argv[1], sys.argv[2].split()
servers = ["ursula", "ursula-1core", "ds-0.1.5", "ref-0.3.7", "hello", "hello-1core"]
phys = json.load(open(os.path.join(out, "physical.json")))
def load(server, scenario):
    p = os.path.join(out, f"{server}.{scenario}.json")
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
def ceiling(scenario):
    # The "hello" column is the ceiling that serves the scenario.
    return "hello-streams" if scenario in ("read", "replay", "fanout") else "hello"
def rate(r, scenario):
    if r is None:
        return None
    if scenario in ("read", "batch"):
        return r["mb_per_sec"]
    return r["ops_per_sec"]
def window(server, scenario):
    # Clock ticks over the measured window: the server's, and the host's busy share.
    try:
        f = open(os.path.join(out, f"{server}.{scenario}.cpu")).read().split()
        c0, c1, hz = map(float, f[:3])
    except (OSError, ValueError):
        return None
    w = {"server": c1 - c0, "hz": hz}
    if len(f) >= 5:
        (b0, t0), (b1, t1) = (map(float, x.split(",")) for x in f[3:5])
        w["host_busy_ticks"] = b1 - b0
        w["host_busy"] = (b1 - b0) / (t1 - t0) if t1 > t0 else None
    return w
def cpu_per_op_us(server, scenario, r):
    # Server CPU time (all threads) over the measured window, per operation.
    w = window(server, scenario)
    if w is None or r is None or not r["ops"]:
        return None
    return w["server"] / w["hz"] / r["ops"] * 1e6
def host_cpu_per_op_us(server, scenario, r):
    # Every CPU's busy time over the window per operation, less the load generator's own:
    # the server's CPU including kernel threads working for it (an O_DSYNC write's flush
    # runs in a kworker, outside the process), plus whatever else ran on the host.
    w = window(server, scenario)
    if (w is None or "host_busy_ticks" not in w or r is None or not r["ops"]
            or r.get("client_cpu_us_per_op") is None):
        return None
    return w["host_busy_ticks"] / w["hz"] / r["ops"] * 1e6 - r["client_cpu_us_per_op"]
def host_busy_pct(server, scenario):
    w = window(server, scenario)
    return None if w is None or w.get("host_busy") is None else 100 * w["host_busy"]
unit = {"read": "MB/s", "batch": "MB/s", "batch-small": "events/s"}
print(f"Physical limits: dd oflag=direct {phys['dd_mb_per_sec']:.0f} MB/s, loopback TCP {phys['loopback_mb_per_sec']:.0f} MB/s\n")
if phys.get("server_cpus") or phys.get("client_cpus"):
    print(f"Servers on CPUs {phys.get('server_cpus') or 'all'}, load generator on CPUs {phys.get('client_cpus') or 'all'}\n")
print("| scenario | metric | " + " | ".join(servers) + " | ursula/1core | ursula/ds | ursula/ref | ursula/hello | hello/1core |")
print("|---|---|" + "---|" * len(servers) + "---|---|---|---|---|")
for sc in scenarios:
    rows = {s: load(ceiling(sc) if s == "hello" else s, sc) for s in servers}
    for metric in ("throughput", "p50 ms", "p99 ms", "cpu us/op", "host cpu us/op",
                   "loadgen cpu us/op", "host busy %", "errors"):
        vals = {}
        for s, r in rows.items():
            if r is None:
                vals[s] = None
            elif metric == "throughput":
                vals[s] = rate(r, sc)
            elif metric == "errors":
                vals[s] = r["error_total"]
            elif metric == "cpu us/op":
                vals[s] = cpu_per_op_us(ceiling(sc) if s == "hello" else s, sc, r)
            elif metric == "host cpu us/op":
                vals[s] = host_cpu_per_op_us(ceiling(sc) if s == "hello" else s, sc, r)
            elif metric == "loadgen cpu us/op":
                vals[s] = r.get("client_cpu_us_per_op")
            elif metric == "host busy %":
                vals[s] = host_busy_pct(ceiling(sc) if s == "hello" else s, sc)
            else:
                vals[s] = r["latency"]["p50_ms" if metric == "p50 ms" else "p99_ms"]
        def fmt(v):
            return "–" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")
        def ratio(a, b):
            if a is None or b is None or b == 0 or metric in ("errors", "host busy %"):
                return "–"
            return f"{a / b:.2f}x"
        label = f"{unit.get(sc, 'ops/s')}" if metric == "throughput" else metric
        if sc.endswith("-paced") and metric == "throughput":
            offered = next((r.get("parameters", {}).get("rate") for r in rows.values() if r), None)
            if offered:
                label += f" (offered {offered:,.0f})"
        if sc == "replay" and metric == "throughput":
            clients = {s: (r or {}).get("parameters", {}).get("clients") for s, r in rows.items()}
            label += " (clients: " + ", ".join(f"{s} {c}" for s, c in clients.items() if c) + ")"
        if metric in ("cpu us/op", "host cpu us/op", "loadgen cpu us/op", "host busy %") and all(v is None for v in vals.values()):
            continue
        print(f"| {sc} | {label} | " + " | ".join(fmt(vals[s]) for s in servers)
              + f" | {ratio(vals['ursula'], vals['ursula-1core'])} | {ratio(vals['ursula'], vals['ds-0.1.5'])} | {ratio(vals['ursula'], vals['ref-0.3.7'])} | {ratio(vals['ursula'], vals['hello'])} | {ratio(vals['hello'], vals['hello-1core'])} |")
limits = {"batch": ("dd oflag=direct", phys["dd_mb_per_sec"]),
          "read": ("loopback TCP", phys["loopback_mb_per_sec"])}
notes = [f"- ursula {sc}: {rate(load('ursula', sc), sc):,.0f} MB/s = {100 * rate(load('ursula', sc), sc) / lim:.0f}% of {name}"
         for sc, (name, lim) in limits.items() if sc in scenarios and load("ursula", sc) and lim]
print("\ncpu us/op: server CPU time (user + system, all threads, /proc/PID/stat) over the measured window per operation; lower is better")
print("host cpu us/op: every CPU's busy time over the window per operation, less the load generator's own: the server's CPU with the kernel threads working for it (Ursula's disk flushes run in kworkers), plus anything else on the host")
print("loadgen cpu us/op: the load generator's own CPU over the window per operation (it shares the host's cores with the server)")
print("host busy %: share of all CPUs busy over the window (/proc/stat), whoever used them; near 100 the host, not the server, sets the pace")
print("\nhello: hello-monoio for the write scenarios, hello-streams (in memory) for read, replay and fanout; neither runs batch. hello-1core: hello-monoio on one core; hello/1core is what a second core gives a server that does no work, on this host")
if notes:
    print()
    print("\n".join(notes))
EOF
echo "reports, charts and summary in $OUT" >&2
