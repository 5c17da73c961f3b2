#!/usr/bin/env bash
# Cold reads through the server: catch-up and random old-offset reads of segments that
# were evicted to a real S3 server, against the same data read from the local disk, in one
# run on this machine (method and current results: docs/benchmarks.md, "Cold tier (S3)").
#
#   scripts/bench-cold.sh [--quick] [--out DIR]
#
# Starts on 127.0.0.1 (ports chosen by the kernel):
#   ursula-test-s3  s3s-fs, objects as files in a temp dir
#   cold            ursula archiving to it with a small --cold-local-bytes: most sealed
#                   segments leave the local disk and are read back with ranged GETs
#   hot             ursula with the same settings and no local budget: every segment local
# fills both with the same bytes (`ursula-loadgen read --prefill`, 1 MiB appends), waits
# until both archives caught up and the cold server's eviction settled, checks that a few
# streams read back byte-identical from both, then measures in interleaved rounds:
#   read-1    `ursula-loadgen read --reuse`, one reader catching up on one stream
#   read-N    the same, one reader on each of the N streams
#   seek      `ursula-loadgen seek`, random old offsets of those streams, 16 connections
# Beside throughput and latency it reports, over each measured window: CPU time of the
# server and of the S3 server per request (user + system, all threads, /proc/PID/stat),
# the bytes fetched from S3 per byte served, S3 GETs per GiB read back, and the
# hit rate of the cold block cache (the server's metrics). The in-memory stream cache is
# kept at CACHE_BYTES (1 MiB) on both servers, so that hot reads come from the disk.
#
# A full run takes 4-5 minutes; it builds nothing (cargo build --release -p ursula-server
# -p ursula-indexer -p ursula-loadgen makes the three binaries).
#
# Output: a markdown table on stdout (medians over the rounds, each round's MB/s beside
# them); with --out, DIR also keeps every loadgen report, the server logs and summary.md.
# --quick: less data, one short round, for a smoke run (under a minute).
#
# Env: BIN_DIR (default $CARGO_TARGET_DIR/release, else target/release; needs ursula,
#      ursula-test-s3 and ursula-loadgen),
#      CORES (server cores, 2), STREAMS (16), FILL (bytes per stream, 128m),
#      LOCAL_BYTES (the cold server's local segment budget, all cores, 256m),
#      SEGMENT_BYTES (1: the engine's smallest segments, about 48 MiB), CACHE_BYTES (1m),
#      ROUNDS (3), DURATION (8s), WARMUP (1s), SEEK_BYTES (max_bytes of a seek, 4k),
#      VERIFY_STREAMS (streams compared byte for byte, "0 LAST").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"

QUICK=""
OUT=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT="$2"; shift ;;
    -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

CORES="${CORES:-2}"
STREAMS="${STREAMS:-16}"
SEGMENT_BYTES="${SEGMENT_BYTES:-1}"
CACHE_BYTES="${CACHE_BYTES:-1m}"
SEEK_BYTES="${SEEK_BYTES:-4k}"
if [[ -n "$QUICK" ]]; then
    FILL="${FILL:-24m}" LOCAL_BYTES="${LOCAL_BYTES:-96m}" ROUNDS="${ROUNDS:-1}"
    DURATION="${DURATION:-3s}" WARMUP="${WARMUP:-1s}"
else
    FILL="${FILL:-128m}" LOCAL_BYTES="${LOCAL_BYTES:-256m}" ROUNDS="${ROUNDS:-3}"
    DURATION="${DURATION:-8s}" WARMUP="${WARMUP:-1s}"
fi
VERIFY_STREAMS="${VERIFY_STREAMS:-0 $((STREAMS - 1))}"

for b in ursula ursula-test-s3 ursula-loadgen; do
    [[ -x "$BIN/$b" ]] || { echo "$BIN/$b not found (set BIN_DIR)" >&2; exit 2; }
done

bytes() { # 256m | 1k | 4096  ->  bytes
    local v="${1,,}"
    case "$v" in
    *g) echo $((${v%g} << 30)) ;;
    *m) echo $((${v%m} << 20)) ;;
    *k) echo $((${v%k} << 10)) ;;
    *) echo "$v" ;;
    esac
}

secs() { # 8s | 500ms | 1.5  ->  seconds for sleep
    case "$1" in
    *ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ursula-bench-cold.XXXXXX")"
OUT="${OUT:-$WORK/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
declare -A PID=()
LG=""
stop() { # pid... (empty ones skipped)
    local p
    for p in "$@"; do [[ -z "$p" ]] || kill -TERM "$p" 2>/dev/null || true; done
    for p in "$@"; do
        [[ -n "$p" ]] || continue
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}
cleanup() {
    local rc=$?
    # The servers before S3: a clean stop runs a last archive round.
    stop "$LG" "${PID[cold]:-}" "${PID[hot]:-}"
    stop "${PID[s3]:-}"
    # The data dirs and the S3 objects are gigabytes; reports stay only with --out.
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

say() { printf '== %s\n' "$*" >&2; }

# The S3 test server's fixed test credentials.
export AWS_ACCESS_KEY_ID=testak AWS_SECRET_ACCESS_KEY=testsecretkey AWS_EC2_METADATA_DISABLED=true
BUCKET=bench

listening_url() { # stdout-file "name listening on"  ->  URL, once printed
    local url=""
    for _ in $(seq 1 600); do
        url="$(sed -n "s/^$2 listening on \(http:[^ ]*\)\$/\1/p" "$1" | head -n1)"
        [[ -n "$url" ]] && { echo "$url"; return 0; }
        sleep 0.1
    done
    return 1
}

mkdir -p "$WORK/s3"
"$BIN/ursula-test-s3" --listen 127.0.0.1:0 --root "$WORK/s3" --bucket "$BUCKET" \
    --counts-file "$WORK/s3.counts" >"$WORK/s3.stdout" 2>"$OUT/s3.log" &
PID[s3]=$!
S3_URL="$(listening_url "$WORK/s3.stdout" ursula-test-s3)" ||
    { echo "ursula-test-s3 did not start" >&2; tail "$OUT/s3.log" >&2; exit 1; }

declare -A URL=()
start_ursula() { # name local-bytes-or-empty
    local name="$1" local_line=""
    [[ -n "$2" ]] && local_line="local_bytes = $(bytes "$2")"
    mkdir -p "$WORK/$name"
    # archive_interval_ms: the open segment's data reaches S3 within a second of the fill.
    cat >"$WORK/$name.toml" <<EOF
segment_bytes = $(bytes "$SEGMENT_BYTES")
cache_bytes = $(bytes "$CACHE_BYTES")
[cold_tier]
s3_bucket = "$BUCKET"
s3_prefix = "$name"
s3_endpoint = "$S3_URL"
s3_region = "us-east-1"
archive_interval_ms = 1000
$local_line
EOF
    "$BIN/ursula" server --listen 127.0.0.1:0 --data-dir "$WORK/$name/data" --storage disk \
        --cores "$CORES" --long-poll-timeout-ms 500 --config "$WORK/$name.toml" \
        >"$WORK/$name.stdout" 2>"$OUT/$name.server.log" &
    PID[$name]=$!
    URL[$name]="$(listening_url "$WORK/$name.stdout" ursula)" ||
        { echo "$name did not start" >&2; tail "$OUT/$name.server.log" >&2; exit 1; }
}

metrics() { # name file
    curl -fsS "${URL[$1]}/__ursula/metrics" >"$2"
}

metric() { # name metric-name [label-filter]  ->  sum over its series
    curl -fsS "${URL[$1]}/__ursula/metrics" |
        awk -v m="$2" -v f="${3:-}" '
            ($1 == m || index($1, m "{") == 1) && (f == "" || index($1, f)) { s += $2 }
            END { printf "%.0f\n", s }'
}

cpu_ticks() { # pid -> utime + stime of all its threads, in clock ticks
    # The command name (field 2) may hold spaces; count fields after its closing paren.
    sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }'
}

COMMON=(--prefix bc --run-id bench --append-size 1m)

fill() { # name
    say "$1: filling $STREAMS streams with $FILL each (1 MiB appends)"
    local t0=$SECONDS
    "$BIN/ursula-loadgen" read --target "${URL[$1]}" --streams "$STREAMS" --prefill "$FILL" \
        "${COMMON[@]}" --duration 1s --warmup 0s >"$OUT/$1.fill.txt" 2>&1 ||
        { cat "$OUT/$1.fill.txt" >&2; exit 1; }
    say "$1: filled in $((SECONDS - t0)) s"
}

wait_settled() { # name
    # The durable ends reach the archiver once a second: a lag of 0 right after the fill
    # may predate the last records.
    local t0=$SECONDS local_bytes
    sleep 2.5
    while (($(metric "$1" ursula_cold_archive_lag_bytes) > 0)); do
        ((SECONDS - t0 < 180)) || { echo "$1: the archive did not catch up" >&2; exit 1; }
        sleep 0.5
    done
    # Eviction takes only segments below the last checkpoint, which the shards' upkeep
    # writes a while after the fill: the local files reach the budget later.
    while [[ "$1" == cold ]]; do
        local_bytes="$(metric cold ursula_storage_local_segment_bytes)"
        ((local_bytes > $(bytes "$LOCAL_BYTES"))) || break
        if ((SECONDS - t0 > 300)); then
            echo "cold: local segment files still $((local_bytes >> 20)) MiB after 300 s" >&2
            break
        fi
        sleep 0.5
    done
    local line
    line="$1: settled after $((SECONDS - t0)) s: local segment files"
    line+=" $(($(metric "$1" ursula_storage_local_segment_bytes) >> 20)) MiB,"
    line+=" $(metric "$1" ursula_storage_segments) segments,"
    line+=" $(metric "$1" ursula_storage_cold_segments) of them only in S3"
    say "$line"
    echo "$line" >>"$OUT/settled.txt"
}

read_stream() { # url path -> sha256 of the whole stream, read from offset -1 to its tail
    python3 - "$1" "$2" <<'EOF'
import hashlib, sys, urllib.request
base, path = sys.argv[1], sys.argv[2]
h, offset, n = hashlib.sha256(), "-1", 0
while True:
    with urllib.request.urlopen(f"{base}{path}?offset={offset}", timeout=60) as r:
        body = r.read()
        nxt, done = r.headers["Stream-Next-Offset"], r.headers.get("Stream-Up-To-Date") == "true"
    h.update(body)
    n += len(body)
    if done or nxt == offset:
        break
    offset = nxt
print(h.hexdigest(), n)
EOF
}

verify() { # when
    local i c h
    for i in $VERIFY_STREAMS; do
        c="$(read_stream "${URL[cold]}" "/v1/stream/bc-read-bench-$i")"
        h="$(read_stream "${URL[hot]}" "/v1/stream/bc-read-bench-$i")"
        if [[ "$c" != "$h" || "${c#* }" != "$(bytes "$FILL")" ]]; then
            echo "stream $i $1: cold read back $c, hot $h (want $(bytes "$FILL") bytes)" >&2
            exit 1
        fi
    done
    say "streams $VERIFY_STREAMS $1: byte-identical on both servers"
}

measure() { # server scenario round
    local s="$1" sc="$2" r="$3" tag="$1.$2.$3" args=()
    case "$sc" in
    read-1) args=(read --streams 1 --reuse "${COMMON[@]}") ;;
    read-*) args=(read --streams "${sc#read-}" --reuse "${COMMON[@]}") ;;
    seek) args=(seek --of read --streams "$STREAMS" --connections 16 --max-bytes "$SEEK_BYTES"
        --prefix bc --run-id bench) ;;
    esac
    "$BIN/ursula-loadgen" "${args[@]}" --target "${URL[$s]}" --duration "$DURATION" \
        --warmup "$WARMUP" --json "$OUT/$tag.json" >"$OUT/$tag.txt" 2>&1 &
    LG=$!
    # Server-side numbers over the measured window only (set-up and warm-up excluded).
    sleep "$(secs "$WARMUP")"
    local c0 s0 c1 s1
    c0="$(cpu_ticks "${PID[$s]}")" s0="$(cpu_ticks "${PID[s3]}")"
    metrics "$s" "$OUT/$tag.m0"
    cp "$WORK/s3.counts" "$OUT/$tag.s3c0"
    sleep "$(secs "$DURATION")"
    c1="$(cpu_ticks "${PID[$s]}")" s1="$(cpu_ticks "${PID[s3]}")"
    metrics "$s" "$OUT/$tag.m1"
    cp "$WORK/s3.counts" "$OUT/$tag.s3c1"
    echo "$c0 $c1 $s0 $s1 $(getconf CLK_TCK)" >"$OUT/$tag.cpu"
    if ! wait "$LG"; then
        LG=""
        echo "  $tag failed:" >&2
        cat "$OUT/$tag.txt" >&2
        exit 1
    fi
    LG=""
    printf '   %-5s %-7s round %s: %s\n' "$s" "$sc" "$r" \
        "$(grep -E '^ops' "$OUT/$tag.txt" | head -n1)" >&2
}

start_ursula cold "$LOCAL_BYTES"
start_ursula hot ""
say "s3 $S3_URL, cold ${URL[cold]} (local budget $LOCAL_BYTES), hot ${URL[hot]}; $CORES cores each"
fill cold
fill hot
wait_settled cold
wait_settled hot
verify "after eviction"

SCENARIOS="read-1 read-$STREAMS seek"
for r in $(seq 1 "$ROUNDS"); do
    say "round $r of $ROUNDS"
    for sc in $SCENARIOS; do
        # Which server goes first alternates, so that neither always follows the other.
        if ((r % 2)); then order="cold hot"; else order="hot cold"; fi
        for s in $order; do measure "$s" "$sc" "$r"; done
    done
done
verify "after the rounds"

python3 - "$OUT" "$ROUNDS" "$SCENARIOS" "$STREAMS x $FILL per stream in 1 MiB appends, \
$CORES server cores, segment_bytes $SEGMENT_BYTES, cache_bytes $CACHE_BYTES, cold local budget \
$LOCAL_BYTES; $ROUNDS rounds of $WARMUP + $DURATION; seek: 16 connections, max_bytes $SEEK_BYTES" \
    <<'EOF' | tee "$OUT/summary.md"
import json, os, statistics, sys
out, rounds, scenarios, setup = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
print(f"Data: {setup}.")
for line in open(os.path.join(out, "settled.txt")):
    print(f"- {line.strip()}")
print()

def metrics(path):
    """Sum of each metric's series, and S3 GETs by result."""
    m = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{")[0]
        if name == "ursula_cold_requests_total" and 'kind="get"' in key:
            name = "get_" + key.split('result="')[1].split('"')[0]
        m[name] = m.get(name, 0.0) + float(value)
    return m

def counts(path):
    try:
        return {k: float(v) for k, v in (l.split() for l in open(path) if l.strip())}
    except (OSError, ValueError):
        return {}

def one(server, sc, r):
    tag = os.path.join(out, f"{server}.{sc}.{r}")
    rep = json.load(open(tag + ".json"))
    c0, c1, s0, s1, hz = map(float, open(tag + ".cpu").read().split())
    m0, m1 = metrics(tag + ".m0"), metrics(tag + ".m1")
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
    ops = rep["ops"] or 1
    cold = d("ursula_cold_read_bytes_total")
    hits, misses = d("ursula_storage_cold_cache_hits_total"), d("ursula_storage_cold_cache_misses_total")
    served = rep["bytes"]
    return {
        "mbs": rep["mb_per_sec"], "rps": rep["ops_per_sec"],
        "p50": rep["latency"]["p50_ms"], "p99": rep["latency"]["p99_ms"],
        "cpu": (c1 - c0) / hz / ops * 1e6, "s3cpu": (s1 - s0) / hz / ops * 1e6,
        # The metrics are read at the window's edges, the loadgen counts within it.
        "cold_share": cold / served if served else None,
        "gets_per_gib": d("get_ok") / (cold / 2**30) if cold else None,
        "get_errors": d("get_error"),
        "hit": hits / (hits + misses) * 100 if hits + misses else None,
        "errors": rep["error_total"],
        "gets": d("get_ok"),
        "s3_gets": counts(tag + ".s3c1").get("GET", 0) - counts(tag + ".s3c0").get("GET", 0),
    }

def fmt(v, unit=""):
    if v is None:
        return "–"
    return (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}") + unit

def med(rows, k):
    vals = [r[k] for r in rows if r[k] is not None]
    return statistics.median(vals) if vals else None

print("| reads | data | MB/s | MB/s per round | req/s | p50 ms | p99 ms | server CPU µs/req "
      "| S3 server CPU µs/req | S3 bytes per byte served | GETs per GiB from S3 | cold cache hits | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
ratios = []
for sc in scenarios:
    res = {}
    for server in ("cold", "hot"):
        rows = [one(server, sc, r) for r in range(1, rounds + 1)]
        res[server] = rows
        errs = int(sum(r["errors"] + r["get_errors"] for r in rows))
        share, hit = med(rows, "cold_share"), med(rows, "hit")
        print(f"| {sc} | {'evicted (S3)' if server == 'cold' else 'local disk'} | {fmt(med(rows, 'mbs'))} "
              f"| {' / '.join(fmt(r['mbs']) for r in rows)} | {fmt(med(rows, 'rps'))} "
              f"| {fmt(med(rows, 'p50'))} | {fmt(med(rows, 'p99'))} | {fmt(med(rows, 'cpu'))} "
              f"| {fmt(med(rows, 's3cpu'))} | {fmt(share)} "
              f"| {fmt(med(rows, 'gets_per_gib'))} "
              f"| {'–' if hit is None else f'{hit:.0f}%'} "
              f"| {errs} |")
    pr = [c["rps"] / h["rps"] for c, h in zip(res["cold"], res["hot"]) if h["rps"]]
    p99 = [c["p99"] / h["p99"] for c, h in zip(res["cold"], res["hot"]) if h["p99"]]
    cpu = [c["cpu"] / h["cpu"] for c, h in zip(res["cold"], res["hot"]) if h["cpu"]]
    gets = sum(r["gets"] for r in res["cold"])
    s3_gets = sum(r["s3_gets"] for r in res["cold"])
    ratios.append(f"- {sc}: cold / hot throughput {' '.join(f'{x:.2f}' for x in pr)}, "
                  f"p99 {' '.join(f'{x:.2f}' for x in p99)}, server CPU per request "
                  f"{' '.join(f'{x:.2f}' for x in cpu)} (per round); GETs in the windows "
                  f"{gets:,.0f} counted by the server, {s3_gets:,.0f} by the S3 server")
print()
print("\n".join(ratios))
print("\nMedians over the rounds. CPU: user + system time of all threads over the measured "
      "window per request; the S3 server runs on the same machine. S3 bytes per byte "
      "served: ursula_cold_read_bytes over the window against the bytes the readers received "
      "(blocks are 1 MiB and readahead fetches the next 4 MiB of the stream).")
EOF
[[ "$OUT" == "$WORK/out" ]] || echo "reports and summary in $OUT" >&2
