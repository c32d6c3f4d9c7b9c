"""The mufc plugin: plan(), a run through the real command line, bad input as one clear line."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

from fedproto.algorithms.mufc.cli import PROTOCOL, removal_stream, unit_box
from fedproto.cli import main
from fedproto.data import load_dataset
from fedproto.metering import Meter
from fedproto.runtime import RuntimeConfig, run_parties
from fedproto.transports.memory import MemoryNetwork

CELLTYPE = Path(__file__).resolve().parents[4] / "shared" / "data" / "celltype.npz"


def parse(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="iris")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partition", default="iid")
    parser.add_argument("--deadline", type=float, default=60.0)
    PROTOCOL.add_arguments(parser)
    return parser.parse_args(argv)


def run_plan(plan):
    async def go():
        network = MemoryNetwork(plan.roster)
        meter = Meter(trio.current_time)
        machines = {p: plan.make_machine(p) for p in plan.roster}
        results = await run_parties(machines, network.endpoints(), config=RuntimeConfig(session=plan.session),
                                    meter=meter)
        return results, meter.report(protocol="mufc", transport="memory", session=plan.session, parties=plan.roster)

    results, report = trio.run(go)
    return {p: plan.result_to_json(p, r) for p, r in results.items()}, report


def test_plan_runs_and_summarises_with_exactness_and_the_analytic_bytes():
    args = parse(["--remove", "4", "--batch", "2", "--no-timing", "--n-init", "2"])
    plan = PROTOCOL.plan(args, load_dataset("iris"))
    results, report = run_plan(plan)
    summary = plan.summarize(results)
    assert summary["points removed"] == 8 and summary["decoded point count (final)"] == 142
    assert summary["model equals training on the remaining data (same keys)"] is True
    assert summary["clients agree on the model"] is True
    assert summary["loss ratio phi_f / phi_c*"] >= summary["phi_c (nearest centroid)"] / summary[
        "phi_c* (scikit-learn KMeans, 10 restarts)"] - 1e-12  # phi_f >= phi_c
    # every share is T * width payload bytes: the analytic figure is what each client uploads
    per_client = plan.analytic["analytic syndrome payload per client per aggregation (T·ceil(log2 p / 8) bytes)"]
    shares = [link for link in report.links if link.tag == "mufc.syndromes"]
    assert len(shares) == 3 * 5
    assert all(per_client < link.payload_bytes < per_client + 64 for link in shares)


def test_removal_stream_is_random_valid_and_keeps_k_points():
    ids = [np.arange(10), np.arange(10, 14), np.arange(14, 40)]
    stream = removal_stream([10, 4, 26], ids, 8, 2, 1, 3, seed=5)
    assert len(stream) == 9 and stream[-1][1] is None
    seen = [i for _, b in stream[:-1] for i in b]
    assert len(seen) == len(set(seen)) == 16
    for c, batch in stream[:-1]:
        assert set(batch) <= set(ids[c].tolist())
    with pytest.raises(ValueError):
        removal_stream([3, 3], [np.arange(3), np.arange(3, 6)], 1, 1, 0, 3, seed=0)
    with pytest.raises(ValueError):
        removal_stream([3, 3], [np.arange(3), np.arange(3, 6)], 0, 1, 2, 1, seed=0)


def test_unit_box_keeps_unit_data_and_scales_the_rest():
    x = np.array([[0.0, 1.0], [0.5, 0.25]])
    assert unit_box(x) is not None and np.array_equal(unit_box(x), x)
    y = unit_box(np.array([[-3.0, 10.0], [1.0, 10.0]]))
    assert y.min() == 0.0 and y.max() == 1.0 and np.all(y[:, 1] == 0.0)


@pytest.mark.skipif(not CELLTYPE.is_file(), reason="needs ../shared/data/celltype.npz")
def test_celltype_uses_its_own_hundred_client_split():
    args = parse(["--data", str(CELLTYPE), "--remove", "0"])
    plan = PROTOCOL.plan(args, load_dataset(str(CELLTYPE)))
    assert len(plan.roster) == 101


def fedproto(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "fedproto", *argv], capture_output=True, text=True,
                          timeout=600, cwd=cwd, stdin=subprocess.DEVNULL)


def test_command_line_run_writes_the_report_and_plot(tmp_path):
    out = fedproto("run", "mufc", "--data", "gaussian-small", "--clients", "4", "--remove", "3", "--quiet",
                   "--retrains", "1", "--report", str(tmp_path / "run.json"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loss ratio" in out.stdout and "unlearning speed-up" in out.stdout
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["results"]["model equals training on the remaining data (same keys)"] is True
    assert (tmp_path / "run.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--k", "0"], "--k must be at least 1"),
        (["--k", "500"], "larger than the number of points"),
        (["--remove", "1000"], "can serve another removal"),
        (["--leave", "3"], "every one of the 3 clients"),
        (["--split", "file"], "client_X"),
        (["--gamma", "-1"], "gamma"),
    ],
)
def test_bad_arguments_print_one_line(capsys, argv, message):
    code = main(["run", "mufc", "--data", "iris", "--clients", "3", "--no-timing", *argv])
    err = capsys.readouterr().err
    assert code != 0
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
