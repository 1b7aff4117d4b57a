"""torch_phantom.distributed.bind_to_cores: each rank of a machine on cores
of its own.

Each case runs in a fresh interpreter (binding changes the whole process),
given the machine's CPUs as this process may use them:

- local rank r of n gets share r of the cores, the shares of the n ranks
  are disjoint and cover the process's CPUs, and every thread is bound:
  one started before the call, and the stream worker phantom starts after;
- the arguments default to torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE;
- a second call with the same arguments binds the same CPUs (it splits the
  CPUs the process had before the first call, not its own share);
- more local ranks than cores, a rank out of range, missing or malformed
  settings: a ValueError (TypeError for a non-integer) saying what to do,
  and nothing is bound.

The launch with torchrun is in test_distributed_launch.py.
"""

import json
import os

import pytest

from conftest import run_python

CPUS = sorted(os.sched_getaffinity(0))

_PROGRAM = """
import json, os, threading, torch, torch_phantom
from torch_phantom.distributed import bind_to_cores
before = set(os.sched_getaffinity(0))
started = threading.Event(); release = threading.Event()
early = threading.Thread(target=lambda: (started.set(), release.wait()))
early.start(); started.wait()
result = {"tids_before": sorted(os.listdir("/proc/self/task"))}
try:
    result["cpus"] = sorted(bind_to_cores(*ARGS))
    result["again"] = sorted(bind_to_cores(*ARGS))
except (ValueError, TypeError) as e:
    result["error"] = type(e).__name__ + ": " + str(e)
(torch.ones(4, device="phantom") + 1).sum().item()  # starts a stream worker
threads = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        threads[tid] = [f.read().strip(), sorted(os.sched_getaffinity(int(tid)))]
release.set(); early.join()
result["threads"] = threads
result["before"] = sorted(before)
print(json.dumps(result))
"""


def bind(args=(), env=None):
    """Runs bind_to_cores(*args) in a fresh interpreter; returns its report."""
    env = dict(env or {})
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.setdefault(name, "")  # unset unless the case sets it (below)
    code = ""
    for name, value in env.items():
        code += (f"import os; os.environ.pop({name!r}, None)\n" if value == ""
                 else f"import os; os.environ[{name!r}] = {value!r}\n")
    done = run_python(code + _PROGRAM.replace("ARGS", repr(tuple(args))), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_each_local_rank_gets_its_own_share_and_every_thread_is_bound():
    shares = []
    for rank in range(2):
        report = bind((rank, 2))
        assert "error" not in report, report
        cpus = report["cpus"]
        assert cpus and set(cpus) <= set(report["before"])
        # Every thread: the main thread and the one started before the
        # call, and those phantom started after it (its stream worker).
        later = set(report["threads"]) - set(report["tids_before"])
        assert len(report["tids_before"]) >= 2 and later, report
        for name, thread_cpus in report["threads"].values():
            assert thread_cpus == cpus, (name, thread_cpus, cpus)
        shares.append(set(cpus))
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(CPUS)
    assert min(shares[0]) < min(shares[1])  # rank order follows CPU order


def test_one_rank_keeps_every_cpu():
    report = bind((0, 1))
    assert report["cpus"] == CPUS


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_torchruns_settings_are_the_defaults():
    report = bind((), {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert report["cpus"] == bind((1, 2))["cpus"]


def test_a_second_call_binds_the_same_cpus():
    report = bind((0, 1))
    assert report["again"] == report["cpus"] == CPUS
    if len(CPUS) >= 2:
        report = bind((0, 2))
        assert report["again"] == report["cpus"]


@pytest.mark.parametrize("args, env, error, words", [
    ((0, len(CPUS) + 1), None, "ValueError",
     [f"cannot give each of {len(CPUS) + 1} local ranks a core of its own",
      f"at most {len(CPUS)} ranks per machine"]),
    ((2, 2), None, "ValueError", ["local_rank must be in 0..local_world_size-1",
                                 "local_rank=2"]),
    ((0, 0), None, "ValueError", ["local_world_size at least 1"]),
    ((), None, "ValueError", ["needs local_rank", "launch with torchrun", "LOCAL_RANK"]),
    ((), {"LOCAL_RANK": "0"}, "ValueError", ["needs local_world_size", "LOCAL_WORLD_SIZE"]),
    ((), {"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"}, "ValueError",
     ["LOCAL_RANK='x' is not an integer"]),
    ((0.5, 2), None, "TypeError", ["local_rank must be an int"]),
], ids=["more_ranks_than_cores", "rank_out_of_range", "no_ranks", "no_torchrun_settings",
        "no_local_world_size", "malformed_setting", "float_rank"])
def test_bad_input_says_what_to_do_and_binds_nothing(args, env, error, words):
    report = bind(args, env)
    assert report["error"].startswith(error + ": "), report["error"]
    for word in words:
        assert word in report["error"], report["error"]
    for name, cpus in report["threads"].values():
        assert cpus == report["before"], (name, cpus)
