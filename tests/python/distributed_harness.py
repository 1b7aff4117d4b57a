"""Running a process group for a test: one fresh interpreter per rank.

``run_group(worker, world)`` starts ``tests/python/distributed_workers/<worker>.py``
once per rank, on the loopback address and a free port (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK set as torchrun sets them), and
waits for all of them within ``timeout`` seconds. If any rank is still
running then, or one fails while others wait for it, every rank's whole
process group is killed, so a broken backend cannot hang the suite. Each
rank reports its findings by printing one ``RESULT <json>`` line
(distributed_workers/common.py); the harness returns them per rank, with
the exit codes and the output for the failure message.

Workers check many things in one group and report each by name, because a
group costs a few seconds to start (every rank imports torch); the test
modules then assert on the names one by one.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKERS = Path(__file__).parent / "distributed_workers"

# DISTRIBUTED_FULL=1 adds the heavy cases (bigger models, more steps, a
# 256 MiB all-reduce); the default set keeps CI to a few minutes.
FULL = os.environ.get("DISTRIBUTED_FULL") == "1"


@dataclass
class RankOutcome:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    results: dict = field(default_factory=dict)


class GroupFailed(AssertionError):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(outcomes):
    parts = []
    for o in outcomes:
        parts.append(
            f"--- rank {o.rank}: exit {o.returncode} ---\n"
            f"{o.stdout[-3000:]}\n--- stderr ---\n{o.stderr[-6000:]}"
        )
    return "\n".join(parts)


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_group(worker, world, timeout=180, args=(), env=None, expect_success=True):
    """Runs ``worker`` on ``world`` ranks; returns a list of RankOutcome.

    With ``expect_success`` (the default), raises GroupFailed, with every
    rank's output, unless all ranks exit 0."""
    port = free_port()
    base_env = dict(os.environ)
    base_env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SPARE_PORT=str(free_port()),  # for a worker that needs a second store
        WORLD_SIZE=str(world),
        PYTHONUNBUFFERED="1",
    )
    if env:
        base_env.update(env)
    procs = []
    for rank in range(world):
        rank_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / f"{worker}.py"), *map(str, args)],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # killpg reaches everything it started
            )
        )
    deadline = time.monotonic() + timeout
    outputs = [None] * world
    timed_out = False
    try:
        for rank, p in enumerate(procs):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                outputs[rank] = p.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        _kill(procs)
    outcomes = []
    for rank, p in enumerate(procs):
        if outputs[rank] is None:
            out, err = p.communicate()
        else:
            out, err = outputs[rank]
        outcome = RankOutcome(rank, p.returncode, out, err)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                outcome.results.update(json.loads(line[len("RESULT "):]))
        outcomes.append(outcome)
    if timed_out:
        raise GroupFailed(
            f"{worker} on {world} ranks did not finish within {timeout} s; "
            f"every rank was killed\n{_describe(outcomes)}"
        )
    if expect_success and any(o.returncode != 0 for o in outcomes):
        raise GroupFailed(f"{worker} on {world} ranks failed\n{_describe(outcomes)}")
    return outcomes


def check_named(outcomes, name):
    """Asserts that every rank reported check ``name`` as "ok"."""
    failures = []
    for o in outcomes:
        value = o.results.get(name, "<not reported>")
        if value != "ok":
            failures.append(f"rank {o.rank}: {value}")
    assert not failures, f"{name}:\n" + "\n".join(failures)
