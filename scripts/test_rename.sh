#!/usr/bin/env bash
# The rename promise (docs/porting.md, "Renaming the backend"): builds the
# package under another backend name into a scratch directory and runs
# scripts/rename_smoke.py against it, so a hard-coded "phantom" anywhere on
# the user's path fails CI. The scratch install is first on PYTHONPATH and
# never touches the current Python's site-packages; the build directory is
# build/wheel-NAME, so the default build (build/wheel) stays cached, and
# ccache makes every file the name does not reach a cache hit.
# Environment: RENAME_BACKEND_NAME (default vnpu: lower-case letters and
# underscores), RENAME_TIMEOUT (seconds for the build, default 900).
set -euo pipefail
cd "$(dirname "$0")/.."

name=${RENAME_BACKEND_NAME:-vnpu}
scratch="build/rename-$name"
rm -rf "$scratch"
mkdir -p "$scratch/site" "$scratch/run"
start=$SECONDS
echo "== rename: building the backend as '$name' into $scratch/site"
limit=${RENAME_TIMEOUT:-900}
timeout "$limit" \
  bash scripts/build_python.sh --backend-name "$name" --target "$scratch/site" ||
  { status=$?
    [ "$status" = 124 ] && echo "rename: the build took more than $limit s" \
      "(a cold ccache rebuilds everything): raise RENAME_TIMEOUT, or skip" \
      "the step with RENAME_TEST=0" >&2
    exit "$status"; }
built=$SECONDS
# From an empty directory, so neither the source tree nor an installed
# default build is imported instead; PHANTOM_* settings at their defaults.
site="$PWD/$scratch/site"
smoke="$PWD/scripts/rename_smoke.py"
(cd "$scratch/run" &&
  env $(env | grep -o '^PHANTOM_[A-Z0-9_]*' | sed 's/^/-u /') \
    TORCH_DEVICE_BACKEND_AUTOLOAD=1 PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 300 python3 "$smoke" "$name" "$site")
echo "== rename: build $((built - start)) s, smoke test $((SECONDS - built)) s"
