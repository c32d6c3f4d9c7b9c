"""The on-disk memo of pure results (fedproto.memo) and the DP calibrations kept in it: a cached
calibration is bit for bit the solved one, a later call solves nothing (so imports no SciPy), and
a memo that is off, unreadable or answers another key is never trusted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedproto import memo
from fedproto.algorithms import _dp_gdp, dp


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(memo, "_enabled", True)
    return tmp_path


def _no_solve(*args, **kwargs):
    raise AssertionError("solved again")


def test_cached_calibrations_are_the_solved_floats_bit_for_bit(cache, monkeypatch):
    rng = np.random.default_rng(29)
    cases = [(float(e), float(d)) for e, d in zip(rng.uniform(0.01, 20.0, 40), 10.0 ** rng.uniform(-12, -1, 40))]
    cases += [(1.0, 1e-5), (0.1, 1e-9), (8.0, 1 / (5000 * np.log(5000)))]
    monkeypatch.setattr(memo, "_enabled", False)
    fresh_sigma = [dp.gaussian_sigma(e, d) for e, d in cases]
    fresh_spent = [dp.spent_epsilon(1.0 / s, d) for s, (_, d) in zip(fresh_sigma, cases)]
    assert not (cache / "fedproto").exists()  # off: nothing written
    monkeypatch.setattr(memo, "_enabled", True)
    first = [dp.gaussian_sigma(e, d) for e, d in cases]
    first_spent = [dp.spent_epsilon(1.0 / s, d) for s, (_, d) in zip(fresh_sigma, cases)]
    assert len(list((memo.memo_dir() / "gaussian_sigma").glob("*.json"))) == len(cases)
    monkeypatch.setattr(_dp_gdp, "_solve_increasing", _no_solve)  # where the curve is solved
    monkeypatch.setattr(_dp_gdp, "_log_gdp_delta", _no_solve)
    cached = [dp.gaussian_sigma(e, d) for e, d in cases]
    cached_spent = [dp.spent_epsilon(1.0 / s, d) for s, (_, d) in zip(fresh_sigma, cases)]
    for got in (first, cached):
        assert [float.hex(x) for x in got] == [float.hex(x) for x in fresh_sigma]
    for got in (first_spent, cached_spent):
        assert [float.hex(x) for x in got] == [float.hex(x) for x in fresh_spent]
    with pytest.raises(AssertionError, match="solved again"):  # other arguments are another solve
        dp.gaussian_sigma(1.0, 2e-5)


def test_an_unreadable_or_foreign_memo_file_is_ignored_and_replaced(cache, monkeypatch):
    sigma = dp.gaussian_sigma(1.0, 1e-5)
    (path,) = (memo.memo_dir() / "gaussian_sigma").glob("*.json")
    path.write_text("{not json")
    assert dp.gaussian_sigma(1.0, 1e-5) == sigma  # solved again, file rewritten
    doc = json.loads(path.read_text())
    doc["key"][0] = float.hex(2.0)  # a file that answers another question
    doc["value"] = 99.0
    path.write_text(json.dumps(doc))
    assert dp.gaussian_sigma(1.0, 1e-5) == sigma


def test_a_memo_that_cannot_be_written_costs_only_the_speed_up(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the directory should be
    monkeypatch.setattr(memo, "_enabled", True)
    assert memo.lookup("gaussian_sigma", ["x"]) is None
    memo.store("gaussian_sigma", ["x"], 1.5)  # no exception
    assert dp.gaussian_sigma(1.0, 1e-5) == pytest.approx(3.730632, rel=1e-6)


def test_no_compile_cache_turns_the_memo_off(tmp_path, monkeypatch):
    import argparse

    from fedproto import cli

    monkeypatch.setattr(memo, "_enabled", True)
    cli._compile_cache(argparse.Namespace(no_compile_cache=True))
    assert memo._enabled is False


def test_the_scipy_version_in_the_key_is_the_installed_distributions(tmp_path, monkeypatch):
    """The solver's key names SciPy's version, read from its ``version.py`` without importing
    SciPy (or from the distribution's metadata where that file says nothing)."""
    from importlib.metadata import version

    _dp_gdp._scipy_version.cache_clear()
    try:
        assert _dp_gdp._scipy_version() == version("scipy")
        assert _dp_gdp._solver_key(1.0)[-1] == version("scipy")
    finally:
        _dp_gdp._scipy_version.cache_clear()
    good = tmp_path / "good.py"
    good.write_text('"""doc"""\nfull = "x"\nversion = "9.8.7"\nversion = "later"\n')
    assert _dp_gdp._assigned_string(str(good), "version") == "9.8.7"
    for text in ("version = 3\n", "def f(:\n", "other = 'a'\n", "version: str = 'annotated'\n"):
        good.write_text(text)
        assert _dp_gdp._assigned_string(str(good), "version") is None
    assert _dp_gdp._assigned_string(str(tmp_path / "missing.py"), "version") is None
