"""Plots bench/results/distributed.json (written by bench/bench_distributed.py)
into docs/img/:

  distributed_allreduce.png  all-reduce bus bandwidth by size, Gloo on CPU
                             tensors and pccl on phantom tensors, and their
                             ratio with the 0.8 target from 1 MiB up
  distributed_ddp.png        DDP training step time per model, CPU and phantom
                             (and the DLRM step without DDP, both ranks at once)

    python bench/plot_distributed.py [--results bench/results/distributed.json]
    python bench/plot_distributed.py --markdown    # the tables of docs/performance.md
"""

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def subtitle(data):
    m = data["machine"]
    return (f"{m['cpu_model']}, {m['cpu_count']} cores, world {m.get('world_size', 2)}, "
            f"torch {m['torch']}, phantom {m['phantom_commit'][:10]}, {m['date'][:10]}")


def size_label(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def markdown(data):
    rows = [r for r in data["results"] if r["benchmark"] == "allreduce"]
    if rows:
        print("| size | Gloo, CPU tensors | pccl, phantom tensors | phantom / CPU bandwidth |")
        print("|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {size_label(r['bytes'])} | {r['cpu_busbw_gbs']:.3f} GB/s "
                  f"| {r['phantom_busbw_gbs']:.3f} GB/s | {r['bandwidth_ratio']:.2f} |")
        print()
    rows = [r for r in data["results"] if r["benchmark"] == "ddp"]
    if rows:
        print("| model | CPU step | phantom step | phantom / CPU "
              "| CPU time per step, CPU | CPU time per step, phantom |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            # Runs before the benchmark recorded CPU time have none.
            cost = [f"{r[k]['cpu_time_s'] * 1e3:.2f} ms" if k in r else "-"
                    for k in ("cpu_arm_cost", "phantom_arm_cost")]
            print(f"| {r['model']} | {r['cpu_s'] * 1e3:.2f} ms | {r['phantom_s'] * 1e3:.2f} ms "
                  f"| {r['ratio']:.2f} | {cost[0]} | {cost[1]} |")


def plot(data, outdir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["results"] if r["benchmark"] == "allreduce"]
    if rows:
        figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                             gridspec_kw={"height_ratios": [2, 1]})
        sizes = [r["bytes"] for r in rows]
        top.plot(sizes, [r["cpu_busbw_gbs"] for r in rows], marker="o", label="Gloo, CPU tensors")
        top.plot(sizes, [r["phantom_busbw_gbs"] for r in rows], marker="o",
                 label="pccl, phantom tensors")
        top.set_xscale("log", base=2)
        top.set_ylabel("bus bandwidth (GB/s)")
        top.set_title("all_reduce (sum, float32), 2 ranks on one machine\n" + subtitle(data),
                      fontsize=9)
        top.legend(fontsize=8)
        top.grid(True, which="both", alpha=0.3)
        bottom.plot(sizes, [r["bandwidth_ratio"] for r in rows], marker="o", color="black")
        bottom.plot([1 << 20, max(sizes)], [0.8, 0.8], color="grey", linestyle="--",
                    label="target 0.8 (from 1 MiB)")
        bottom.axhline(1.0, color="black", linewidth=0.6)
        bottom.set_ylabel("phantom / CPU")
        bottom.set_xlabel("bytes per rank")
        bottom.set_xticks(sizes, [size_label(s) for s in sizes], rotation=45, fontsize=7)
        bottom.legend(fontsize=8)
        bottom.grid(True, alpha=0.3)
        figure.tight_layout()
        figure.savefig(outdir / "distributed_allreduce.png", dpi=110)
        plt.close(figure)

    rows = [r for r in data["results"] if r["benchmark"] == "ddp"]
    if rows:
        figure, axis = plt.subplots(figsize=(7, 3.8))
        names = [r["model"] for r in rows]
        xs = range(len(rows))
        axis.bar([x - 0.2 for x in xs], [r["cpu_s"] * 1e3 for r in rows], 0.4, label="CPU (Gloo)")
        axis.bar([x + 0.2 for x in xs], [r["phantom_s"] * 1e3 for r in rows], 0.4,
                 label="phantom (pccl)")
        for x, r in zip(xs, rows):
            axis.annotate(f"{r['ratio']:.2f}x", (x + 0.2, r["phantom_s"] * 1e3),
                          ha="center", va="bottom", fontsize=8)
        axis.set_yscale("log")
        axis.set_xticks(list(xs), names)
        axis.set_ylabel("ms per DDP step (log)")
        axis.set_title("DDP training step, 2 ranks (target: phantom <= 1.1x CPU)\n"
                       + subtitle(data), fontsize=9)
        axis.legend(fontsize=8)
        axis.grid(True, axis="y", alpha=0.3)
        figure.tight_layout()
        figure.savefig(outdir / "distributed_ddp.png", dpi=110)
        plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "bench" / "results" / "distributed.json"))
    parser.add_argument("--outdir", default=str(ROOT / "docs" / "img"))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    data = json.loads(pathlib.Path(args.results).read_text())
    if args.markdown:
        markdown(data)
    else:
        outdir = pathlib.Path(args.outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        plot(data, outdir)


if __name__ == "__main__":
    main()
