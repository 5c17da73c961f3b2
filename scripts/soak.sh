#!/usr/bin/env bash
# Soak test: the release server under write + fanout + read at once, for a while, watching
# for leaks and drift (issue #8).
#
#   scripts/soak.sh [--seconds N]        (default 600; CI runs a short one)
#
# Runs three ursula-loadgen scenarios concurrently against one server (disk engine, temp
# data dir), each repeated back to back in slices of SLICE seconds until the time is up:
#   write   64 streams, 256 B appends, closed loop
#   fanout  one writer at 50 events/s, 100 SSE subscribers
#   read    catch-up reads of 4 pre-filled 16 MiB streams
# Every 5 s it samples the server's RSS and open file descriptors. It fails when
#   * RSS at the end is more than 10% above RSS after the warm-up (the first slice or the
#     first quarter of the run, whichever is longer),
#   * the fd count, within 30 s after the load stops, is still more than 16 above the count
#     before it started,
#   * any loadgen slice reports errors or missed deliveries, or
#   * write p99 in the last slice is more than 3x the first slice's.
# It prints the samples and a verdict.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ursula-target}"
BIN="$CARGO_TARGET_DIR/release"
SECONDS_TOTAL=600
while [[ $# -gt 0 ]]; do
    case "$1" in
    --seconds) SECONDS_TOTAL="$2"; shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
SLICE=$((SECONDS_TOTAL < 120 ? SECONDS_TOTAL / 4 : 30))
((SLICE >= 5)) || SLICE=5

for b in ursula ursula-loadgen; do
    [[ -x "$BIN/$b" ]] || { echo "missing $BIN/$b: cargo build --release --workspace" >&2; exit 2; }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ursula-soak.XXXXXX")"
PID=""
cleanup() {
    local rc=$?
    jobs -p | xargs -r kill 2>/dev/null || true
    if [[ -n "$PID" ]]; then kill -KILL "$PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

# A small read cache, so the bounded caches are full after the first slice and any
# later growth is a leak, not the cache warming up.
printf 'cache_bytes = %d\n' $((16 << 20)) >"$WORK/ursula.toml"
"$BIN/ursula" server --listen 127.0.0.1:0 --data-dir "$WORK/data" --storage disk \
    --long-poll-timeout-ms 500 --config "$WORK/ursula.toml" >"$WORK/stdout" 2>"$WORK/server.log" &
PID=$!
URL=""
for _ in $(seq 1 300); do
    URL="$(sed -n 's/^ursula listening on \(http:[^ ]*\)$/\1/p' "$WORK/stdout" | head -n1)"
    [[ -n "$URL" ]] && break
    sleep 0.1
done
[[ -n "$URL" ]] || { tail "$WORK/server.log" >&2; exit 1; }

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$PID/status"; }
fds() { ls "/proc/$PID/fd" | wc -l; }
FDS_BEFORE="$(fds)"

# One scenario, repeated in slices until the deadline; each slice's report is kept.
DEADLINE=$((SECONDS + SECONDS_TOTAL))
loop() { # name args...
    local name="$1" i=0
    shift
    while ((SECONDS + SLICE <= DEADLINE)); do
        "$BIN/ursula-loadgen" "$@" --target "$URL" --cores 1 --warmup 0s \
            --duration "${SLICE}s" --prefix "soak-$name-$i" \
            --json "$WORK/$name.$(printf %04d $i).json" >/dev/null 2>"$WORK/$name.err" || {
            echo "loadgen $name slice $i failed:" >&2
            cat "$WORK/$name.err" >&2
            return 1
        }
        i=$((i + 1))
    done
}
loop write write --streams 64 --payload 256 &
W=$!
loop fanout fanout --subscribers 100 --rate 50 &
F=$!
loop read read --streams 4 --prefill 16m --append-size 1m &
R=$!

echo "soak: ${SECONDS_TOTAL}s against $URL in ${SLICE}s slices (server pid $PID)"
echo "elapsed_s rss_kib fds" | tee "$WORK/samples"
while kill -0 "$W" 2>/dev/null || kill -0 "$F" 2>/dev/null || kill -0 "$R" 2>/dev/null; do
    echo "$((SECONDS_TOTAL - DEADLINE + SECONDS)) $(rss_kib) $(fds)" | tee -a "$WORK/samples"
    sleep 5
done
rc=0
for j in "$W" "$F" "$R"; do wait "$j" || rc=1; done
# Connections close as their clients go; an SSE subscriber that vanished is noticed at
# the next keep-alive write, so give the count up to 30 s to come back down.
for _ in $(seq 1 30); do
    FDS_AFTER="$(fds)"
    ((FDS_AFTER <= FDS_BEFORE + 16)) && break
    sleep 1
done

python3 - "$WORK" "$SLICE" "$FDS_BEFORE" "$FDS_AFTER" "$rc" <<'EOF'
import glob, json, sys
work, slice_s, fds_before, fds_after, rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
samples = [tuple(map(int, l.split())) for l in open(f"{work}/samples").read().split("\n")[1:] if l.strip()]
fail = []
if rc:
    fail.append("a loadgen slice failed")
# Warm-up: the first slice, or the first quarter of a long run.
warm_s = max(slice_s, samples[-1][0] // 4 if samples else 0)
warm = [s for s in samples if s[0] >= warm_s]
if len(warm) >= 2:
    base, end = warm[0][1], warm[-1][1]
    peak = max(s[1] for s in warm)
    print(f"RSS after warm-up {base} KiB, at the end {end} KiB (peak {peak} KiB): {100 * (end - base) / base:+.1f}%")
    if end > base * 1.10:
        fail.append(f"RSS grew {100 * (end - base) / base:.1f}% (> 10%)")
else:
    fail.append("too few samples after warm-up")
print(f"fds before the load {fds_before}, after {fds_after}")
if fds_after > fds_before + 16:
    fail.append(f"fd count grew from {fds_before} to {fds_after}")
for name in ("write", "fanout", "read"):
    reports = [json.load(open(p)) for p in sorted(glob.glob(f"{work}/{name}.*.json"))]
    if not reports:
        fail.append(f"no {name} reports")
        continue
    errors = sum(r["error_total"] for r in reports)
    missed = sum(r["counters"].get("missed_deliveries", 0) for r in reports)
    p99 = [r["latency"]["p99_ms"] for r in reports]
    rate = [r["ops_per_sec"] for r in reports]
    print(f"{name}: {len(reports)} slices, ops/s first {rate[0]:.0f} last {rate[-1]:.0f}, "
          f"p99 ms first {p99[0]:.1f} last {p99[-1]:.1f}, errors {errors}, missed {missed}")
    if errors or missed:
        fail.append(f"{name}: {errors} errors, {missed} missed deliveries")
    if name == "write" and len(p99) >= 2 and p99[-1] > 3 * max(p99[0], 1.0):
        fail.append(f"write p99 drifted from {p99[0]:.1f} to {p99[-1]:.1f} ms")
if fail:
    print("SOAK FAILED: " + "; ".join(fail))
    sys.exit(1)
print("SOAK PASSED")
EOF
