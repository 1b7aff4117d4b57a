#!/usr/bin/env bash
# One command for the streams-and-memory benchmarks (allocator, launch,
# copies): builds the C++ benchmark, runs everything phantom-vs-CPU in one
# process each, writes bench/results/*.json and, if matplotlib is present,
# docs/img/copies.png. Needs the package installed (scripts/build_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_NOHASHDIR=true CCACHE_BASEDIR="$PWD"
cmake -S . -B build/bench -G Ninja -DPHANTOM_BUILD_BENCH=ON \
  -DPHANTOM_BUILD_TESTS=OFF -DPHANTOM_BUILD_PYTHON=OFF >/dev/null
cmake --build build/bench --target phantom_allocator_bench >/dev/null
mkdir -p bench/results
build/bench/bench/phantom_allocator_bench | tee bench/results/allocator.json
python3 bench/bench_copies.py --out bench/results/copies.json
python3 bench/plot_results.py || echo "(no plot: pip install matplotlib)"
