"""The privacy ledger of FastLloyd and its baselines (issue 30, item 3).

* the ledger's composed epsilon, at its delta, is what ``dp_accounting``'s privacy-loss-
  distribution accountant computes for the same sequence of mechanisms, built independently
  from the calibration objects (:func:`dp.calibrate_fastlloyd`, :func:`dp.calibrate_glloyd`,
  :func:`dp.sulloyd_parameters`), for the whole run and for each round;
* every release's noise scale is the one the server's noise kernels are called with in a small
  run, and the one the calibration objects give; its sensitivity is the calibration's;
* ``fedproto run fastlloyd`` writes the ledger into the report (valid against the schema, its
  total equal to ``results.epsilon_spent``) and prints it; ``lloyd`` and ``--no-noise`` runs
  have none.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import jsonschema
import numpy as np
import pytest
from dp_accounting import pld

from fedproto.algorithms import dp
from fedproto.algorithms.fastlloyd import _kernels
from fedproto.algorithms.fastlloyd.cli import privacy_ledger, privacy_spent
from fedproto.algorithms.fastlloyd.config import FastLloydOptions, make_config
from fedproto.algorithms.fastlloyd.protocol import FastLloydClient, FastLloydServer
from fedproto.metering import report_schema
from fedproto.testing.harness import Harness

PRIVATE = ("fastlloyd", "glloyd", "sulloyd")
#: (epsilon, N, k, d): Iris at epsilon 1 (T = 2 for all three variants), and settings whose
#: heuristics pick T = 7, 7, 3 and T = 5, 2, 2 (FastLloyd, GLloyd, SuLloyd).
SETTINGS = [(1.0, 150, 3, 4), (0.1, 50000, 4, 3), (0.25, 5000, 5, 2)]
#: PLD discretisation. dp_accounting's PLD is pessimistic: each mechanism's privacy losses are
#: rounded up to this grid, so the composed epsilon it returns lies at or above the exact one and
#: at most one interval per mechanism above it. The ledger's accounting is exact (GDP for the
#: Gaussian variants, basic composition for Laplace), so it must land in that window.
PLD_INTERVAL = 1e-4
#: For composed Laplace mechanisms the largest privacy loss (the basic-composition total) has
#: probability at least 2^-(2T) >= 6e-5, so the PLD epsilon at this delta is that total, the
#: epsilon at delta 0 (the PLD itself returns inf at exactly 0, from its truncated tails).
PURE_DELTA = 1e-9


def _calibration_events(variant: str, epsilon: float, n: int, k: int, d: int):
    """``[T]`` lists of dp_accounting events per iteration, from the calibration objects alone."""
    if variant == "sulloyd":
        su = dp.sulloyd_parameters(epsilon, n, k, d)
        # L1 sensitivities d (sums of points in [-1, 1]^d) and 1 (counts)
        one = [dp_accounting.LaplaceDpEvent(su.scale_sum / d), dp_accounting.LaplaceDpEvent(su.scale_count)]
        return [one] * su.iterations
    calibrate = dp.calibrate_fastlloyd if variant == "fastlloyd" else dp.calibrate_glloyd
    cal = calibrate(epsilon, n, k, d)
    return [
        [dp_accounting.GaussianDpEvent(std / radius), dp_accounting.GaussianDpEvent(cal.std_count)]
        for radius, std in zip(cal.radii, cal.std_sum)
    ]


def _assert_matches_pld(epsilon: float, events, delta: float) -> None:
    """``epsilon`` at ``delta`` is what the PLD accountant computes for ``events`` composed."""
    accountant = pld.PLDAccountant(value_discretization_interval=PLD_INTERVAL)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    computed = accountant.get_epsilon(delta if delta > 0 else PURE_DELTA)
    assert epsilon - 1e-9 <= computed <= epsilon + PLD_INTERVAL * len(events), (epsilon, computed)


@pytest.mark.parametrize("variant", PRIVATE)
@pytest.mark.parametrize(("epsilon", "n", "k", "d"), SETTINGS)
def test_the_composed_epsilon_is_what_dp_accounting_computes(variant, epsilon, n, k, d):
    ledger = privacy_ledger(make_config(variant, n=n, k=k, d=d, epsilon=epsilon))
    rounds = _calibration_events(variant, epsilon, n, k, d)
    assert ledger["rounds"] == len(rounds) == len(ledger["per_round"])
    if variant == "sulloyd":
        assert ledger["accountant"] == "basic_composition" and ledger["delta"] == 0.0
        # pure DP: the largest privacy loss of composed Laplace mechanisms is the basic-composition
        # total, which the PLD reaches at delta 0
        at = 0.0
    else:
        assert ledger["accountant"] == "gdp" and ledger["delta"] == pytest.approx(dp.default_delta(n), rel=1e-12)
        at = ledger["delta"]
    _assert_matches_pld(ledger["epsilon"], [event for events in rounds for event in events], at)
    assert ledger["epsilon"] == pytest.approx(epsilon, rel=1e-9)  # the budget the run was calibrated for
    for entry, events in zip(ledger["per_round"], rounds):
        assert entry["delta"] == at
        _assert_matches_pld(entry["epsilon"], events, at)
    if variant != "sulloyd":
        # GDP composes sublinearly: the rounds' epsilons at delta add up to more than the total
        assert math.fsum(r["epsilon"] for r in ledger["per_round"]) > ledger["epsilon"] * 1.01


def _small_run(variant: str, monkeypatch, *, noise: bool = True):
    """A 3-client run of ``variant`` on 90 points in 3-d (k = 3, epsilon 1) through the sans-IO
    harness; returns its config and every ``(shape, scale)`` the noise kernels were called with."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(c, 0.3, size=(30, 3)) for c in ((0, 0, 0), (3, 3, 0), (0, 3, 3))])
    options = FastLloydOptions(variant=variant, k=3, epsilon=None if variant == "lloyd" else 1.0, noise=noise)
    clients = ("client-0", "client-1", "client-2")
    machines = {"server": FastLloydServer("server", options=options, clients=clients, noise_seed=1, session=9)}
    for i, client in enumerate(clients):
        machines[client] = FastLloydClient(
            client, options=options, server="server", clients=clients, points=x[i::3], entropy=bytes([i]) * 32,
            session=9,
        )
    draws = []
    kernel = _kernels.round_noise

    def recording(seed, round_idx, sum_scale, count_scale, *, k, d, mechanism):
        draws.append((mechanism, (k, d), float(sum_scale)))
        draws.append((mechanism, (k,), float(count_scale)))
        return kernel(seed, round_idx, sum_scale, count_scale, k=k, d=d, mechanism=mechanism)

    monkeypatch.setattr(_kernels, "round_noise", recording)
    Harness(machines, session=9).run()
    config = machines["server"].config
    assert config == options.config(len(x), 3)  # what the CLI builds its ledger from
    return config, draws


@pytest.mark.parametrize("variant", PRIVATE)
def test_each_release_has_the_noise_the_server_draws_and_the_calibration_gives(variant, monkeypatch):
    config, draws = _small_run(variant, monkeypatch)
    ledger = privacy_ledger(config)
    releases = ledger["releases"]
    assert len(draws) == len(releases) == 2 * config.iterations
    for (mechanism, shape, scale), release in zip(draws, releases):
        assert (release["mechanism"], tuple(release["shape"]), release["noise_scale"]) == (mechanism, shape, scale)
    assert [(r["round_idx"], r["name"]) for r in releases] == [
        (t, name) for t in range(config.iterations) for name in ("sums", "counts")
    ]
    n, k, d, t = 90, 3, 3, config.iterations
    if variant == "sulloyd":
        su = dp.sulloyd_parameters(1.0, n, k, d)
        expected = [(d * 1.0, su.scale_sum), (1.0, su.scale_count)] * t
        assert {r["sensitivity_norm"] for r in releases} == {"l1"}
    else:
        calibrate = dp.calibrate_fastlloyd if variant == "fastlloyd" else dp.calibrate_glloyd
        cal = calibrate(1.0, n, k, d)
        expected = [pair for r, s in zip(cal.radii, cal.std_sum) for pair in ((r, s), (1.0, cal.std_count))]
        assert {r["sensitivity_norm"] for r in releases} == {"l2"}
        assert ledger["gdp_mu"] == pytest.approx(cal.mu(), rel=1e-12)
    got = [value for r in releases for value in (r["sensitivity"], r["noise_scale"])]
    assert got == pytest.approx([value for pair in expected for value in pair], rel=1e-12)
    for release in releases:  # each release alone: epsilon from its own sensitivity and scale
        if variant == "sulloyd":
            assert release["epsilon"] == pytest.approx(release["sensitivity"] / release["noise_scale"], rel=1e-12)
        else:
            mu = release["sensitivity"] / release["noise_scale"]
            assert release["gdp_mu"] == pytest.approx(mu, rel=1e-12)
            assert dp.gdp_delta(mu, release["epsilon"]) == pytest.approx(release["delta"], rel=1e-6)


def test_a_run_without_noise_has_no_ledger(monkeypatch):
    config, draws = _small_run("lloyd", monkeypatch)
    assert draws == [] and privacy_ledger(config) == {}
    assert privacy_spent(config)["epsilon_spent"] is None
    config, draws = _small_run("fastlloyd", monkeypatch, noise=False)  # --no-noise: calibrated, no noise
    assert draws == [] and privacy_ledger(config) == {}


@pytest.mark.parametrize("variant", ["fastlloyd", "glloyd", "sulloyd", "lloyd"])
def test_the_report_carries_the_ledger_and_the_terminal_shows_it(variant, tmp_path, capsys):
    from fedproto.cli import main

    path = tmp_path / "run.json"
    argv = ["run", "fastlloyd", "--variant", variant, "--data", "iris", "--clients", "2", "--seed", "0",
            "--quiet", "--no-plot", "--report", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert list(jsonschema.Draft202012Validator(report_schema()).iter_errors(doc)) == []
    assert "privacy" not in doc["results"]
    if variant == "lloyd":
        assert "privacy" not in doc and "Privacy ledger" not in out
        return
    ledger = doc["privacy"]
    assert ledger["epsilon"] == doc["results"]["epsilon_spent"]
    assert ledger["rounds"] == doc["results"]["iterations"] == doc["algorithm_rounds"]
    assert "Privacy ledger" in out and ledger["definition"] in out.replace("\n", " ")


def test_a_noise_free_report_has_no_ledger(tmp_path):
    from fedproto.cli import main

    path = tmp_path / "run.json"
    assert main(["run", "fastlloyd", "--data", "iris", "--clients", "2", "--no-noise", "--quiet", "--no-plot",
                 "--report", str(path)]) == 0
    assert "privacy" not in json.loads(path.read_text())
