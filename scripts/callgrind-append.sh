#!/usr/bin/env bash
# User-space instructions per append of the release server, counted by callgrind.
#
#   scripts/callgrind-append.sh [SERVER_BINARY]
#
# Wall-clock benchmarks on a shared machine swing by +-15% between runs, which hides
# changes of a few percent in the request path. Instruction counts do not swing: two runs
# of the same binary agree within 1%. The server runs under valgrind on one core with
# instrumentation off; after a 3 s warm-up of write-100, instrumentation is switched on
# for 6 s of write-100 (256 B appends, 100 streams, one client core) and the count is
# divided by the appends acknowledged. Kernel time (TCP, io_uring, the disk) is not in
# the count: compare with `perf` for that.
#
# STREAMS sets the writer streams (default 100).
#
# Needs valgrind. Builds nothing: run `cargo build --release -p ursula-server -p
# ursula-loadgen` first. Prints one line: appends, instructions, instructions per append.
set -euo pipefail

target=${CARGO_TARGET_DIR:-$HOME/.cache/ursula-target}
server=${1:-$target/release/ursula}
loadgen=${LOADGEN:-$target/release/ursula-loadgen}
port=${PORT:-4988}

command -v valgrind >/dev/null || { echo "callgrind-append: valgrind is not installed" >&2; exit 2; }
work=$(mktemp -d /tmp/ursula-callgrind.XXXXXX)
vpid=
cgpid=
cleanup() {
    [[ -n "$cgpid" ]] && kill -9 "$cgpid" 2>/dev/null || true
    [[ -n "$vpid" ]] && kill -9 "$vpid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/cg.out" \
    "$server" server --listen "127.0.0.1:$port" --data-dir "$work/data" --storage disk \
    --cores 1 >"$work/server.log" 2>&1 &
vpid=$!
# Wait for the port (under valgrind the start-up line can lag far behind it).
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
for _ in $(seq 240); do
    listening && break
    sleep 0.5
done
listening || { cat "$work/server.log" >&2; exit 1; }

load() {
    "$loadgen" write --streams "${STREAMS:-100}" --payload 256 --duration "$1" --warmup 0s --cores 1 \
        --target "http://127.0.0.1:$port" --surface compat --prefix cg
}
load 3s >/dev/null
# callgrind_control needs the pid of valgrind itself, which may be a child of `$!`.
cgpid=$( (vgdb -l 2>/dev/null || true) | sed -n "s|^use --pid=\([0-9]*\) for .*$work/cg.out.*|\1|p" | head -1)
[[ -n "$cgpid" ]] || { echo "callgrind-append: valgrind process not found" >&2; exit 1; }
callgrind_control -i on "$cgpid" >/dev/null 2>&1
appends=$(load 6s | awk '/^ops/ {print $2}')
callgrind_control -i off "$cgpid" >/dev/null 2>&1
callgrind_control -d "$cgpid" >/dev/null 2>&1
sleep 2
# Graceful shutdown under valgrind can take minutes; the numbers are already dumped.
kill -9 "$cgpid" "$vpid" 2>/dev/null || true
wait "$vpid" 2>/dev/null || true
vpid=

dump=$(ls -S "$work"/cg.out* | head -1)
instructions=$(awk '/^(summary|totals):/ {n = $2} END {print n}' "$dump")
if [[ -z "$appends" || "$appends" -eq 0 || -z "$instructions" ]]; then
    echo "callgrind-append: no appends or no count (see $work)" >&2
    trap - EXIT
    exit 1
fi
echo "appends $appends instructions $instructions per-append $((instructions / appends))"
if [[ -n "${KEEP:-}" ]]; then
    cp "$dump" "$KEEP"
fi
