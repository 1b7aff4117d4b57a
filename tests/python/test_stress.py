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
import sys
import threading
import time

import torch

P = torch.phantom
THREADS = 4
STREAMS_PER_THREAD = 3
MAX_CHAIN = 24


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
           "copy_into", "other_device", "switch_stream", "check_pinned",
           "check_pageable", "h2d_pinned", "h2d_pageable")

    def __init__(self, index, seed, deadline, stop):
        self.index = index
        self.rng = random.Random(seed + index)
        self.deadline = deadline
        self.stop = stop
        self.device = index % P.device_count()
        self.chains = 0
        self.ops = 0
        self.history = []

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
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise ChainFailure(
                f"thread {self.index}, chain {self.chains}: {how} differs from the CPU "
                f"after ops {self.history}: max abs diff "
                f"{(got - want).abs().max().item() if got.shape == want.shape else 'shape'} "
                f"(shape {tuple(got.shape)} vs {tuple(want.shape)})")

    def run(self):
        streams = [P.Stream(self.device, priority=-(i % 2)) for i in range(STREAMS_PER_THREAD)]
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            self.chain(streams)
            self.chains += 1

    def chain(self, streams):
        rng = self.rng
        stream = rng.choice(streams)
        ref = self.fresh()
        dev = self.upload(ref, stream, pinned=rng.random() < 0.5)
        self.history = ["upload"]
        for _ in range(rng.randint(1, MAX_CHAIN)):
            op = rng.choice(self.OPS)
            self.history.append(op)
            self.ops += 1
            with P.stream(stream):
                if op == "switch_stream":
                    target = rng.choice([s for s in streams if s != stream])
                    target.wait_event(stream.record_event())
                    dev.record_stream(target)
                    stream = target
                else:
                    dev, ref = self.apply(op, dev, ref, stream)
        with P.stream(stream):
            self.check(dev.cpu(), ref, "the chain's result")

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
            others = [d for d in range(P.device_count()) if d != self.device]
            if not others:
                return dev.clone(), ref
            there = dev.to(f"phantom:{rng.choice(others)}")
            return (there * 1.5).to(dev.device), ref * 1.5
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


def test_threads_streams_copies_and_events_match_the_cpu():
    seed, seconds = _settings()
    replay = (f"seed={seed} duration={seconds:g}s (replay: PHANTOM_STRESS_SEED={seed} "
              f"PHANTOM_STRESS_SECONDS={seconds:g})")
    print(f"\nphantom stress: {THREADS} threads, {replay}", flush=True)
    # The baseline must not count earlier tests' garbage: a reference cycle
    # holding a tensor that Python's collector frees during the run made the
    # end count fall below it (1024 != 2048 bytes in one CI run).
    gc.collect()
    for index in range(P.device_count()):
        P.synchronize(index)
    P.empty_cache()
    allocated = [P.memory_allocated(i) for i in range(P.device_count())]
    active = [P.memory_stats(i)["active.all.current"] for i in range(P.device_count())]

    stop = threading.Event()
    deadline = time.monotonic() + seconds
    workers = [Worker(i, seed, deadline, stop) for i in range(THREADS)]
    failures = []

    def body(worker):
        try:
            worker.run()
        except BaseException as error:  # noqa: B902 -- reported below
            failures.append((worker.index, error))
            stop.set()

    threads = [threading.Thread(target=body, args=(w,), name=f"stress-{w.index}", daemon=True)
               for w in workers]
    # Last resort, should the main thread itself hang in a sync: dump every
    # stack and exit instead of hanging CI.
    faulthandler.dump_traceback_later(seconds + 300, exit=True)
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=max(1.0, deadline + 120 - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        if hung:
            stop.set()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            raise AssertionError(f"deadlock: {hung} did not finish; stacks on stderr; {replay}")
        elapsed = time.monotonic() - started
        chains = sum(w.chains for w in workers)
        ops = sum(w.ops for w in workers)
        print(f"phantom stress: {chains} chains, {ops} ops in {elapsed:.1f}s; {replay}", flush=True)
        if failures:
            index, error = failures[0]
            raise AssertionError(f"thread {index} failed: {type(error).__name__}: {error}; "
                                 f"{replay}") from error
        assert chains >= THREADS, f"the threads ran almost nothing ({chains} chains); {replay}"

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
    finally:
        faulthandler.cancel_dump_traceback_later()
