"""The performance suite's judging and publishing rules (bench/bench_perf.py
runs the benchmarks; this says which ratio each target judges and whether
a result may be published).

Design. Every row of a run carries phantom's time over the CPU's. A target
(TARGETS, from the performance issues) judges one ratio per row: the fair
one, the CPU at its best (docs/performance.md, "Fair arms"). Rows marked
as context are shown and not judged; the first operation is judged by
phantom's extra milliseconds, not a ratio; training is judged by the ratio of
each device alone in its own processes, the in-process ratio being
context; scaling is judged only above SCALING_JUDGED_ABOVE elements.
tree_state() tells the commit a run measured and the tracked files it did
not include, so a published result always names clean code.
"""
import pathlib
import statistics
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Targets from the performance issues: (comparison, bound) on the judged
# ratio (row["ratio"]; phantom time / CPU time, lower is better).
TARGETS = {
    "small_ops": ("<=", 1.5),
    "scaling": ("<=", 1.05),  # only judged above 10^6 elements
    "large_ops": ("<=", 1.05),
    "training": ("<=", 1.1),  # each alone (fair); in one process is context
    "copies": ("<=", 1.05),   # pinned H2D/D2H against CPU copy_
    "waits": ("<=", 2.0),     # quiet machine
    "waits_loaded": ("<=", 3.0),  # one busy process running
    "add_chain": ("<=", 1.2),
    "first_op": ("<=", 50),   # phantom's extra ms over the CPU, not a ratio
}
SCALING_JUDGED_ABOVE = 10**6


def target_label(bench):
    """The target as text: "<= 1.05", or "<= 50 ms extra" for first_op."""
    op, bound = TARGETS[bench]
    return f"{op} {bound}" + (" ms extra" if bench == "first_op" else "")


def judge(results):
    """Adds `target`, `judged_ratio` and `met` to each judged row; returns a
    summary per benchmark. Training is judged by its "each alone" ratio
    (the in-process one is context, summarised as training_in_process);
    rows marked as context are shown, not judged."""
    summary = {}

    def count(key, target, ratio, met):
        entry = summary.setdefault(key, {"target": target, "met": 0, "total": 0,
                                         "ratios": []})
        entry["total"] += 1
        entry["met"] += met
        entry["ratios"].append(ratio)

    for row in results:
        bench = row["benchmark"]
        if bench not in TARGETS:
            continue
        op, bound = TARGETS[bench]
        target = target_label(bench)

        def meets(ratio):
            return ratio <= bound if op == "<=" else ratio >= bound
        if bench == "scaling" and (row["size"] or 0) <= SCALING_JUDGED_ABOVE:
            row["target"] = None  # small sizes are shown, not judged
            continue
        if row.get("context") or (bench == "copies" and not row.get("judged")):
            row["target"] = None
            continue
        if bench == "training":
            # In one process: context (OMP_WAIT_POLICY=PASSIVE, shared cores).
            row["met_in_process"] = meets(row["ratio"])
            count("training_in_process (context)", target, row["ratio"],
                  row["met_in_process"])
            if not row.get("alone_ratio"):
                row["target"] = None  # the children failed: nothing fair to judge
                continue
            judged = row["alone_ratio"]
            row["met_alone"] = meets(judged)
        elif bench == "first_op":
            judged = row["extra_ms"]
        else:
            judged = row["ratio"]
        if bench == "copies":
            # Beside it, the issue's own yardstick: a CPU copy_ alone.
            count("copies_vs_copy_ (context)", target, row["ratio_to_cpu_copy"],
                  meets(row["ratio_to_cpu_copy"]))
        row["target"] = target
        row["judged_ratio"] = judged
        row["met"] = meets(judged)
        count(bench, target, judged, row["met"])
    for entry in summary.values():
        entry["median_ratio"] = statistics.median(entry.pop("ratios"))
    return summary


def tree_state():
    """(commit, dirty files): HEAD and the tracked files with uncommitted
    changes, leaving out the suite's own outputs (results, plots, the
    generated results page), which a run rewrites."""
    def git(*cmd):
        try:
            return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True,
                                  text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    outputs = ("bench/results/", "docs/img/", "docs/performance-results.md")
    dirty = [line[3:] for line in git("status", "--porcelain",
                                      "--untracked-files=no").splitlines()
             if line[3:] and not line[3:].startswith(outputs)]
    return git("rev-parse", "HEAD").strip() or "unknown", dirty
