"""The kzcenter CLI plugin: plan(), a run over the memory transport, and the fedproto command line."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.cli import KZCENTER
from fedproto.algorithms.kzclustering.data import OUTLIER_LABEL, gaussian_mixture, inject_outliers, synthetic_dataset
from fedproto import cli as core_cli
from fedproto import registry
from fedproto.data import load_dataset
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork


def parse(plugin, argv):
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=False)
    plugin.add_arguments(parser)
    return parser.parse_args(argv)


async def run_plan(plan):
    machines = {p: plan.make_machine(p) for p in plan.roster}
    network = MemoryNetwork(list(plan.roster))
    results = await run_parties(machines, network.endpoints(), config=RuntimeConfig(session=plan.session))
    return {p: plan.result_to_json(p, r) for p, r in results.items()}


async def test_plan_runs_over_the_memory_transport():
    args = parse(KZCENTER, ["--data", "iris", "--machines", "3", "--k", "3", "--eps", "0.5",
                            "--inject-outliers", "6", "--compare", "charikar,mkcwm,random-kzc"])
    plan = KZCENTER.plan(args, load_dataset("iris"))
    assert plan.roster == ("coordinator", "machine-0", "machine-1", "machine-2")
    results = await run_plan(plan)
    json.dumps(results)  # JSON-ready
    summary = plan.summarize(results)
    assert summary["n"] == 156 and summary["z"] == 6 and summary["machines"] == 3
    assert summary["points beyond L_out"] <= summary["allowed (1+eps)z"]
    assert sum(results[f"machine-{i}"]["outliers"] for i in range(3)) == summary["points beyond L_out"]
    assert summary["radius ((1+eps)z outliers removed)"] <= summary["certified radius L_out"]
    assert summary["words (all messages)"] == sum(v for k, v in summary.items() if k.startswith("words: "))
    assert "mkcwm: words (all / paper)" in summary and summary["charikar: radius (z removed)"] > 0
    json.dumps(summary)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--k", "200"], "k = 200"),
        (["--k", "3", "--z", "150"], "z = 150"),
        (["--k", "3", "--z", "5", "--eps", "0"], "eps"),
        (["--k", "3", "--z", "5", "--eps", "1.5"], "eps"),
        (["--k", "3", "--machines", "0"], "machines"),
        (["--k", "3", "--machines", "151"], "parties"),
        (["--k", "3", "--compare", "best"], "unknown baseline"),
        (["--k", "3", "--inject-outliers", "-1"], "inject"),
    ],
)
def test_plan_rejects_bad_arguments(argv, match):
    with pytest.raises(ValueError, match=match):
        KZCENTER.plan(parse(KZCENTER, ["--data", "iris", *argv]), load_dataset("iris"))


def test_the_fedproto_command_line(monkeypatch, capsys, tmp_path):
    """``fedproto run kzcenter ...`` end to end (the plugin registered in place of the entry point)."""
    monkeypatch.setattr(registry, "protocol_names", lambda: ["kzcenter"])
    monkeypatch.setattr(registry, "load_protocol", lambda name: KZCENTER)
    report = tmp_path / "report.json"
    code = core_cli.main(["run", "kzcenter", "--synthetic", "300", "--machines", "3", "--k", "4", "--z", "10",
                          "--inject-outliers", "10", "--eps", "0.5", "--quiet", "--report", str(report)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "certified radius" in out.out
    doc = json.loads(report.read_text())
    assert doc["results"]["points beyond L_out"] <= 15 and doc["communication_rounds"] == 7
    code = core_cli.main(["run", "kzcenter", "--data", "wine", "--k", "500", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "k = 500" in err and "Traceback" not in err


def test_synthetic_data_and_outlier_injection_follow_the_recipe():
    x, labels = gaussian_mixture(1000, 3, 4, factor=50.0, seed=1)
    assert x.shape == (1000, 3) and set(labels.tolist()) == {0, 1, 2, 3}
    same, _ = gaussian_mixture(1000, 3, 4, factor=50.0, seed=1)
    np.testing.assert_array_equal(x, same)
    for c in range(4):  # covariance (f/15) I per component
        assert abs(x[labels == c].std(axis=0).mean() ** 2 / (50 / 15) - 1) < 0.5
    y, mask = inject_outliers(x, 100, dist_factor=50.0, seed=2)
    assert y.shape == (1100, 3) and mask.sum() == 100 and np.array_equal(y[:1000], x)
    s = max(np.linalg.norm(x, axis=1).mean(), 1.0)
    moved = np.min(_kernels.pairwise_distances(y[mask], x), axis=1)
    assert np.median(moved) > 0.5 * np.sqrt(50 * s)  # noise std per coordinate is sqrt(50 s)
    data = synthetic_dataset(500, 2, 3, 20, seed=3)
    assert data.n == 520 and int(np.sum(data.y == OUTLIER_LABEL)) == 20 and data.paper_k == 3
    with pytest.raises(ValueError):
        gaussian_mixture(2, 2, 3)
    with pytest.raises(ValueError):
        inject_outliers(np.zeros((0, 2)), 3)
