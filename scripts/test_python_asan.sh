#!/usr/bin/env bash
# The Python tests (tests/python) with the whole torch_phantom package --
# _C, ops, runtime and fake driver -- built under AddressSanitizer
# (docs/reliability.md, "Python under ASan"). Not run by CI: the
# instrumented build of ops/ and the ~5x slower test run take far longer
# than CI's other sanitizer runs; run it after changes to memory handling.
#
# The package is built into its own directory ($PHANTOM_BUILD_ROOT/python-asan,
# default build/python-asan) and imported from there (PYTHONPATH), never
# installed over the normal package. Python itself and libtorch are not
# instrumented, so the ASan runtime must be loaded first (LD_PRELOAD).
#   detect_leaks=0  CPython keeps interned objects, arenas and module state
#                   until exit on purpose; LeakSanitizer would report them
#                   all. Leaks in phantom's C++ are covered by
#                   scripts/test_sanitizers.sh and the HAL fuzzer instead.
#   PYTHONMALLOC=malloc  route Python's allocations through malloc so ASan
#                   sees them (pymalloc's arenas hide overflows).
# Arguments are passed to pytest (default: all of tests/python).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
root=${PHANTOM_BUILD_ROOT:-build}
build="$(realpath -m "$root/python-asan")"
flags="-fsanitize=address -fno-omit-frame-pointer"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPHANTOM_BUILD_TESTS=OFF "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$flags" "-DCMAKE_MODULE_LINKER_FLAGS=$flags" >/dev/null
cmake --build "$build"

# libstdc++ is preloaded too: python3 does not link it, and ASan resolves
# its __cxa_throw interceptor at start-up; without libstdc++ loaded by then,
# the first C++ exception (any RuntimeError raised from C++) aborts with
# "CHECK failed: ... real___cxa_throw != 0".
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0
export PYTHONMALLOC=malloc
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
cd tests/python
python3 -c 'import torch_phantom, sys; print("torch_phantom from", torch_phantom.__file__)'
python3 -m pytest -q -p no:cacheprovider "${@:-.}"
