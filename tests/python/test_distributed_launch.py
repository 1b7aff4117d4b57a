"""examples/distributed/train_ddp.py under torchrun: one node with two
processes, and two nodes (two torchrun launches on the loopback address),
as docs/distributed.md shows. The example checks its own result against one
CPU process on the whole batch and prints OK."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from distributed_harness import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed" / "train_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def launch(args):
    return subprocess.Popen(
        [*TORCHRUN, *args, str(EXAMPLE), "--steps", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def finish(procs, timeout=240):
    """Waits for every launch; kills them all if one outlives the timeout."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("torchrun did not finish; killed\n" +
                             "\n".join(p.communicate()[0] for p in procs))
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    return outputs


def test_torchrun_one_node_two_processes():
    (out,) = finish([launch(["--standalone", "--nproc-per-node=2"])])
    assert "mlp on 2 ranks: parameters differ" in out and "-> OK" in out, out


def test_torchrun_two_nodes_on_loopback():
    port = free_port()
    common = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1",
              f"--master-port={port}"]
    outs = finish([launch([*common, "--node-rank=0"]), launch([*common, "--node-rank=1"])])
    assert "mlp on 2 ranks: parameters differ" in outs[0] and "-> OK" in outs[0], outs[0]
