#!/usr/bin/env bash
# Installs what Phantom needs on a fresh Debian machine with Python 3.11:
# the pinned CPU torch wheel, the Python build/test tools, GoogleTest from
# Debian, and Debian's CMake, Ninja, ccache, clang and libFuzzer. Safe to
# run again.
set -euo pipefail

need_apt=()
dpkg -s libgtest-dev >/dev/null 2>&1 || need_apt+=(libgtest-dev)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v ccache >/dev/null 2>&1 || need_apt+=(ccache)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
# clang and libFuzzer for the HAL fuzzer (scripts/test_fuzz.sh); libFuzzer
# exists only for clang, and Debian ships its runtime in libfuzzer-N-dev.
command -v clang++ >/dev/null 2>&1 || need_apt+=(clang)
clang_major=$( (clang++ -dumpversion 2>/dev/null || echo 14) | cut -d. -f1)
dpkg -s "libfuzzer-$clang_major-dev" >/dev/null 2>&1 || need_apt+=("libfuzzer-$clang_major-dev")
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "phantom: installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
python3 -m pip install -q --disable-pip-version-check \
  "torch==2.13.0" "scikit-build-core>=0.10" pytest expecttest numpy
