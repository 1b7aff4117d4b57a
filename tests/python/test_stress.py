"""Bounded stress test: threads, streams, copies and events at once.

Several Python threads each own a few phantom streams and run random
chains of operations -- elementwise ops, reductions, matmuls, views,
in-place ops on views, host-to-device and device-to-host copies (pinned
with non_blocking=True, and pageable), device-to-device copies (same and
other device) and cross-stream hand-overs (record an event on one of the
thread's streams, wait for it on another, record_stream the tensor there).
Every chain runs on the CPU alongside and every result read back is
compared with it. The GIL serialises the Python threads, but the device
work runs concurrently on the streams' worker threads, which is what this
exercises: stream ordering, events, the caching allocator's stream-ordered
reuse and the pinned host cache.

Failures are part of the load (docs/streams.md, "Device errors"). A chain
may queue an op that fails on the device (an index out of bounds) and go
on: across its streams, through a hop over a stream of another device and
back (an event chain across devices), through copies. It must then fail,
at the latest at its final read-back, with that op's error naming the
stream it was queued on; a chain that completes is a failure of the test.
Meanwhile a chaos thread arms the kernel fault injector
(torch_phantom.testing.faults.fail_kernel(k), a new k each time), so faults also
land at random kernels of any thread. Every error a thread sees must be
explained: its own failed op, or an injected fault on one of its own
streams; an error reaching another thread's work is a failure. After an
error the thread synchronizes its streams (each reports once) and goes on.

A process boundary: the same stress runs at the same time in a child
process (bounded, its own seed, printed), where chains also shrink a
storage under a view and check that using the view is refused at the call
(docs/performance.md's bounds check); in the child, a regression that
crashes the process is reported by the parent with the child's output.

Bounded: ~20 s by default (PHANTOM_STRESS_SECONDS). Each thread draws its
operations from random.Random(seed + thread), so a failure is replayed with
PHANTOM_STRESS_SEED=<seed> (the interleaving of threads differs from run to
run; the operations do not). Seed and duration are printed (pytest -s) and
are in every assertion message. A watchdog turns a deadlock into a failure
with every thread's stack instead of a hung CI job. At the end the devices
are synchronized and memory_allocated() and the allocator's active block
counts are back at their baseline: nothing leaked, nothing still in use.
"""

import faulthandler
import gc
import os
import random
import re
import subprocess
import sys
import threading
import time

import torch
from torch_phantom.testing import faults

P = torch.phantom
THREADS = 4
STREAMS_PER_THREAD = 3
MAX_CHAIN = 24
DEVICE_ERROR_RATE = 0.01  # per op: queue an op that fails on the device
SHRUNK_VIEW_RATE = 0.01   # per op, in the child: a view past its storage
QUEUED_ON = re.compile(r"\(queued on phantom:(\d+) stream_id=(\d+)\)")
INJECTED = re.compile(r"injected device fault: kernel #\d+ since "
                      r"torch_phantom\.testing\.faults\.fail_kernel\((\d+)\)")


def _settings():
    seed = int(os.environ.get("PHANTOM_STRESS_SEED", random.SystemRandom().randrange(2**31)))
    seconds = float(os.environ.get("PHANTOM_STRESS_SECONDS", "20"))
    return seed, seconds


class ChainFailure(AssertionError):
    pass


class Worker:
    """One thread's work: chains of random ops on its device and streams,
    mirrored on the CPU."""

    OPS = ("add", "mul", "relu", "tanh", "sigmoid", "sum", "mean", "amax",
           "matmul", "transpose", "slice", "reshape", "inplace_view", "clone",
           "copy_into", "other_device", "switch_stream", "device_hop", "check_pinned",
           "check_pageable", "h2d_pinned", "h2d_pageable")

    def __init__(self, index, seed, deadline, stop, shrink_views=False):
        self.index = index
        self.rng = random.Random(seed + index)
        self.deadline = deadline
        self.stop = stop
        self.shrink_views = shrink_views
        self.device = index % P.device_count()
        self.chains = 0
        self.ops = 0
        self.history = []
        self.own = set()       # (device, stream id) of this thread's streams
        self.hops = {}         # device -> this thread's stream there
        self.pending = None    # the stream where this chain's op failed
        self.failed_chains = 0  # chains that failed as they had to
        self.injected = set()  # k of the injected faults this thread met
        self.refused_views = 0

    def fresh(self):
        rows, cols = self.rng.randint(1, 48), self.rng.randint(1, 48)
        generator = torch.Generator().manual_seed(self.rng.randrange(2**31))
        return torch.randn(rows, cols, generator=generator)

    def upload(self, cpu, stream, pinned):
        with P.stream(stream):
            if pinned:
                host = cpu.pin_memory()
                return host.to(f"phantom:{self.device}", non_blocking=True)
            return cpu.to(f"phantom:{self.device}")

    def check(self, got, want, how):
        # Not bit for bit: the CPU's BLAS splits a matmul's sums by the
        # number of threads it uses, which differs between the thread that
        # runs the phantom op and the one that runs the reference (measured:
        # 4% of these matmuls differ between 1 and 2 threads, by up to 5e-5
        # on values near 10), and a chain compounds it. Stale or unordered
        # data is off by about the values themselves, far beyond this bound.
        scale = 1.0
        if want.numel() and want.is_floating_point():
            scale = max(1.0, want.abs().max().item())
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-3,
                                                         atol=5e-3 * scale):
            raise ChainFailure(
                f"thread {self.index}, chain {self.chains}: {how} differs from the CPU "
                f"after ops {self.history}: max abs diff "
                f"{(got - want).abs().max().item() if got.shape == want.shape else 'shape'} "
                f"(shape {tuple(got.shape)} vs {tuple(want.shape)})")

    def where(self):
        return f"thread {self.index}, chain {self.chains}, ops {self.history}"

    def run(self):
        streams = [P.Stream(self.device, priority=-(i % 2)) for i in range(STREAMS_PER_THREAD)]
        for device in range(P.device_count()):
            if device != self.device:
                self.hops[device] = P.Stream(device)
        self.own = {(s.device_index, s.stream_id) for s in streams + list(self.hops.values())}
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            self.pending = None
            try:
                self.chain(streams)
            except torch.AcceleratorError as error:
                self.explain(str(error))
                self.failed_chains += self.pending is not None
                self.recover()
            else:
                if self.pending is not None:
                    raise ChainFailure(
                        f"{self.where()}: the chain completed although an op it depends on "
                        f"failed on the device (queued on {self.pending})")
            self.chains += 1

    def explain(self, message):
        """An error this thread met must be its own: its chain's failed op, or
        an injected fault on one of its streams."""
        queued = QUEUED_ON.search(message)
        if queued is not None and (int(queued[1]), int(queued[2])) not in self.own:
            raise ChainFailure(f"{self.where()}: an error of another thread's stream "
                               f"reached this thread: {message}")
        injected = INJECTED.search(message)
        if injected is not None:
            self.injected.add(int(injected[1]))
            return
        if "aten::index" in message and "out of bounds" in message and self.pending is not None:
            expected = f"(queued on {self.pending.device} stream_id={self.pending.stream_id})"
            if expected not in message:
                raise ChainFailure(f"{self.where()}: the failure does not name the stream "
                                   f"it was queued on, {expected}: {message}")
            return
        raise ChainFailure(f"{self.where()}: an error nothing explains: {message}")

    def recover(self):
        """Each of this thread's streams reports what it still has, once."""
        for device_index, stream_id in sorted(self.own):
            stream = P.Stream(stream_id=stream_id, device_index=device_index)
            try:
                stream.synchronize()
            except torch.AcceleratorError as error:
                self.explain(str(error))
            stream.synchronize()
        self.pending = None

    def chain(self, streams):
        rng = self.rng
        stream = rng.choice(streams)
        ref = self.fresh()
        dev = self.upload(ref, stream, pinned=rng.random() < 0.5)
        self.history = ["upload"]
        for _ in range(rng.randint(1, MAX_CHAIN)):
            op = rng.choice(self.OPS)
            if self.pending is None and rng.random() < DEVICE_ERROR_RATE:
                op = "device_error"
            elif self.shrink_views and rng.random() < SHRUNK_VIEW_RATE:
                op = "shrunk_view"
            self.history.append(op)
            self.ops += 1
            with P.stream(stream):
                if op == "switch_stream":
                    target = rng.choice([s for s in streams if s != stream])
                    target.wait_event(stream.record_event())
                    dev.record_stream(target)
                    stream = target
                elif op == "device_hop":
                    stream = self.hop(dev, stream, streams)
                else:
                    dev, ref = self.apply(op, dev, ref, stream)
        with P.stream(stream):
            self.check(dev.cpu(), ref, "the chain's result")

    def hop(self, dev, stream, streams):
        """An event chain across devices: this stream -> a stream of another
        device (which computes there) -> another of this thread's streams."""
        if not self.hops:
            return stream
        hop = self.hops[self.rng.choice(sorted(self.hops))]
        hop.wait_event(stream.record_event())
        with P.stream(hop):
            torch.ones(8, device=hop.device).mul_(2.0)
        target = self.rng.choice([s for s in streams if s != stream])
        target.wait_event(hop.record_event())
        dev.record_stream(target)
        return target

    def apply(self, op, dev, ref, stream):
        rng = self.rng
        if op in ("add", "mul"):
            c = rng.uniform(-2, 2)
            return (dev + c, ref + c) if op == "add" else (dev * c, ref * c)
        if op in ("relu", "tanh", "sigmoid"):
            fn = getattr(torch, op)
            return fn(dev), fn(ref)
        if op in ("sum", "mean", "amax"):
            dim = rng.randrange(2)
            fn = getattr(torch, op)
            return fn(dev, dim, keepdim=True), fn(ref, dim, keepdim=True)
        if op == "matmul":
            scale = 1.0 / max(1, ref.shape[1])
            return (dev @ dev.t()) * scale, (ref @ ref.t()) * scale
        if op == "transpose":
            return dev.t(), ref.t()
        if op == "slice":
            rows = ref.shape[0]
            a = rng.randrange(rows)
            b = rng.randint(a + 1, rows)
            return dev[a:b], ref[a:b]
        if op == "reshape":
            return dev.reshape(ref.shape[1], ref.shape[0]), ref.reshape(ref.shape[1], ref.shape[0])
        if op == "inplace_view":
            dev, ref = dev.clone(), ref.clone()  # own the storage before writing
            dev[:, :1].mul_(3.0)
            ref[:, :1].mul_(3.0)
            return dev, ref
        if op == "clone":
            return dev.clone(), ref.clone()
        if op == "copy_into":
            out = torch.empty(ref.shape, device=dev.device)
            out.copy_(dev)
            return out, ref.clone()
        if op == "other_device":
            if not self.hops:
                return dev.clone(), ref
            # On this thread's own stream there: another thread's failure
            # must not reach this chain through a shared stream.
            there_stream = self.hops[rng.choice(sorted(self.hops))]
            with P.stream(there_stream):
                there = dev.to(there_stream.device)
                return (there * 1.5).to(dev.device), ref * 1.5
        if op == "device_error":
            bad = torch.tensor([ref.shape[0] + 5], device=dev.device)
            try:
                dev[bad]  # fails on the device, on this stream
            except IndexError as error:  # or at the call, when the op waits
                if "out of bounds" not in str(error):
                    raise
                return dev, ref
            self.pending = stream
            return dev, ref
        if op == "shrunk_view":
            owner = dev.clone()
            view = owner[:]
            owner.untyped_storage().resize_(0)
            try:
                view + 1
            except RuntimeError as error:
                if "was the storage resized under a view" not in str(error):
                    raise
                self.refused_views += 1
                return dev, ref
            raise ChainFailure(f"{self.where()}: an op on a view past its storage was "
                               "not refused at the call")
        if op == "check_pinned":
            host = torch.empty(ref.shape, pin_memory=True)
            host.copy_(dev, non_blocking=True)
            stream.record_event().synchronize()
            self.check(host, ref, "a non_blocking copy into pinned memory")
            return dev, ref
        if op == "check_pageable":
            self.check(dev.cpu(), ref, "a copy to pageable memory")
            return dev, ref
        if op in ("h2d_pinned", "h2d_pageable"):
            # Combine with fresh data uploaded on this stream.
            other = self.fresh()[: ref.shape[0], : ref.shape[1]]
            other = torch.nn.functional.pad(
                other, (0, ref.shape[1] - other.shape[1], 0, ref.shape[0] - other.shape[0]))
            uploaded = self.upload(other, stream, pinned=op == "h2d_pinned")
            return dev + uploaded, ref + other
        raise AssertionError(f"unknown op {op}")


class Chaos:
    """Arms the kernel fault injector at random moments, with a new k each
    time (k is in the fault's message, so every report names its fault),
    once the previous fault has fired."""

    def __init__(self, seed, stop):
        self.rng = random.Random(seed - 1)
        self.stop = stop
        self.armed = None
        self.fired = set()
        self.next_k = 1

    def run(self):
        while not self.stop.wait(self.rng.uniform(0.2, 1.0)):
            if faults.armed()["kernel"] is not None:
                continue
            if self.armed is not None:
                self.fired.add(self.armed)
            self.armed = self.next_k
            self.next_k += 1
            faults.fail_kernel(self.armed)

    def finish(self):
        """After the workers stopped: disarm; what fired is final."""
        if faults.armed()["kernel"] is None and self.armed is not None:
            self.fired.add(self.armed)
        faults.reset()


def run_stress(seed, seconds, shrink_views=False):
    """The stress itself, in this process; raises AssertionError on any
    failure, with the seed. Returns the summary line."""
    replay = (f"seed={seed} duration={seconds:g}s (replay: PHANTOM_STRESS_SEED={seed} "
              f"PHANTOM_STRESS_SECONDS={seconds:g})")
    print(f"\nphantom stress (pid {os.getpid()}): {THREADS} threads, {replay}", flush=True)
    # The baseline must not count earlier tests' garbage: a reference cycle
    # holding a tensor that Python's collector frees during the run made the
    # end count fall below it (1024 != 2048 bytes in one CI run).
    gc.collect()
    for index in range(P.device_count()):
        P.synchronize(index)
    P.empty_cache()
    faults.reset()
    allocated = [P.memory_allocated(i) for i in range(P.device_count())]
    active = [P.memory_stats(i)["active.all.current"] for i in range(P.device_count())]

    stop = threading.Event()
    deadline = time.monotonic() + seconds
    workers = [Worker(i, seed, deadline, stop, shrink_views) for i in range(THREADS)]
    chaos = Chaos(seed, stop)
    failures = []

    def body(worker):
        try:
            worker.run()
        except BaseException as error:  # noqa: B902 -- reported below
            failures.append((worker.index, error))
            stop.set()

    threads = [threading.Thread(target=body, args=(w,), name=f"stress-{w.index}", daemon=True)
               for w in workers]
    chaos_thread = threading.Thread(target=chaos.run, name="stress-chaos", daemon=True)
    # Last resort, should the main thread itself hang in a sync: dump every
    # stack and exit instead of hanging CI.
    faulthandler.dump_traceback_later(seconds + 300, exit=True)
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        chaos_thread.start()
        for thread in threads:
            thread.join(timeout=max(1.0, deadline + 120 - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        stop.set()
        chaos_thread.join(timeout=10)
        if hung:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            raise AssertionError(f"deadlock: {hung} did not finish; stacks on stderr; {replay}")
        chaos.finish()
        elapsed = time.monotonic() - started
        chains = sum(w.chains for w in workers)
        ops = sum(w.ops for w in workers)
        failed = sum(w.failed_chains for w in workers)
        seen = [w.injected for w in workers]
        summary = (f"{chains} chains ({failed} failed on purpose, as they had to), {ops} ops, "
                   f"{len(chaos.fired)} injected faults fired, "
                   f"{sum(len(k) for k in seen)} reported, "
                   f"{sum(w.refused_views for w in workers)} views past their storage "
                   f"refused, in {elapsed:.1f}s; {replay}")
        print(f"phantom stress (pid {os.getpid()}): {summary}", flush=True)
        if failures:
            index, error = failures[0]
            raise AssertionError(f"thread {index} failed: {type(error).__name__}: {error}; "
                                 f"{replay}") from error
        assert chains >= THREADS, f"the threads ran almost nothing ({chains} chains); {replay}"
        everything = set().union(*seen)
        assert everything <= chaos.fired, (
            f"injected faults {sorted(everything - chaos.fired)} were reported but never "
            f"fired; {replay}")
        for a in range(len(seen)):
            for b in range(a + 1, len(seen)):
                assert not seen[a] & seen[b], (
                    f"injected faults {sorted(seen[a] & seen[b])} reached threads {a} and {b}; "
                    f"{replay}")

        for index in range(P.device_count()):
            P.synchronize(index)
        del workers, threads
        # A block freed after record_stream stays active until the allocator
        # next looks at its events (as in CUDA's allocator); empty_cache does.
        P.empty_cache()
        for index in range(P.device_count()):
            assert P.memory_allocated(index) == allocated[index], (
                f"phantom:{index}: memory_allocated {P.memory_allocated(index)} != "
                f"baseline {allocated[index]}; {replay}")
            now = P.memory_stats(index)["active.all.current"]
            assert now == active[index], (
                f"phantom:{index}: {now} active blocks != baseline {active[index]}; {replay}")
        return summary
    finally:
        faulthandler.cancel_dump_traceback_later()
        faults.reset()


def test_threads_streams_copies_events_and_failures_match_the_cpu():
    seed, seconds = _settings()
    child_seed = seed + 7919
    # The child runs the same stress (and views past their storage) in a
    # process of its own, at the same time, bounded; it prints its seed.
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", str(child_seed), f"{seconds:g}"],
        cwd=os.path.dirname(os.path.abspath(__file__)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        run_stress(seed, seconds)
    finally:
        try:
            output, _ = child.communicate(timeout=seconds + 240)
        except subprocess.TimeoutExpired:
            child.kill()
            output, _ = child.communicate()
            raise AssertionError(f"the child process (seed {child_seed}) did not finish:\n"
                                 f"{output[-6000:]}")
    assert child.returncode == 0, (
        f"the stress in a child process failed (exit code {child.returncode}; replay it with "
        f"PHANTOM_STRESS_SEED={child_seed} in `python {os.path.basename(__file__)} --child "
        f"{child_seed} {seconds:g}`):\n{output[-6000:]}")
    print(output.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    # python test_stress.py --child SEED SECONDS: the child process's run.
    if len(sys.argv) != 4 or sys.argv[1] != "--child":
        sys.exit(f"usage: {sys.argv[0]} --child SEED SECONDS")
    os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
    os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "1GiB")
    run_stress(int(sys.argv[2]), float(sys.argv[3]), shrink_views=True)
