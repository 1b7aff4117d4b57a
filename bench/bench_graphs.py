"""Graph replay on phantom against eager phantom and eager CPU, in one
process, reported as ratios (docs/graphs.md has the measurements).

Design. Each case is the same work in three arms: the CPU eager, phantom
eager (each op queued on the stream, the host paying dispatch and a
launch per op) and phantom graph replay (the ops captured once with
torch.phantom.graph, each sample one g.replay(), one launch for the whole
chain). A sample runs the work `inner` times and, on phantom, ends with
torch.phantom.synchronize(), so queued work is paid for. Arms are timed
in interleaved rounds (the order rotates each round) and each ratio is the
median over rounds of the two arms' quotient, which cancels most of the
machine's drift. No assertion is made: targets are checked by reading the
table.

Cases:
- chain: 200 elementwise ops (alternating add and mul by scalars) on
  1,000 floats;
- mlp: a 2-layer MLP of width 256 at batch 1 (forward only);
- decoder: a Transformer decoder layer (width 256, 4 heads) at batch 1, one
  decode step (one new token against 16 positions of memory).

With --nodes, each case's replay is also broken down node by node: 200
replays under torch.profiler (ProfilerActivity.PrivateUse1), each node's
device time (the fake's activity trace times every node of a replay) as
the median over replays, in capture order. The profiler adds its own cost
to every node, so the sum is above an unprofiled replay's time; the table
says where a replay's time goes, not what it costs.

    python bench/bench_graphs.py            # ~30 s
    python bench/bench_graphs.py --quick    # a few rounds, smoke test
    python bench/bench_graphs.py --nodes    # and a per-node table per case
"""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_phantom  # noqa: F401


def chain(x):
    for i in range(100):
        x = x + 0.001 * i
        x = x * 0.999
    return x


def make_mlp(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)
    )
    return model.to(device).eval()


def make_decoder(device):
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(
        256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
    return layer.to(device).eval()


def arms_for(case):
    if case == "chain":
        cpu_x = torch.randn(1000)
        ph_x = cpu_x.to("phantom")
        cpu_fn = lambda: chain(cpu_x)  # noqa: E731
        ph_fn = lambda: chain(ph_x)  # noqa: E731
    elif case == "decoder":
        cpu_model, ph_model = make_decoder("cpu"), make_decoder("phantom")
        cpu_t, cpu_m = torch.randn(1, 1, 256), torch.randn(1, 16, 256)
        ph_t, ph_m = cpu_t.to("phantom"), cpu_m.to("phantom")

        def cpu_fn():
            with torch.no_grad():
                return cpu_model(cpu_t, cpu_m)

        def ph_fn():
            with torch.no_grad():
                return ph_model(ph_t, ph_m)
    else:
        cpu_model, ph_model = make_mlp("cpu"), make_mlp("phantom")
        cpu_x = torch.randn(1, 256)
        ph_x = cpu_x.to("phantom")

        def cpu_fn():
            with torch.no_grad():
                return cpu_model(cpu_x)

        def ph_fn():
            with torch.no_grad():
                return ph_model(ph_x)

    # Warm up phantom eager on a side stream, as torch.cuda.graph advises.
    for _ in range(3):
        ph_fn()
    torch.phantom.synchronize()
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        out = ph_fn()
    g.replay()
    torch.phantom.synchronize()
    # The replay computes what eager computes.
    torch.testing.assert_close(out.cpu(), ph_fn().cpu())
    return {"cpu": cpu_fn, "phantom eager": ph_fn, "phantom graph": g.replay}


def node_times(replay, replays=200):
    """[(node name, median device us)] of one graph's nodes, in order, and
    the median device time of the whole replay."""
    with profile(activities=[ProfilerActivity.PrivateUse1]) as prof:
        for _ in range(replays):
            replay()
        torch.phantom.synchronize()
    events = sorted(
        (e for e in prof.events()
         if e.device_type != torch.autograd.DeviceType.CPU),
        key=lambda e: e.time_range.start)
    launches, nodes = [], []
    for e in events:
        if e.name == "ph_graph_launch":
            launches.append(e.time_range.end - e.time_range.start)
            nodes.append([])
        elif nodes:
            nodes[-1].append((e.name, e.time_range.end - e.time_range.start))
    per_node = []
    for i, (name, _) in enumerate(nodes[0]):
        per_node.append(
            (name, statistics.median(run[i][1] for run in nodes if len(run) > i)))
    return per_node, statistics.median(launches)


def sample(fn, inner, on_phantom):
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    if on_phantom:
        torch.phantom.synchronize()
    return time.perf_counter() - start


def run_case(case, rounds, inner):
    arms = arms_for(case)
    names = list(arms)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(sample(arms[name], inner, name != "cpu"))

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    per_call_us = {n: 1e6 * statistics.median(times[n]) / inner for n in names}
    return {
        "per call (us)": per_call_us,
        "phantom eager / graph": ratio("phantom eager", "phantom graph"),
        "cpu / graph": ratio("cpu", "phantom graph"),
        "phantom eager / cpu": ratio("phantom eager", "cpu"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", action="store_true",
                        help="also time each case's replay node by node")
    args = parser.parse_args()
    rounds, inner = (3, 5) if args.quick else (15, 30)
    torch.set_num_threads(1)
    for case in ("chain", "mlp", "decoder"):
        result = run_case(case, rounds, inner)
        per = result["per call (us)"]
        print(f"{case}: per call cpu {per['cpu']:.0f} us, phantom eager "
              f"{per['phantom eager']:.0f} us, phantom graph "
              f"{per['phantom graph']:.0f} us")
        for key in ("phantom eager / graph", "cpu / graph", "phantom eager / cpu"):
            print(f"  {key}: {result[key]:.2f}x")
        if args.nodes:
            per_node, launch = node_times(arms_for(case)["phantom graph"])
            print(f"  nodes of one replay (profiled, median us; the replay "
                  f"{launch:.1f} us):")
            if len(per_node) > 40:  # the chain: by op
                by_name = {}
                for name, us in per_node:
                    count, total = by_name.get(name, (0, 0.0))
                    by_name[name] = (count + 1, total + us)
                for name, (count, total) in by_name.items():
                    print(f"    {count:3d} x {name:36s} {total:8.2f} in all")
            else:
                for i, (name, us) in enumerate(per_node):
                    print(f"    {i:3d} {name:40s} {us:8.2f}")


if __name__ == "__main__":
    main()
