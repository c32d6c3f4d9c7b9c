"""Every benchmark script runs with ``--quick --json``: it prints its table and writes its rows as
JSON records (a smoke test, not a timing), and the shared record writer refuses what is not a
flat record."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedproto.testing import load_file

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

#: script -> (a line of its main table's title, the tables its ``--quick`` run writes).
SCRIPTS: dict[str, tuple[str, set[str]]] = {
    "message_rate.py": ("Message rate (messages/s, best of repeats)", {"message_rate", "stage_cost", "meter_cost"}),
    "tcp_rate.py": ("Round trips/s over TCP loopback", {"tcp_round_trips", "envelope"}),
    "fastlloyd_timing.py": ("FastLloyd, M = 2, epsilon = 0.1", {"fastlloyd_timing"}),
    "transport_rounds.py": ("Steady FastLloyd round (ms) per transport", {"transport_rounds"}),
    "scale.py": (
        "FastLloyd, all parties in one process: one steady round",
        {"scale_runs", "scale_per_client", "scale_engines", "scale_memory", "scale_secagg_plus"},
    ),
    "scale_out.py": (
        "FastLloyd over R ranks: whole run and one steady round", {"scale_out_runs", "scale_out_ranks"}
    ),
    "kz_communication.py": (
        "(k,z)-center: communication and radius (z points removed) against z",
        {"kz_center", "kz_authors", "kz_center_growth"},
    ),
    "kz_scale.py": (
        "dist-kzc over the memory transport: time per round as n grows",
        {"kz_scale", "kz_scale_time_split", "kz_scale_rounds", "kz_scale_baselines"},
    ),
    "deletion_streams.py": ("Amortised seconds per deletion", {"deletion_timing", "deletion_quality"}),
    "scma.py": ("SCMA decoding time as the support m = K*L grows", {"scma_decoding", "scma_upload"}),
    "mufc_unlearning.py": ("Unlearning: mean ms per random single-point removal", {"mufc_quality", "mufc_unlearning"}),
    "startup.py": ("Start-up of fedproto run fastlloyd on iris", {"startup", "startup_targets"}),
    "network_model.py": (
        "Link model: predicted against measured wall time", {"network_model", "network_model_paper"}
    ),
    "secagg.py": (
        "Bytes per client per stage (sent + received, mean over the n clients)",
        {"secagg_bytes", "secagg_time", "secagg_growth"},
    ),
}
#: Scripts that draw a figure (sent to the test's temporary directory).
PLOTTING = {"kz_communication.py", "kz_scale.py", "deletion_streams.py", "scma.py", "mufc_unlearning.py", "secagg.py"}
#: Extra arguments of a script's smoke run: secagg.py's ``--quick`` (n = 100 and 1,000, about a
#: minute) is cut to n = 20 and 50 (a few seconds), which still runs every scheme and table;
#: kz_communication.py's (300 inliers per data set, about 20 s of CPU) to 100 (about 12 s), which
#: still runs every method at both values of z on both data sets.
SMOKE_ARGS: dict[str, list[str]] = {"secagg.py": ["--clients", "20", "50"], "kz_communication.py": ["--n", "100"]}
#: Scripts whose quick run is mostly JAX compilation (7-12 s each on a shared 2-core machine, which
#: would take the default run of this file past a minute), transport_rounds (it starts three
#: MPI ranks that each import JAX), startup (three fresh ``fedproto run`` processes, about
#: 15 s), scale (three fresh processes, each importing JAX) and network_model (as root, the
#: per-frame cost between two namespaced processes, six fresh processes timing a first kernel,
#: eight fresh lean runs and three namespaced federations of eleven processes: about 100 s): run
#: with ``-m slow``.
SLOW = {"deletion_streams.py", "mufc_unlearning.py", "transport_rounds.py", "startup.py", "scale.py",
        "network_model.py"}


common = load_file(BENCHMARKS / "_common.py", "benchmark_common", sibling_imports=True)  # a script helper
helpers = load_file(Path(__file__).with_name("_helpers.py"), "tests_helpers")


def test_every_script_is_listed_here_and_in_the_readme():
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SCRIPTS)
    readme = (BENCHMARKS / "README.md").read_text()
    for script, (_, tables) in SCRIPTS.items():
        assert f"`{script}" in readme, script
        for table in tables:
            assert f"`{table}`" in readme, (script, table)


@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in sorted(SCRIPTS)]
)
def test_benchmark_runs_quick_prints_its_table_and_writes_records(script, tmp_path):
    title, tables = SCRIPTS[script]
    path = tmp_path / "records.json"
    command = [sys.executable, str(BENCHMARKS / script), "--quick", "--json", str(path), *SMOKE_ARGS.get(script, [])]
    if script in PLOTTING:
        command += ["--plot", str(tmp_path / "figure.png")]
    # JAX's compile cache on (the tests' shared one): a kernel another test compiled is loaded
    out = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env=helpers.compile_cache_env())
    assert out.returncode == 0, out.stderr[-4000:]
    assert title in out.stdout, out.stdout[-4000:]
    assert "numpy" in out.stdout and "jax" in out.stdout  # the machine facts come first
    records = json.loads(path.read_text())
    assert isinstance(records, list) and records
    for row in records:
        assert isinstance(row, dict)
        assert all(common.RECORD_KEY.fullmatch(key) for key in row), row
        assert all(v is None or isinstance(v, str | int | float | bool) for v in row.values()), row
    assert {row["table"] for row in records} == tables
    for table in tables:  # every table has a number in it, not only labels
        rows = [row for row in records if row["table"] == table]
        assert any(isinstance(v, int | float) and not isinstance(v, bool) for row in rows for v in row.values())
    if script in PLOTTING:
        assert (tmp_path / "figure.png").stat().st_size > 0


def _mpiexec() -> str | None:
    # The registry's MPICH installs mpiexec next to the interpreter of the environment.
    search = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    return shutil.which("mpiexec", path=os.pathsep.join(search))


@pytest.mark.mpi
def test_scale_out_under_mpiexec_measures_one_and_two_ranks_in_one_invocation(tmp_path):
    if importlib.util.find_spec("mpi4py") is None or _mpiexec() is None:
        pytest.skip("needs mpi4py and mpiexec (pip install 'fedproto[mpi]')")
    path = tmp_path / "records.json"
    command = [_mpiexec(), "-n", "2", sys.executable, str(BENCHMARKS / "scale_out.py"), "--quick", "--json", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True, env=helpers.compile_cache_env())  # the quick run's kernels
    try:
        out, err = proc.communicate(timeout=180)
    finally:  # mpiexec and every rank it started end here, whatever happened
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    assert "identical at every R" in out, out[-4000:]
    records = json.loads(path.read_text())
    runs = [r for r in records if r["table"] == "scale_out_runs"]
    assert {(r["scaling"], r["ranks"], r["n_clients"]) for r in runs} == {
        ("strong", 1, 1000), ("strong", 2, 1000), ("weak", 1, 500), ("weak", 2, 1000),
    }
    for r in runs:
        assert r["round_bytes"] == r["analytic_round_bytes"] > 0
        assert r["run_s"] > 0 and r["round_s"] > 0 and r["run_with_build_s"] > r["run_s"]
        assert r["peak_rss_mib_max"] > 0 and 0 < r["serial_percent"] < 100
        if r["ranks"] == 1:
            assert r["speed_up"] == 1.0 and r["exchange_percent_max"] < 5  # one rank: no frame leaves it
        else:
            assert r["speed_up"] > 0 and r["exchange_percent_max"] > 0
    by_clients: dict[int, set] = {}
    for r in runs:  # the same clients give the same centroids at every R, and the same bytes
        by_clients.setdefault(r["n_clients"], set()).add((r["result_digest"], r["round_bytes"], r["setup_bytes"]))
    assert all(len(v) == 1 for v in by_clients.values()), by_clients
    two = [r for r in records if r["table"] == "scale_out_ranks" and r["ranks"] == 2 and r["scaling"] == "strong"]
    assert sorted(r["rank"] for r in two) == [0, 1]
    assert sum(r["parties"] for r in two) == 1001  # the server and every client, each on one rank


def test_json_into_a_missing_directory_is_a_usage_error_before_any_work(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "message_rate.py"), "--quick", "--json", str(tmp_path / "no" / "r.json")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert out.returncode == 2
    assert "--json" in out.stderr and "does not exist" in out.stderr
    assert "Message rate" not in out.stdout


def test_record_converts_numpy_scalars_and_non_finite_floats():
    np = pytest.importorskip("numpy")
    row = common.record("t", n_points=np.int64(3), ratio=np.float32(0.5), ok=np.bool_(True), gap=math.nan,
                        top=math.inf, name="x")
    assert row == {"table": "t", "n_points": 3, "ratio": 0.5, "ok": True, "gap": None, "top": None, "name": "x"}
    assert type(row["n_points"]) is int and type(row["ratio"]) is float and type(row["ok"]) is bool
    json.dumps(row, allow_nan=False)


@pytest.mark.parametrize(("table", "fields"), [
    ("t", {"Payload bytes": 1}),
    ("t", {"bytes/iter": 1}),
    ("Not Snake", {"n": 1}),
])
def test_record_refuses_keys_that_are_not_snake_case(table, fields):
    with pytest.raises(ValueError, match="snake_case"):
        common.record(table, **fields)


def test_record_refuses_nested_values():
    with pytest.raises(TypeError, match="record value"):
        common.record("t", walls=[0.1, 0.2])


def test_write_records_writes_a_json_array_and_checks_every_row(tmp_path):
    path = tmp_path / "r.json"
    rows = [common.record("a", x_s=1.5), common.record("b", n=2)]
    common.write_records(path, rows)
    assert json.loads(path.read_text()) == rows
    with pytest.raises(ValueError, match="snake_case"):
        common.write_records(path, [{"table": "a", "Bad Key": 1}])
    with pytest.raises(TypeError):
        common.write_records(path, [{"table": "a", "nested": {"x": 1}}])
    common.write_records(None, rows)  # no --json: nothing written, no error
