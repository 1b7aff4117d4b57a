#!/usr/bin/env bash
# The Python suite (tests/python) with the stream race detector on in error
# mode (PHANTOM_RACE_DETECTOR=2, from `import torch`), so any race it
# reports fails the test that caused it (docs/race-detector.md, "Running
# the suite under the detector").
#
#   bash scripts/test_race_detector_suite.sh [pytest arguments]
#
# By default a deterministic sample: the first test of each file and every
# SAMPLE-th after it in collection order (PHANTOM_RACE_SUITE_SAMPLE, in
# tests/python/conftest.py), SAMPLE=8 unless set: every file is represented
# and the run stays within a few minutes on two cores. FULL=1 runs every
# test. Tests that plant races on purpose or cannot run under the detector
# are skipped with their reason (conftest.py: RACE_SUITE_EXCLUDED_FILES and
# the no_race_detector marker); `-rs` lists them. Subprocesses the tests
# start inherit the setting, so they run under the detector too.
# Run from the tests folder so the installed package is what gets imported.
set -euo pipefail
cd "$(dirname "$0")/../tests/python"

sample="${SAMPLE:-8}"
if [ "${FULL:-0}" != 0 ]; then
  sample=1
fi
export PHANTOM_RACE_DETECTOR=2
export PHANTOM_RACE_SUITE_SAMPLE="$sample"
exec python3 -m pytest -q -p no:cacheprovider -rfEs "$@" .
