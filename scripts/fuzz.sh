#!/usr/bin/env bash
# Run every cargo-fuzz target in fuzz/ for a bounded time.
#   scripts/fuzz.sh [SECONDS]      seconds per target (default: $URSULA_FUZZ_SECONDS or 60)
#   URSULA_FUZZ_TARGETS="a b"      run only these targets
#
# Installs cargo-fuzz (pinned) when it is missing. The targets need nightly-only compiler
# flags (sanitizers, coverage); on the stable toolchain RUSTC_BOOTSTRAP=1 allows them.
# Each run starts from the committed seeds (fuzz/seeds/<target>) plus whatever earlier runs
# found (fuzz/corpus/<target>, not committed). A crash leaves its input under
# fuzz/artifacts/<target>/ and fails the script; turn it into a regression test next to
# the code it broke.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${1:-${URSULA_FUZZ_SECONDS:-60}}"
CARGO_FUZZ_VERSION="0.13.1"
# Fuzz builds use sanitizer flags, so they get their own target dir instead of
# invalidating the workspace's.
export CARGO_TARGET_DIR="${URSULA_FUZZ_TARGET_DIR:-$HOME/.cache/ursula-fuzz-target}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    (unset CARGO_TARGET_DIR; cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION")
fi

cd "$ROOT/fuzz"
TARGETS="${URSULA_FUZZ_TARGETS:-$(cargo fuzz list)}"
for t in $TARGETS; do
    cargo fuzz build -O "$t" || { echo "fuzz build of $t failed" >&2; exit 1; }
done

# The recovery target writes a small segment per input; tmpfs (O_DIRECT works there on
# current kernels) keeps it from being bound by the disk.
if [[ -z "${URSULA_FUZZ_TMP:-}" && -d /dev/shm && -w /dev/shm ]]; then
    URSULA_FUZZ_TMP="$(mktemp -d /dev/shm/ursula-fuzz.XXXXXX)"
    export URSULA_FUZZ_TMP
    trap 'rm -rf "$URSULA_FUZZ_TMP"' EXIT
fi

failed=()
for t in $TARGETS; do
    mkdir -p "corpus/$t"
    log="$CARGO_TARGET_DIR/fuzz-$t.log"
    printf -- '-- %s: %ss\n' "$t" "$SECONDS_PER_TARGET"
    # -rss_limit_mb: the recovery target opens a whole shard per input.
    if cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -print_final_stats=1 \
        >"$log" 2>&1; then
        execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
        printf '   ok: %s execs\n' "${execs:-?}"
    else
        echo "   FAILED; last lines of $log:" >&2
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -n 10 >&2 || tail -n 30 "$log" >&2
        failed+=("$t")
    fi
done
if ((${#failed[@]})); then
    echo "fuzz targets failed: ${failed[*]}" >&2
    exit 1
fi
echo "all fuzz targets ran ${SECONDS_PER_TARGET}s without a crash"
