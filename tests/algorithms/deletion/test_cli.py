"""The qkmeans and dckmeans plugins: plan() and a run over the memory transport."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import trio

from algorithms.deletion.cli import DCKMEANS, QKMEANS, file_partition, plot_cumulative
from fedproto.data import Dataset, load_dataset
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from transports.memory import MemoryNetwork

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
