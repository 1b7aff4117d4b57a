#!/usr/bin/env bash
# One command for the performance suite: phantom against the CPU (small-op
# latency, scaling, large ops, training steps, copies, waits, the first
# operation of a process), then the plots.
#   bash bench/run_perf.sh            # full run, ~7 min, writes bench/results/perf.json
#   bash bench/run_perf.sh --quick    # ~1.5 min smoke run (results not saved)
# The full run writes the published result, bench/results/perf.json, and
# refuses to from a tree with uncommitted changes (--allow-dirty: write it
# anyway, its commit marked +dirty).
# Extra arguments go to bench/bench_perf.py (e.g. --only scaling --reps 7).
# Builds nothing: torch_phantom must be importable (installed, or
# PYTHONPATH=<build>/python).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import torch_phantom' 2>/dev/null; then
  echo "torch_phantom is not importable. Install it (pip install --no-build-isolation --no-deps .)" >&2
  echo "or build it and point PYTHONPATH at the build: cmake -S . -B build -G Ninja && ninja -C build" >&2
  echo "  && PYTHONPATH=build/python bash bench/run_perf.sh" >&2
  exit 1
fi
# OpenMP threads that spin at barriers turn a loaded machine's scheduler
# delays into 20 ms per parallel region (seen at load 10 on 2 cores: a
# 10^6-element add took 20 ms instead of 0.3 ms on the CPU); passive waiting
# measures the code, not the scheduler. Same setting for both devices.
# (The judged training ratio, "each alone", and the copies run in child
# processes with OpenMP's default policy: the CPU at its best.)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# torch puts CPU tensors of 2 MiB and more in 2 MiB pages, as phantom's
# device memory is: the large ops are judged with both arms on the same
# page size (bench_perf.py times the CPU's default allocation as context).
export THP_MEM_ALLOC_ENABLE="${THP_MEM_ALLOC_ENABLE:-1}"
echo "load: $(uptime); OMP_WAIT_POLICY=$OMP_WAIT_POLICY THP_MEM_ALLOC_ENABLE=$THP_MEM_ALLOC_ENABLE"
out=bench/results/perf.json
for a in "$@"; do
  # A quick or partial run must not overwrite the saved full results.
  case "$a" in --quick|--only) out=/tmp/phantom-perf-partial.json ;; esac
done
python3 bench/bench_perf.py --out "$out" "$@"
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 bench/plot_perf.py --results "$out" \
    $([ "$out" = bench/results/perf.json ] || echo --outdir /tmp/phantom-perf-plots)
else
  echo "(no plots: pip install matplotlib)"
fi
