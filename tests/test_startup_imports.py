"""Start-up imports only what a command needs (issue 29, target 3).

* ``fedproto --help`` and ``fedproto list`` import no protocol module (the built-in protocols
  are described from the registry's table, which must agree with the plugins themselves);
* ``fedproto run fastlloyd`` imports neither scikit-learn nor SciPy's statistics: the
  scikit-learn reference is read from the cache of an earlier run (bit for bit a fresh fit),
  SciPy's special functions and root finder only when a calibration is not on disk yet
  (:mod:`fedproto.memo`), and a run without noise (``--variant lloyd``) imports no SciPy at all;
* the default ``--secagg msa`` imports neither SecAgg+'s engine nor SCMA nor FLINT.

Each command runs in a fresh interpreter (``sys.modules`` of this one holds everything).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Runs the command line in this process and prints the modules it imported, as JSON, last.
_PROBE = """
import contextlib, io, json, sys
from fedproto.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _probe(script: str, tmp_path: Path, *argv: str) -> tuple[dict, str]:
    """Run a probe ``script`` with ``argv`` in a fresh interpreter (in ``tmp_path``, its own cache);
    its last line of output as JSON, and its error output."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script, *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _imported(tmp_path: Path, *argv: str) -> set[str]:
    doc, stderr = _probe(_PROBE, tmp_path, *argv)
    assert doc["code"] == 0, (argv, stderr[-2000:])
    return set(doc["modules"])


def _protocol_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith("fedproto.algorithms."))


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["run", "--help"]])
def test_help_and_list_import_no_protocol_module(tmp_path, argv):
    modules = _imported(tmp_path, *argv)
    assert _protocol_modules(modules) == [], argv
    assert "jax" not in modules and "sklearn" not in modules and "scipy" not in modules, argv


def test_the_registry_table_describes_each_builtin_protocol_as_the_plugin_does():
    from fedproto import registry

    installed = {entry.value: name for name, entry in registry._group(registry.PROTOCOL_GROUP).items()}
    assert set(registry.BUILTIN_PROTOCOLS) <= set(installed)
    for value, (description, modules) in registry.BUILTIN_PROTOCOLS.items():
        plugin = registry.load_protocol(installed[value])
        assert registry._description(plugin) == description, value
        loaded = {m.split(".")[0] for m in sys.modules}
        assert set(modules) <= loaded, value


def test_the_installed_plugins_are_scanned_once_a_process_per_group(monkeypatch):
    """Each group's entry points are read once (a scan costs 5-7 ms and a run asks about six
    times); every call gets its own dict; a replaced ``entry_points`` is scanned afresh."""
    from fedproto import registry

    calls: list[str] = []

    class _Entry:
        def __init__(self, name: str) -> None:
            self.name = name

    def fake(*, group):
        calls.append(group)
        return [_Entry(f"{group}-one"), _Entry(f"{group}-two")]

    monkeypatch.setattr(registry, "entry_points", fake)
    first = registry._group("g.a")
    first["mine"] = None  # a caller's changes stay its own
    assert registry._group("g.a").keys() == {"g.a-one", "g.a-two"}
    assert list(registry._group("g.b")) == ["g.b-one", "g.b-two"]
    registry._group("g.b")
    assert calls == ["g.a", "g.b"]


def test_list_names_a_builtin_protocol_broken_when_a_module_it_needs_is_missing(monkeypatch):
    import importlib.util

    from fedproto import registry

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flint" else real(name, *a))
    infos = {info.name: info for info in registry.describe_protocols()}
    assert infos["mufc"].error == "ModuleNotFoundError: No module named 'flint'"
    assert infos["fastlloyd"].error is None  # FLINT only for --secagg plus, imported then
    assert infos["qkmeans"].error is None and infos["qkmeans"].description.startswith("Q-k-means")


def test_a_warm_fastlloyd_run_imports_no_sklearn_and_no_scipy_stats(tmp_path):
    argv = ["run", "fastlloyd", "--data", "iris", "--clients", "2", "--no-plot", "--quiet"]
    cold = _imported(tmp_path, *argv)
    assert "sklearn" in cold  # the first run fits the reference
    warm = _imported(tmp_path, *argv)
    assert _protocol_modules(warm) and all(
        m.startswith(("fedproto.algorithms.fastlloyd", "fedproto.algorithms.secagg", "fedproto.algorithms.dp",
                      "fedproto.algorithms._dp_", "fedproto.algorithms.kmeans", "fedproto.algorithms.scma",
                      "fedproto.algorithms._scma_"))
        for m in _protocol_modules(warm)
    ), _protocol_modules(warm)  # only the named protocol (and what it builds on)
    assert "sklearn" not in warm and "scipy.stats" not in warm
    # the calibration and the spent epsilon were kept on disk by the first run: no SciPy at all
    assert "scipy" not in warm
    # MSA (the default --secagg) needs neither SecAgg+'s engine nor SCMA's arithmetic nor FLINT
    assert not {"flint", "fedproto.algorithms.scma", "fedproto.algorithms._scma_field",
                "fedproto.algorithms.secagg_plus.engine"} & warm
    plus = _imported(tmp_path, *argv[:4], "--clients", "3", *argv[6:], "--secagg", "plus")
    assert {"flint", "fedproto.algorithms.secagg_plus.engine"} <= plus
    lloyd = _imported(tmp_path, *argv, "--variant", "lloyd")  # no noise: nothing to calibrate
    assert "sklearn" not in lloyd and "scipy" not in lloyd


def test_the_cached_reference_is_the_fresh_fit_bit_for_bit(tmp_path, monkeypatch):
    from fedproto.algorithms.fastlloyd import reference

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    x = np.random.default_rng(3).normal(size=(300, 3))
    fresh = reference.sklearn_reference(x, 4, seed=7, cache=False)
    assert not reference.reference_cache_dir().exists()
    first = reference.sklearn_reference(x, 4, seed=7)
    assert len(list(reference.reference_cache_dir().glob("*.json"))) == 1

    def no_fit(*args):
        raise AssertionError("fitted again")

    monkeypatch.setattr(reference, "_fit", no_fit)
    cached = reference.sklearn_reference(x, 4, seed=7)
    for got in (first, cached):
        assert got.inertia == fresh.inertia and np.array_equal(got.centroids, fresh.centroids)
    with pytest.raises(AssertionError, match="fitted again"):  # another seed is another fit
        reference.sklearn_reference(x, 4, seed=8)


# Runs ``fedproto`` as this process's own command line (``main()`` reading ``sys.argv``, as the
# console script does) and prints, as JSON, the collector's state when the run started and after.
_GC_PROBE = """
import contextlib, gc, io, json, sys
import fedproto._cli_run as cli_run
from fedproto.cli import main
seen = {}
run_memory = cli_run._run_memory
def at_run(*args, **kwargs):
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), collections=len(collections) - before)
    return run_memory(*args, **kwargs)
cli_run._run_memory = at_run
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
sys.argv = ["fedproto", *sys.argv[1:]]
before = len(collections)
with contextlib.redirect_stdout(io.StringIO()):
    code = main()
print(json.dumps({"code": code, "at_run": seen, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_the_collector_pauses_for_the_start_up_of_a_run_and_runs_again_for_the_run(tmp_path):
    # a run: no collection while it starts (imports, parser, plugin, plan), then the collector is
    # on again, with what the start-up made frozen out of its way
    doc, _ = _probe(_GC_PROBE, tmp_path, "run", str(ROOT / "docs" / "tutorial" / "secure_sum.py"), "--quiet",
                    "--no-plot")
    assert doc["code"] == 0
    assert doc["at_run"] == {"enabled": True, "frozen": doc["at_run"]["frozen"], "collections": 0}
    assert doc["at_run"]["frozen"] > 10_000
    assert doc["enabled"] is True
    # an error before the run (no such data file) and a command without a run leave it on too
    for argv in (["run", "fastlloyd", "--data", str(tmp_path / "missing.csv")], ["list"]):
        doc, _ = _probe(_GC_PROBE, tmp_path, *argv)
        assert doc["code"] == (1 if argv[0] == "run" else 0) and doc["at_run"] == {}
        assert doc["enabled"] is True and doc["frozen"] > 0, argv


def test_a_library_call_of_the_command_line_leaves_the_collector_alone():
    from fedproto.cli import main

    frozen = gc.get_freeze_count()
    assert main(["list"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen
