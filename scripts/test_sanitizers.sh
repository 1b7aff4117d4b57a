#!/usr/bin/env bash
# Phantom's C++ suites under sanitizers (docs/reliability.md, "Sanitizers"):
#  - asan: HAL conformance and fake driver under AddressSanitizer +
#    UndefinedBehaviorSanitizer (no torch: a small build);
#  - tsan: the same suites, with the driver's concurrency tests, under
#    ThreadSanitizer;
#  - asan-runtime: the torch runtime suite (tests/runtime) under ASan+UBSan.
#    Only phantom's own code is instrumented (fake driver, runtime, test):
#    ops/ and libtorch are not, and ops/ compiles exactly as in the ordinary
#    build, so with ccache this build is the runtime library and its test.
#    LeakSanitizer stays on; should libtorch's static-init allocations ever
#    be reported, they go in tests/sanitizers/lsan.supp, one commented entry
#    each, and never a frame of phantom's own code.
# Any sanitizer report fails the run (halt_on_error, -fno-sanitize-recover).
# PHANTOM_BUILD_ROOT (default build) is where the build directories go.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
root=${PHANTOM_BUILD_ROOT:-build}

run() {
  local name=$1 flags=$2
  cmake -S . -B "$root/$name" -G Ninja -DPHANTOM_BUILD_TORCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
    "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" >/dev/null
  cmake --build "$root/$name"
  echo "== ctest under $name"
  (cd "$root/$name" && ctest --output-on-failure -j2)
}

asan_flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
run asan "$asan_flags"
run tsan "-fsanitize=thread -fno-omit-frame-pointer"

# The runtime suite: same flags through PHANTOM_SANITIZE (tests/CMakeLists.txt),
# building only the runtime tests (tests/runtime) and what they link.
cmake -S . -B "$root/asan-runtime" -G Ninja -DPHANTOM_BUILD_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DPHANTOM_SANITIZE=$asan_flags" >/dev/null
cmake --build "$root/asan-runtime" --target phantom_runtime_tests \
  phantom_settings_startup_tests phantom_observability_tests \
  phantom_runtime_alone_tests
echo "== ctest of tests/runtime under asan-runtime"
# ASan intercepts dlopen, so the runtime's run path does not reach the
# loader's search: name the build's driver by its path.
PHANTOM_DRIVER="$(cd "$root/asan-runtime/device/fake" && pwd)/libphantom_fake.so" \
LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp" \
  ctest --test-dir "$root/asan-runtime/tests/runtime" --output-on-failure -j2
