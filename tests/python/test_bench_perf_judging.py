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


def test_first_op_is_judged_by_phantoms_extra_milliseconds_not_its_ratio():
    rows = [{"benchmark": "first_op", "case": "randn", "size": None,
             "cpu_ms": 1.0, "phantom_ms": 40.0, "extra_ms": 39.0, "ratio": 40.0},
            {"benchmark": "first_op", "case": "conv2d", "size": None,
             "cpu_ms": 100.0, "phantom_ms": 160.0, "extra_ms": 60.0, "ratio": 1.6}]
    summary = bench_perf.judge(rows)
    assert rows[0]["met"] is True   # 40x the CPU, but 39 ms extra: within 50
    assert rows[1]["met"] is False  # 1.6x the CPU, but 60 ms extra
    assert rows[0]["target"] == "<= 50 ms extra"
    assert summary["first_op"]["median_ratio"] == pytest.approx(49.5)


def test_waits_are_judged_quiet_and_loaded_with_their_own_bounds():
    rows = [{"benchmark": "waits", "case": "LBFGS", "size": None, "ratio": 2.5},
            {"benchmark": "waits_loaded", "case": "LBFGS, +1 busy process",
             "size": None, "ratio": 2.5},
            {"benchmark": "waits_loaded", "case": "add chain, +1 busy process",
             "size": None, "ratio": 1.5, "context": True},
            {"benchmark": "add_chain", "case": "add chain", "size": None, "ratio": 1.25}]
    summary = bench_perf.judge(rows)
    assert rows[0]["met"] is False  # quiet: <= 2
    assert rows[1]["met"] is True   # one busy process: <= 3
    assert rows[2]["target"] is None and "met" not in rows[2]
    assert rows[3]["met"] is False  # the chain: <= 1.2
    assert summary["waits_loaded"]["total"] == 1


def test_the_tables_show_the_waits_and_the_first_operation(capsys):
    data = {"machine": {"cpu_model": "x", "cpu_count": 2, "torch": "2.13", "torch_threads": 2,
                        "phantom_commit": "0123456789abcdef", "date": "d",
                        "load_average_at_start": [0.5], "load_average_at_end": [0.6]},
            "reps": 5, "summary": {},
            "results": [{"benchmark": "waits", "case": "item loop, per call",
                         "phantom_s": 6e-6, "cpu_s": 3e-6, "ratio": 2.0, "rounds": 40,
                         "target": "<= 2.0", "met": True},
                        {"benchmark": "first_op", "case": "train_step", "cpu_ms": 6.0,
                         "phantom_ms": 30.0, "extra_ms": 24.0, "ratio": 5.0,
                         "imported_before": "import torch._dynamo",
                         "phantom_only_packages": [], "target": "<= 50 ms extra",
                         "met": True}]}
    plot_perf.markdown(data)
    out = capsys.readouterr().out
    assert "| item loop, per call | 6 µs | 3 µs | 2.00 | <= 2.0 met |" in out
    assert "| train_step (after `import torch._dynamo` on both) | 6.0 ms | 30.0 ms | 24.0 ms |" in out
