#!/usr/bin/env bash
# Every test, from a fresh machine: install, build the package and the
# GoogleTest suites, run ctest (HAL conformance on both drivers, fake and
# remote driver, runtime, the build configured with the remote driver), the
# driver suites again under ASan+UBSan and TSan, the runtime suite under
# ASan+UBSan, the HAL fuzzer for a minute, the package built under another
# backend name with a smoke test (RENAME_TEST=0 skips it), and pytest
# (user-facing behaviour, a sample of it again under the stream race
# detector (RACE_SUITE=0 skips that) and on a driver without a kernel view
# (NO_KERNEL_VIEW_TEST=0 skips that) and on the remote driver
# (REMOTE_DRIVER_TEST=0 skips that), PyTorch's OpInfo database, and the
# libraries people train with).
# Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build_python.sh
# transformers, accelerate, Lightning, TorchRec: pinned, torch untouched.
bash scripts/install_test_deps.sh

export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
cmake -S . -B build/tests -G Ninja -DPHANTOM_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tests

status=0
(cd build/tests && ctest --output-on-failure -j2) || status=1
bash scripts/test_sanitizers.sh || status=1
bash scripts/test_fuzz.sh || status=1
# The package built under another backend name, and a smoke test of it
# (docs/porting.md, "Renaming the backend"): under a minute once the build
# above has filled ccache. RENAME_TEST=0 skips it.
if [ "${RENAME_TEST:-1}" != 0 ]; then
  bash scripts/test_rename.sh || status=1
fi
# Run from the tests folder so the installed package, not the source tree,
# is what gets imported.
(cd tests/python && python3 -m pytest -q -p no:cacheprovider .) || status=1
# The same suite under the stream race detector, a deterministic sample
# (docs/race-detector.md). RACE_SUITE=0 skips it.
if [ "${RACE_SUITE:-1}" != 0 ]; then
  bash scripts/test_race_detector_suite.sh || status=1
fi
# A sample of the same suite on a driver without a kernel view (the copying
# CPU fallback; docs/operators.md): a few minutes. NO_KERNEL_VIEW_TEST=0
# skips it.
if [ "${NO_KERNEL_VIEW_TEST:-1}" != 0 ]; then
  bash scripts/test_no_kernel_view.sh || status=1
fi
# The same sample on the second driver, the out-of-process remote device
# (docs/remote-driver.md): under 4 minutes. REMOTE_DRIVER_TEST=0 skips it.
if [ "${REMOTE_DRIVER_TEST:-1}" != 0 ]; then
  DRIVER=remote bash scripts/test_no_kernel_view.sh || status=1
fi
# PyTorch's OpInfo database on phantom against the CPU (docs/conformance.md).
(cd tests/conformance && python3 -m pytest -q -p no:cacheprovider .) || status=1
# The same database through torch.compile, a fixed sample (docs/compile.md).
(cd tests/compile_conformance && python3 -m pytest -q -p no:cacheprovider .) || status=1
# The libraries people train with, on phantom against the CPU.
(cd tests/integration && python3 -m pytest -q -p no:cacheprovider .) || status=1
exit $status
