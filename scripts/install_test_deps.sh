#!/usr/bin/env bash
# Installs the libraries the integration tests run on phantom
# (tests/integration: Hugging Face transformers and accelerate, PyTorch
# Lightning, TorchRec with fbgemm-gpu-cpu), at the exact versions pinned in
# tests/integration/requirements*.txt, into the current Python. torch is
# never touched: every install is constrained to the pinned torch
# (constraints.txt), and the script fails if torch changed anyway. Safe to
# run again (nothing is downloaded when the pins are installed).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tests/integration
pip=(python3 -m pip install -q --disable-pip-version-check -c "$dir/constraints.txt")

torch_before=$(python3 -c 'import torch; print(torch.__version__, torch.__file__)')
"${pip[@]}" -r "$dir/requirements.txt"
"${pip[@]}" --no-deps -r "$dir/requirements-no-deps.txt"
torch_after=$(python3 -c 'import torch; print(torch.__version__, torch.__file__)')
if [ "$torch_before" != "$torch_after" ]; then
  echo "install_test_deps.sh: torch changed from '$torch_before' to '$torch_after'" >&2
  exit 1
fi
