"""The kzcenter CLI plugin: plan(), a run over the memory transport, and the fedproto command line."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

import fedproto.algorithms  # noqa: F401
from fedproto.algorithms.kzclustering import _kernels
from fedproto.algorithms.kzclustering.cli import CENTER_PHASES, KZCENTER, prepare_data
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
    results = await run_parties(machines, network, config=RuntimeConfig(session=plan.session))
    return {p: plan.result_to_json(p, r) for p, r in results.items()}


async def test_plan_runs_over_the_memory_transport():
    args = parse(KZCENTER, ["--data", "iris", "--machines", "3", "--k", "3", "--slack", "0.5",
                            "--inject-outliers", "6", "--compare", "charikar,mkcwm,random-kzc"])
    plan = KZCENTER.plan(args, load_dataset("iris"))
    assert plan.roster == ("coordinator", "machine-0", "machine-1", "machine-2")
    results = await run_plan(plan)
    json.dumps(results)  # JSON-ready
    summary = plan.summarize(results)
    assert (summary["n_points"], summary["z"], summary["n_clients"], summary["slack"]) == (156, 6, 3, 0.5)
    assert summary["n_outliers"] <= summary["outlier_budget"] == 9
    assert sum(results[f"machine-{i}"]["outliers"] for i in range(3)) == summary["n_outliers"]
    assert summary["radius_budget_removed"] <= summary["radius"]
    assert summary["radius_budget_removed"] <= summary["radius_z_removed"]
    phases = [key for key in summary if key.startswith("words_phase_") and key.removeprefix("words_phase_") in CENTER_PHASES]
    assert phases and summary["words_total"] == sum(summary[key] for key in phases)
    # the baselines: words of the distributed ones, radius of all, keys snake_case
    assert summary["words_total_mkcwm"] >= summary["words_points_mkcwm"] > 0
    assert summary["words_total_random_kzc"] >= summary["words_points_random_kzc"] > 0
    assert "words_total_charikar" not in summary and summary["radius_z_removed_charikar"] > 0
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", key) for key in summary)
    assert all(not isinstance(v, str) for k, v in summary.items() if k not in ("data_set", "search"))
    # every result key but the arrays has a readable label or reads well with "_" -> " "
    assert plan.labels["radius"] == "certified radius L_out"
    assert plan.labels["radius_z_removed_charikar"] == "charikar: radius (z removed)"
    json.dumps(summary, allow_nan=False)


@pytest.mark.parametrize(
    ("new", "old"),
    [
        (["--clients", "4", "--slack", "0.25", "--probe-batch", "3", "--normalize"],
         ["--machines", "4", "--eps", "0.25", "--batch", "3", "--normalize", "minmax"]),
        (["--clients", "2", "--slack", "0.5", "--probe-batch", "0", "--normalize", "none"],
         ["--machines", "2", "--eps", "0.5", "--batch", "0"]),
    ],
)
def test_old_option_spellings_are_hidden_aliases(new, old):
    """``--eps``, ``--batch`` and ``--machines`` set the same options as ``--slack``,
    ``--probe-batch`` and ``--clients``; the old spellings are not in ``--help``."""
    a, b = parse(KZCENTER, ["--k", "3", *new]), parse(KZCENTER, ["--k", "3", *old])
    assert vars(a) == vars(b)
    assert not hasattr(a, "eps") and not hasattr(a, "batch") and not hasattr(a, "machines")
    parser = argparse.ArgumentParser()
    core_cli._common_arguments(parser, party=False)
    KZCENTER.add_arguments(parser)
    text = parser.format_help()
    assert "--slack" in text and "--probe-batch" in text and "--machines" in text
    assert "--eps" not in text and "--batch " not in text
    assert parse(KZCENTER, ["--k", "3"]).normalize == "none"


def test_normalize_minmax_scales_features_and_none_keeps_them():
    raw = load_dataset("wine")
    scaled, m = prepare_data(parse(KZCENTER, ["--data", "wine", "--normalize", "--machines", "3"]), raw)
    kept, _ = prepare_data(parse(KZCENTER, ["--data", "wine", "--normalize", "none"]), raw)
    assert m == 3
    np.testing.assert_array_equal(kept.x, raw.x)
    assert np.allclose(scaled.x.min(axis=0), -1) and np.allclose(scaled.x.max(axis=0), 1)
    with pytest.raises(SystemExit):
        parse(KZCENTER, ["--normalize", "zscore"])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--k", "200"], "k = 200"),
        (["--k", "3", "--z", "150"], "z = 150"),
        (["--k", "3", "--z", "5", "--slack", "0"], "slack"),
        (["--k", "3", "--z", "5", "--eps", "1.5"], "slack"),
        (["--k", "3", "--probe-batch", "-1"], "probe-batch"),
        (["--k", "3", "--machines", "0"], "machines"),
        (["--k", "3", "--machines", "151"], "parties"),
        (["--k", "3", "--compare", "best"], "unknown baseline"),
        (["--k", "3", "--inject-outliers", "-1"], "inject"),
    ],
)
def test_plan_rejects_bad_arguments(argv, match):
    with pytest.raises(ValueError, match=match):
        KZCENTER.plan(parse(KZCENTER, ["--data", "iris", *argv]), load_dataset("iris"))


async def test_sub_machines_split_every_machine_into_parts():
    """``--sub-machines 3``: three parts per machine, the count bound of 3 m virtual machines, the
    same guarantees; ``auto`` is 1 below 10,000 points per machine; bad values are refused."""
    argv = ["--data", "iris", "--machines", "2", "--k", "3", "--slack", "0.5", "--inject-outliers", "6"]
    plan = KZCENTER.plan(parse(KZCENTER, [*argv, "--sub-machines", "3"]), load_dataset("iris"))
    machine = plan.make_machine("machine-0")
    assert machine.config.sub_machines == 3 and machine.config.virtual_machines == 6
    assert machine._local.count == 3
    summary = plan.summarize(await run_plan(plan))
    assert summary["sub_machines"] == 3 and summary["n_outliers"] <= summary["outlier_budget"] == 9
    auto = KZCENTER.plan(parse(KZCENTER, argv), load_dataset("iris"))
    assert auto.make_machine("machine-0").config.sub_machines == 1
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit):
            parse(KZCENTER, [*argv, "--sub-machines", bad])


def test_the_fedproto_command_line(monkeypatch, capsys, tmp_path):
    """``fedproto run kzcenter ...`` end to end (the plugin registered in place of the entry point)."""
    monkeypatch.setattr(registry, "protocol_names", lambda: ["kzcenter"])
    monkeypatch.setattr(registry, "load_protocol", lambda name: KZCENTER)
    report = tmp_path / "report.json"
    code = core_cli.main(["run", "kzcenter", "--synthetic", "300", "--machines", "3", "--k", "4", "--z", "10",
                          "--inject-outliers", "10", "--slack", "0.5", "--quiet", "--report", str(report)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "certified radius" in out.out
    doc = json.loads(report.read_text())
    # probe search: the extent, two phases per probe round, the fetch and its points, the answer
    assert doc["results"]["n_outliers"] <= 15
    assert doc["communication_rounds"] == 5 + 2 * doc["results"]["probe_rounds"]
    assert doc["results"]["n_clients"] == 3 and doc["results"]["slack"] == 0.5
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
