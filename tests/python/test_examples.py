"""The README's main job: examples/train_mlp.py trains on phantom next to the
CPU and must exit 0 (bit-identical losses, loss falling)."""

import pathlib

from conftest import run_python

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"


def test_the_main_job_matches_the_cpu():
    code = f"import sys; sys.argv = ['train_mlp', '--steps', '8']; exec(open({str(EXAMPLE)!r}).read())"
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: phantom matches the CPU at every step" in result.stdout
