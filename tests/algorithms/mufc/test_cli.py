"""The mufc plugin: plan(), a run through the real command line, bad input as one clear line."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedproto.algorithms.mufc.cli import LABELS, PAPER_MEAN_SPEEDUP, PROTOCOL, paper_figures, removal_stream, unit_box
from fedproto.cli import main
from fedproto.data import find_data_file, load_dataset
from fedproto.progress import use_display
from fedproto.testing import load_file, run_plan_in_memory

helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")
CELLTYPE = find_data_file("celltype") or Path("celltype.npz")  # the FEDPROTO_DATA mirror (tests/conftest.py)


def parse(argv):
    return helpers.plugin_args(PROTOCOL, argv, data="iris", clients=3, partition=PROTOCOL.default_partition)


def test_plan_runs_and_summarises_with_exactness_and_the_analytic_bytes():
    args = parse(["--removals", "4", "--points-per-removal", "2", "--no-timing", "--n-init", "2"])
    plan = PROTOCOL.plan(args, load_dataset("iris"))
    results, report = run_plan_in_memory(plan, protocol="mufc")
    summary = plan.summarize(results)
    assert summary["n_points_removed"] == 8 and summary["n_points_decoded"] == 142
    assert summary["n_removals"] == 4 and summary["points_per_removal"] == 2 and summary["n_points"] == 150
    assert summary["model_equals_retrain"] is True
    assert summary["clients_agree"] is True
    assert summary["loss_ratio"] == summary["phi_f"] / summary["phi_c_star"]
    assert summary["loss_ratio"] >= summary["phi_c"] / summary["phi_c_star"] - 1e-12  # phi_f >= phi_c
    assert 0 < summary["loss_ratio_kfed"] and 0 < summary["loss_ratio_dckm"]
    assert "paper" not in summary  # iris is not in the paper's Table 1
    # every share is T * width payload bytes: the analytic figure is what each client uploads
    per_client = plan.analytic["analytic_syndrome_bytes_per_client"]
    shares = [link for link in report.links if link.tag == "mufc.syndromes"]
    assert len(shares) == 3 * 5
    assert all(per_client < link.payload_bytes < per_client + 64 for link in shares)


def _check_result_keys(summary, labels):
    """Result keys (and the paper's) are snake_case identifiers; no value is a number written as
    a string; the labels name keys of the summary, readably."""
    for key, value in [*summary.items(), *summary.get("paper", {}).items()]:
        assert key.isidentifier() and key == key.lower(), key
        if isinstance(value, str):
            with pytest.raises(ValueError):
                float(value.split(" ")[0])
    shown = {key for key in summary if key in labels} | {key for key in summary.get("paper", {}) if key in labels}
    assert {"loss_ratio", "removal_ms_mean", "retrain_ms", "speedup_over_retrain", "phi_c_star"} <= shown
    assert labels["phi_c_star"] == "phi_c* (scikit-learn KMeans, 10 restarts)"


class RecordingDisplay:
    """A progress display that records each task: ``[description, total, steps advanced, removed]``."""

    def __init__(self):
        self.tasks = []

    def add_task(self, description, *, total=None):
        self.tasks.append([description, total, 0, False])
        return len(self.tasks) - 1

    def advance(self, task_id, advance=1):
        self.tasks[task_id][2] += advance

    def remove_task(self, task_id):
        self.tasks[task_id][3] = True


def test_summary_keys_are_identifiers_with_labels_and_numbers():
    args = parse(["--clients", "3", "--removals", "2", "--retrains", "1", "--n-init", "2"])
    dataset = load_dataset("iris")
    plan = PROTOCOL.plan(args, dataset)
    results = run_plan_in_memory(plan, protocol="mufc")[0]
    display = RecordingDisplay()
    with use_display(display):
        summary = plan.summarize(results)
    # every phase after the protocol shows progress; the timed replay counts its requests
    tasks = {description: (total, done, removed) for description, total, done, removed in display.tasks}
    assert {"K-FED baseline", "DC-KM baseline"} <= set(tasks)
    assert tasks["timed replay of the removal stream"] == (2, 2, True)
    assert all(removed for _, _, removed in tasks.values())
    _check_result_keys(summary, plan.labels)
    assert summary["data_set"] == "iris" and summary["n_clients"] == 3 and summary["k"] == 3
    # the timed replay: a mean and a spread as two numbers, retraining slower than one removal
    assert summary["removal_ms_mean"] > 0 and summary["removal_ms_std"] >= 0
    assert summary["speedup_over_retrain"] == pytest.approx(summary["retrain_ms"] / summary["removal_ms_mean"])
    # the per-removal breakdown adds up to the removal time; the codec is measured apart
    parts = ("client", "share_sum", "decode", "cluster")
    assert all(summary[f"{part}_ms_mean"] >= 0 for part in parts) and summary["codec_ms_mean"] > 0
    assert sum(summary[f"{part}_ms_mean"] for part in parts) == pytest.approx(summary["removal_ms_mean"])
    assert len(summary["cumulative_removal_s"]) == len(summary["loss_ratio_per_removal"]) == 2
    assert summary["replay_matches_protocol"] is True
    # the paper's figures sit apart, keyed like the measured ones (iris is not in Table 1)
    assert summary["paper"] == {"speedup_over_retrain": PAPER_MEAN_SPEEDUP}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedproto.algorithms.mufc.cli import plot_stream

    fig, ax = plt.subplots()
    plot_stream(ax, summary)  # reads the cumulative times and loss ratios under their result keys
    assert [len(line.get_xdata()) for line in ax.get_lines()] == [2, 2]
    assert len(fig.axes) == 2  # the loss ratio's twin axis
    plt.close(fig)


def test_paper_figures_are_table_1_as_numbers():
    figures = paper_figures("celltype", timed=False)
    assert figures["loss_ratio_mean"] == 1.14 and figures["loss_ratio_std"] == 0.03
    assert figures["loss_ratio_kfed_mean"] == 1.72 and figures["loss_ratio_dckm_std"] == 0.01
    assert "speedup_over_retrain" not in figures
    assert paper_figures("gaussian", timed=True)["speedup_over_retrain"] == 84.0
    assert paper_figures("iris", timed=False) == {}
    assert all(key in LABELS for key in paper_figures("gaussian", timed=True))


@pytest.mark.parametrize(
    ("old", "new", "dest", "value"),
    [
        ("--remove", "--removals", "removals", 7),
        ("--batch", "--points-per-removal", "points_per_removal", 3),
        ("--gamma", "--quantization-step", "quantization_step", 0.25),
        ("--max-iter", "--max-iterations", "max_iterations", 40),
    ],
)
def test_old_option_spellings_stay_hidden_aliases(capsys, old, new, dest, value):
    assert getattr(parse([old, str(value)]), dest) == value == getattr(parse([new, str(value)]), dest)
    parser = argparse.ArgumentParser()
    PROTOCOL.add_arguments(parser)
    text = parser.format_help()
    assert new in text and old not in text.replace(new, "")


def test_removal_stream_is_random_valid_and_keeps_k_points():
    ids = [np.arange(10), np.arange(10, 14), np.arange(14, 40)]
    stream = removal_stream([10, 4, 26], ids, 8, 2, 1, 3, seed=5)
    assert len(stream) == 9 and stream[-1][1] is None
    seen = [i for _, b in stream[:-1] for i in b]
    assert len(seen) == len(set(seen)) == 16
    for c, batch in stream[:-1]:
        assert set(batch) <= set(ids[c].tolist())
    with pytest.raises(ValueError):
        removal_stream([3, 3], [np.arange(3), np.arange(3, 6)], 1, 1, 0, 3, seed=0)
    with pytest.raises(ValueError):
        removal_stream([3, 3], [np.arange(3), np.arange(3, 6)], 0, 1, 2, 1, seed=0)


def test_unit_box_keeps_unit_data_and_scales_the_rest():
    x = np.array([[0.0, 1.0], [0.5, 0.25]])
    assert unit_box(x) is not None and np.array_equal(unit_box(x), x)
    y = unit_box(np.array([[-3.0, 10.0], [1.0, 10.0]]))
    assert y.min() == 0.0 and y.max() == 1.0 and np.all(y[:, 1] == 0.0)


@pytest.mark.skipif(not CELLTYPE.is_file(), reason="needs celltype.npz in a FEDPROTO_DATA directory")
def test_celltype_uses_its_own_hundred_client_split():
    args = parse(["--data", str(CELLTYPE), "--removals", "0"])
    plan = PROTOCOL.plan(args, load_dataset(str(CELLTYPE)))
    assert len(plan.roster) == 101


def test_gaussian_small_is_a_tenth_of_the_paper_set_under_its_own_name():
    full, small = (PROTOCOL.generated_datasets[name](3) for name in ("gaussian", "gaussian-small"))
    assert small.name == "gaussian-small" and full.name == "gaussian"  # no Table 1 figures beside it
    assert small.x.shape == (full.x.shape[0] // 10, full.x.shape[1]) and small.paper_k == full.paper_k


def fedproto(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "fedproto", *argv], capture_output=True, text=True,
                          timeout=600, cwd=cwd, stdin=subprocess.DEVNULL)


def test_command_line_run_writes_the_report_and_plot(tmp_path):
    # iris rather than gaussian-small: the same path through the command line (baselines, the timed
    # replay, the report and the plot) at a tenth of the points, its kernels mostly compiled already
    out = fedproto("run", "mufc", "--data", "iris", "--clients", "4", "--removals", "3", "--quiet",
                   "--retrains", "1", "--report", str(tmp_path / "run.json"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # the readable labels; the headline results come first, so the shortened table keeps them
    first_table = out.stdout.split("rows shown")[0]
    assert "mufc on iris" in first_table
    assert "loss ratio phi_f / phi_c*" in first_table and "unlearning speed-up" in first_table
    report = json.loads((tmp_path / "run.json").read_text())
    results = report["results"]
    assert results["model_equals_retrain"] is True
    assert isinstance(results["loss_ratio"], float) and isinstance(results["removal_ms_mean"], float)
    assert results["n_removals"] == 3 and results["n_clients"] == 4
    assert (tmp_path / "run.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--k", "0"], "--k must be at least 1"),
        (["--k", "500"], "larger than the number of points"),
        (["--removals", "1000"], "can serve another removal"),
        (["--leave", "3"], "every one of the 3 clients"),
        (["--partition", "file"], "client_X"),
        (["--split", "file"], "client_X"),  # the old spelling
        (["--quantization-step", "-1"], "--quantization-step must be positive"),
        (["--gamma", "0"], "--quantization-step must be positive"),
        (["--max-iterations", "0"], "--max-iterations must be at least 1"),
        (["--points-per-removal", "0"], "--points-per-removal at least 1"),
    ],
)
def test_bad_arguments_print_one_line(capsys, argv, message):
    code = main(["run", "mufc", "--data", "iris", "--clients", "3", "--no-timing", *argv])
    err = capsys.readouterr().err
    assert code != 0
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_partition_takes_mufc_schemes_and_split_is_its_old_spelling(capfd):
    from fedproto import cli

    for argv, scheme in ((["--partition", "iid"], "iid"), (["--split", "noniid"], "noniid"), ([], "auto")):
        parser = cli.build_parser(["run", "mufc"])
        args = parser.parse_args(["run", "mufc", *argv])
        assert args.partition == scheme
    # the common schemes MUFC does not implement are refused, not silently ignored
    assert cli.main(["run", "mufc", "--partition", "label-skew"]) == 2
    err = capfd.readouterr().err
    assert "--partition" in err and "noniid" in err and len(err.strip().splitlines()) == 1
