#!/usr/bin/env bash
# Builds and installs the torch_phantom package into the current Python
# against the installed torch (never reinstalling it: --no-build-isolation,
# --no-deps). The build directory build/wheel is kept between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
python3 -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps .
