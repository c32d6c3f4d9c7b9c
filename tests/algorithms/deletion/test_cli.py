"""The qkmeans and dckmeans plugins: plan() and a run over the memory transport."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import trio

from fedproto.algorithms.deletion import streams
from fedproto.algorithms.deletion.cli import DCKMEANS, QKMEANS, file_partition, plot_cumulative
from fedproto.data import Dataset, load_dataset
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork

CELLTYPE = Path(__file__).resolve().parents[4] / "shared" / "data" / "celltype.npz"


def parse(plugin, argv):
    """The plugin's options plus the ones the core CLI adds (fedproto.cli._common_arguments)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="blobs")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partition", default="iid")
    parser.add_argument("--deadline", type=float, default=60.0)
    plugin.add_arguments(parser)
    return parser.parse_args(argv)


def run_plan(plan):
    async def go():
        network = MemoryNetwork(plan.roster)
        meter = Meter(trio.current_time)
        endpoints = network.endpoints()
        machines = {p: plan.make_machine(p) for p in plan.roster}
        results = await run_parties(machines, endpoints, config=RuntimeConfig(session=plan.session), meter=meter)
        for endpoint in endpoints.values():
            await endpoint.aclose()
        return results, meter.report(protocol="x", transport="memory", session=plan.session, parties=plan.roster)

    results, report = trio.run(go)
    as_json = {p: plan.result_to_json(p, r) for p, r in results.items()}
    return as_json, report


def blobs(mixture, sizes, labels=True):
    x = mixture(40, sizes)
    y = np.repeat(np.arange(len(sizes)), sizes) if labels else None
    return Dataset("blobs", x * 10 - 3, y, None)  # min-max scaling brings it back to [0, 1]


def test_dckmeans_plugin_runs_the_stream_and_summarises(mixture):
    dataset = blobs(mixture, (70, 70, 60))
    args = parse(DCKMEANS, ["--k", "3", "--deletions", "6", "--no-timing"])
    plan = DCKMEANS.plan(args, dataset)
    assert plan.roster == ("root", "leaf-0", "leaf-1", "leaf-2", "leaf-3")
    results, report = run_plan(plan)
    summary = plan.summarize(results)
    assert summary["model equals training on the remaining data (same key)"] is True
    assert summary["deletions"] == 6 and summary["width w"] == 4
    assert 0.5 < summary["loss ratio"] < 3 and summary["NMI (DC-k-means, arithmetic)"] > 0.5
    assert "cumulative time s" not in summary
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
    dataset = blobs(mixture, (45, 175, 175, 175))
    args = parse(QKMEANS, ["--k", "4", "--deletions", "8", "--clients", "3", "--eps", "0.03125",
                           "--baseline-retrains", "2"])
    plan = QKMEANS.plan(args, dataset)
    assert plan.roster == ("server", "client-0", "client-1", "client-2")
    results, report = run_plan(plan)
    summary = plan.summarize(results)
    assert summary["model equals training on the remaining data (same key)"] is True
    assert summary["clients agree on the model"] is True
    assert summary["certified deletions"] + summary["retrained deletions"] == 8
    assert report.algorithm_rounds == 9
    assert summary["speedup over retraining"] > 0 and len(summary["cumulative time s"]) == 9
    assert summary["amortised s per deletion (Q-k-means)"] > 0


def test_plugins_refuse_bad_arguments(mixture):
    dataset = blobs(mixture, (5, 5))
    with pytest.raises(ValueError, match="fewer than k"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "3", "--deletions", "8"]), dataset)
    with pytest.raises(ValueError, match="larger than"):
        QKMEANS.plan(parse(QKMEANS, ["--k", "11"]), dataset)
    with pytest.raises(ValueError, match="npz"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "2", "--leaves", "file"]), dataset)
    with pytest.raises(ValueError, match="--width"):
        DCKMEANS.plan(parse(DCKMEANS, ["--k", "2", "--height", "2"]), dataset)


@pytest.mark.skipif(not CELLTYPE.exists(), reason="celltype.npz is not available")
def test_celltype_client_split_becomes_the_leaves():
    dataset = load_dataset(str(CELLTYPE))
    leaves = file_partition(str(CELLTYPE), dataset.x)
    with np.load(CELLTYPE) as archive:
        sizes = archive["client_sizes"]
    np.testing.assert_array_equal(np.bincount(leaves, minlength=100), sizes)


def test_qkmeans_plugin_federated_equals_the_centralised_run(mixture):
    dataset = blobs(mixture, (45, 175, 175, 175))
    args = parse(QKMEANS, ["--k", "4", "--deletions", "6", "--clients", "3", "--eps", "0.03125", "--no-timing",
                           "--federated"])
    plan = QKMEANS.plan(args, dataset)
    assert plan.roster == ("coordinator", "client-0", "client-1", "client-2")
    assert plan.phases == ("seed", "seed-point", "lloyd", "model", "request")
    results, report = run_plan(plan)
    summary = plan.summarize(results)
    assert summary["federated equals centralised Q-k-means on the stream (same key)"] is True
    assert summary["model equals training on the remaining data (same key)"] is True
    assert summary["clients agree on the model"] is True
    assert summary["method"] == "Q-k-means (federated)"
    retrains = summary["retrained deletions"]
    assert summary["federated trainings (1 + retrains)"] == 1 + retrains
    # k seeding rounds, executed + 1 Lloyd rounds per training, one round per certified deletion.
    assert report.algorithm_rounds >= 4 + 2 + summary["certified deletions"]
    assert plan.analytic["analytic bytes per Lloyd round (P·8·(2kd + k), plus framing)"] == 3 * 8 * (2 * 4 * 3 + 4)
    plain = QKMEANS.plan(parse(QKMEANS, ["--k", "4", "--deletions", "6", "--clients", "3"]), dataset)
    assert plain.session != plan.session  # the two variants never share a session


def test_dckmeans_plugin_weighted_variant(mixture):
    dataset = blobs(mixture, (70, 70, 60))
    args = parse(DCKMEANS, ["--k", "3", "--deletions", "4", "--no-timing", "--weighted"])
    plan = DCKMEANS.plan(args, dataset)
    results, report = run_plan(plan)
    summary = plan.summarize(results)
    assert summary["method"] == "DC-k-means (weighted)"
    assert summary["model equals training on the remaining data (same key)"] is True
    assert {link.tag for link in report.links} == {"del.wnode", "del.remove", "del.model"}
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

    args = build_parser().parse_args(["run", protocol, "--data", "gaussian-small", "--deletions", "3"])
    plugin = registry.load_protocol(protocol)
    plan = plugin.plan(args, _dataset(plugin, args))
    assert len(plan.roster) > 1 and plan.iterations >= 4


@pytest.mark.slow
def test_dckmeans_runs_on_the_generated_set_from_the_command_line(capsys):
    from fedproto.cli import main

    code = main(["run", "dckmeans", "--data", "gaussian-small", "--deletions", "3", "--no-timing", "--quiet",
                 "--width", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "gaussian-small" in out and "model equals training on the remaining data" in out
