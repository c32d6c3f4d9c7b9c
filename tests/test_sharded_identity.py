"""``mpiexec -n R fedproto run ... --engine lean``: an R-rank run is the 1-rank run (issue 28, part 2).

For every protocol family (FastLloyd with and without ``--secagg plus``, MUFC, QK-means, DC-k-means,
k-z-center, k-z-median, k-z-means), the sharded run's report has the same results, per-link
records, messages and payload bytes as the one-process lean run, field for field (clocks, the
command line and ``ranks`` apart), and the same results, links, messages and bytes as the tasks
engine; its ``ranks`` has one entry per rank with that rank's party count under the placement
and a peak RSS. The default placement, ``--placement coordinator-alone`` and a placement file
(non-contiguous: clients dealt round-robin, the coordinator on the last rank) give the same.

Speed: the references (both engines, in this process) run first, so the ranks find every kernel
in the on-disk compile cache; then ONE ``mpiexec`` job per R runs every case in turn
(tests/fedproto/sharded_main.py: imports and JAX paid once per rank). The default run holds R = 3
(it has ranks with one client and ranks with two, and a rank that is neither the first nor the
last) with every family and both placements; R = 2 and R = 4 and larger sizes are ``slow``.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fedproto.shards import block_placement

DRIVER = Path(__file__).parent / "fedproto" / "sharded_main.py"
_spec = importlib.util.spec_from_file_location("sharded_main", DRIVER)
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)  # its helpers: mpiexec(), run_mpiexec(), skip_without_mpi()
TIMEOUT_S = 420

#: Small runs of every protocol family, with enough clients that each of 4 ranks gets one.
FAMILIES: dict[str, list[str]] = {
    "fastlloyd": ["fastlloyd", "--data", "iris", "--clients", "6", "--seed", "3"],
    "fastlloyd-secagg-plus": ["fastlloyd", "--data", "iris", "--clients", "5", "--seed", "3", "--secagg", "plus"],
    "mufc": ["mufc", "--data", "iris", "--clients", "5", "--removals", "1", "--points-per-removal", "1",
             "--leave", "1", "--no-timing", "--no-baselines", "--n-init", "1", "--seed", "2"],
    "qkmeans": ["qkmeans", "--data", "iris", "--clients", "5", "--removals", "10", "--no-timing", "--seed", "2"],
    "dckmeans": ["dckmeans", "--data", "iris", "--removals", "10", "--no-timing", "--seed", "2"],
    "kzcenter": ["kzcenter", "--data", "iris", "--clients", "5", "--k", "3", "--z", "5", "--slack", "0.5", "--seed", "2"],
    "kzmedian": ["kzmedian", "--data", "iris", "--clients", "5", "--k", "3", "--inject-outliers", "5", "--seed", "2"],
    "kzmeans": ["kzmeans", "--data", "iris", "--clients", "5", "--k", "3", "--inject-outliers", "5", "--seed", "2"],
}

#: Larger runs (``slow``, on 4 ranks): more clients per rank, more rounds, wine's 13 dimensions.
LARGE: dict[str, list[str]] = {
    "large-fastlloyd": ["fastlloyd", "--data", "wine", "--clients", "40", "--seed", "5"],
    "large-fastlloyd-secagg-plus": ["fastlloyd", "--data", "wine", "--clients", "12", "--seed", "5", "--secagg", "plus"],
    "large-mufc": ["mufc", "--data", "wine", "--clients", "12", "--removals", "3", "--points-per-removal", "2",
                   "--leave", "1", "--no-timing", "--no-baselines", "--n-init", "2", "--seed", "5"],
    "large-qkmeans": ["qkmeans", "--data", "wine", "--clients", "12", "--removals", "20", "--no-timing", "--seed", "5"],
    "large-kzcenter": ["kzcenter", "--data", "wine", "--clients", "12", "--k", "3", "--z", "8", "--slack", "0.5",
                       "--seed", "5"],
    "large-kzmeans": ["kzmeans", "--data", "wine", "--clients", "12", "--k", "3", "--inject-outliers", "8", "--seed", "5"],
}

#: The placement cases (k-z-center, the quickest family, on 3 ranks): ``--placement coordinator-alone``
#: and a placement file.
PLACEMENTS = ("kzcenter@coordinator-alone", "kzcenter@file")

#: Report fields that differ between any two runs (clocks, the command line), and ``ranks``.
RUN_SPECIFIC = {"wall_time_s", "round_wall_s", "compile_s", "started_at", "finished_at", "command", "options", "ranks"}
#: Options that name the run rather than the protocol's configuration.
RUN_OPTIONS = {"report", "engine", "placement"}

#: R -> the cases of that R's one job (the default run: R = 3).
JOBS: dict[int, list[str]] = {
    2: list(FAMILIES),
    3: [*FAMILIES, *PLACEMENTS],
    4: [*FAMILIES, *LARGE],
}


def _argv(case: str) -> list[str]:
    return (FAMILIES | LARGE).get(case) or FAMILIES[case.split("@")[0]]


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Any:
    """``references(case, engines) -> {engine: report}``, each run once, in this process."""
    from fedproto.cli import main

    folder = tmp_path_factory.mktemp("references")
    done: dict[tuple[str, str], dict] = {}

    def get(case: str, engines: tuple[str, ...] = ("lean", "tasks")) -> dict[str, dict]:
        family = case.split("@")[0]
        for engine in engines:
            if (family, engine) not in done:
                path = folder / f"{family}.{engine}.json"
                argv = ["run", *_argv(family), "--engine", engine, "--quiet", "--no-plot", "--report", str(path)]
                assert main(argv) == 0, f"{family} --engine {engine} failed"
                done[family, engine] = json.loads(path.read_text())
        return {engine: done[family, engine] for engine in engines}

    return get


def _custom_placement(roster: list[str], ranks: int) -> dict[str, int]:
    """Clients dealt round-robin from rank 0, the coordinator on the last rank: no block at all."""
    return {roster[0]: ranks - 1, **{p: j % ranks for j, p in enumerate(roster[1:])}}


@pytest.fixture(scope="module")
def sharded(references, tmp_path_factory) -> Any:
    """``sharded(R) -> {case: {"report": ..., "ranks": [per-rank record], "placement": {party: rank}}}``:
    one ``mpiexec -n R`` job per R, run once. The lean references run first (the ranks then find
    every kernel in the compile cache), the tasks references while the job runs."""
    jobs: dict[int, dict[str, dict]] = {}

    def get(size: int) -> dict[str, dict]:
        if size in jobs:
            return jobs[size]
        driver.skip_without_mpi()
        folder = tmp_path_factory.mktemp(f"ranks{size}")
        cases, placements = {}, {}
        for case in JOBS[size]:
            roster = references(case, ("lean",))["lean"]["parties"]
            argv = list(_argv(case))
            placement = block_placement(roster, size)
            if case.endswith("@coordinator-alone"):
                argv += ["--placement", "coordinator-alone"]
                clients = roster[1:]
                placement = {roster[0]: 0, **{p: 1 + j * (size - 1) // len(clients) for j, p in enumerate(clients)}}
            elif case.endswith("@file"):
                placement = _custom_placement(roster, size)
                path = folder / "placement.json"
                path.write_text(json.dumps(placement))
                argv += ["--placement", str(path)]
            cases[case], placements[case] = argv, placement
        (folder / "cases.json").write_text(json.dumps(cases))
        command = [driver.mpiexec(), "-n", str(size), sys.executable, str(DRIVER), str(folder / "cases.json"),
                   str(folder)]
        result = driver.run_mpiexec(command, TIMEOUT_S, meanwhile=lambda: [references(case) for case in cases])
        assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}"
        jobs[size] = {
            case: {
                "report": json.loads((folder / f"{case}.json").read_text()),
                "ranks": [json.loads((folder / f"{case}.rank{r}.json").read_text()) for r in range(size)],
                "placement": placements[case],
            }
            for case in cases
        }
        return jobs[size]

    return get


def _links(report: dict) -> dict:
    return {
        (l["round_idx"], l["phase"], l["sender"], l["receiver"], l["tag"]): (l["messages"], l["payload_bytes"])
        for l in report["links"]
    }


def _check_identity(size: int, case: str, run: dict, refs: dict[str, dict]) -> None:
    report, lean, tasks = run["report"], refs["lean"], refs["tasks"]
    assert report["status"] == "completed"
    for rank, record in enumerate(run["ranks"]):
        assert record["code"] == 0, f"rank {rank}: {record['stderr']}"
        if rank:  # rank 0 speaks for the run; the others print nothing
            assert record["stdout"] == record["stderr"] == "", f"rank {rank} printed"
    # the one-process lean run, field for field
    assert report["links"] and _links(report) == _links(lean)
    for field in set(report) | set(lean):
        if field not in RUN_SPECIFIC:
            assert report.get(field) == lean.get(field), f"{case} on {size} ranks: {field} differs from one rank"
    mine = {k: v for k, v in report["options"].items() if k not in RUN_OPTIONS}
    assert mine == {k: v for k, v in lean["options"].items() if k not in RUN_OPTIONS}
    # the tasks engine: results, links, messages and bytes
    assert _links(report) == _links(tasks)
    assert (report["payload_bytes"], report["messages"]) == (tasks["payload_bytes"], tasks["messages"])
    assert report["results"] == tasks["results"]
    # one entry per rank, its parties under the placement, its peak memory
    counts = collections.Counter(run["placement"].values())
    assert [r["rank"] for r in report["ranks"]] == list(range(size))
    assert [r["parties"] for r in report["ranks"]] == [counts.get(r, 0) for r in range(size)]
    assert sum(r["parties"] for r in report["ranks"]) == len(report["parties"])
    assert all(r["peak_rss_mib"] > 0 and r["exchange_s"] >= 0 for r in report["ranks"])


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("size", "case"),
    [
        *[pytest.param(3, case, id=f"3-{case}") for case in JOBS[3]],
        *[pytest.param(2, case, id=f"2-{case}", marks=pytest.mark.slow) for case in JOBS[2]],
        *[pytest.param(4, case, id=f"4-{case}", marks=pytest.mark.slow) for case in JOBS[4]],
    ],
)
def test_an_r_rank_run_is_the_one_rank_run_and_the_tasks_engines(size, case, sharded, references):
    _check_identity(size, case, sharded(size)[case], references(case))


def test_the_placement_cases_spread_the_parties_otherwise():
    """The placement cases test something: their placements differ from the default blocks."""
    roster = ["coordinator", *(f"machine-{j}" for j in range(5))]
    blocks = block_placement(roster, 3)
    assert collections.Counter(blocks.values()) == {0: 2, 1: 2, 2: 2}
    assert _custom_placement(roster, 3) != blocks and _custom_placement(roster, 3)["coordinator"] == 2
