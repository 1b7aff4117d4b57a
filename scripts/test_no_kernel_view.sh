#!/usr/bin/env bash
# The Python suite on a driver without a kernel view, so every op other
# than factories, copies, views and item() runs through the copying CPU
# fallback (docs/operators.md, "Without a kernel view"), with
# PHANTOM_CPU_FALLBACK=silent. DRIVER chooses the driver:
#
#   fake (default)  the fake with PHANTOM_FAKE_NO_KERNEL_VIEW=1 (its table
#                   leaves ph_kernel_address NULL, as a discrete device's
#                   driver does);
#   remote          the second driver, PHANTOM_DRIVER=libphantom_remote.so
#                   (docs/remote-driver.md): an out-of-process device, its
#                   memory in a server process, no kernel view at all.
#
#   bash scripts/test_no_kernel_view.sh              # the sample (default)
#   DRIVER=remote bash scripts/test_no_kernel_view.sh
#   FULL=1 bash scripts/test_no_kernel_view.sh       # the whole suite
#
# The sample: the first SAMPLE (default 2) runnable tests of every file in
# tests/python, in file order (tests/python/conftest.py,
# NO_KERNEL_VIEW_SAMPLE), so every file is represented. Tests that need the
# kernel view (native kernels, queued generic ops, compiled kernels, sparse
# kernels, kernel faults) are marked requires_kernel_view and skipped with
# their reason; under the remote driver so are those marked
# requires_fake_driver (the fake's test settings, and the OPTIONAL sections
# the remote driver lacks: telemetry, interprocess sharing, the activity
# trace). The sample counts only runnable tests. Extra
# arguments go to pytest. Run from the tests folder so the installed
# package is used.
#
# Last recorded runs of the default sample (SAMPLE=2: all 64 files
# represented), on the 2-core machine while other builds shared it (the
# two runs one after the other, load average 7 to 17):
#   fake:   246 s; 106 passed, 467 skipped (the files and tests marked
#           requires_kernel_view, and the suite's own skips), 2055 deselected.
#   remote: 237 s; 106 passed, 487 skipped (those, and the tests marked
#           requires_fake_driver), 2035 deselected. The server's round trips
#           cost little next to the suite's own work: a quieter earlier run
#           took 147 s.
set -euo pipefail
cd "$(dirname "$0")/../tests/python"

case "${DRIVER:-fake}" in
  fake) export PHANTOM_FAKE_NO_KERNEL_VIEW=1 ;;
  # Looked for next to the runtime: the installed one.
  remote) export PHANTOM_DRIVER=libphantom_remote.so ;;
  *) echo "test_no_kernel_view.sh: DRIVER='${DRIVER}' is not a driver it" \
          "knows; accepted: fake (the default) or remote" >&2
     exit 2 ;;
esac
export PHANTOM_CPU_FALLBACK=silent
args=(-q -p no:cacheprovider)
if [ "${FULL:-0}" != 1 ]; then
  export NO_KERNEL_VIEW_SAMPLE="${SAMPLE:-2}"
fi
start=$(date +%s)
status=0
python3 -m pytest "${args[@]}" "$@" . || status=$?
echo "test_no_kernel_view.sh: $(( $(date +%s) - start )) s" \
     "(DRIVER=${DRIVER:-fake}, FULL=${FULL:-0}, NO_KERNEL_VIEW_SAMPLE=${NO_KERNEL_VIEW_SAMPLE:-all})"
exit $status
