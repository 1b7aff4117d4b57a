#!/usr/bin/env bash
# The driver-level suites (HAL conformance, fake driver) under
# AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer.
# They need no torch, so these builds are small. Any sanitizer report fails
# the run (halt_on_error / -fno-sanitize-recover).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"

run() {
  local name=$1 flags=$2
  cmake -S . -B "build/$name" -G Ninja -DPHANTOM_BUILD_TORCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
    "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" >/dev/null
  cmake --build "build/$name"
  echo "== ctest under $name"
  (cd "build/$name" && ctest --output-on-failure -j2)
}

export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
run asan "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
run tsan "-fsanitize=thread -fno-omit-frame-pointer"
