#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, then train a small MLP
# on the phantom device and on the CPU side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build_python.sh
python3 examples/train_mlp.py
