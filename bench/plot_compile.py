"""Plots bench/results/compile.json (written by bench/bench_compile.py) into
docs/img/compile.png, and prints the tables of docs/performance.md's
"torch.compile" section with --markdown.

compile.png: time per call of each case, one bar per arm (compiled and,
for the pointwise chain, eager, on phantom and on the CPU), each case
scaled to its compiled-CPU time; the ratios judged against a target are
written on the bars.

    python bench/plot_compile.py [--results bench/results/compile.json]
    python bench/plot_compile.py --markdown
"""

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def fmt_time(seconds):
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def markdown(data):
    m = data["machine"]
    lines = [
        f"Taken on {m['cpu_model']} ({m['cpu_count']} cores, torch {m['torch']}, "
        f"{m['torch_threads']} threads), phantom commit `{m['phantom_commit'][:12]}`, "
        f"{m['date']}, load average {m['load_average_at_start'][0]:.1f} at start and "
        f"{m['load_average_at_end'][0]:.1f} at end, env {m['env']}.",
        "",
        "| case | arm | time per call |",
        "|---|---|---:|",
    ]
    for row in data["results"]:
        for arm, seconds in row["median_s"].items():
            lines.append(f"| {row['case']} | {arm} | {fmt_time(seconds)} |")
    lines += ["", "| case | ratio | value | target | met |", "|---|---|---:|---|---|"]
    for row in data["results"]:
        for r in row["ratios"]:
            target = "—" if r["target"].endswith("inf") else r["target"]
            met = "—" if target == "—" else ("yes" if r["met"] else "**no**")
            lines.append(f"| {row['case']} | {r['numerator']} / {r['denominator']} | "
                         f"{r['ratio']:.2f} | {target} | {met} |")
    return "\n".join(lines)


def plot(data, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["results"] if r["case"] != "launch"]
    figure, axis = plt.subplots(figsize=(7.5, 4.2))
    arms = ["compiled phantom", "compiled cpu", "eager phantom", "eager cpu"]
    colors = {"compiled phantom": "#1f77b4", "compiled cpu": "#ff7f0e",
              "eager phantom": "#aec7e8", "eager cpu": "#ffbb78"}
    width = 0.2
    for i, row in enumerate(rows):
        base = row["median_s"]["compiled cpu"]
        present = [a for a in arms if a in row["median_s"]]
        for j, arm in enumerate(present):
            x = i + (j - (len(present) - 1) / 2) * width
            value = row["median_s"][arm] / base
            axis.bar(x, value, width, color=colors[arm],
                     label=arm if i == 0 or arm not in [a for r in rows[:i] for a in r["median_s"]]
                     else None)
            axis.text(x, value, fmt_time(row["median_s"][arm]), ha="center",
                      va="bottom", fontsize=6, rotation=90)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.axhline(1.1, color="grey", linestyle="--", linewidth=1,
                 label="target: compiled phantom <= 1.1 x compiled cpu")
    axis.set_xticks(range(len(rows)))
    axis.set_xticklabels([r["case"] for r in rows])
    axis.set_ylabel("time per call / compiled cpu's")
    m = data["machine"]
    axis.set_title("torch.compile: phantom against the CPU\n"
                   f"{m['cpu_model']}, {m['cpu_count']} cores, torch {m['torch']}, "
                   f"phantom {m['phantom_commit'][:10]}, {m['date'][:10]}", fontsize=9)
    handles, labels = axis.get_legend_handles_labels()
    seen = {}
    for h, lab in zip(handles, labels):
        seen.setdefault(lab, h)
    axis.legend(seen.values(), seen.keys(), fontsize=7)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "bench/results/compile.json"))
    parser.add_argument("--outdir", default=str(ROOT / "docs/img"))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    data = json.loads(pathlib.Path(args.results).read_text())
    if args.markdown:
        print(markdown(data))
        return
    plot(data, pathlib.Path(args.outdir) / "compile.png")


if __name__ == "__main__":
    main()
