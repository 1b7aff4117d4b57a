"""Plots bench/results/perf.json (written by bench/bench_perf.py) into
docs/img/:

  perf_scaling.png   phantom/CPU time ratio against tensor size (log x), one
                     line per op, with the 1.05 target drawn from 10^6 up
  perf_training.png  time per training step, phantom and CPU bars per model

    python bench/plot_perf.py [--results bench/results/perf.json]
    python bench/plot_perf.py --markdown     # the tables of docs/performance-results.md
"""

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def commit_label(machine, digits=12):
    """The measured commit, shortened, with its "+dirty" mark kept: a
    result from uncommitted code must say so wherever it is shown."""
    commit = machine["phantom_commit"]
    return commit[:digits] + ("+dirty" if commit.endswith("+dirty") else "")


def subtitle(data):
    m = data["machine"]
    return (f"{m['cpu_model']}, {m['cpu_count']} cores, {m['torch_threads']} threads, "
            f"torch {m['torch']}, phantom {commit_label(m, 10)}, {m['date'][:10]}")


def pyplot():
    """matplotlib's pyplot, imported only to plot: --markdown needs none."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_scaling(data, out):
    plt = pyplot()
    rows = [r for r in data["results"] if r["benchmark"] == "scaling"]
    if not rows:
        return False
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for op in dict.fromkeys(r["op"] for r in rows):
        part = [r for r in rows if r["op"] == op]
        points = sorted((r["size"], r["ratio"]) for r in part)
        context = any(r.get("context") for r in part)  # shown, not judged
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                  label=op + (" (context: fresh output)" if context else ""),
                  linestyle="--" if context else "-", alpha=0.6 if context else 1.0)
    axis.axhline(1.0, color="black", linewidth=0.8)
    top = max(r["size"] for r in rows)
    axis.plot([1e6, top], [1.05, 1.05], color="grey", linestyle="--",
              linewidth=1, label="target 1.05 (> 10^6)")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("elements per tensor")
    axis.set_ylabel("time phantom / time CPU (log)")
    axis.set_title("phantom against the CPU by size\n" + subtitle(data), fontsize=9)
    axis.legend(fontsize=8)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return True


def plot_training(data, out):
    plt = pyplot()
    rows = [r for r in data["results"] if r["benchmark"] == "training"]
    if not rows:
        return False
    figure, axis = plt.subplots(figsize=(7, 4))
    names = [r["case"] for r in rows]
    xs = range(len(rows))
    # Each device alone (judged) first when measured, then in one process
    # (context).
    pairs = [("phantom_s", "cpu_s", "ratio", "", 1.0)]
    if all(r.get("alone_ratio") for r in rows):
        pairs = [("phantom_alone_s", "cpu_alone_s", "alone_ratio", ", each alone (judged)", 1.0),
                 ("phantom_s", "cpu_s", "ratio", ", one process (context)", 0.45)]
    width = 0.8 / (2 * len(pairs))
    for p, (ph, cpu, ratio, label, alpha) in enumerate(pairs):
        left = -0.4 + 2 * p * width + width / 2
        axis.bar([x + left for x in xs], [r[ph] * 1e3 for r in rows], width,
                 label="phantom" + label, color="tab:blue", alpha=alpha)
        axis.bar([x + left + width for x in xs], [r[cpu] * 1e3 for r in rows], width,
                 label="CPU" + label, color="tab:orange", alpha=alpha)
        for x, r in zip(xs, rows):
            axis.text(x + left + width / 2, max(r[ph], r[cpu]) * 1e3, f"{r[ratio]:.2f}x",
                      ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(xs))
    axis.set_xticklabels(names)
    axis.set_ylabel("ms per training step (median)")
    axis.set_title("training step: forward, backward, optimizer\n" + subtitle(data),
                   fontsize=9)
    axis.legend(fontsize=8)
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return True


def fmt(seconds):
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def rounds_text(data):
    """How many rounds each case got: a fixed count in results taken before
    the rounds grew with a time budget, else the range actually used."""
    counts = [r["rounds"] for r in data["results"] if "rounds" in r]
    if not counts:
        return str(data["reps"])
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def markdown(data):
    """The results as markdown tables, one per benchmark."""
    m = data["machine"]
    print(f"Taken on {m['cpu_model']} ({m['cpu_count']} cores, torch {m['torch']}, "
          f"{m['torch_threads']} threads), phantom commit `{commit_label(m)}`, "
          f"{m['date']}, "
          + (f"cpuidle {m['cpuidle_driver']} with guest_halt_poll_ns {m['guest_halt_poll_ns']}, "
             if m.get("cpuidle_driver") else "")
          + f"load average {m['load_average_at_start'][0]:.1f} at start and "
          f"{m['load_average_at_end'][0]:.1f} at end, env {m.get('env', {})}, "
          f"medians of {rounds_text(data)} interleaved rounds per case"
          + (f", inputs built again every {data['remake_every']} rounds"
             if data.get("remake_every") else "")
          + (", ratios the median over blocks of rounds (one per arm order)"
             if any("ratio_per_round" in r for r in data["results"]) else
             ", ratios the median of the rounds' ratios"
             if any("ratio_of_medians" in r for r in data["results"]) else "")
          + (f", {m['steal_fraction']:.0%} of the CPU time stolen by the hypervisor"
             if m.get("steal_fraction") is not None else "") + ".\n")
    rows = data["results"]

    def judged(r):
        target = r.get("target")
        if not target:
            return r.get("context") and "(context)" or "(not judged)"
        return f"{target}{' met' if r.get('met') else ' **not met**'}"

    for bench in ("small_ops", "scaling", "large_ops", "waits", "add_chain",
                  "waits_loaded"):
        part = [r for r in rows if r["benchmark"] == bench]
        if not part:
            continue
        if bench == "scaling":
            print("![phantom/CPU ratio against size](img/perf_scaling.png)\n")
        control = any("control_ratio" in r for r in part)
        default_alloc = any(r.get("ratio_cpu_default_alloc") for r in part)
        print(f"| {bench} | phantom | CPU | phantom/CPU | target |"
              + (" context: phantom / CPU with torch's default allocation (4 KiB pages) |"
                 if default_alloc else "")
              + (" noise floor (CPU copy 2 / copy 1) |" if control else ""))
        print("|---|---:|---:|---:|---|" + ("---:|" if default_alloc else "")
              + ("---:|" if control else ""))
        for r in part:
            extra = ""
            if default_alloc:
                c = r.get("ratio_cpu_default_alloc")
                extra += f" {c:.2f} |" if c else " ? |"
            if control:
                extra += (f" {r['control_ratio']:.2f} |" if "control_ratio" in r
                          else " |")
            print(f"| {r['case']} | {fmt(r['phantom_s'])} | {fmt(r['cpu_s'])} | "
                  f"{r['ratio']:.2f} | {judged(r)} |" + extra)
        print()
    part = [r for r in rows if r["benchmark"] == "training"]
    if part:
        print("![time per training step, in one process and each "
              "alone](img/perf_training.png)\n")
        # Judged: each device alone (own processes, OpenMP default policy).
        print("| training | CPU alone | phantom alone | phantom/CPU, each alone | target |"
              " phantom alone, backward on the caller: ratio |"
              " context, in one process: phantom | CPU | phantom/CPU |"
              " noise floor (CPU copy 2 / copy 1) |")
        print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        for r in part:
            a, pa, ar = r.get("cpu_alone_s"), r.get("phantom_alone_s"), r.get("alone_ratio")
            car = r.get("caller_alone_ratio")
            noise = r.get("control_ratio")
            print(f"| {r['case']} | {fmt(a) if a else '?'} | {fmt(pa) if pa else '?'} | "
                  f"{f'{ar:.2f}' if ar else '?'} | {judged(r)} | "
                  f"{f'{car:.2f}' if car else '-'} | {fmt(r['phantom_s'])} | "
                  f"{fmt(r['cpu_s'])} | {r['ratio']:.2f} | "
                  f"{f'{noise:.2f}' if noise else ''} |")
        print()
    part = [r for r in rows if r["benchmark"] == "copies"]
    if part:
        if "cpu_copy_gb_s" in part[0]:
            print("| copy | phantom GB/s | best CPU GB/s | phantom/best CPU time | target |"
                  " CPU copy_ GB/s | memcpy (one thread) GB/s | phantom/copy_ time |")
            print("|---|---:|---:|---:|---|---:|---:|---:|")
            for r in part:
                print(f"| {r['case']} | {r['phantom_gb_s']:.2f} | {r['best_cpu_gb_s']:.2f} | "
                      f"{r['ratio']:.2f} | {judged(r)} | {r['cpu_copy_gb_s']:.2f} | "
                      f"{r['memcpy_gb_s']:.2f} | {r['ratio_to_cpu_copy']:.2f} |")
        else:  # results from before copies were judged against copy_
            print("| copy | phantom GB/s | memcpy GB/s | phantom/memcpy bandwidth | target |")
            print("|---|---:|---:|---:|---|")
            for r in part:
                print(f"| {r['case']} | {r['phantom_gb_s']:.2f} | {r['memcpy_gb_s']:.2f} | "
                      f"{r['ratio']:.2f} | {judged(r)} |")
        print()
    part = [r for r in rows if r["benchmark"] == "first_op"]
    if part:
        print("| first operation, fresh process | CPU | phantom | phantom's extra | target |"
              " imported on phantom only |")
        print("|---|---:|---:|---:|---|---|")
        for r in part:
            before = " (after `import torch._dynamo` on both)" if r.get("imported_before") else ""
            print(f"| {r['case']}{before} | {r['cpu_ms']:.1f} ms | {r['phantom_ms']:.1f} ms | "
                  f"{r['extra_ms']:.1f} ms | {judged(r)} | "
                  f"{', '.join(r.get('phantom_only_packages') or []) or '-'} |")
        print()
    part = [r for r in rows if r["benchmark"] == "breakdown"]
    if part:
        print("| one torch.add, 1,000 floats | ns per op (best) |")
        print("|---|---:|")
        for r in part:
            print(f"| {r['case'].strip()} | {r['ns_per_op']:.0f} |")
        print()
    print("| benchmark | target | median ratio (first_op: extra ms) | cases met |")
    print("|---|---|---:|---:|")
    for bench, e in data["summary"].items():
        print(f"| {bench} | {e['target']} | {e['median_ratio']:.2f} | {e['met']}/{e['total']} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "bench/results/perf.json"))
    parser.add_argument("--outdir", default=str(ROOT / "docs/img"))
    parser.add_argument("--markdown", action="store_true",
                        help="print the results as markdown tables instead of plotting")
    args = parser.parse_args(argv)
    data = json.loads(pathlib.Path(args.results).read_text())
    if args.markdown:
        markdown(data)
        return
    outdir = pathlib.Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for name, plot in (("perf_scaling.png", plot_scaling),
                       ("perf_training.png", plot_training)):
        if plot(data, outdir / name):
            print(f"wrote {outdir / name}")
        else:
            print(f"({name}: no such results in {args.results})")


if __name__ == "__main__":
    main()
