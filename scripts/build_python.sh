#!/usr/bin/env bash
# Builds and installs the torch_phantom package into the current Python
# against the installed torch (never reinstalling it: --no-build-isolation,
# --no-deps). The build directory build/wheel is kept between runs.
#
#   bash scripts/build_python.sh [--backend-name NAME] [--driver TARGET]
#                                [--target DIR]
#
# --backend-name NAME builds the backend under another device name
# (CMake's PHANTOM_BACKEND_NAME: torch.device("NAME"), torch.NAME;
# lower-case letters and underscores). --driver TARGET makes the CMake
# target TARGET the driver the runtime loads by default (CMake's
# PHANTOM_DRIVER; docs/porting.md, "Building with your driver"). Either
# builds in a build directory of its own (build/wheel-NAME,
# build/wheel-driver-TARGET), so the default build stays cached and keeps
# its options. --target DIR installs into DIR (put it first on PYTHONPATH
# to use it) instead of the current Python's site-packages.
# scripts/test_rename.sh uses --backend-name and --target.
set -euo pipefail
cd "$(dirname "$0")/.."

name=""
driver=""
target=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend-name) name="${2:?--backend-name needs a name}"; shift 2 ;;
    --driver) driver="${2:?--driver needs a CMake target}"; shift 2 ;;
    --target) target="${2:?--target needs a directory}"; shift 2 ;;
    *) echo "build_python.sh: unknown argument '$1'; accepted:" \
            "[--backend-name NAME] [--driver TARGET] [--target DIR]" >&2; exit 2 ;;
  esac
done

args=()
build_dir=build/wheel
if [[ -n "$name" ]]; then
  args+=(-C "cmake.define.PHANTOM_BACKEND_NAME=$name")
  build_dir+="-$name"
fi
if [[ -n "$driver" ]]; then
  args+=(-C "cmake.define.PHANTOM_DRIVER=$driver")
  build_dir+="-driver-$driver"
fi
if [[ "$build_dir" != build/wheel ]]; then
  args+=(-C "build-dir=$build_dir")
fi
if [[ -n "$target" ]]; then
  # --upgrade replaces an earlier install in DIR instead of refusing it.
  args+=(--target "$target" --upgrade)
fi

export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
python3 -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps "${args[@]}" .
