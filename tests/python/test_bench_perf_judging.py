"""The performance suite's judging and publishing rules (bench/perf_judging.py,
bench/plot_perf.py): which ratio each target judges, that context rows are
shown but not judged, and that the published result names its commit and
is not written from uncommitted code unless marked +dirty."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

bench_perf = pytest.importorskip("bench_perf")
import plot_perf  # noqa: E402


def test_training_is_judged_each_alone_and_the_in_process_ratio_is_context():
    rows = [{"benchmark": "training", "case": "mlp", "size": None,
             "ratio": 0.43, "alone_ratio": 1.2}]
    summary = bench_perf.judge(rows)
    assert rows[0]["judged_ratio"] == 1.2
    assert rows[0]["met"] is False  # 1.2 > 1.1, though 0.43 in one process
    assert summary["training"]["median_ratio"] == 1.2
    assert summary["training_in_process (context)"]["median_ratio"] == 0.43


def test_fresh_output_add_and_unpinned_copies_are_shown_not_judged():
    rows = [
        {"benchmark": "scaling", "case": "add 1e+07", "size": 10**7, "ratio": 0.2,
         "context": bench_perf.CONTEXT_FRESH_OUTPUT},
        {"benchmark": "scaling", "case": "add out= 1e+07", "size": 10**7, "ratio": 0.99},
        {"benchmark": "copies", "case": "d2d 64 MiB", "size": 64 << 20, "ratio": 2.0,
         "judged": False, "ratio_to_cpu_copy": 2.0},
        {"benchmark": "copies", "case": "h2d_pinned 64 MiB", "size": 64 << 20,
         "ratio": 1.2, "judged": True, "ratio_to_cpu_copy": 0.9},
    ]
    summary = bench_perf.judge(rows)
    assert rows[0]["target"] is None and "met" not in rows[0]
    assert rows[2]["target"] is None and "met" not in rows[2]
    assert summary["scaling"]["total"] == 1 and summary["scaling"]["met"] == 1
    # Pinned copies: judged against the CPU's best copy (1.2: not met),
    # while the ratio to copy_ alone is summarised as context.
    assert summary["copies"]["total"] == 1 and summary["copies"]["met"] == 0
    assert summary["copies_vs_copy_ (context)"]["met"] == 1


def test_the_published_result_is_refused_from_a_dirty_tree(monkeypatch, capsys):
    monkeypatch.setattr(bench_perf, "tree_state",
                        lambda: ("0123456789abcdef", ["device/fake/copy_channels.cc"]))
    with pytest.raises(SystemExit) as exit_info:
        bench_perf.main(["--out", str(bench_perf.PUBLISHED), "--only", "copies"])
    message = str(exit_info.value.code)
    assert "uncommitted changes" in message
    assert "device/fake/copy_channels.cc" in message
    assert "--allow-dirty" in message


def test_the_plots_and_tables_keep_the_dirty_mark():
    machine = {"phantom_commit": "0123456789abcdef0123+dirty"}
    assert plot_perf.commit_label(machine) == "0123456789ab+dirty"
    assert plot_perf.commit_label({"phantom_commit": "0123456789abcdef"}) == "0123456789ab"
