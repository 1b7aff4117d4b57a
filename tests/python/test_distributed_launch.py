"""examples/distributed/train_ddp.py under torchrun: one node with two
processes (also with each rank bound to cores of its own), and two nodes
(two torchrun launches on the loopback address), as docs/distributed.md
shows. The example checks its own result against one
CPU process on the whole batch and prints OK."""

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed_harness import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed" / "train_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def launch(args, example_args=()):
    return subprocess.Popen(
        [*TORCHRUN, *args, str(EXAMPLE), "--steps", "3", *example_args],
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


def test_torchrun_one_node_each_rank_bound_to_its_own_cores():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    (out,) = finish([launch(["--standalone", "--nproc-per-node=2"], ["--bind-cores"])])
    assert "-> OK" in out, out
    shares = {}
    for line in out.splitlines():
        if "runs on CPUs" in line:
            rank, listed = line.split("local rank ")[1].split(" runs on CPUs ")
            shares[int(rank)] = set(ast.literal_eval(listed))
    assert sorted(shares) == [0, 1], out
    assert shares[0] and shares[1] and not shares[0] & shares[1], shares
    assert shares[0] | shares[1] <= set(cpus), shares


def test_torchrun_two_nodes_on_loopback():
    port = free_port()
    common = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1",
              f"--master-port={port}"]
    outs = finish([launch([*common, "--node-rank=0"]), launch([*common, "--node-rank=1"])])
    assert "mlp on 2 ranks: parameters differ" in outs[0] and "-> OK" in outs[0], outs[0]
