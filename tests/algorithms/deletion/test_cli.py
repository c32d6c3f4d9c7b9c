"""The qkmeans and dckmeans plugins: plan() and a run over the memory transport."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.cli import (
    DCKMEANS,
    QKMEANS,
    file_partition,
    paper_figures,
    plot_cumulative,
    prepare,
    summary_labels,
)
from fedproto.data import Dataset, find_data_file, load_dataset
from fedproto.progress import use_display
from fedproto.testing import load_file, run_plan_in_memory

helpers = load_file(Path(__file__).resolve().parents[2] / "_helpers.py", "tests_helpers")
CELLTYPE = find_data_file("celltype") or Path("celltype.npz")  # the FEDPROTO_DATA mirror (tests/conftest.py)


parse = helpers.plugin_args  # the plugin's options plus the core's (fedproto.cli._common_arguments)


def blobs(mixture, sizes, labels=True):
    x = mixture(40, sizes)
    y = np.repeat(np.arange(len(sizes)), sizes) if labels else None
    return Dataset("blobs", x * 10 - 3, y, None)  # min-max scaling brings it back to [0, 1]


def qkmeans_plan(mixture, *options):
    """The qkmeans plan (k 4, 3 clients, lattice step 1/32, and ``options``) on the four-blob set
    of 45, 175, 175 and 175 points, and that set."""
    dataset = blobs(mixture, (45, 175, 175, 175))
    args = parse(QKMEANS, ["--k", "4", "--clients", "3", "--lattice-step", "0.03125", *options])
    return QKMEANS.plan(args, dataset), dataset


def test_dckmeans_plugin_runs_the_stream_and_summarises(mixture):
    dataset = blobs(mixture, (70, 70, 60))
    args = parse(DCKMEANS, ["--k", "3", "--removals", "6", "--no-timing"])
    plan = DCKMEANS.plan(args, dataset)
    assert plan.roster == ("root", "leaf-0", "leaf-1", "leaf-2", "leaf-3")
    results, report = run_plan_in_memory(plan)
    summary = plan.summarize(results)
    assert summary["model_equals_retrain"] is True
    assert summary["n_removals"] == 6 and summary["width"] == 4 and summary["n_points"] == 200
    assert summary["leaf_size_min"] <= summary["leaf_size_mean"] <= summary["leaf_size_max"]
    assert summary["leaf_size_mean"] == 200 / 4
    assert summary["loss_ratio"] == summary["loss"] / summary["loss_kmeans"]
    assert 0.5 < summary["loss_ratio"] < 3 and summary["nmi"] > 0.5
    assert plan.labels["nmi"] == "NMI (DC-k-means, arithmetic)"
    assert "cumulative_time_s" not in summary and "paper" not in summary  # blobs are not in the paper
    assert report.algorithm_rounds == 6 + 2
    removed = sum(len(results[p]["removed"]) for p in plan.roster if p.startswith("leaf"))
    assert removed == 6
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plot_cumulative(ax, summary)
    plt.close(fig)


def test_qkmeans_plugin_runs_the_stream_and_summarises(mixture):
    plan, _ = qkmeans_plan(mixture, "--removals", "8", "--retrains", "2")
    assert plan.roster == ("server", "client-0", "client-1", "client-2")
    results, report = run_plan_in_memory(plan)
    shown = []

    class Display:  # records the progress tasks of the checks and timed replays after the protocol
        def add_task(self, description, *, total=None):
            shown.append(description)
            return len(shown)

        def advance(self, task_id, advance=1):
            pass

        def remove_task(self, task_id):
            pass

    with use_display(Display()):
        summary = plan.summarize(results)
    assert "timed replay of the 8 deletions" in shown and "k-means baseline: 2 timed retrains" in shown
    assert len(shown) == 5
    assert summary["model_equals_retrain"] is True
    assert summary["clients_agree"] is True
    assert summary["n_certified_removals"] + summary["n_retrained_removals"] == 8
    assert summary["lattice_step"] == 0.03125 and summary["balance"] == 0.2
    assert report.algorithm_rounds == 9
    assert summary["speedup_over_retrain"] == pytest.approx(summary["retrain_amortised_ms"] / summary["amortised_ms"])
    assert len(summary["cumulative_time_s"]) == len(summary["retrain_cumulative_time_s"]) == 9
    assert summary["cumulative_time_s"][0] == pytest.approx(summary["train_ms"] / 1e3)
    # the amortised time spreads training over the deletions
    assert summary["amortised_ms"] == pytest.approx(summary["train_ms"] / 8 + summary["removal_ms_mean"])
    assert summary["removal_ms_std"] >= 0 and summary["retrain_ms"] > 0 and summary["n_retrains_timed"] == 2
    assert plan.labels["amortised_ms"] == "amortised ms per deletion (Q-k-means, training included)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plot_cumulative(ax, summary)  # reads the cumulative times under their result keys
    assert [len(line.get_xdata()) for line in ax.get_lines()] == [9, 9]
    plt.close(fig)


def test_plugins_refuse_bad_arguments(mixture):
    dataset = blobs(mixture, (5, 5))
    with pytest.raises(ValueError, match="fewer than k"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "3", "--removals", "8"]), dataset)
    with pytest.raises(ValueError, match="larger than"):
        QKMEANS.plan(parse(QKMEANS, ["--k", "11"]), dataset)
    with pytest.raises(ValueError, match="npz"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "2", "--leaves", "file"]), dataset)
    with pytest.raises(ValueError, match="--width"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "2", "--height", "2"]), dataset)
    with pytest.raises(ValueError, match="--lattice-step must be positive"):
        QKMEANS.plan(parse(QKMEANS, ["--k", "2", "--lattice-step", "0"]), dataset)
    with pytest.raises(ValueError, match=r"--balance must lie in \[0, 1\)"):
        QKMEANS.plan(parse(QKMEANS, ["--k", "2", "--gamma", "1"]), dataset)
    with pytest.raises(ValueError, match="--retrains must be at least 1"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "2", "--retrains", "0"]), dataset)


@pytest.mark.parametrize(
    ("plugin", "old", "new", "dest", "value", "parsed"),
    [
        (QKMEANS, "--deletions", "--removals", "removals", "7", 7),
        (DCKMEANS, "--deletions", "--removals", "removals", "7", 7),
        (DCKMEANS, "--baseline-retrains", "--retrains", "retrains", "5", 5),
        (QKMEANS, "--scale", "--normalize", "normalize", "none", "none"),
        (QKMEANS, "--eps", "--lattice-step", "lattice_step", "0.125", 0.125),
        (QKMEANS, "--gamma", "--balance", "balance", "0.5", 0.5),
    ],
)
def test_old_option_spellings_stay_hidden_aliases(plugin, old, new, dest, value, parsed):
    assert getattr(parse(plugin, [old, value]), dest) == parsed == getattr(parse(plugin, [new, value]), dest)
    parser = argparse.ArgumentParser()
    plugin.add_arguments(parser)
    text = parser.format_help()
    assert new in text and old not in text.replace(new, "")


def test_normalize_defaults_to_minmax_and_a_bare_flag_means_minmax(mixture):
    assert parse(DCKMEANS, []).normalize == "minmax"
    assert parse(DCKMEANS, ["--normalize"]).normalize == "minmax"
    assert parse(DCKMEANS, ["--normalize", "none"]).normalize == "none"
    dataset = blobs(mixture, (5, 5))
    np.testing.assert_array_equal(prepare(dataset, "none"), dataset.x)
    scaled = prepare(dataset, "minmax")
    assert scaled.min() == 0.0 and scaled.max() == 1.0
    with pytest.raises(ValueError, match="--normalize"):
        prepare(dataset, "zscore")


def test_paper_figures_are_the_tables_keyed_like_the_summary():
    q, dc = paper_figures("celltype", "Q-k-means"), paper_figures("celltype", "DC-k-means (weighted)")
    table = streams.PAPER_TABLES["celltype"]
    assert q["loss_ratio"] == table["loss ratio"][1] and dc["loss_ratio"] == table["loss ratio"][2]
    assert q["speedup_over_retrain"] == pytest.approx(4.241 / 0.026)
    assert dc["amortised_ms"] == pytest.approx(272.0) and dc["retrain_amortised_ms"] == pytest.approx(4241.0)
    assert paper_figures("iris", "Q-k-means") == {}
    labels = summary_labels("Q-k-means")
    assert set(q) <= set(labels)


@pytest.mark.skipif(not CELLTYPE.exists(), reason="celltype.npz is not available")
def test_celltype_client_split_becomes_the_leaves():
    dataset = load_dataset(str(CELLTYPE))
    leaves = file_partition(str(CELLTYPE), dataset.x)
    with np.load(CELLTYPE) as archive:
        sizes = archive["client_sizes"]
    np.testing.assert_array_equal(np.bincount(leaves, minlength=100), sizes)


@pytest.mark.skipif(not CELLTYPE.exists(), reason="celltype.npz is not available")
def test_leaves_file_finds_celltype_by_name():
    """``--data celltype --leaves file``: the bare name finds the registered file's client split."""
    args = parse(DCKMEANS, ["--data", "celltype", "--k", "4", "--leaves", "file"])
    plan = DCKMEANS.plan(args, load_dataset("celltype"))
    assert plan.roster == ("root", *(f"leaf-{j}" for j in range(100)))


def test_qkmeans_plugin_federated_equals_the_centralised_run(mixture):
    plan, dataset = qkmeans_plan(mixture, "--removals", "6", "--no-timing", "--federated")
    assert plan.roster == ("coordinator", "client-0", "client-1", "client-2")
    assert plan.phases == ("setup.data", "seed", "seed-point", "lloyd", "model", "request")
    results, report = run_plan_in_memory(plan)
    summary = plan.summarize(results)
    assert summary["federated_equals_centralised"] is True
    assert summary["model_equals_retrain"] is True
    assert summary["clients_agree"] is True
    assert summary["method"] == "Q-k-means (federated)"
    retrains = summary["n_retrained_removals"]
    assert summary["n_trainings"] == 1 + retrains
    # k seeding rounds, executed + 1 Lloyd rounds per training, one round per certified deletion.
    assert report.algorithm_rounds >= 4 + 2 + summary["n_certified_removals"]
    assert plan.analytic["analytic bytes per Lloyd round (P·8·(2kd + k), plus framing)"] == 3 * 8 * (2 * 4 * 3 + 4)
    plain = QKMEANS.plan(parse(QKMEANS, ["--k", "4", "--removals", "6", "--clients", "3"]), dataset)
    assert plain.session != plan.session  # the two variants never share a session


def test_dckmeans_plugin_weighted_variant(mixture):
    dataset = blobs(mixture, (70, 70, 60))
    args = parse(DCKMEANS, ["--k", "3", "--removals", "4", "--no-timing", "--weighted"])
    plan = DCKMEANS.plan(args, dataset)
    results, report = run_plan_in_memory(plan)
    summary = plan.summarize(results)
    assert summary["method"] == "DC-k-means (weighted)"
    assert summary["model_equals_retrain"] is True
    assert {link.tag for link in report.links} == {"del.summary", "del.agreed", "del.wnode", "del.remove", "del.model"}
    key = "analytic upward bytes per deletion (h·k·(d + weighted)·8, plus framing and the request)"
    assert plan.analytic[key] == 1 * 3 * (3 + 1) * 8


@pytest.mark.parametrize("plugin", [QKMEANS, DCKMEANS])
def test_the_papers_gaussian_set_is_generated_by_name(plugin):
    """Spec 4/5.1: 5 spherical Gaussians in [0, 1]^25 with covariance 0.8 I, min-max scaled."""
    from fedproto.cli import _dataset

    small = _dataset(plugin, argparse.Namespace(data="gaussian-small", seed=3))
    assert small.name == "gaussian-small" and small.paper_k == 5
    assert small.x.shape == (10_000, 25) and np.bincount(small.y).tolist() == [2_000] * 5
    np.testing.assert_array_equal(small.x.min(axis=0), 0.0)
    np.testing.assert_array_equal(small.x.max(axis=0), 1.0)
    again = plugin.generated_datasets["gaussian-small"](3)
    np.testing.assert_array_equal(again.x, small.x)
    assert not np.array_equal(plugin.generated_datasets["gaussian-small"](4).x, small.x)
    # One spherical covariance for every component: per coordinate, the components' variances agree
    # (scaling multiplies them by the same factor) within 5 standard errors of a variance estimate
    # from 2,000 samples, and coordinates are uncorrelated within a component.
    variances = np.stack([np.var(small.x[small.y == j], axis=0, ddof=1) for j in range(5)])
    assert np.all(np.abs(variances / variances.mean(axis=0) - 1) < 5 * np.sqrt(2 / 1_999))
    corr = np.corrcoef(small.x[small.y == 0], rowvar=False)
    assert np.all(np.abs(corr[~np.eye(25, dtype=bool)]) < 5 / np.sqrt(2_000))
    full = plugin.generated_datasets["gaussian"]
    assert full is streams.GENERATED_DATASETS["gaussian"]
    with pytest.raises(ValueError):
        streams.gaussian_dataset(0, 0)


@pytest.mark.parametrize("protocol", ["qkmeans", "dckmeans"])
def test_the_command_line_plans_a_run_on_the_generated_set(protocol):
    from fedproto import registry
    from fedproto.cli import _dataset, build_parser

    args = build_parser().parse_args(["run", protocol, "--data", "gaussian-small", "--removals", "3"])
    plugin = registry.load_protocol(protocol)
    plan = plugin.plan(args, _dataset(plugin, args))
    assert len(plan.roster) > 1 and plan.iterations >= 4


@pytest.mark.slow
def test_dckmeans_runs_on_the_generated_set_from_the_command_line(capsys):
    from fedproto.cli import main

    code = main(["run", "dckmeans", "--data", "gaussian-small", "--removals", "3", "--no-timing", "--quiet",
                 "--width", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "gaussian-small" in out and "model equals training on the remaining data" in out  # the label
    table = out[: out.index("rows shown")] if "rows shown" in out else out
    assert "loss ratio" in table  # the headline results come first, inside the shortened table
