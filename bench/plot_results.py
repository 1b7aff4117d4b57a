"""Plots bench/results/copies.json: time ratio phantom / CPU copy_ against
transfer size, one line per copy kind, into docs/img/copies.png."""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> None:
    data = json.loads((ROOT / "bench/results/copies.json").read_text())
    sizes = [row["size_mib"] for row in data["results"]]
    figure, axis = plt.subplots(figsize=(7, 4))
    for case in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d"):
        ratios = [row["cases"][case]["time_ratio_to_cpu_copy"] for row in data["results"]]
        axis.plot(sizes, ratios, marker="o", label=case.replace("_", " "))
    axis.axhline(1.05, color="grey", linestyle="--", linewidth=1,
                 label="target 1.05 (pinned)")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("transfer size (MiB)")
    axis.set_ylabel("time / CPU copy_ time (lower is faster)")
    axis.set_title("phantom copies against a CPU copy_ (median of interleaved runs)")
    axis.legend(fontsize=8)
    axis.grid(True, alpha=0.3)
    out = ROOT / "docs/img/copies.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
