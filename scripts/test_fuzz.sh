#!/usr/bin/env bash
# The libFuzzer HAL fuzzer (tests/fuzz/hal_fuzzer.cc, docs/reliability.md):
# builds it with clang under ASan+UBSan in its own build directory and runs
# it for a bounded time from the seed corpus in tests/fuzz/corpus. A crash,
# hang (-timeout), leak or sanitizer report fails the run; libFuzzer then
# prints the reproducer's path (crash-*, timeout-*, leak-* in the artifact
# directory below). Reproduce with:
#   build/fuzz/tests/fuzz/phantom_hal_fuzzer <reproducer>
#   PHANTOM_FUZZ_TRACE=1 build/fuzz/tests/fuzz/phantom_hal_fuzzer <reproducer>
# Environment: FUZZ_SECONDS (default 60), FUZZ_RUNS (default: no limit,
# e.g. FUZZ_RUNS=20000 for a repeatable run with FUZZ_SEED), FUZZ_SEED
# (default 1), PHANTOM_BUILD_ROOT (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
root=${PHANTOM_BUILD_ROOT:-build}
build="$root/fuzz"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DPHANTOM_BUILD_FUZZER=ON -DPHANTOM_BUILD_TORCH=OFF \
  -DPHANTOM_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target phantom_hal_fuzzer

# The corpus libFuzzer grows goes to a scratch directory; the seeds in the
# repository stay as they are.
work="$build/fuzz-run"
rm -rf "$work" && mkdir -p "$work/corpus" "$work/artifacts"
args=(-max_total_time="${FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=4096
      -seed="${FUZZ_SEED:-1}" -print_final_stats=1 -print_funcs=0
      -artifact_prefix="$work/artifacts/")
[ -n "${FUZZ_RUNS:-}" ] && args+=(-runs="$FUZZ_RUNS")
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
echo "== HAL fuzzer: ${args[*]}"
status=0
"$build/tests/fuzz/phantom_hal_fuzzer" "${args[@]}" \
  "$work/corpus" tests/fuzz/corpus >"$work/log" 2>&1 || status=$?
grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|stat::(number_of_executed_units|peak_rss_mb)|Done )' \
  "$work/log" || true
if [ "$status" -ne 0 ]; then
  tail -n 60 "$work/log"
  echo "HAL fuzzer FAILED (exit $status); reproducer(s):"
  ls -1 "$work/artifacts/"* 2>/dev/null || echo "  (none written; see $work/log)"
  exit 1
fi
echo "HAL fuzzer: no crash, hang or leak"
