"""The JAX compile clock, the persistent compile cache, and compile time in the run report."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from fedproto import compilation, memo
from fedproto.metering import Meter, RunReport, report_schema


def test_compile_seconds_grows_when_a_new_kernel_compiles():
    before = compilation.compile_seconds()

    @jax.jit
    def kernel(x):
        return jnp.cumsum(jnp.sin(x) * 3.0) - x

    kernel(jnp.arange(37.0)).block_until_ready()
    middle = compilation.compile_seconds()
    assert middle > before
    kernel(jnp.arange(37.0)).block_until_ready()  # compiled already: no time added
    assert compilation.compile_seconds() == middle


def test_meter_reports_the_compile_time_between_start_and_finish():
    meter = Meter()
    assert meter.compile_s == 0.0  # not started
    meter.start()

    @jax.jit
    def kernel(x):
        return jnp.tanh(x) @ x.T

    kernel(jnp.ones((5, 3))).block_until_ready()
    meter.finish()
    spent = meter.compile_s
    assert spent > 0
    kernel(jnp.ones((7, 2))).block_until_ready()  # after finish: not this run's
    report = meter.report(protocol="p", transport="memory", session=0, parties=["a"])
    assert report.compile_s == spent
    doc = report.to_dict()
    assert doc["compile_s"] == spent
    assert RunReport.from_dict(doc).compile_s == spent
    old = {k: v for k, v in doc.items() if k != "compile_s"}  # reports written before the field
    assert RunReport.from_dict(old).compile_s == 0.0
    merged = RunReport.merge([report, RunReport.from_dict(old)])
    assert merged.compile_s == spent  # the longest over the processes
    assert "compile_s" in report_schema()["properties"]


def test_default_cache_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation.default_cache_dir() == tmp_path / "fedproto" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compilation.default_cache_dir().parts[-3:] == (".cache", "fedproto", "jax")


def _command(report, *extra):
    return [sys.executable, "-m", "fedproto", "run", "fastlloyd", "--data", "iris", "--clients", "2", "--quiet",
            "--no-plot", "--report", str(report), *extra]


def _run(tmp_path, name, *extra):
    report = tmp_path / f"{name}.json"
    # the calibrations and the scikit-learn reference (fedproto.memo) come from the tests' shared
    # cache, as the kernels do not: another test's run may have kept them, and they are not
    # what this test measures
    mine = tmp_path / "cache" / "fedproto" / "memo"
    if not mine.exists():
        mine.parent.mkdir(parents=True, exist_ok=True)
        shared = memo.memo_dir()
        shared.mkdir(parents=True, exist_ok=True)
        mine.symlink_to(shared, target_is_directory=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(_command(report, *extra), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(report.read_text())
    assert doc["device"].startswith("cpu: ") or doc["device"].startswith("gpu: ")
    return doc


def test_a_second_run_loads_its_kernels_from_the_cache(tmp_path):
    """The first run fills the cache; the second compiles less (only tracing and lowering are
    left) and finds the same result; ``--no-compile-cache`` writes nothing."""
    off = tmp_path / "off"
    off.mkdir()
    report = off / "report.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(off / "cache")}
    # the run without the cache has a cache directory of its own: it runs beside the first run
    uncached = subprocess.Popen(
        _command(report, "--no-compile-cache"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True,
    )
    try:
        first = _run(tmp_path, "first")
        _, err = uncached.communicate(timeout=300)
    finally:
        uncached.kill()
        uncached.communicate()
    cache = tmp_path / "cache" / "fedproto" / "jax"
    entries = list(cache.iterdir())
    assert entries and first["compile_s"] > 0
    second = _run(tmp_path, "second")
    assert second["compile_s"] < first["compile_s"]
    assert second["results"] == first["results"]
    assert len(list(cache.iterdir())) == len(entries)  # nothing new to compile
    assert uncached.returncode == 0, err
    assert not (off / "cache" / "fedproto").exists()
    assert json.loads(report.read_text())["compile_s"] > 0


@pytest.fixture
def _restore_default_device():
    before = jax.config.jax_default_device
    yield
    jax.config.update("jax_default_device", before)


def test_device_selection_and_its_description(_restore_default_device):
    compilation.select_device("auto")  # JAX's own choice: nothing changes
    try:
        jax.devices("cpu")
    except RuntimeError:  # JAX_PLATFORMS=cuda: no CPU backend in this process
        with pytest.raises(ValueError, match="--device cpu: JAX offers no CPU device"):
            compilation.select_device("cpu")
    else:
        compilation.select_device("cpu")  # also after JAX started a GPU (a GPU machine's tests)
        assert compilation.device_description().startswith("cpu: ")
    with pytest.raises(ValueError, match="device must be one of"):
        compilation.select_device("tpu-pod")
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(ValueError, match="JAX sees no GPU .*platforms found: cpu"):
            compilation.select_device("gpu")


def test_a_report_names_no_device_until_the_process_has_compiled_a_kernel(monkeypatch):
    compilation.compile_seconds()  # counting on (JAX is imported)
    monkeypatch.setattr(compilation, "_events", 0)  # as in a process that ran no JAX yet
    meter = Meter()
    meter.start()
    meter.finish()
    assert not compilation.kernels_compiled()
    assert meter.report(protocol="p", transport="memory", session=0, parties=["a"]).device == ""
    meter = Meter()
    meter.start()
    jax.jit(lambda x: x * 3.0)(jnp.arange(5.0)).block_until_ready()  # a new function: traced
    meter.finish()
    assert compilation.kernels_compiled()
    report = meter.report(protocol="p", transport="memory", session=0, parties=["a"])
    assert report.device == compilation.device_description() != ""


def test_reports_name_their_device_and_merge_the_distinct_ones():
    jax.jit(lambda x: x + 1)(jnp.zeros(2)).block_until_ready()  # this process uses JAX
    meter = Meter()
    meter.start()
    meter.finish()
    report = meter.report(protocol="p", transport="memory", session=0, parties=["a"])
    assert report.device == compilation.device_description() != ""
    doc = report.to_dict()
    assert RunReport.from_dict(doc).device == report.device
    assert RunReport.from_dict({k: v for k, v in doc.items() if k != "device"}).device == ""
    other = dataclasses.replace(report, device="gpu: NVIDIA H100")
    merged = RunReport.merge([report, other, report])
    assert merged.device == f"{report.device}; gpu: NVIDIA H100"


def test_the_command_line_refuses_a_missing_gpu_in_one_line(capsys, tmp_path):
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    from fedproto import cli

    code = cli.main(["run", "fastlloyd", "--data", "iris", "--device", "gpu", "--quiet",
                     "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 1 and "no GPU" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "r.json").exists()


def test_deterministic_gpu_ops_are_asked_for_unless_the_user_chose(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert compilation.deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", "--xla_gpu_deterministic_ops=true"]
    assert compilation.deterministic_gpu_ops()  # idempotent
    assert os.environ["XLA_FLAGS"].count("deterministic") == 1
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")
    assert not compilation.deterministic_gpu_ops()
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false"


_DEFERRED = """
import sys
from fedproto.compilation import compile_seconds, enable_compile_cache, kernels_compiled

directory = enable_compile_cache(sys.argv[1])
assert "jax" not in sys.modules, "enable_compile_cache imported JAX"
assert compile_seconds() == 0.0 and not kernels_compiled() and "jax" not in sys.modules
import jax
import jax.numpy as jnp

assert jax.config.jax_compilation_cache_dir == str(directory)
assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
jax.jit(lambda x: 2 * x + 1)(jnp.ones(3)).block_until_ready()
print(compile_seconds(), kernels_compiled())
"""


def test_the_compile_cache_is_turned_on_without_importing_jax(tmp_path):
    """A protocol that never uses JAX does not pay for importing it (the tutorial's parties); one
    that imports it later gets the cache and has its first kernel's compile time counted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION") and not k.startswith("JAX_PERSISTENT")}
    done = subprocess.run(
        [sys.executable, "-c", _DEFERRED, str(tmp_path / "cache")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seconds, compiled = done.stdout.split()
    assert float(seconds) > 0 and compiled == "True"
    assert any((tmp_path / "cache").iterdir())  # the kernel went into the cache
